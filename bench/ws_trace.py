"""Where one ws-kernel call's time goes (X reorder kernel, CTA start, prologue, first record, main loop, epilogue),
read from %globaltimer stamps patched into a copy of kernels/w12_gemv.cu. One GPU call.

    python bench/ws_trace.py --build DIR [--rev REV]            # here (nvcc): the stamped library
    W12_CUDA=1 python bench/ws_trace.py --libs DIR [--out OUT]   # on the GPU

The stamped build keeps the kernel's code and adds, per CTA (thread 0 or consumer warp 0, lane 0), the globaltimer
at: entry, after the barrier setup, after the escape prologue, when slot 0 first fills (an extra wait on its
phase 0, which the ring completes anyway), at the main loop's end, after the post-loop __syncthreads, and at exit;
plus the first entry and the last exit of w12_x_ws_kernel (the X reorder launched before it). Per case: the
stamped output is checked against the landed build's bits, then RUNS replays of the captured call (both kernels,
one CUDA graph), each after do_bench's L2 flush (256 MB zeroed) give the phases in µs from the reorder kernel's
first entry; medians over the runs. Beside them: do_bench µs of the landed build and of cuBLAS.

The same build counts where the main loop waits (clock64, SM cycles; thread 0 of consumer warp 0 and the producer's
lane 0 only): the consumers' waits for a full slot, their wgmma waits, each record's fetch time (from the producer's
issue of its copies to the consumer's full wait returning) and the producer's waits for an empty slot, as fractions
of the main loop (slot 0 filled → loop end).  If the consumers wait on `full` while the producer seldom waits on
`empty`, the ring cannot bring records in fast enough (bytes in flight × fetch time); if the producer waits on
`empty` and the consumers seldom wait, the consumers' own chain (decode, wgmma, escapes) bounds the loop.
"""

import argparse
import ctypes
import datetime
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from revision import commit  # noqa: E402  (bench/revision.py)
CASES = [(6144, 4096, 32, (4, 5)), (4096, 4096, 32, (4, 4)), (10240, 5120, 32, (4, 3)), (151936, 5120, 32, (4, 1)),
         (10240, 5120, 64, (8, 3)), (6144, 4096, 128, (16, 2)), (28672, 4096, 128, (16, 1)), (151936, 5120, 128, (16, 1)),
         (28672, 4096, 128, (16, 1), True), (151936, 5120, 128, (16, 1), True)]  # True: the 8-bit view
MAX_CTAS = 8192
WORDS = 16  # trace words per CTA: 0-6 globaltimer stamps, 7 SM id, 8-14 the wait counters (w12_sw)

STAMP = "asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(w12_t));"
# w12_sw (per CTA, shared): 0 consumer full-wait cycles, 1 consumer wgmma-wait cycles, 2 fetch cycles summed over
# records, 3 records counted, 4 producer empty-wait cycles, 5 / 6 clock64 at slot 0 filled / at the loop's end.
# w12_si[slot]: clock64 when the producer issued the slot's copies.


def timed(call: str, add: str) -> str:
    """A consumer loop line `call;` timed by consumer warp 0's thread 0, which then runs `add` (c0, c1: the clocks)."""
    return ("      do { const bool w12_me = warp == 0 && lane == 0; unsigned long long w12_c0 = 0; "
            f"if (w12_me) w12_c0 = w12_clk(); {call}; "
            f"if (w12_me) {{ const unsigned long long w12_c1 = w12_clk(); {add} }} }} while (0);\n")


def timed_full(call: str, slot: str) -> tuple:
    """(the consumers' full wait `call`, its timed form): the wait's cycles, the record's fetch cycles, one record."""
    add = f"w12_sw[0] += w12_c1 - w12_c0; w12_sw[2] += w12_c1 - w12_si[{slot}]; w12_sw[3] += 1;"
    return f"      {call};\n", timed(call, add), 1


EXIT = ("  if (tid == 0) {\n    W12_STAMP(W12_CTA + 6);\n    unsigned smid;\n"
        "    asm volatile(\"mov.u32 %0, %%smid;\" : \"=r\"(smid));\n    g_ws_trace[W12_CTA + 7] = smid;\n  }\n")
PATCHES = [  # (anchor in the landed source, text put after it); each anchor must occur once
    ("#include <cuda_bf16.h>\n",
     f"__device__ unsigned long long g_ws_trace[8 + {WORDS} * {MAX_CTAS}];\n"
     f"#define W12_STAMP(slot) do {{ unsigned long long w12_t; {STAMP} g_ws_trace[slot] = w12_t; }} while (0)\n"
     f"#define W12_CTA (8 + {WORDS} * (int)((blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x))\n"
     "__device__ __forceinline__ unsigned long long w12_clk() {\n"
     "  unsigned long long c;\n  asm volatile(\"mov.u64 %0, %%clock64;\" : \"=l\"(c));\n  return c;\n}\n"
     "__shared__ unsigned long long w12_sw[8], w12_si[16];\n"),
    ("                                int Mpad, int K) {\n",
     f"  if (threadIdx.x == 0) {{ unsigned long long w12_t; {STAMP} atomicMax(&g_ws_trace[0], ~w12_t); }}\n"),
    ("    xq[((size_t)kb * Mpad + m) * 32 + (((d >> 2) ^ (m & 7)) << 2) + (d & 3)] = v;\n  }\n",
     f"  __syncthreads();\n  if (threadIdx.x == 0) {{ unsigned long long w12_t; {STAMP} atomicMax(&g_ws_trace[1], w12_t); }}\n"),
    ("  int* s_toff = reinterpret_cast<int*>(empty + STAGES);                                      // [8][kps + 1]\n"
     "  __shared__ __align__(16) uint8_t s_e[128];\n  __shared__ int s_last;\n",
     "  if (threadIdx.x == 0) W12_STAMP(W12_CTA + 0);\n  if (threadIdx.x < 8) w12_sw[threadIdx.x] = 0;\n"),
    ("  if (tid < 8) reinterpret_cast<uint4*>(s_e)[tid] = __ldg(reinterpret_cast<const uint4*>(expo + nb * 128) + tid);\n"
     "  __syncthreads();\n", "  if (tid == 0) W12_STAMP(W12_CTA + 1);\n"),
    ("    ws_escape_prologue<MT, VIEW>(my_toff, my_corr, toff, tent, nb * 8 + warp, KB, a, nrec, lane, e_lo, e_hi, ent);\n",
     "    if (warp == 0 && lane == 0) {\n      W12_STAMP(W12_CTA + 2);\n      mbar_wait(full, 0);\n"
     "      W12_STAMP(W12_CTA + 3);\n      w12_sw[5] = w12_clk();\n    }\n    __syncwarp();\n"),
    ("    fence_acc(acc);  // the accumulators are read only after the last wait\n",
     "    if (warp == 0 && lane == 0) {\n      w12_sw[6] = w12_clk();\n      W12_STAMP(W12_CTA + 4);\n    }\n"),
    # the barrier after the main loop (__syncthreads, or a producer warpgroup form's consumer-side bar.sync)
    ("// every slot consumed: the ring holds the CTA's sums [MT][128] (X row-major) from here on\n",
     "  if (tid == 0) W12_STAMP(W12_CTA + 5);\n"
     "  if (tid < 7) g_ws_trace[W12_CTA + 8 + tid] = w12_sw[tid];\n"),
    # the exit, after the store: a split-K pair in a cluster (launch_ws: split 2) returns from its own store
    ("    finish_tile_cluster<MT, THREADS>(reinterpret_cast<float*>(ring), y, ldy, N, nb * 128, m0, mcount);\n", EXIT),
    ("                                         N, nb * 128, m0, mcount);\n", EXIT),
]
# (text in the landed source, its timed form, how often it occurs): the main loop's waits, counted into w12_sw
WAITS = [
    timed_full("mbar_wait(full + s0, (i / STAGES) & 1)", "s0"),
    timed_full("mbar_wait(full + s1, ((i + 1) / STAGES) & 1)", "s1"),
    timed_full("mbar_wait(full + s, (i / STAGES) & 1)", "s"),
    ("      wg_wait0();\n", timed("wg_wait0()", "w12_sw[1] += w12_c1 - w12_c0;"), 2),
    ("    if (i >= STAGES) mbar_wait(empty + s, ((i / STAGES) - 1) & 1);  // the consumers are done with the slot\n",
     "    {\n      const unsigned long long w12_c0 = w12_clk();\n"
     "      if (i >= STAGES) mbar_wait(empty + s, ((i / STAGES) - 1) & 1);\n"
     "      if (lane == 0) {\n        const unsigned long long w12_c1 = w12_clk();\n"
     "        w12_sw[4] += w12_c1 - w12_c0;\n        w12_si[s] = w12_c1;  // before the copies' expect_tx arrive\n"
     "      }\n    }\n", 1),
]
HOST = f"""
extern "C" int w12_ws_trace_clear() {{
  void* p;
  cudaError_t e = cudaGetSymbolAddress(&p, g_ws_trace);
  return e != cudaSuccess ? (int)e : (int)cudaMemset(p, 0, sizeof(g_ws_trace));
}}
extern "C" int w12_ws_trace_read(void* dst, int ctas) {{
  return (int)cudaMemcpyFromSymbol(dst, g_ws_trace, (8 + {WORDS} * (size_t)ctas) * 8);
}}
"""
PHASES = ["reorder end", "first CTA in", "last CTA in", "setup", "escape prologue", "slot 0 filled", "main loop",
          "main loop (max)", "drain", "epilogue", "epilogue (max)", "last CTA out"]


def stamped_source(src: str) -> str:
    """kernels/w12_gemv.cu's text `src` with the stamps and the wait counters patched in."""
    for anchor, add in PATCHES:
        assert src.count(anchor) == 1, f"bench/ws_trace.py: anchor not found once in w12_gemv.cu: {anchor[:60]!r}"
        src = src.replace(anchor, anchor + add)
    for text, counted, count in WAITS:
        assert src.count(text) == count, f"bench/ws_trace.py: wait not found {count}× in w12_gemv.cu: {text[:60]!r}"
        src = src.replace(text, counted)
    return src + HOST


def cta_rows(buf: list, ctas: int) -> list:
    """Each CTA's WORDS trace words."""
    return [buf[8 + WORDS * c: 8 + WORDS * (c + 1)] for c in range(ctas)]


def phases(buf: list, ctas: int) -> list:
    """One replay's figures (µs) from the trace words (see PHASES)."""
    t0 = ~buf[0] & (2 ** 64 - 1)
    rows = cta_rows(buf, ctas)
    med = lambda i, j: statistics.median(r[j] - r[i] for r in rows) / 1e3  # noqa: E731
    mx = lambda i, j: max(r[j] - r[i] for r in rows) / 1e3  # noqa: E731
    return [(buf[1] - t0) / 1e3, (min(r[0] for r in rows) - t0) / 1e3, (max(r[0] for r in rows) - t0) / 1e3,
            med(0, 1), med(1, 2), med(2, 3), med(3, 4), mx(3, 4), med(4, 5), med(5, 6), mx(5, 6),
            (max(r[6] for r in rows) - t0) / 1e3]


WAIT_COLS = ["ns / record", "GHz", "consumer full wait %", "consumer wgmma wait %", "producer empty wait %", "fetch ns"]


def loop_waits(buf: list, ctas: int, start: int, end: int, figures, cols: int) -> list:
    """Medians over the CTAs of figures(w, cyc, ns): w the CTA's counters (w12_sw), its loop in SM cycles (counters
    5 → 6) and in ns (stamps start → end); CTAs without a loop or a record are left out."""
    per = []
    for r in cta_rows(buf, ctas):
        w = r[8:15]
        cyc, ns = w[6] - w[5], r[end] - r[start]
        if cyc > 0 and ns > 0 and w[3]:
            per.append(figures(w, cyc, ns))
    return [statistics.median(p[i] for p in per) if per else float("nan") for i in range(cols)]


def waits(buf: list, ctas: int) -> list:
    """One replay's wait figures (WAIT_COLS): the main loop from slot 0 filled to the loop's end in SM cycles and in ns
    (stamps 3, 4) give the clock; the waits are fractions of the loop."""
    return loop_waits(buf, ctas, 3, 4, lambda w, cyc, ns: [ns / w[3], cyc / ns, 100 * w[0] / cyc, 100 * w[1] / cyc,
                                                           100 * w[4] / cyc, w[2] / w[3] * ns / cyc], len(WAIT_COLS))


X_KINDS = {  # X's values; wgmma's power draw depends on them, and a board at its power cap slows its SM clock
    "randn": lambda m, k: torch.randn(m, k, device="cuda").to(torch.bfloat16),
    "zeros": lambda m, k: torch.zeros(m, k, device="cuda", dtype=torch.bfloat16),
}


def flushed_traces(lib, call, ctas: int, runs: int) -> list:
    """The trace words (8 + WORDS · ctas) of `runs` replays of `call` captured in one CUDA graph, each replay after
    do_bench's L2 flush (256 MB zeroed); lib: the stamped library."""
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    gr = torch.cuda.CUDAGraph()
    with torch.cuda.graph(gr):
        call()
    buf = (ctypes.c_uint64 * (8 + WORDS * ctas))()
    bufs = []
    for _ in range(runs):
        flush.zero_()
        assert lib.w12_ws_trace_clear() == 0
        torch.cuda.synchronize()
        gr.replay()
        torch.cuda.synchronize()
        assert lib.w12_ws_trace_read(buf, ctas) == 0
        bufs.append(list(buf))
    return bufs


def load_libs(lib_dir: Path) -> tuple:
    """(landed, stamped) libraries of a --build folder."""
    return ctypes.CDLL(str(lib_dir / "w12_gemv_landed.so")), ctypes.CDLL(str(lib_dir / "w12_gemv_trace.so"))


def trace_case(libs: tuple, call, cublas, ctas: int, runs: int, phases_of, waits_of) -> tuple:
    """One case: `call` (the kernel through gemm_cuda.library) with the landed library — its bits and do_bench µs —,
    cuBLAS's µs (`cublas`), the stamped library's bits (asserted equal) and µs, then `runs` flushed replays.  Returns
    (µs cuBLAS, landed, stamped, medians of phases_of(words, ctas), medians of waits_of(words, ctas), every replay's
    words)."""
    from kernels import bench

    from w12.kernels import gemm_cuda as gc
    landed, stamped = libs
    gc.library = lambda: landed
    y0 = call()
    t_landed, t_cublas = bench(call), bench(cublas)
    gc.library = lambda: stamped
    assert torch.equal(call().view(torch.int16), y0.view(torch.int16)), "the stamped build's bits differ"
    t_stamped = bench(call)
    bufs = flushed_traces(stamped, call, ctas, runs)
    med = lambda rows: [statistics.median(r[i] for r in rows) for i in range(len(rows[0]))]  # noqa: E731
    return (t_cublas, t_landed, t_stamped, med([phases_of(b, ctas) for b in bufs]),
            med([waits_of(b, ctas) for b in bufs]), bufs)


def case_rows(label: str, ctas: int, res: tuple, ghz_col: int) -> tuple:
    """A case's row of the phases table and of the waits table (label: 'N×K | M | config'); res: trace_case's."""
    t_cublas, t_landed, t_stamped, figs, wfigs = res[:5]
    row = (f"| {label} | {ctas} | {t_cublas:.1f} | {t_landed:.1f} | {t_stamped:.1f} | "
           + " | ".join(f"{v:.1f}" for v in figs) + " |")
    wrow = f"| {label} | " + " | ".join(f"{v:.2f}" if i == ghz_col else f"{v:.0f}" for i, v in enumerate(wfigs)) + " |"
    print(row, wrow, sep="\n", flush=True)
    return row, wrow


def report(title: str, script: str, phase_note: str, lines: list, wait_note: str, wlines: list, phase_cols: list,
           wait_cols: list) -> str:
    """The markdown report of a trace run."""
    return "\n".join([
        f"# {title} — {datetime.date.today()}", "",
        f"- GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}; commit {commit()}",
        f"- command: `python bench/{script} --build DIR` here, then `W12_CUDA=1 python bench/{script} --libs DIR`",
        "- do_bench µs (graph replay, L2 flushed, median) of cuBLAS, the landed build and the stamped build (same bits); "
        + phase_note, "",
        "| N×K | M | config | CTAs | cuBLAS | landed | stamped | " + " | ".join(phase_cols) + " |",
        "|---" * (7 + len(phase_cols)) + "|", *lines, "", wait_note, "",
        "| N×K | M | config | " + " | ".join(wait_cols) + " |", "|---" * (3 + len(wait_cols)) + "|", *wlines]) + "\n"


def trace_all(lib_dir: Path, cases, runs: int, phases_of, waits_of, ghz_col: int, detail=None) -> tuple:
    """Both tables' rows for `cases`: an iterator of (label 'N×K | M | config', CTAs, the kernel call, cuBLAS's call),
    each case made as it comes, so that its matrix is freed before the next; and detail(label, ctas, replays' words)'s
    lines per case, if given."""
    libs = load_libs(lib_dir)
    lines, wlines, dlines = [], [], []
    for label, ctas, call, cublas in cases:
        assert ctas <= MAX_CTAS
        res = trace_case(libs, call, cublas, ctas, runs, phases_of, waits_of)
        row, wrow = case_rows(label, ctas, res, ghz_col)
        lines.append(row)
        wlines.append(wrow)
        if detail:
            dlines += detail(label, ctas, res[5])
        del call, cublas, res
        torch.cuda.empty_cache()
    return lines, wlines, dlines


def run(lib_dir: Path, runs: int, out: str, x_kinds=("randn",)):
    from kernels import Mat

    from w12.kernels import gemm_cuda as gc

    def cases():
        for (n, k, m, (nt, split), *view), x_kind in ((c, xk) for c in CASES for xk in x_kinds):
            view = bool(view and view[0])
            cfg, mt = gc.WsConfig(nt, split), Mat(n, k, 900 + m)
            x = X_KINDS[x_kind](m, k)
            kind = f"{cfg}{' (8-bit view)' if view else ''}{'' if x_kind == 'randn' else f', X {x_kind}'}"
            yield (f"{n}×{k} | {m} | {kind}", (n + 127) // 128 * ((m + 8 * nt - 1) // (8 * nt)) * split,
                   lambda: mt.run(x, view=view, cuda=cfg), lambda: torch.matmul(x, mt.w.t()))

    lines, wlines, _ = trace_all(lib_dir, cases(), runs, phases, waits, 1)
    text = report(
        "ws kernel: one call's phases from globaltimer stamps", "ws_trace.py",
        f"phases: µs, medians over {runs} flushed replays of the captured call (X reorder + ws kernel); 'reorder end', "
        "'CTA in' and 'last CTA out' from the reorder kernel's first entry, the others per CTA (median, or max)", lines,
        "Where the main loop waits (clock64; consumer warp 0's thread 0 and the producer; medians over the CTAs, then over "
        "the replays): ns per record of the loop, the SM clock, the waits as % of the loop, and a record's fetch time "
        "from the producer's issue to the consumer's full wait returning", wlines, PHASES, WAIT_COLS)
    Path(out, "ws_trace.md").write_text(text)
    print(text)


def cli(doc: str, stamped_source, run_libs, extra=None):
    """The trace scripts' command line: --build DIR writes the landed and the stamped library (stamped_source(text)),
    --libs DIR calls run_libs(args) on the GPU; extra(parser) adds arguments."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", type=Path, help="write the landed and the stamped library here (needs nvcc, no GPU)")
    ap.add_argument("--libs", type=Path, help="run with the libraries of this folder (needs the GPU)")
    ap.add_argument("--rev", default="HEAD", help="with --build: the kernel source to stamp (a revision, `worktree` or "
                    "file:PATH; default HEAD), built beside it unstamped as 'landed'")
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    if extra:
        extra(ap)
    a = ap.parse_args()
    if a.build:
        from ab_kernel import build_libs, source_at
        landed = source_at(a.rev)
        for name, lib in build_libs({"landed": landed, "trace": stamped_source(landed)}, a.build).items():
            print(name, lib)
    elif a.libs:
        run_libs(a, ap)
    else:
        ap.error("give --build DIR or --libs DIR")


def main():
    def x_arg(ap):
        ap.add_argument("--x", default="randn", help="comma-separated X kinds, each case timed with each: "
                        + ", ".join(X_KINDS) + " (default randn)")

    def run_libs(a, ap):
        kinds = a.x.split(",")
        if set(kinds) - set(X_KINDS):
            ap.error(f"--x: unknown kind(s) {sorted(set(kinds) - set(X_KINDS))}; known: {', '.join(X_KINDS)}")
        run(a.libs, a.runs, a.out, kinds)

    cli(__doc__, stamped_source, run_libs, x_arg)


if __name__ == "__main__":
    main()
