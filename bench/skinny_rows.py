"""What a skinny-kernel build costs apart from its rows: each config timed at 1, 16 and 32 rows. One GPU call.

    W12_CUDA=1 python bench/skinny_rows.py [--shapes 4096x4096,…] [--configs 4/4/1/1x,4/4/2/1] [--out DIR]

At 32 rows the skinny kernel's nt = 4 builds are 11–42 % slower than the 1-row kernel on the one-wave shapes, while
nt = 2 at 16 rows is as fast as one row (kernels/w12_gemv_tried.md, "What bounds M = 17–32"). A build at nt = 4 runs
any M ≤ 32 as one 32-row tile (rows past M load row 0's X and their outputs are dropped), so its loop does the same
work at 1, 16 and 32 rows. Timed side by side:
- nt = 4 at 1 / 16 / 32 rows alike → the build's own cost (its loop, registers, epilogue), not the rows';
- nt = 4 faster at 1 / 16 rows → what the extra rows bring (X lines, the epilogue's outputs and escape X).
Each config runs with the matrix's escapes and without (empty lists: wrong results, timing only). Every timing as
bench/kernels.py times (CUDA graph replay, do_bench, L2 flushed, median); results are checked against the reference
first (relative ∞-norm error < 1e-2) except the no-escape runs.  Prints and writes OUT/skinny_rows.md.
"""

import argparse
import datetime
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from revision import commit  # noqa: E402  (bench/revision.py)
from kernels import Mat, bench, rel  # noqa: E402  (bench/kernels.py)
from profile_kernels import parse_configs  # noqa: E402  (bench/profile_kernels.py: "nt/warps/unroll/split[x]")
from skinny_configs import cfg_str  # noqa: E402  (bench/skinny_configs.py)

from w12.kernels import gemm_cuda as gc  # noqa: E402

SHAPES = "4096x4096,6144x4096,10240x5120,5120x8192,4096x14336"
MS = (1, 16, 32)
CONFIGS = "1/8/1/1,2/4/1/1,2/8/1/1,4/4/1/1,4/8/1/1,4/4/1/1x"  # nt/warps/unroll/split, x: xreg


def timed(mt, x, c, esc):
    """µs of config c on x with the matrix's escapes (esc: checked first) or with empty lists."""
    e = (mt.escapes, mt.offs, mt.cols) if esc else mt.no_escapes()
    fn = lambda: gc.launch(x, mt.records, mt.exps, mt.n, *e, config=c)  # noqa: E731
    if esc:
        err = rel(fn(), x.float() @ mt.w.float().t())
        if err >= 1e-2:
            return f"err {err:.0e}"
    return bench(fn)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--configs", default=CONFIGS, help=f"nt/warps/unroll/split[x],… (x: xreg; default {CONFIGS})")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    head = ("| N×K | config | " + " | ".join(f"M={m} µs" for m in MS) + " | "
            + " | ".join(f"M={m} no esc." for m in MS) + " |")
    rows = [head, "|" + "---|" * (2 + 2 * len(MS))]
    for si, s in enumerate(a.shapes.split(",")):
        n, k = (int(v) for v in s.split("x"))
        mt = Mat(n, k, 100 + si)
        xs = {m: torch.randn(m, k, device="cuda").to(torch.bfloat16) for m in MS}
        cb = [bench(lambda: torch.matmul(xs[m], mt.w.t())) for m in MS]
        rows.append(f"| {n}×{k} | cuBLAS | " + " | ".join(f"{t:.1f}" for t in cb) + " |" + " |" * len(MS))
        for c in parse_configs(a.configs):
            cells = []
            for esc in (True, False):
                for m in MS:
                    t = "-" if c.nt == 1 and m > 8 else timed(mt, xs[m], c, esc)
                    cells.append(t if isinstance(t, str) else f"{t:.1f}")
            rows.append(f"| {n}×{k} | {cfg_str(c).removeprefix('skinny ')} | " + " | ".join(cells) + " |")
            print(rows[-1], flush=True)
        del mt
        torch.cuda.empty_cache()
    text = (f"# skinny kernel builds at 1, 16 and 32 rows (bench/skinny_rows.py) — {datetime.date.today()}\n\n"
            f"- GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}; commit {commit()}\n"
            f"- command: `W12_CUDA=1 python bench/skinny_rows.py --shapes {a.shapes}"
            + (f" --configs {a.configs}" if a.configs != CONFIGS else "") + "`\n"
            "- µs: CUDA graph replay, do_bench, L2 flushed, median; config nt/warps/unroll/split; an nt = 4 build runs any "
            "M ≤ 32 as one 32-row tile\n\n" + "\n".join(rows) + "\n")
    with open(os.path.join(a.out, "skinny_rows.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
