"""Escapes through the CUDA skinny kernel at M ≤ 8, checked by bits. One GPU call (~30 s).

    W12_CUDA=1 python bench/escape_check.py

Two 300 × 1024 matrices (a partial record row, 16 records) with weights out of their row's window: "dense", where
1 weight in 37 is 100.0 and 1 in 997 is -1e-30 (~440 escapes per 16-channel tile, more than one chunk of THREADS
entries: the CTA-wide epilogue), and "sparse", only the -1e-30 ones (~16 per tile: at M ≤ 2 the one-warp epilogue,
warp0_finish).  For every skinny config of gemm_cuda.TABLE and pick_config at M ≤ 8, W12:
1. identity product (X = consecutive rows of the identity, so Y[m, n] = W[n, i + m]) at M = 1, 2, 3 and 8: every
   in-window weight bit-exact, every escape within bf16 rounding of its value;
2. random X against the fp32 product with the decoded weights (relative ∞-norm error < 1e-2; the escapes carry
   most of each output, so a wrong X word under an escape shows), and the same bits over 3 runs;
3. the first rows of an M = 8 product are the same bits as the M = 1 and M = 2 products of those rows (an MMA
   output does not depend on the other rows: this compares the one-warp epilogue with the CTA-wide one).
Prints one line per matrix and config and ALL OK, or raises.
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernels import make_weight, mat_of, rel  # noqa: E402  (bench/kernels.py)

from w12.kernels import gemm_cuda as gc  # noqa: E402


def escape_matrix(n, k, dense):
    w = make_weight(n, k, 3)
    if dense:
        w.view(-1)[::37] = torch.tensor(100.0, dtype=torch.bfloat16)
    w.view(-1)[5::997] = torch.tensor(-1e-30, dtype=torch.bfloat16)
    return w


def main():
    n, k = 300, 1024
    cfgs = {gc.pick_config(m, n, k) for m in (1, 3, 8)} | {c for key, c in gc.TABLE.items() if key[2] == 8}
    for name, dense in (("dense", True), ("sparse", False)):
        w = escape_matrix(n, k, dense)
        mt, esc = mat_of(w)
        print(f"{name}: {int(esc.sum())} escapes ({int(esc[:16].sum())} in the first 16-channel tile)")
        for cfg in sorted(cfgs, key=repr):
            for m in (1, 2, 3, 8):
                y = mt.seen(m, cuda=cfg)
                assert torch.equal(y.view(torch.int16)[~esc], w.view(torch.int16)[~esc]), f"{name} {cfg} M={m}: decode"
                assert torch.allclose(y[esc].float(), w[esc].float(), rtol=2**-8, atol=1e-30), f"{name} {cfg} M={m}: escapes"
                x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
                yr = mt.run(x, cuda=cfg)
                err = rel(yr, x.float() @ w.float().t())
                assert err < 1e-2 and all(torch.equal(mt.run(x, cuda=cfg), yr) for _ in range(3)), f"{name} {cfg} M={m}: {err}"
            x8 = torch.randn(8, k, device="cuda").to(torch.bfloat16)
            y8 = mt.run(x8, cuda=cfg)
            for m in (1, 2):
                assert torch.equal(mt.run(x8[:m], cuda=cfg).view(torch.int16), y8[:m].view(torch.int16)), \
                    f"{name} {cfg}: M = {m} rows differ from the M = 8 product's"
            print(f"{name} {cfg}: identity product exact at M = 1, 2, 3, 8; random X within {err:.1e}, deterministic; "
                  "M = 1, 2 rows = M = 8 rows by bits")
    print("ALL OK")


if __name__ == "__main__":
    main()
