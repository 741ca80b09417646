"""Escapes through the CUDA skinny kernel at M ≤ 8, checked by bits. One GPU call (~20 s).

    W12_CUDA=1 python bench/escape_check.py

A 300 × 1024 matrix (a partial record row, 16 records) where 1 weight in 37 is 100.0 and 1 in 997 is -1e-30 (both
out of their row's window: ~440 escapes per 16-channel tile, more than one chunk of THREADS entries), for every
skinny config of gemm_cuda.TABLE and pick_config at M ≤ 8, W12:
1. identity product (X = consecutive rows of the identity, so Y[m, n] = W[n, i + m]) at M = 1, 3 and 8: every
   in-window weight bit-exact, every escape within bf16 rounding of its value;
2. random X against the fp32 product with the decoded weights (relative ∞-norm error < 1e-2; the escapes carry
   most of each output, so a wrong X word under an escape shows), and the same bits over 3 runs.
Prints one line per config and ALL OK, or raises.
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernels import make_weight, mat_of, rel  # noqa: E402  (bench/kernels.py)

from w12.kernels import gemm_cuda as gc  # noqa: E402


def main():
    n, k = 300, 1024
    w = make_weight(n, k, 3)
    w.view(-1)[::37] = torch.tensor(100.0, dtype=torch.bfloat16)
    w.view(-1)[5::997] = torch.tensor(-1e-30, dtype=torch.bfloat16)
    mt, esc = mat_of(w)
    cfgs = {gc.pick_config(m, n, k) for m in (1, 3, 8)} | {c for key, c in gc.TABLE.items() if key[2] == 8}
    print(f"{int(esc.sum())} escapes ({int(esc[:16].sum())} in the first 16-channel tile)")
    for cfg in sorted(cfgs, key=repr):
        for m in (1, 3, 8):
            y = mt.seen(m, cuda=cfg)
            assert torch.equal(y.view(torch.int16)[~esc], w.view(torch.int16)[~esc]), f"{cfg} M={m}: decode"
            assert torch.allclose(y[esc].float(), w[esc].float(), rtol=2**-8, atol=1e-30), f"{cfg} M={m}: escapes"
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            yr = mt.run(x, cuda=cfg)
            err = rel(yr, x.float() @ w.float().t())
            assert err < 1e-2 and all(torch.equal(mt.run(x, cuda=cfg), yr) for _ in range(3)), f"{cfg} M={m}: {err}"
        print(f"{cfg}: identity product exact at M = 1, 3, 8; random X within {err:.1e}, deterministic")
    print("ALL OK")


if __name__ == "__main__":
    main()
