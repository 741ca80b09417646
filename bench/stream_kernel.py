"""The stream kernel (w12_gemv.cu's w12_stream_kernel) against the dispatched kernels at M ≤ 32. One GPU call.

    W12_CUDA=1 python bench/stream_kernel.py [--ms 1,32] [--out OUT]
    W12_CUDA=1 python bench/stream_kernel.py --check 8      # the correctness part alone, 8 or 4 consumer warps

At one row the skinny kernel streams the LM heads at ~4.1 TB/s, while a bare ring of bulk copies at two CTAs per SM
streams the same bytes at ~4.3 (bench/tma_stream.py --shapes, 2026-12-04-tma-stream-shapes-h200-s32.md). The stream
kernel is that ring with the decode and the MMAs: each CTA streams one contiguous range of records and their X tiles
(rows split between CTAs are added in a fixed order); at 32 rows it also does without the ws kernel's X reorder
kernel, escape prologue and split-K epilogue. First, for 8 and for 4 consumer warps, each in a child process with a
time limit (a wrong ring phase hangs, it does not fail; a count that fails is not timed): small matrices with many
escapes (more than one chunk of 16 per segment), more CTAs than records, N not a multiple of 128, M = 1, 3, 8, 13 and
32, W12 and the view, each config checked against the reference (decode + fp32 matmul) and bit-equal over three runs.
Then, per shape of bench/kernels.py: cuBLAS BF16, the dispatched config and the stream configs (CTAs per SM, ring
stages, L2 evict_first on the record copies, 8 or 4 consumer warps, and with evict_first the same with each CTA's range
in one record row (aligned, gemm_cuda.stream_ctas); only those whose CTAs per SM the GPU's occupancy
query says are resident together), each checked against the reference and bit-equal over three runs, timed as
bench/kernels.py times (CUDA graph replay, do_bench, median): every config once, then the best three and the dispatched
one in three interleaved rounds. Prints a table and writes OUT/stream_kernel.md and OUT/stream_table.py after each
shape, so that a call cut short keeps the shapes it finished (the entries where the stream kernel is ≥ 1.5 % faster,
for gemm_cuda.STREAM_TABLE; `W12_STREAM_TABLE=OUT/stream_table.py python bench/kernels.py` then runs the full bench
with them).
"""

import argparse
import dataclasses
import datetime
import math
import os
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from revision import commit  # noqa: E402  (bench/revision.py)
from kernels import SHAPES, Mat, bench, decode_gpu, mat_of, rel, stream_name  # noqa: E402
from m1_configs import timed  # noqa: E402

from w12.kernels import gemm_cuda as gc  # noqa: E402

SC = gc.StreamConfig


def cands(m, view, warps=(8, 4), fits=gc.stream_fits):
    """The stream configs timed at M = m (above 16 rows a slot holds a 4 KB X tile: two CTAs per SM up to 5 stages),
    with 8 consumer warps and with 4 (32 channels each: half the X reads; up to three CTAs per SM at M ≤ 8), those
    whose CTAs per SM are resident together (fits(cfg, m, view))."""
    out = []
    if 8 in warps:
        if m > 16:
            out += [SC(c, s, ef) for c, s in (((1, 12), (2, 6), (2, 8)) if view else ((1, 8), (1, 12), (2, 4), (2, 5)))
                    for ef in (False, True)]
        elif view:
            out += [SC(2, s, ef) for s in (6, 8) for ef in (False, True)]
        else:
            out += [SC(2, s, ef) for s in (4, 5, 6, 8) for ef in (False, True)] + [SC(1, 8), SC(1, 12)]
    if 4 in warps:
        cs = (((2, 5), (2, 4), (1, 10)) if m > 16 and not view else ((2, 6), (1, 12)) if m > 16
              else ((3, 5), (2, 8)) if m <= 8 or view else ((2, 6), (2, 7)))
        out += [SC(c, s, ef, warps=4) for c, s in cs for ef in (False, True)]
    out += [dataclasses.replace(c, aligned=True) for c in out if c.evict_first]  # each CTA in one record row
    return [c for c in out if fits(c, m, view)]


def same_bits(a, b):
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


def checked(mt, x, ref, cfg, view):
    """The config's output, within 1e-2 of the reference and bit-equal over three runs."""
    ys = [mt.run(x, view=view, cuda=cfg) for _ in range(3)]
    err = rel(ys[0], ref)
    assert err < 1e-2, f"{cfg} view={view} {mt.n}x{mt.k} M={x.shape[0]}: rel. error {err:.2e}"
    assert all(same_bits(ys[0], y) for y in ys[1:]), f"{cfg} view={view} {mt.n}x{mt.k}: bits differ across runs"
    return err


def check(warps):
    """The configs with `warps` consumer warps against the reference (a hang here is caught by the parent's limit)."""
    torch.manual_seed(0)
    cases = []
    for n, k, every in ((300, 1024, 997), (1000, 4096, 97), (4096, 4096, 4099)):
        w = (torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16)
        w.view(-1)[::every] = 100.0  # out-of-window weights: the small ones of those channels become escapes
        mt, _ = mat_of(w)
        cases.append(mt)
    cfgs = [dataclasses.replace(c, warps=warps) for c in (SC(2, 4), SC(1, 2), SC(2, 6, True), SC(4, 3), SC(1, 12),
                                                          SC(2, 4, True, aligned=True), SC(1, 2, aligned=True))]
    for mt in cases:
        wv = decode_gpu(mt.records, mt.exps, mt.counts, mt.escapes, mt.n, mt.k, view=True)
        for m in (1, 3, 8, 13, 32):
            x = torch.randn(m, mt.k, device="cuda").to(torch.bfloat16)
            ref, refv = x.float() @ mt.w.float().t(), x.float() @ wv.float().t()
            for cfg in cfgs:
                e = checked(mt, x, ref, cfg, False)
                ev = checked(mt, x, refv, cfg, True)
            print(f"check {warps} warps {mt.n}x{mt.k} ({mt.nnz} escapes) M={m}: ok (last rel. error W12 {e:.1e}, "
                  f"view {ev:.1e})", flush=True)
    print("CHECK OK")


def checked_warps():
    """Each consumer-warp count's check in its own child process with a time limit: (the counts that passed, the
    children's output). A failed count is left out of the timing; the other is still timed."""
    ok, texts = [], []
    for warps in (8, 4):
        try:
            out = subprocess.run([sys.executable, __file__, "--check", str(warps)], capture_output=True, text=True,
                                 timeout=120)
            text, good = out.stdout + out.stderr, out.returncode == 0 and "CHECK OK" in out.stdout
        except subprocess.TimeoutExpired as e:
            text, good = f"timed out after 120 s (a hang):\n{e.stdout or ''}", False
        texts.append(f"{warps} warps: " + ("passed" if good else "FAILED") + "\n" + text[-3000:])
        if good:
            ok.append(warps)
    return ok, "\n".join(texts)


def gpu_fits(cfg, m, view):
    return gc.stream_blocks_per_sm(cfg, m, view) >= cfg.ctas_per_sm


def residency_rule():
    """gemm_cuda.stream_fits (the CPU's rule) against the GPU's occupancy query over every M bucket, W12 / view, warp
    count, 1–3 CTAs per SM and 2–16 stages: the configs where they disagree (the timing filters by the GPU's answer)."""
    bad = []
    for m in (1, 16, 32):
        for view in (False, True):
            for warps in (8, 4):
                for stages in range(2, 17):
                    r = gc.stream_blocks_per_sm(SC(1, stages, warps=warps), m, view)
                    bad += [(m, view, SC(c, stages, warps=warps), r) for c in (1, 2, 3)
                            if gc.stream_fits(SC(c, stages, warps=warps), m, view) != (r >= c)]
    return bad


def name(c):
    if isinstance(c, SC):
        return stream_name(c)
    if isinstance(c, gc.WsConfig):
        return f"ws {c.nt}/{c.split}"
    return f"skinny {c.nt}/{c.warps}/{c.unroll}/{c.split} l2 {c.l2}"


def shape_rows(si, n, k, ms, warps):
    """One row per m of ms: cuBLAS, and for W12 and the view the dispatched config and the best stream config."""
    mt = Mat(n, k, 300 + si)
    wv = decode_gpu(mt.records, mt.exps, mt.counts, mt.escapes, n, k, view=True)
    rows = []
    for m in ms:
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        ref, refv = x.float() @ mt.w.float().t(), x.float() @ wv.float().t()
        row = dict(n=n, k=k, m=m, cb=bench(lambda: torch.matmul(x, mt.w.t())))
        for view, r in ((False, ref), (True, refv)):
            cur, cs = gc.dispatched_config(m, n, k, view), cands(m, view, warps, gpu_fits)
            errs = {c: checked(mt, x, r, c, view) for c in [cur] + cs}
            fn = lambda c: (lambda: mt.run(x, view=view, cuda=c))  # noqa: E731
            first = {c: bench(fn(c), rep=20) for c in cs}
            top = sorted(first, key=first.get)[:3]
            fin = timed({c: fn(c) for c in [cur] + top}, 3)
            best = min(top, key=fin.get)
            key = "v" if view else "w"
            row.update({f"{key}cur": cur, f"{key}t_cur": fin[cur], f"{key}best": best, f"{key}t_best": fin[best],
                        f"{key}err": max(errs[c] for c in (cur, best)),
                        f"{key}first": sorted(first.items(), key=lambda ct: ct[1])})
        rows.append(row)
        print(f"M={m} {n}x{k}: cuBLAS {row['cb']:.1f}; W12 {name(row['wcur'])} {row['wt_cur']:.1f}, "
              f"{name(row['wbest'])} {row['wt_best']:.1f}; view {name(row['vcur'])} {row['vt_cur']:.1f}, "
              f"{name(row['vbest'])} {row['vt_best']:.1f}", flush=True)
    del mt, wv
    torch.cuda.empty_cache()
    return rows


def geo(v):
    return math.exp(sum(map(math.log, v)) / len(v))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--ms", default="1", help="rows of X, comma-separated, each ≤ 32 (default 1)")
    ap.add_argument("--check", type=int, choices=(8, 4), metavar="WARPS",
                    help="run the correctness part only, for the configs with 8 or 4 consumer warps")
    a = ap.parse_args()
    if a.check:
        check(a.check)
        return
    warps, text = checked_warps()
    print(text, flush=True)
    if not warps:
        sys.exit("the stream kernel's checks failed: nothing timed")
    ms = [int(v) for v in a.ms.split(",")]
    assert all(1 <= m <= 32 for m in ms), "--ms: rows of X from 1 to 32"
    bad = residency_rule()
    rule = ("- CTAs per SM: gemm_cuda.stream_fits agrees with the GPU's occupancy query on every config" if not bad else
            "- CTAs per SM: gemm_cuda.stream_fits DISAGREES with the GPU's occupancy query (the timing used the "
            "GPU's): " + "; ".join(f"M={m} view={v} {name(c)[7:]}: {r} resident" for m, v, c, r in bad[:12]))
    print(rule, flush=True)
    rows, t0 = [], time.time()
    for si, (n, k) in enumerate(SHAPES):  # the files are rewritten after each shape: a call cut short keeps its rows
        rows += shape_rows(si, n, k, ms, warps)
        text, table = write(a.out, a.ms, ms, warps, rule, rows, done=si + 1 == len(SHAPES))
        print(f"{n}x{k} done at {time.time() - t0:.0f} s", flush=True)
    print(text)
    print("STREAM_TABLE = {\n" + table + "}")


def write(out, ms_arg, ms, warps, rule, rows, done):
    """OUT/stream_kernel.md (the table) and OUT/stream_table.py (the entries where the stream kernel beat the
    dispatched config by ≥ 1.5 %, for gemm_cuda.STREAM_TABLE; W12_STREAM_TABLE=OUT/stream_table.py runs
    bench/kernels.py with them) from the rows so far; returns (text, table)."""
    lines = [f"# The stream kernel against the dispatched kernels — {datetime.date.today()}", "",
             f"- GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}; commit {commit()}",
             f"- command: `W12_CUDA=1 python bench/stream_kernel.py --ms {ms_arg} --out $OUT`",
             f"- checks (a child process per consumer-warp count): passed with {', '.join(map(str, warps))} warps"
             + ("" if len(warps) == 2 else " (the other FAILED: not timed)") + "; every config below within 1e-2 of "
             "the reference and bit-equal over three runs",
             rule,
             "- µs: CUDA graph replay, do_bench (zeroing flush), median of three interleaved rounds (the dispatched config "
             "and the best three of one round); ratio = cuBLAS / kernel"]
    if not done:
        lines.append(f"- CUT SHORT: {len(rows) // len(ms)} of {len(SHAPES)} shapes (the geomeans are over those)")
    lines.append("")
    for m in ms:
        rs = [r for r in rows if r["m"] == m]
        lines += [f"## M = {m}", "",
                  f"W12 geomean: dispatched {geo([r['cb'] / r['wt_cur'] for r in rs]):.3f}, stream "
                  f"{geo([r['cb'] / r['wt_best'] for r in rs]):.3f}, faster of the two per shape "
                  f"{geo([r['cb'] / min(r['wt_cur'], r['wt_best']) for r in rs]):.3f}; view: dispatched "
                  f"{geo([r['cb'] / r['vt_cur'] for r in rs]):.3f}, stream {geo([r['cb'] / r['vt_best'] for r in rs]):.3f}",
                  "", "| N×K | cuBLAS µs | W12 dispatched | µs | stream | µs | ratio dispatched → stream | max rel. err | "
                  "view dispatched µs | view stream | µs | view ratio | W12 stream configs, one round (µs) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rs:
            lines.append(
                f"| {r['n']}×{r['k']} | {r['cb']:.1f} | {name(r['wcur'])} | {r['wt_cur']:.1f} | {name(r['wbest'])} | "
                f"{r['wt_best']:.1f} | {r['cb'] / r['wt_cur']:.3f} → {r['cb'] / r['wt_best']:.3f} | {r['werr']:.1e} | "
                f"{r['vt_cur']:.1f} | {name(r['vbest'])} | {r['vt_best']:.1f} | {r['cb'] / r['vt_cur']:.3f} → "
                f"{r['cb'] / r['vt_best']:.3f} | " + ", ".join(f"{name(c)[7:]} {t:.1f}" for c, t in r["wfirst"]) + " |")
        lines.append("")
    text = "\n".join(lines)
    with open(os.path.join(out, "stream_kernel.md"), "w") as fh:
        fh.write(text)
    table = "".join(f"    {gc.stream_key(r['m'], r['n'], r['k'], view)!r}: {r[key + 'best']!r},\n"
                    for r in rows for view, key in ((False, "w"), (True, "v"))
                    if r[key + "t_best"] < r[key + "t_cur"] / 1.015)
    with open(os.path.join(out, "stream_table.py"), "w") as fh:
        fh.write("STREAM_TABLE = {\n" + table + "}\n")
    return text, table


if __name__ == "__main__":
    main()
