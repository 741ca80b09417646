"""Prefill-sized calls (M > 128): decode W once + cuBLAS against the fused Triton kernel and BF16 cuBLAS. One GPU call.

    PYTHONUNBUFFERED=1 python bench/large_m.py [--ms 128,256,512,1024,2048] [--shapes 0,2,...] [--out DIR]
    PYTHONUNBUFFERED=1 python bench/large_m.py --decode-sweep [--shapes ...] [--out DIR]

For every shape of bench/kernels.py (random bf16 weights with escapes, encoded on the GPU):
1. checks: kernels/decode.py gives W bit for bit (and the 8-bit view as the reference defines it); at every
   M > ops.LARGE_M, torch.ops.w12.gemm gives the bits of `F.linear(x, W)` on the original BF16 weight, the same
   bits on a second run and in a CUDA-graph replay;
2. times (CUDA graph replay, do_bench, L2 flushed, median; µs): BF16 cuBLAS (`F.linear`), torch.ops.w12.gemm as
   dispatched, the fused kernels the op ran before decode + cuBLAS took M > LARGE_M (the Triton kernel; skipped
   where one call takes over 50 ms), decode + cuBLAS at M ≤ LARGE_M too (where the fused kernels stay), and the
   decode alone with its TB/s (12 KB per record read, 2·N·K written).
Prints the table last and writes OUT/large_m.md.
--overlap instead tries decode overlapped with cuBLAS (overlap_linear: N in C chunks of record rows, each decoded on
a side stream while the main stream runs the previous chunk's F.linear; C of --chunks) against the op and BF16, with
the bits compared to F.linear on the whole weight, and writes OUT/overlap.md.
--decode-sweep instead times kernels/decode.py alone for every (rows per program, warps) of SWEEP, each checked
bit for bit first, and writes OUT/decode_sweep.md.
"""

import argparse
import datetime
import os
import sys
import time

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from revision import commit  # noqa: E402  (bench/revision.py)
from kernels import SHAPES, Mat, bench, decode_gpu, geo, spin  # noqa: E402  (bench/kernels.py)

from w12.kernels import decode as dec  # noqa: E402
from w12.kernels import ops  # noqa: E402


def publish(text: str, out_dir: str, name: str) -> None:
    """Print a report and, with --out, write it to out_dir/name."""
    print(text)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, name), "w") as f:
            f.write(text)


SWEEP = [(rows, warps) for rows in (128, 64, 32, 16) for warps in (1, 2, 4, 8) if rows * 64 >= warps * 32 * 4]


def decode_sweep(shapes, args):
    rows_out = []
    for si, (n, k) in enumerate(shapes):
        mt = Mat(n, k, 500 + si)
        nb, kb = mt.counts.shape
        moved = nb * kb * 12288 + 2 * n * k
        line = []
        for rows, warps in SWEEP:
            run = lambda: dec.decode(mt.records, mt.exps, mt.escapes, mt.offs, n, k, rows=rows, warps=warps)  # noqa: E731
            ok = torch.equal(run().view(torch.int16), mt.w.view(torch.int16))
            t = bench(run) if ok else float("nan")
            line.append((rows, warps, ok, t))
            print(f"{n}x{k} rows {rows} warps {warps}: {t:.1f} µs, {moved / t / 1e6:.2f} TB/s, bits {ok}", flush=True)
        rows_out.append((n, k, moved, line))
        del mt
        torch.cuda.empty_cache()
    head = "| N×K | " + " | ".join(f"{r}/{w}" for r, w in SWEEP) + " |"
    out = ["# kernels/decode.py: rows per program / warps — " + str(datetime.date.today()), "",
           f"- GPU: {torch.cuda.get_device_name()}; commit: {commit()}",
           f"- command: `python bench/large_m.py {' '.join(sys.argv[1:])}`",
           "- µs (TB/s of 12 KB per record read + 2·N·K written): CUDA graph replay, do_bench, L2 flushed, median; "
           "every config gave W's bits first (≠: it did not)", "", head, "|---|" + "---|" * len(SWEEP)]
    for n, k, moved, line in rows_out:
        out.append(f"| {n}×{k} | " + " | ".join(f"{t:.1f} ({moved / t / 1e6:.2f})" if ok else "≠"
                                                  for _, _, ok, t in line) + " |")
    publish("\n".join(out) + "\n", args.out, "decode_sweep.md")


_SIDE = {}


def overlap_linear(x, mt, chunks: int):
    """F.linear(x, W) with W decoded in `chunks` pieces of whole record rows on a side stream, chunk i's GEMM on the
    main stream overlapping chunk i+1's decode; the pieces' outputs concatenated along N."""
    main = torch.cuda.current_stream()
    side = _SIDE.setdefault("s", torch.cuda.Stream())
    nb, kb = mt.counts.shape
    step = -(-nb // chunks)
    side.wait_stream(main)
    parts, events = [], []
    with torch.cuda.stream(side):
        for r0 in range(0, nb, step):
            r1 = min(nb, r0 + step)
            n0, n1 = r0 * 128, min(mt.n, r1 * 128)
            w = dec.decode(mt.records[r0:r1], mt.exps[n0:], mt.escapes, mt.offs[r0 * kb:r1 * kb + 1], n1 - n0, mt.k)
            ev = torch.cuda.Event()
            ev.record(side)
            parts.append(w)
            events.append(ev)
    outs = []
    for w, ev in zip(parts, events):
        main.wait_event(ev)
        w.record_stream(main)
        outs.append(F.linear(x, w))
    return torch.cat(outs, dim=1)


def overlap(shapes, ms, chunks, args):
    rows = []
    for si, (n, k) in enumerate(shapes):
        mt = Mat(n, k, 500 + si)
        for m in ms:
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            base = F.linear(x, mt.w)
            t_blas = bench(lambda: F.linear(x, mt.w))
            t_op = bench(lambda: torch.ops.w12.gemm(x, mt.records, mt.exps, mt.escapes, mt.offs, mt.cols, n))
            line = []
            for c in chunks:
                same = torch.equal(overlap_linear(x, mt, c), base)
                t = bench(lambda: overlap_linear(x, mt, c))
                line.append((c, t, same))
            rows.append((n, k, m, t_blas, t_op, line))
            print(f"{n}x{k} M={m}: BF16 {t_blas:.1f} op {t_op:.1f} " +
                  " ".join(f"C={c} {t:.1f} ({'=' if same else '≠'})" for c, t, same in line), flush=True)
        del mt
        torch.cuda.empty_cache()
    out = ["# Decode overlapped with cuBLAS (bench/large_m.py --overlap) — " + str(datetime.date.today()), "",
           f"- GPU: {torch.cuda.get_device_name()}; commit: {commit()}",
           f"- command: `python bench/large_m.py {' '.join(sys.argv[1:])}`",
           "- BF16 µs / W12 µs (CUDA graph replay, do_bench, L2 flushed, median); = / ≠: bits of F.linear on the "
           "whole weight or not", "",
           "| N×K | M | BF16 µs | op | " + " | ".join(f"C = {c}" for c in chunks) + " |",
           "|---|---|---|---|" + "---|" * len(chunks)]
    for n, k, m, tb, to, line in rows:
        out.append(f"| {n}×{k} | {m} | {tb:.1f} | {tb / to:.3f} | " +
                   " | ".join(f"{tb / t:.3f} {'=' if same else '≠'}" for _, t, same in line) + " |")
    out += ["", "| M | op geomean | " + " | ".join(f"C = {c}" for c in chunks) + " |",
            "|---|---|" + "---|" * len(chunks)]
    for m in ms:
        sel = [r for r in rows if r[2] == m]
        out.append(f"| {m} | {geo([r[3] / r[4] for r in sel]):.3f} | " +
                   " | ".join(f"{geo([r[3] / r[5][j][1] for r in sel]):.3f}" for j in range(len(chunks))) + " |")
    publish("\n".join(out) + "\n", args.out, "overlap.md")


def once_ms(fn) -> float:
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ms", default="128,256,512,1024,2048", help="rows of X (comma-separated)")
    ap.add_argument("--shapes", default="", help="indices into bench/kernels.py SHAPES (default: all)")
    ap.add_argument("--out", default="", help="directory for large_m.md")
    ap.add_argument("--decode-sweep", action="store_true", help="time the decode kernel's configs instead")
    ap.add_argument("--overlap", action="store_true", help="try decode overlapped with cuBLAS instead")
    ap.add_argument("--chunks", default="2,4,8", help="--overlap: numbers of N chunks")
    args = ap.parse_args()
    ms = [int(v) for v in args.ms.split(",")]
    shapes = [SHAPES[int(i)] for i in args.shapes.split(",")] if args.shapes else SHAPES
    if args.decode_sweep:
        return decode_sweep(shapes, args)
    if args.overlap:
        return overlap(shapes, [m for m in ms if m > ops.LARGE_M], [int(c) for c in args.chunks.split(",")], args)
    dev = torch.cuda.get_device_name()
    t0 = time.time()
    rows, checks = [], []
    for si, (n, k) in enumerate(shapes):
        mt = Mat(n, k, 500 + si)
        w = mt.w
        wd = dec.decode(mt.records, mt.exps, mt.escapes, mt.offs, n, k)
        exact = torch.equal(wd.view(torch.int16), w.view(torch.int16))
        vd = dec.decode(mt.records, mt.exps, None, None, n, k, view=True)
        vref = decode_gpu(mt.records, mt.exps, mt.counts, mt.escapes, n, k, view=True)
        view_ok = torch.equal(vd.view(torch.int16), vref.view(torch.int16))
        del wd, vd, vref
        spin()
        t_dec = bench(lambda: dec.decode(mt.records, mt.exps, mt.escapes, mt.offs, n, k))
        nb, kb = mt.counts.shape
        tbs = (nb * kb * 12288 + 2 * n * k) / t_dec / 1e6
        for m in ms:
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            run = lambda: torch.ops.w12.gemm(x, mt.records, mt.exps, mt.escapes, mt.offs, mt.cols, n)  # noqa: E731
            base = F.linear(x, w)
            y = run()
            same = torch.equal(y, base) if m > ops.LARGE_M else None
            repeat = torch.equal(y, run())
            gr = torch.cuda.CUDAGraph()
            with torch.cuda.graph(gr):
                yg = run()
            gr.replay()
            graph_ok = torch.equal(yg, y)
            r32 = x.float() @ w.float().t()
            err = ((y.float() - r32).abs().max() / r32.abs().max()).item()
            del r32, yg, gr
            checks.append((n, k, m, exact, view_ok, same, repeat, graph_ok, err))
            spin()
            t_blas = bench(lambda: F.linear(x, w))
            t_op = bench(run)
            t_dec_blas = t_op if m > ops.LARGE_M else bench(  # above LARGE_M the op is decode + cuBLAS
                lambda: F.linear(x, dec.decode(mt.records, mt.exps, mt.escapes, mt.offs, n, k)))
            t_old = float("nan")
            if m > ops.LARGE_M and once_ms(lambda: mt.op(x)) < 50:
                t_old = bench(lambda: mt.op(x))
            rows.append((n, k, m, t_blas, t_op, t_dec_blas, t_old, t_dec, tbs))
            print(f"{n}x{k} M={m}: cuBLAS {t_blas:.1f} op {t_op:.1f} decode+cuBLAS {t_dec_blas:.1f} "
                  f"fused/Triton {t_old:.1f} decode {t_dec:.1f} µs ({tbs:.2f} TB/s); bits: decode {exact}, "
                  f"view {view_ok}, = F.linear {same}, repeat {repeat}, graph {graph_ok}, rel err {err:.1e}",
                  flush=True)
            del x, base, y
        del mt, w
        torch.cuda.empty_cache()
    publish(report(rows, checks, dev, args, time.time() - t0), args.out, "large_m.md")


def report(rows, checks, dev, args, secs) -> str:
    rev = commit()
    out = [f"# Prefill-sized W12 calls: decode + cuBLAS vs fused kernels vs BF16 — {datetime.date.today()}", "",
           f"- GPU: {dev}; torch {torch.__version__}; triton {triton.__version__}", f"- commit: {rev}",
           f"- command: `python bench/large_m.py {' '.join(sys.argv[1:])}`; wall {secs:.0f} s",
           f"- ops.LARGE_M = {ops.LARGE_M}: the op runs the fused kernels up to it, decode + cuBLAS above",
           "- µs: CUDA graph replay, do_bench (L2 flushed, median); ratio = BF16 µs / W12 µs", "",
           "## Checks", "",
           "| N×K | M | decode = W (bits) | view decode = reference | op = F.linear(x, W) (bits) | repeat | graph | "
           "rel. error vs fp32 |", "|---|---|---|---|---|---|---|---|"]
    for n, k, m, exact, view_ok, same, repeat, graph_ok, err in checks:
        out.append(f"| {n}×{k} | {m} | {exact} | {view_ok} | {'-' if same is None else same} | {repeat} | "
                   f"{graph_ok} | {err:.1e} |")
    out += ["", "## Summary (geomean over shapes of BF16 µs / W12 µs)", "",
            "| M | op | decode + cuBLAS | fused/Triton (old path above LARGE_M) |", "|---|---|---|---|"]
    for m in sorted({r[2] for r in rows}):
        sel = [r for r in rows if r[2] == m]
        out.append(f"| {m} | {geo([r[3] / r[4] for r in sel]):.3f} | {geo([r[3] / r[5] for r in sel]):.3f} | "
                   f"{geo([r[3] / r[6] for r in sel]):.3f} |")
    out += ["", "## Table", "",
            "| N×K | M | BF16 µs | op µs | op ratio | decode + cuBLAS µs | ratio | fused/Triton µs | ratio | "
            "decode µs | decode TB/s |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for n, k, m, tb, to, tdb, told, td, tbs in rows:
        out.append(f"| {n}×{k} | {m} | {tb:.1f} | {to:.1f} | {tb / to:.3f} | {tdb:.1f} | {tb / tdb:.3f} | "
                   f"{told:.1f} | {tb / told:.3f} | {td:.1f} | {tbs:.2f} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
