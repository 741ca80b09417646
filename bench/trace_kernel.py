"""Where the time of one M = 1 skinny-kernel call goes: each CTA's entry, main loop and epilogue, read from the
kernel's TRACE build (w12_gemv.cu g_trace: %globaltimer and clock64 at entry, after the main loop and at exit). One
GPU call.

    W12_CUDA=1 python bench/trace_kernel.py [--shapes 4096x4096,...] [--runs 20] [--out DIR]

Per shape (W12 and the 8-bit view, the dispatched M = 1 config): the traced output is checked against the
untraced kernel's (the same bits), then RUNS launches, each after the same L2 flush as do_bench's (256 MB zeroed)
and a synchronise, give per launch: the span from the first CTA's entry to the last CTA's exit (globaltimer), when
the CTAs enter (median and last entry after the first), the main loop's and the epilogue's cycles per CTA (median
and max, clock64 at the SM clock), when they exit (median and 90th percentile after the first entry: against the span,
the grid's tail), and the CTAs per SM. Beside them, do_bench µs of the untraced kernel, the
traced kernel and cuBLAS (the trace build holds a few more registers; their gap is the trace's own cost).
The medians over the runs are printed as a table and written to OUT/trace_kernel.md.
"""

import argparse
import datetime
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from revision import commit  # noqa: E402  (bench/revision.py)
from kernels import SHAPES, Mat, bench  # noqa: E402  (bench/kernels.py)

from w12.kernels import gemm_cuda as gc  # noqa: E402


def traced(mt, x, view, cfg, trace):
    return gc.launch(x, mt.records, mt.exps, mt.n, mt.escapes, mt.offs, mt.cols, view=view, config=cfg, trace=trace)


def one_launch(mt, x, view, cfg, trace, flush):
    """Per-launch figures from the trace (µs; clock64 cycles converted at the SM clock that the same trace
    shows: each CTA's cycles over its globaltimer ns, median over the CTAs)."""
    flush.zero_()
    torch.cuda.synchronize()
    traced(mt, x, view, cfg, trace)
    torch.cuda.synchronize()
    t = trace.cpu()  # int64: differences first (a double holds ~1e18 ns only to ~256 ns)
    g0, c0, g1, c1, g2, c2, sm = (t[:, i] for i in range(7))
    start = g0.min()
    entry, exit_ = (g0 - start).double(), (g2 - start).double()
    ran, cycles = (g2 - g0).double(), (c2 - c0).double()
    long = ran > 2000  # CTAs that ran > 2 µs: the globaltimer's step is small against them
    clock_ghz = (cycles[long] / ran[long]).median().item() if long.any() else 1.98
    loop = (c1 - c0).double() / clock_ghz / 1e3
    epi = (c2 - c1).double() / clock_ghz / 1e3
    per_sm = torch.bincount(sm)
    return dict(span=(g2.max() - start).item() / 1e3, entry_med=entry.median().item() / 1e3,
                entry_last=entry.max().item() / 1e3, loop_med=loop.median().item(), loop_max=loop.max().item(),
                epi_med=epi.median().item(), epi_max=epi.max().item(), ctas_per_sm=per_sm[per_sm > 0].max().item(),
                exit_med=exit_.median().item() / 1e3, exit_p90=exit_.quantile(0.9).item() / 1e3,
                clock_ghz=clock_ghz,
                tick=(g0.unique().diff().min().item() if g0.unique().numel() > 1 else float("nan")))  # ns


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=",".join(f"{n}x{k}" for n, k in SHAPES))
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    lines = []
    for si, (n, k) in enumerate(shapes):
        mt = Mat(n, k, 200 + si)
        x = torch.randn(1, k, device="cuda").to(torch.bfloat16)
        for view in (False, True):
            cfg = gc.dispatched_config(1, n, k, view)
            ctas = (n + 127) // 128 * 8 * cfg.split
            trace = torch.zeros(ctas, 8, dtype=torch.int64, device="cuda")
            y = gc.launch(x, mt.records, mt.exps, n, mt.escapes, mt.offs, mt.cols, view=view, config=cfg)
            same = torch.equal(traced(mt, x, view, cfg, trace), y)
            runs = [one_launch(mt, x, view, cfg, trace, flush) for _ in range(args.runs)]
            med = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
            t_plain = bench(lambda: gc.launch(x, mt.records, mt.exps, n, mt.escapes, mt.offs, mt.cols, view=view,
                                              config=cfg))
            t_traced = bench(lambda: traced(mt, x, view, cfg, trace))
            t_cublas = bench(lambda: torch.matmul(x, mt.w.t()))
            row = (f"| {n}×{k} | {'view' if view else 'W12'} | {cfg.warps}/{cfg.unroll}/{cfg.split} | {ctas} | "
                   f"{med['ctas_per_sm']:.0f} | {t_plain:.1f} | {t_traced:.1f} | {t_cublas:.1f} | {med['span']:.2f} | "
                   f"{med['entry_med']:.2f} / {med['entry_last']:.2f} | {med['loop_med']:.2f} / {med['loop_max']:.2f} | "
                   f"{med['epi_med']:.2f} / {med['epi_max']:.2f} | {med['exit_med']:.2f} / {med['exit_p90']:.2f} | {same} |")
            print(row, f"(globaltimer step {med['tick']:.0f} ns, SM clock {med['clock_ghz']:.2f} GHz)", flush=True)
            lines.append(row)
        torch.cuda.empty_cache()
    text = "\n".join([
        f"# One M = 1 skinny-kernel call, traced per CTA — {datetime.date.today()}", "",
        f"- GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}; commit {commit()}; "
        "clock64 cycles converted at the SM clock each trace shows (cycles / globaltimer ns per CTA, median)",
        f"- command: `W12_CUDA=1 python bench/trace_kernel.py --runs {args.runs} --out $OUT`",
        "- per launch after a 256 MB L2 flush and a synchronise; medians over the runs; µs. do_bench columns: CUDA "
        "graph replay, L2 flushed, median", "",
        "| N×K | kernel | warps/unroll/split | CTAs | CTAs per SM | do_bench µs | traced build µs | cuBLAS µs | "
        "span µs (first entry → last exit) | entry after the first: median / last | main loop: median / max | "
        "epilogue: median / max | exit after the first entry: median / 90th percentile (the last: span) | same bits |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|", *lines]) + "\n"
    with open(os.path.join(args.out, "trace_kernel.md"), "w") as fh:
        fh.write(text)
    print(text)


if __name__ == "__main__":
    main()
