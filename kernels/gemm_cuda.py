"""Host side of the CUDA skinny W12 GEMM (kernels/w12_gemv.cu): checks, config choice, launch.

    if gemm_cuda.usable(x, records):
        y = gemm_cuda.launch(x, records, exponents, n, escapes, esc_offsets, esc_cols)   # bf16 [M, n]

Same contract and same tensors as kernels/gemm.py's Triton launcher (records u8 [NB, KB, 12288],
exponents u8 [N_PAD], escapes i16 [nnz, 2], esc_offsets/esc_cols from `gemm.prepare_escapes`).  The CUDA
kernel covers Hopper, M ≤ MAX_M, K a multiple of 64 and 16-byte-aligned X rows; everything else runs
the Triton kernel.  Deterministic: warp partials are added in a fixed order, no atomics.
"""

from dataclasses import dataclass

import torch

from . import cuda_build

MAX_M = 64


@dataclass(frozen=True)
class CudaConfig:
    nt: int  # X rows per CTA / 8: 1, 2, 4 or 8
    warps: int  # 4 or 8 warps per CTA (each takes every `warps`-th record of the CTA's 16 channels)
    unroll: int  # records per pipeline stage per warp, 1, 2 or 4 (two stages in flight)


def _nt_for(m: int) -> int:
    for nt in (1, 2, 4):
        if m <= 8 * nt:
            return nt
    return 8


# (N, K, M bucket, view) -> CudaConfig, from `python bench/kernels.py --cuda-sweep` on the H200.
TABLE: dict = {}


def pick_config(m: int, n: int, k: int, view: bool = False) -> CudaConfig:
    nt = _nt_for(m)
    hit = TABLE.get((n, k, 8 * nt, view))
    return hit if hit is not None else CudaConfig(nt, 8, 2)


def library():
    return cuda_build.load("w12_gemv")


def usable(x: torch.Tensor, records: torch.Tensor) -> bool:
    """True when the CUDA kernel can take this call (else use the Triton kernel)."""
    m, k = x.shape
    return (x.is_cuda and m <= MAX_M and k % 64 == 0 and x.stride(1) == 1 and x.stride(0) % 8 == 0
            and x.data_ptr() % 16 == 0 and records.is_contiguous() and records.data_ptr() % 16 == 0
            and library() is not None)


def launch(x, records, exponents, n, escapes=None, esc_offsets=None, esc_cols=None, *, view=False,
           config: CudaConfig | None = None):
    """Y = X · Wᵀ (view=True: the 8-bit view, escapes ignored). x bf16 [M, K]; returns bf16 [M, n]."""
    m, k = x.shape
    nb, kb = records.shape[:2]
    assert records.dtype == torch.uint8 and records.shape[2] == 12288 and kb * 64 == k, "records vs K"
    assert nb * 128 >= n and exponents.numel() >= nb * 128, "records/exponents vs N"
    if view:
        escapes = esc_offsets = esc_cols = exponents  # unused by the view kernel
    elif escapes.numel() == 0:
        escapes = torch.zeros(1, 2, dtype=torch.int16, device=x.device)
    cfg = config or pick_config(m, n, k, view)
    y = torch.empty(m, n, dtype=torch.bfloat16, device=x.device)
    stream = torch.cuda.current_stream(x.device).cuda_stream
    err = library().w12_gemv(
        _p(x), m, x.stride(0), _p(records), _p(exponents), _p(escapes), _p(esc_offsets), _p(esc_cols),
        _p(y), y.stride(0), n, nb, kb, int(view), cfg.nt, cfg.warps, cfg.unroll, _vp(stream))
    if err != 0:
        raise RuntimeError(f"w12_gemv launch failed: cudaError {err} (config {cfg}, M={m}, N={n}, K={k})")
    return y


def _p(t: torch.Tensor):
    return _vp(t.data_ptr())


def _vp(v: int):
    import ctypes

    return ctypes.c_void_p(v)
