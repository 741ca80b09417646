"""W12 -> BF16 on the GPU in one Triton kernel: the exact weight (or the 8-bit view) as a dense bf16 [N, K].

What it is for: calls with many rows of X (prefill, M > LARGE_M; and small matrices from 33 rows, see
gemm_cuda.prefers_decode), where the GEMM is bound by the tensor cores
rather than by reading weights. There the fused kernels lose (their decode sits in every record's chain), and
decoding once then calling cuBLAS is faster: `F.linear(x, decode(W))` is the very call a BF16 layer makes on the
same bits, so its output is bit-identical to that layer's (`ops._gemm`).

One program = RB rows r0 ≤ r < r0 + RB of one record (nb, kb): weights (nb·128 + r, kb·64 + c), c < 64 (SPEC.md §5):
    b  = record[r·64 + c]                                     view byte
    lo = record[8192 + r·32 + c % 32] >> (4 · (c ≥ 32)) & 15  low nibble
    h  = (b >> 7) << 15 | (E_n − 15 + (b >> 3 & 15)) << 7 | (b & 7) << 4 | lo      (SPEC.md §4)
  stored to out[nb·128 + r, kb·64 + c] where inside [N, K]; then, after a CTA barrier (so that the later store
  wins), the record's escape entries (p, h) in those rows overwrite out[nb·128 + p // 64, kb·64 + p % 64] (SPEC.md §6).
8-bit view (VIEW): lo = 8 and no escape pass (escapes keep their code value, SPEC.md §4).
Integer ops only, so the Triton interpreter runs it exactly on the CPU (the tests do).
"""

import torch
import triton
import triton.language as tl

from w12.formats.layout import REC_BYTES, TK, TN

EB = 64  # escape entries per step of the patch loop
RB, WARPS = 128, 8  # rows of a record per program, warps per program: the fastest of 16 on all 10 shapes
# (3.9 TB/s on the LM heads; 2026-12-03-decode-sweep-h200-s25.md)


@triton.jit
def _decode_kernel(rec_ptr, exp_ptr, esc_ptr, esc_off_ptr, out_ptr, N, K, KB,
                   VIEW: tl.constexpr, PATCH: tl.constexpr, RB: tl.constexpr, TN: tl.constexpr, TK: tl.constexpr,
                   REC: tl.constexpr, EB: tl.constexpr):
    pid = tl.program_id(0)
    rid = pid // (TN // RB)  # the record
    r0 = (pid % (TN // RB)) * RB  # its first row in this program
    nb = rid // KB
    kb = rid % KB
    r = r0 + tl.arange(0, RB)[:, None]
    c = tl.arange(0, TK)[None, :]
    base = rec_ptr + rid.to(tl.int64) * REC
    b = tl.load(base + r * TK + c).to(tl.int32)
    if VIEW:
        lo = 8
    else:
        nib = tl.load(base + TN * TK + r * (TK // 2) + (c % (TK // 2))).to(tl.int32)
        lo = (nib >> (4 * (c >= TK // 2).to(tl.int32))) & 0xF
    top = tl.load(exp_ptr + nb * TN + r).to(tl.int32)
    h = ((b >> 7) << 15) | ((top - 15 + ((b >> 3) & 0xF)) << 7) | ((b & 7) << 4) | lo
    row = nb * TN + r
    col = kb * TK + c
    out = out_ptr + row.to(tl.int64) * K + col
    tl.store(out, h.to(tl.int16), mask=(row < N) & (col < K))
    if PATCH:
        tl.debug_barrier()  # the dense stores of this program before its escape stores to the same addresses
        lo_e = tl.load(esc_off_ptr + rid)
        hi_e = tl.load(esc_off_ptr + rid + 1)
        for start in range(lo_e, hi_e, EB):
            i = start + tl.arange(0, EB)
            p = tl.load(esc_ptr + 2 * i.to(tl.int64), mask=i < hi_e, other=0).to(tl.int32)
            v = tl.load(esc_ptr + 2 * i.to(tl.int64) + 1, mask=i < hi_e, other=0)
            ok = (i < hi_e) & (p // TK >= r0) & (p // TK < r0 + RB)  # the record's entries in this program's rows
            dst = out_ptr + (nb * TN + p // TK).to(tl.int64) * K + kb * TK + p % TK
            tl.store(dst, v, mask=ok)


def decode(records: torch.Tensor, exponents: torch.Tensor, escapes: torch.Tensor | None,
           esc_offsets: torch.Tensor | None, n: int, k: int, view: bool = False, rows: int = RB,
           warps: int = WARPS) -> torch.Tensor:
    """records u8 [NB, KB, 12288], exponents u8 [≥ NB·128], escapes i16 [nnz, 2] with esc_offsets i32 [NB·KB + 1]
    (`gemm.prepare_escapes`; unused with view=True) -> bf16 [n, k]: W exactly (view=True: the 8-bit view)."""
    nb, kb = records.shape[:2]
    assert records.dtype == torch.uint8 and records.shape[2] == REC_BYTES and records.is_contiguous(), "records"
    assert nb == triton.cdiv(n, TN) and kb == triton.cdiv(k, TK), f"records {tuple(records.shape)} vs N={n}, K={k}"
    if not view and (escapes is None or esc_offsets is None):
        raise ValueError("decode: the exact weight needs escapes and esc_offsets (view=True ignores them)")
    patch = not view and escapes.numel() > 0
    esc, esc_off = (escapes.contiguous(), esc_offsets) if patch else (exponents, exponents)  # else unused
    out = torch.empty(n, k, dtype=torch.int16, device=records.device)
    _decode_kernel[(nb * kb * (TN // rows),)](records, exponents, esc, esc_off, out, n, k, kb, VIEW=view,
                                              PATCH=patch, RB=rows, TN=TN, TK=TK, REC=REC_BYTES, EB=EB,
                                              num_warps=warps)
    return out.view(torch.bfloat16)
