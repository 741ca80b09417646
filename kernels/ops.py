"""torch custom ops around the fused kernels, so torch.compile and CUDA graphs can capture them.

    torch.ops.w12.gemm(x, records, exponents, escapes, esc_offsets, esc_cols, n)   -> bf16 [M, n]
    torch.ops.w12.view_gemm(x, records, exponents, n)                            -> bf16 [M, n]

x is bf16 [M, K] (2-D; `matmul` below flattens leading dims). CUDA calls on a Hopper GPU run a CUDA kernel of
kernels/w12_gemv.cu where gemm_cuda.kernel_for names one (the skinny, mma.sync or wgmma tensor-core GEMM; up
to M = 128), other CUDA calls the Triton kernels, each
with a config picked from a table by shape (no autotuning, no host sync); other devices run the
reference decoder + an fp32 matmul (kernels/reference.py). `esc_offsets`, `esc_cols` come from
`gemm.prepare_escapes(counts, escapes)`, computed once when the matrix is loaded.
"""

import torch

from . import gemm as _g
from . import gemm_cuda as _gc
from . import reference as _ref


@torch.library.custom_op("w12::gemm", mutates_args=())
def w12_gemm(x: torch.Tensor, records: torch.Tensor, exponents: torch.Tensor, escapes: torch.Tensor,
             esc_offsets: torch.Tensor, esc_cols: torch.Tensor, n: int) -> torch.Tensor:
    """Y = X · Wᵀ with the exact W (escapes added as an exact sparse correction)."""
    if x.is_cuda:
        if _gc.usable(x, records, exponents, n):
            return _gc.launch(x, records, exponents, n, escapes, esc_offsets, esc_cols)
        return _g.launch(x, records, exponents, n, escapes, esc_offsets, esc_cols)
    counts = _ref.counts_from_offsets(esc_offsets, *records.shape[:2])
    return _ref.gemm(x, records, exponents, counts, escapes, n)


@w12_gemm.register_fake
def _(x, records, exponents, escapes, esc_offsets, esc_cols, n):
    return x.new_empty((x.shape[0], n), dtype=torch.bfloat16)


@torch.library.custom_op("w12::view_gemm", mutates_args=())
def w12_view_gemm(x: torch.Tensor, records: torch.Tensor, exponents: torch.Tensor, n: int) -> torch.Tensor:
    """Y = X · W_qᵀ with the 8-bit view (lo = 8; escapes ignored, they keep their code value)."""
    if x.is_cuda:
        if _gc.usable(x, records, exponents, n):
            return _gc.launch(x, records, exponents, n, view=True)
        return _g.launch(x, records, exponents, n, view=True)
    nb, kb = records.shape[:2]
    counts = torch.zeros(nb, kb, dtype=torch.int32)
    escapes = torch.zeros(0, 2, dtype=torch.int16)
    return _ref.gemm(x, records, exponents, counts, escapes, n, view=True)


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
