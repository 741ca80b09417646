"""CPU fallback of the W12 GEMM ops: the reference decoder (formats.reference) + an fp32 matmul.

    y = (x.float() @ decode(W).float().T).to(bfloat16)

Used by the custom ops for tensors that are not on a CUDA device, and by the tests and the bench as the
ground truth of the fused kernels. Slow and obviously correct.
"""

import torch

from ..formats import reference as fmt


def counts_from_offsets(esc_offsets: torch.Tensor, nb: int, kb: int) -> torch.Tensor:
    """Per-record escape counts back from the exclusive prefix sums of `prepare_escapes`."""
    return (esc_offsets[1:] - esc_offsets[:-1]).to(torch.int32).view(nb, kb)


def decode_weight(records, exponents, counts, escapes, n: int, k: int, view: bool = False) -> torch.Tensor:
    """W as bf16 [N, K] (view=True: the 8-bit view, lo = 8, escapes keep their code value)."""
    dev = records.device
    args = [t.cpu() for t in (records, exponents, counts, escapes)]
    bits = fmt.decode(*args, n, k, lo_fill=8 if view else None)
    return bits.view(torch.bfloat16).to(dev)


def gemm(x: torch.Tensor, records, exponents, counts, escapes, n: int, view: bool = False) -> torch.Tensor:
    """Y[M, N] = X[M, K] · Wᵀ in fp32, rounded once to bf16."""
    k = x.shape[-1]
    w = decode_weight(records, exponents, counts, escapes, n, k, view=view)
    return (x.float() @ w.float().t()).to(torch.bfloat16)
