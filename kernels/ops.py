"""torch custom ops around the fused kernels, so torch.compile and CUDA graphs can capture them.

    torch.ops.w12.gemm(x, records, exponents, escapes, esc_offsets, esc_cols, n)   -> bf16 [M, n]
    torch.ops.w12.gemm_packed(x, packed, n, nnz)                                 -> bf16 [M, n]
    torch.ops.w12.view_gemm(x, records, exponents, n)                            -> bf16 [M, n]

x is bf16 [M, K] (2-D; `matmul` below flattens leading dims). CUDA calls with M ≤ LARGE_M on a Hopper GPU run a
CUDA kernel of kernels/w12_gemv.cu where gemm_cuda.kernel_for names one, other CUDA calls with M ≤ LARGE_M the
Triton kernels, each with a config picked from a table by shape (no autotuning, no host sync).  CUDA calls with
M > LARGE_M (prefill) decode W once into a transient bf16 [N, K] (kernels/decode.py; 2·N·K bytes for the call's
duration) and run `F.linear` on it: cuBLAS on the exact weight, so each output is, bit for bit, what the BF16 layer
gives (bench/large_m.py checks it).  So do calls on small matrices (below 4 M weights) at 33–128 rows (the view:
49–128) on a Hopper GPU, where that beats the kernels (gemm_cuda.prefers_decode).  Other devices run the
reference decoder + an fp32 matmul (kernels/reference.py). `esc_offsets`, `esc_cols` come from
`gemm.prepare_escapes(counts, escapes)`, computed once when the matrix is loaded.

`gemm_packed` is `gemm` with the records and the four small tensors packed into ONE int32 tensor
(`pack_matrix`, load time; the layer's `weight` buffer becomes a view of its records part, so the bytes live
once): what a model's layers call under torch.compile, which re-checks every tensor a compiled graph reads
on every call (about six guards per tensor). Measured on a compiled decode step: five tensors per W12 layer
made the guard check 2.7× BF16's (bench/results/2026-12-01-guard-cost-cpu.md); one per layer is BF16's count.
"""

import functools

import torch
import torch.nn.functional as F

from w12.formats.layout import REC_BYTES, tiles

from . import decode as _dec
from . import gemm as _g
from . import gemm_cuda as _gc
from . import reference as _ref

# Rows of X above which a CUDA call decodes W and runs cuBLAS instead of a fused kernel: there the GEMM is bound
# by the tensor cores, not by reading W (bench/large_m.py).  (Measured slower: decoding N in 2–8 chunks on a side
# stream under the previous chunk's cuBLAS call, geomean 0.34–0.80× BF16 against 0.49–0.84× for one decode + one
# F.linear, and not F.linear's bits on every shape; 2026-12-03-large-m-overlap-FAILED-h200-s25.md.)
LARGE_M = 128


@functools.cache
def _gpus() -> int:
    return torch.cuda.device_count()


def _other_gpu(x: torch.Tensor) -> bool:
    """True when x is on a GPU other than the current device: the CUDA and Triton kernels launch on the current
    device, and a model split over GPUs in one process (device_map="auto") calls layers on the others, so those calls
    make x's GPU current. With one GPU this costs a cached call, not a device query per layer."""
    return _gpus() > 1 and x.get_device() != torch.cuda.current_device()


def on_input_gpu(fn, x: torch.Tensor, *args):
    """fn(x, *args) with x's GPU the current device (see _other_gpu)."""
    if _other_gpu(x):
        with torch.cuda.device(x.device):
            return fn(x, *args)
    return fn(x, *args)


@torch.library.custom_op("w12::gemm", mutates_args=())
def w12_gemm(x: torch.Tensor, records: torch.Tensor, exponents: torch.Tensor, escapes: torch.Tensor,
             esc_offsets: torch.Tensor, esc_cols: torch.Tensor, n: int) -> torch.Tensor:
    """Y = X · Wᵀ with the exact W (escapes added as an exact sparse correction)."""
    return _gemm(x, records, exponents, escapes, esc_offsets, esc_cols, n)


def _gemm(x, records, exponents, escapes, esc_offsets, esc_cols, n):
    if x.is_cuda:
        return on_input_gpu(_gemm_cuda, x, records, exponents, escapes, esc_offsets, esc_cols, n)
    counts = _ref.counts_from_offsets(esc_offsets, *records.shape[:2])
    return _ref.gemm(x, records, exponents, counts, escapes, n)


def _gemm_cuda(x, records, exponents, escapes, esc_offsets, esc_cols, n):
    m, k = x.shape
    cuda = m <= LARGE_M and _gc.usable(x, records, exponents, n)
    if m > LARGE_M or (cuda and _gc.prefers_decode(m, n, k)):  # prefill; small matrices from 33 rows (H200)
        return F.linear(x, _dec.decode(records, exponents, escapes, esc_offsets, n, k))
    if cuda:
        return _gc.launch(x, records, exponents, n, escapes, esc_offsets, esc_cols)
    return _g.launch(x, records, exponents, n, escapes, esc_offsets, esc_cols)


@w12_gemm.register_fake
def _(x, records, exponents, escapes, esc_offsets, esc_cols, n):
    return x.new_empty((x.shape[0], n), dtype=torch.bfloat16)


def _round4(words: int) -> int:
    return (words + 3) // 4 * 4


def table_layout(nb: int, kb: int, nnz: int, cols_words: int) -> tuple:
    """Word offsets (int32) of the parts of a packed table: exponents (NB·128 bytes), escapes (nnz int16
    pairs), esc_offsets (NB·KB + 1), esc_cols (to the end); each part starts on a 16-byte boundary (the CUDA
    kernels' alignment)."""
    a_esc = nb * 32
    a_offs = a_esc + _round4(nnz)
    a_cols = a_offs + _round4(nb * kb + 1)
    return a_esc, a_offs, a_cols, a_cols + cols_words


def pack_tables(exponents: torch.Tensor, escapes: torch.Tensor, esc_offsets: torch.Tensor,
                esc_cols: torch.Tensor) -> torch.Tensor:
    """One int32 tensor [exponents | escapes | esc_offsets | esc_cols] (see table_layout), on their device."""
    nb, nnz = exponents.numel() // 128, escapes.shape[0]
    if nb == 0 or exponents.numel() % 128 or (esc_offsets.numel() - 1) % nb:
        raise ValueError(f"pack_tables: {exponents.numel()} exponents and {esc_offsets.numel()} escape offsets, "
                         "expected NB·128 and NB·KB + 1 (the padded matrix's record grid)")
    kb = (esc_offsets.numel() - 1) // nb
    a_esc, a_offs, a_cols, end = table_layout(nb, kb, nnz, esc_cols.numel())
    t = torch.zeros(end, dtype=torch.int32, device=exponents.device)
    t[:a_esc] = exponents.contiguous().view(torch.int32)
    t[a_esc:a_esc + nnz] = escapes.reshape(-1).contiguous().view(torch.int32)
    t[a_offs:a_offs + esc_offsets.numel()] = esc_offsets
    t[a_cols:] = esc_cols
    return t


def unpack_tables(tables: torch.Tensor, nb: int, kb: int, nnz: int):
    """Views (exponents u8 [NB·128], escapes i16 [nnz, 2], esc_offsets i32, esc_cols i32) of a packed table."""
    a_esc, a_offs, a_cols, _ = table_layout(nb, kb, nnz, 0)
    return (tables[:a_esc].view(torch.uint8), tables[a_esc:a_esc + nnz].view(torch.int16).view(nnz, 2),
            tables[a_offs:a_offs + nb * kb + 1], tables[a_cols:])


def pack_matrix(records: torch.Tensor, exponents: torch.Tensor, escapes: torch.Tensor, esc_offsets: torch.Tensor,
                esc_cols: torch.Tensor) -> torch.Tensor:
    """One int32 tensor [records (NB·KB·12288 bytes) | pack_tables(...)] on the records' device: everything
    the GEMM reads, in one allocation. A record is 12288 bytes, so the table parts keep their 16-byte
    alignment."""
    tables = pack_tables(exponents, escapes, esc_offsets, esc_cols)
    words = records.numel() // 4
    out = torch.empty(words + tables.numel(), dtype=torch.int32, device=records.device)
    out[:words].view(torch.uint8).copy_(records.reshape(-1))  # byte copy: any storage offset of `records`
    out[words:] = tables
    return out


def packed_records(packed: torch.Tensor, nb: int, kb: int) -> torch.Tensor:
    """The records part of a `pack_matrix` tensor, as u8 [NB, KB, 12288] (a view)."""
    return packed[:nb * kb * REC_BYTES // 4].view(torch.uint8).view(nb, kb, REC_BYTES)


def unpack_matrix(packed: torch.Tensor, nb: int, kb: int, nnz: int):
    """Views (records, exponents, escapes, esc_offsets, esc_cols) of a `pack_matrix` tensor."""
    return (packed_records(packed, nb, kb), *unpack_tables(packed[nb * kb * REC_BYTES // 4:], nb, kb, nnz))


@torch.library.custom_op("w12::gemm_packed", mutates_args=())
def w12_gemm_packed(x: torch.Tensor, packed: torch.Tensor, n: int, nnz: int) -> torch.Tensor:
    """`w12::gemm` of the matrix packed in `packed` (pack_matrix); its record grid is tiles(n, K)."""
    nb, kb = tiles(n, x.shape[1])
    return _gemm(x, *unpack_matrix(packed, nb, kb, nnz), n)


@w12_gemm_packed.register_fake
def _(x, packed, n, nnz):
    return x.new_empty((x.shape[0], n), dtype=torch.bfloat16)


@torch.library.custom_op("w12::view_gemm", mutates_args=())
def w12_view_gemm(x: torch.Tensor, records: torch.Tensor, exponents: torch.Tensor, n: int) -> torch.Tensor:
    """Y = X · W_qᵀ with the 8-bit view (lo = 8; escapes ignored, they keep their code value)."""
    if x.is_cuda:
        return on_input_gpu(_view_gemm_cuda, x, records, exponents, n)
    nb, kb = records.shape[:2]
    counts = torch.zeros(nb, kb, dtype=torch.int32)
    escapes = torch.zeros(0, 2, dtype=torch.int16)
    return _ref.gemm(x, records, exponents, counts, escapes, n, view=True)


def _view_gemm_cuda(x, records, exponents, n):
    m, k = x.shape
    cuda = m <= LARGE_M and _gc.usable(x, records, exponents, n)
    if m > LARGE_M or (cuda and _gc.prefers_decode(m, n, k, view=True)):  # small matrices from 49 rows (H200)
        return F.linear(x, _dec.decode(records, exponents, None, None, n, k, view=True))
    if cuda:
        return _gc.launch(x, records, exponents, n, view=True)
    return _g.launch(x, records, exponents, n, view=True)


@w12_view_gemm.register_fake
def _(x, records, exponents, n):
    return x.new_empty((x.shape[0], n), dtype=torch.bfloat16)


def matmul(x: torch.Tensor, records, exponents, escapes, esc_offsets, esc_cols, n: int, view: bool = False):
    """x [..., K] -> [..., n] through the ops above."""
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if view:
        y = torch.ops.w12.view_gemm(x2, records, exponents, n)
    else:
        y = torch.ops.w12.gemm(x2, records, exponents, escapes, esc_offsets, esc_cols, n)
    return y.reshape(*x.shape[:-1], n)
