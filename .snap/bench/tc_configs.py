"""The wgmma tensor-core W12 kernel's split-K choices against cuBLAS BF16, every shape, M = 32 / 64 / 128. One GPU call.

    W12_CUDA=1 python bench/tc_configs.py [--ms 32,64,128] [--nt NT] [--out DIR]

For each (shape, M): every TcConfig(nt, split) with split in 1, 2, 4, 8 (split ≤ K/64), checked against the
reference (decoded weights, fp32 matmul: relative ∞-norm error < 1e-2) and for determinism (the same bits over 3
runs; different splits group the partial sums differently, so they need not agree with each other), then timed as
bench/kernels.py times (CUDA graph replay, do_bench, L2 flushed, median). Prints and writes OUT/tc_configs.md: µs per split, the best, and what
gemm_cuda.pick_tc_config picks today.  --nt: X rows per CTA / 8 forced (e.g. --nt 8 at M = 128: two M tiles per
channel block instead of one CTA of nt = 16), instead of pick_tc_config's nt.
"""

import argparse
import datetime
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernels import bench, rel, sweep_cases  # noqa: E402  (bench/kernels.py)

from w12.kernels import gemm_cuda as gc  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ms", default="32,64,128")
    ap.add_argument("--nt", type=int, default=None, help="force this nt (2, 4, 8, 16) instead of pick_tc_config's")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    ms = [int(v) for v in args.ms.split(",")]
    lines = []
    for n, k, m, mt, x, ref, t_cublas in sweep_cases(ms):
        picked = gc.pick_tc_config(m, n, k)
        res = {}
        for split in (1, 2, 4, 8):
            if split > k // 64:
                continue
            cfg = gc.TcConfig(args.nt or picked.nt, split)
            y = mt.run(x, cuda=cfg)
            err = rel(y, ref)
            assert err < 1e-2, f"{n}x{k} M={m} {cfg}: relative error {err:.2e}"
            assert all(torch.equal(mt.run(x, cuda=cfg), y) for _ in range(3)), f"{cfg} not deterministic"
            res[split] = bench(lambda cfg=cfg: mt.run(x, cuda=cfg))
        best = min(res, key=res.get)
        nt = args.nt or picked.nt
        now = (f"{picked.split} ({t_cublas / res[picked.split]:.2f}×)" if nt == picked.nt
               else f"nt {picked.nt}, split {picked.split}")
        row = (f"| {n}×{k} | {m} | {nt} | {t_cublas:.1f} | "
               + " | ".join(f"{res.get(s, float('nan')):.1f}" for s in (1, 2, 4, 8))
               + f" | {best} ({t_cublas / res[best]:.2f}×) | {now} |")
        print(row, flush=True)
        lines.append(row)
    text = "\n".join([
        f"# wgmma W12 kernel: split-K per shape and M — {datetime.date.today()}", "",
        f"- GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}; commit {os.environ.get('W12_REV', '?')}",
        f"- command: `W12_CUDA=1 python bench/tc_configs.py --ms {args.ms}{f' --nt {args.nt}' if args.nt else ''} --out $OUT`",
        "- µs: CUDA graph replay, do_bench median, L2 flushed; every config checked against the reference first", "",
        "| N×K | M | nt | cuBLAS µs | split 1 | split 2 | split 4 | split 8 | best (vs cuBLAS) | picked today (vs cuBLAS) |",
        "|---|---|---|---|---|---|---|---|---|---|", *lines]) + "\n"
    with open(os.path.join(args.out, f"tc_configs{f'-nt{args.nt}' if args.nt else ''}.md"), "w") as fh:
        fh.write(text)


if __name__ == "__main__":
    main()
