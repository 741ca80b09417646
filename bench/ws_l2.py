"""The ws kernel's record copies with L2 priority evict_first (l2 = 0) or evict_normal (l2 = 100). One GPU call.

    W12_CUDA=1 python bench/ws_l2.py [--out OUT]

bench/dirty_l2.py found that after do_bench's zeroing flush (an L2 full of dirty lines) the skinny kernel's large
calls stream faster with evict_normal weight lines; the ws kernel's M = 128 LM head pays +33 µs for the dirty lines
where cuBLAS pays +10 (2026-12-03-kernels-cuda-h200-s18-call10.md). For every WS_TABLE entry (shape, M bucket;
timed at M = the bucket), W12: the entry's config with WsConfig.l2 = 0 and 100, bits equal, then 3 interleaved
rounds (CUDA graph replay, do_bench, median). Prints and writes OUT/ws_l2.md and OUT/ws_l2_table.py (the entries
where l2 = 100 is ≥ 1.5 % faster).
"""

import argparse
import dataclasses
import datetime
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernels import SHAPES, Mat, bench  # noqa: E402
from m1_configs import timed  # noqa: E402

from w12.kernels import gemm_cuda as gc  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    rows, adopt = [], []
    for si, (n, k) in enumerate(SHAPES):
        keys = [key for key in gc.WS_TABLE if key[:2] == (n, k)]
        if not keys:
            continue
        mt = Mat(n, k, 300 + si)
        for key in keys:
            m = key[2]
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            t_cb = bench(lambda: torch.matmul(x, mt.w.t()))
            cfgs = [dataclasses.replace(gc.WS_TABLE[key], l2=l2) for l2 in (0, 100)]
            ys = [mt.run(x, cuda=c) for c in cfgs]
            assert torch.equal(ys[0].view(torch.int16), ys[1].view(torch.int16)), f"{key}: bits differ across l2"
            t = timed({c: (lambda c=c: mt.run(x, cuda=c)) for c in cfgs}, 3)
            t0, t1 = t[cfgs[0]], t[cfgs[1]]
            if t1 < t0 / 1.015:
                adopt.append((key, cfgs[1]))
            row = f"| {n}×{k} | {m} | nt {cfgs[0].nt} split {cfgs[0].split} | {t_cb:.1f} | {t0:.1f} | {t1:.1f} | {t0 / t1:.3f} |"
            print(row, flush=True)
            rows.append(row)
        del mt
        torch.cuda.empty_cache()
    text = "\n".join([
        f"# ws kernel: record copies evict_first vs evict_normal — {datetime.date.today()}", "",
        f"- GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}; commit {os.environ.get('W12_REV', '?')}",
        "- command: `W12_CUDA=1 python bench/ws_l2.py --out $OUT`",
        "- bits equal for l2 0 and 100 on every entry; µs: CUDA graph replay, do_bench (zeroing flush), median of 3 "
        "interleaved rounds", "",
        "| N×K | M | WS_TABLE config | cuBLAS µs | l2 0 µs | l2 100 µs | speed-up |", "|---|---|---|---|---|---|---|",
        *rows]) + "\n"
    table = "".join(f"    {key}: WsConfig(nt={c.nt}, split={c.split}, l2={c.l2}),\n" for key, c in adopt)
    with open(os.path.join(a.out, "ws_l2.md"), "w") as fh:
        fh.write(text)
    with open(os.path.join(a.out, "ws_l2_table.py"), "w") as fh:
        fh.write(table)
    print(text)
    print(table)


if __name__ == "__main__":
    main()
