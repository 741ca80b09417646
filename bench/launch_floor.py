"""What a single GEMM call costs beyond its bytes: W12 (CUDA kernel) and cuBLAS BF16 at M = 1, three ways.

    W12_CUDA=1 PYTHONUNBUFFERED=1 python bench/launch_floor.py [--out DIR]

- graph:  the call captured alone in a CUDA graph, replays timed by triton.testing.do_bench (bench/kernels.py's
          method: events around each replay, L2 zeroed before each, median).
- direct: the call itself timed by do_bench (what do_bench does with a plain function). Valid while the host
          time of one call (printed) stays below the ~60 µs the L2 flush keeps the GPU busy.
- chain:  R calls back to back in ONE graph over C copies of the weights (C · bytes > 2 × L2, so every call
          reads cold weights), per-call µs = replay / R: the figure a decode step's graph sees.
Each W12 output is checked against cuBLAS's (decoded weights are the same bits) before anything is timed.
A 128×64 matrix gives the floor of each method (launch + ramp, no bytes to speak of).
"""

import argparse
import datetime
import os
import sys
import time

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from revision import commit  # noqa: E402  (bench/revision.py)
from kernels import Mat, bench, rel, spin  # noqa: E402  (bench/kernels.py)

from w12.kernels import gemm_cuda as gc  # noqa: E402

SHAPES = [(128, 64), (4096, 4096), (6144, 4096), (28672, 4096), (4096, 14336), (128256, 4096)]
L2_BYTES = 60 << 20


def host_us(fn, n=200):
    """Host µs per call with the GPU kept busy (so no call waits for the device)."""
    spin(20)
    t = time.perf_counter()
    for _ in range(n):
        fn()
    dt = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return dt


def chain_us(fns, reps):
    """Per-call µs of `reps` calls (cycling over fns) captured back to back in one graph."""
    for f in fns:
        f()
    torch.cuda.synchronize()
    gr = torch.cuda.CUDAGraph()
    with torch.cuda.graph(gr):
        for i in range(reps):
            fns[i % len(fns)]()
    return triton.testing.do_bench(gr.replay, warmup=10, rep=60, return_mode="median") * 1e3 / reps


def copies_of(mt, count):
    """`count` Mats sharing mt's values but not its memory (the first is mt itself)."""
    out = [mt]
    for _ in range(count - 1):
        c = Mat.__new__(Mat)
        c.n, c.k, c.nnz = mt.n, mt.k, mt.nnz
        c.w, c.records, c.exps, c.counts = mt.w.clone(), mt.records.clone(), mt.exps.clone(), mt.counts.clone()
        c.escapes, c.offs, c.cols = mt.escapes.clone(), mt.offs.clone(), mt.cols.clone()
        out.append(c)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    rows = []
    for si, (n, k) in enumerate(SHAPES):
        mt = Mat(n, k, 900 + si)
        x = torch.randn(1, k, device="cuda").to(torch.bfloat16)
        y_ref = torch.matmul(x, mt.w.t())
        err = rel(mt.op(x), y_ref.float())
        assert err < 1e-2, f"{n}x{k}: W12 vs cuBLAS rel err {err:.2e}"
        count = max(1, -(-2 * L2_BYTES // (mt.bytes(1, "w12"))))
        mats = copies_of(mt, count)
        reps = max(8, 2 * count) if n * k < 100_000_000 else 4
        f_c = [lambda m=m: torch.matmul(x, m.w.t()) for m in mats]
        f_w = [lambda m=m: m.op(x) for m in mats]
        r = dict(n=n, k=k, copies=count, reps=reps, cfg=str(gc.pick_config(1, n, k)))
        for name, fc, fw in (("graph", lambda: bench(f_c[0]), lambda: bench(f_w[0])),
                             ("direct", lambda: triton.testing.do_bench(f_c[0], return_mode="median") * 1e3,
                              lambda: triton.testing.do_bench(f_w[0], return_mode="median") * 1e3),
                             ("chain", lambda: chain_us(f_c, reps), lambda: chain_us(f_w, reps))):
            spin()
            r[name] = (fc(), fw())
        r["host"] = (host_us(f_c[0]), host_us(f_w[0]))
        rows.append(r)
        print(f"{n}x{k}: " + "  ".join(f"{nm} {r[nm][0]:.1f}/{r[nm][1]:.1f} ({r[nm][0] / r[nm][1]:.3f})"
                                       for nm in ("graph", "direct", "chain"))
              + f"  host µs/call {r['host'][0]:.1f}/{r['host'][1]:.1f}", flush=True)
        del mats, mt
        torch.cuda.empty_cache()

    rev = commit()
    lines = [f"# Launch floor: W12 vs cuBLAS BF16 at M = 1, three timing methods — {datetime.date.today()}", "",
             f"- GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}; triton {triton.__version__}",
             f"- commit: {rev}", "- command: `W12_CUDA=1 python bench/launch_floor.py --out $OUT`",
             "- µs per call (cuBLAS / W12, ratio = cuBLAS / W12); host = host µs per direct call", "",
             "| N×K | config | graph cuBLAS | graph W12 | ratio | direct cuBLAS | direct W12 | ratio "
             "| chain cuBLAS | chain W12 | ratio | copies × reps | host cuBLAS | host W12 |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = [f"{r['n']}×{r['k']}", r["cfg"]]
        for nm in ("graph", "direct", "chain"):
            c, w = r[nm]
            cells += [f"{c:.1f}", f"{w:.1f}", f"{c / w:.3f}"]
        cells += [f"{r['copies']} × {r['reps']}", f"{r['host'][0]:.1f}", f"{r['host'][1]:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "launch_floor.md"), "w") as fh:
        fh.write(text)


if __name__ == "__main__":
    main()
