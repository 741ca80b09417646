"""Where one stream-kernel call's time goes (CTA start, first record, record loop, segment ends) and which side of its
ring waits, read from %globaltimer and clock64 stamps patched into a copy of kernels/w12_gemv.cu. One GPU call.

    python bench/stream_trace.py --build DIR [--rev REV]            # here (nvcc): the stamped library
    W12_CUDA=1 python bench/stream_trace.py --libs DIR [--out OUT]   # on the GPU

bench/ws_trace.py's method for w12_stream_kernel (its trace buffer, stamp macro and host functions are reused). The
stamped build keeps the kernel's code and adds, per CTA, the globaltimer at entry, after the barrier setup, when
consumer warp 0 first finds a full slot, and when warp 0 leaves its record loop (the CTA's other warps end about
then); clock64 counts of consumer warp 0's waits for a full slot and of its segment ends (scale, escapes, store or
partial and ticket), and of the producer's waits for an empty slot, as fractions of warp 0's loop.  If the consumers
wait on `full` while the producer seldom waits on `empty`, the ring cannot bring the records in fast enough (bytes in
flight × fetch time); if the producer waits and the consumers seldom do, the consumers' chain bounds the loop.  Per
case the stamped output is checked against the landed build's bits; phases are medians over RUNS flushed replays.
A last table per case lists the CTAs that end last (late_ctas): whether the same ones are late on every replay, late
from their first record or in their loop, and alone or with the other CTAs on their SM — the one-wave shapes' slowest
CTAs took 22 µs against a 13 µs median (session 42), and not for their split-row sums (session 43).
"""

import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ws_trace import HOST, PATCHES, cli, cta_rows, loop_waits, report, trace_all  # noqa: E402

# (N, K, M, (ctas per SM, stages, consumer warps[, aligned])): one-wave shapes at 32 rows, each CTA's range in one row
# (the fastest stream configs there, 2026-12-06-stream-kernel-aligned-h100-s46-call1.md) and the equal ranges of s45
CASES = [(4096, 4096, 32, (1, 8, 8, True)), (4096, 4096, 32, (2, 4, 4, True)), (4096, 4096, 32, (2, 4, 4)),
         (6144, 4096, 32, (2, 4, 4, True)), (4096, 14336, 32, (2, 4, 8, True)), (151936, 5120, 32, (2, 4, 4))]

CLK = "w12_clk()"
ME = "warp == 0 && lane == 0"
# w12_sw (per CTA, shared, atomicAdd): 0 warp 0's full-wait cycles, 1 its segment-end cycles, 2 those of its mid-loop
# segment ends (a CTA whose range spans two rows), 3 records, 4 the producer's empty-wait cycles, 5 / 6 clock64 at
# warp 0's first full slot / at its loop's end.  w12_sx (warp 0's segment ends, split): 0 / 1 the scale and escapes
# (all / mid-loop), 2 / 3 a split row's partial store, fence and ticket (all / mid-loop); trace words 4, 5, 6, 15.
REPLACE = [  # (text in the landed source, its stamped form); each must occur once
    ("  const int n = (int)(g1 - g0);\n  if (n == 0) return;\n",
     "  const int n = (int)(g1 - g0);\n  if (n == 0) return;\n"
     "  if (tid == 0) W12_STAMP(W12_CTA + 0);\n  if (tid < 8) w12_sw[tid] = 0;\n"
     "  __shared__ unsigned long long w12_sx[4];\n  if (tid < 4) w12_sx[tid] = 0;\n"),
    ("    mbar_init_fence();\n  }\n  __syncthreads();\n",
     "    mbar_init_fence();\n  }\n  __syncthreads();\n  if (tid == 0) W12_STAMP(W12_CTA + 1);\n"),
    ("      if (i >= stages) mbar_wait(empty + s, ph);\n",
     f"      {{\n        const unsigned long long w12_c0 = {CLK};\n        if (i >= stages) mbar_wait(empty + s, ph);\n"
     f"        if (lane == 0) atomicAdd(&w12_sw[4], {CLK} - w12_c0);\n      }}\n"),
    ("    mbar_wait(full + s, ph);\n    const uint8_t* slot = ring + (size_t)s * SLOT;\n",
     f"    {{\n      const unsigned long long w12_c0 = {ME} ? {CLK} : 0;\n      mbar_wait(full + s, ph);\n"
     f"      if ({ME}) {{\n        const unsigned long long w12_c1 = {CLK};\n"
     "        w12_sw[0] += w12_c1 - w12_c0;\n        w12_sw[3] += 1;\n"
     "        if (i == 0) {\n          W12_STAMP(W12_CTA + 2);\n          w12_sw[5] = w12_c1;\n        }\n      }\n    }\n"
     "    const uint8_t* slot = ring + (size_t)s * SLOT;\n"),
    ("    // ---- the segment of row nb ends here: records [ka, kb] of it\n",
     "    // ---- the segment of row nb ends here: records [ka, kb] of it\n"
     f"    const unsigned long long w12_se = {ME} ? {CLK} : 0;\n"),
    ("    const long row0 = (long)nb * KB;\n",
     f"    unsigned long long w12_sp = 0;\n    if ({ME}) {{\n      w12_sp = {CLK};\n"
     "      w12_sx[0] += w12_sp - w12_se;\n"
     "      if (i + 1 < n) w12_sx[1] += w12_sp - w12_se;\n    }\n    const long row0 = (long)nb * KB;\n"),
    ("      tk = __shfl_sync(0xffffffffu, tk, 0);\n",
     f"      tk = __shfl_sync(0xffffffffu, tk, 0);\n      if ({ME}) {{\n"
     f"        const unsigned long long w12_d = {CLK} - w12_sp;\n        w12_sx[2] += w12_d;\n"
     "        if (i + 1 < n) w12_sx[3] += w12_d;\n      }\n"),
    ("    if (i + 1 == n) break;\n",
     f"    if ({ME}) {{\n      const unsigned long long w12_d = {CLK} - w12_se;\n      w12_sw[1] += w12_d;\n"
     "      if (i + 1 < n) w12_sw[2] += w12_d;\n    }\n    if (i + 1 == n) break;\n"),
    ("    row_start(false);\n  }\n}\n",
     f"    row_start(false);\n  }}\n  if ({ME}) {{\n    w12_sw[6] = {CLK};\n    W12_STAMP(W12_CTA + 3);\n"
     "    unsigned smid;\n    asm volatile(\"mov.u32 %0, %%smid;\" : \"=r\"(smid));\n"
     "    g_ws_trace[W12_CTA + 7] = smid;\n"
     "    for (int w12_i = 0; w12_i < 7; ++w12_i)\n"
     "      g_ws_trace[W12_CTA + 8 + w12_i] = reinterpret_cast<volatile unsigned long long*>(w12_sw)[w12_i];\n"
     "    g_ws_trace[W12_CTA + 4] = w12_sx[0], g_ws_trace[W12_CTA + 5] = w12_sx[1];\n"
     "    g_ws_trace[W12_CTA + 6] = w12_sx[2], g_ws_trace[W12_CTA + 15] = w12_sx[3];\n"
     "  }\n}\n"),
]
PHASES = ["first CTA in", "last CTA in", "setup", "first record", "record loop", "record loop (max)", "last CTA out"]
WAIT_COLS = ["records / CTA", "ns / record", "GHz", "full wait %", "segment ends %", "producer empty wait %"]


def stamped_source(src: str) -> str:
    """kernels/w12_gemv.cu's text `src` with the stamps and the wait counters patched into the stream kernel."""
    header, add = PATCHES[0]  # ws_trace's trace buffer, W12_STAMP, W12_CTA, w12_clk, w12_sw
    assert src.count(header) == 1
    src = src.replace(header, header + add)
    for text, stamped in REPLACE:
        assert src.count(text) == 1, f"bench/stream_trace.py: text not found once in w12_gemv.cu: {text[:60]!r}"
        src = src.replace(text, stamped)
    return src + HOST


def phases(buf: list, ctas: int) -> list:
    """One replay's figures (µs, PHASES) from the trace words, from the first CTA's entry."""
    rows = [r for r in cta_rows(buf, ctas) if r[0]]
    t0 = min(r[0] for r in rows)
    med = lambda i, j: statistics.median(r[j] - r[i] for r in rows) / 1e3  # noqa: E731
    return [0.0, (max(r[0] for r in rows) - t0) / 1e3, med(0, 1), med(1, 2), med(2, 3),
            max(r[3] - r[2] for r in rows) / 1e3, (max(r[3] for r in rows) - t0) / 1e3]


def waits(buf: list, ctas: int) -> list:
    """One replay's wait figures (WAIT_COLS), medians over the CTAs; the loop is warp 0's first full slot → its end."""
    return loop_waits(buf, ctas, 2, 3, lambda w, cyc, ns: [w[3], ns / w[3], cyc / ns, 100 * w[0] / cyc,
                                                           100 * w[1] / cyc, 100 * w[4] / cyc], len(WAIT_COLS))


LATE_COLS = ["CTA", "SM", "records", "exit µs", "first record µs", "record loop µs", "full wait µs",
             "segment ends µs (mid-loop)", "of which escapes", "of which partial, fence, ticket",
             "producer empty wait µs", "latest 5 % in", "its SM's other CTAs: latest exit µs"]


def late_ctas(label: str, ctas: int, bufs: list, show: int = 6) -> list:
    """Which CTAs end last, and are they the same ones on every replay?  Per CTA, medians over the replays of its exit
    (µs from the first CTA's entry), its first record (µs from its setup to warp 0's first full slot), its record loop
    (µs) and, within that loop, warp 0's waits for a full slot, its segment ends (all, and the mid-loop ones of a CTA
    spanning two rows; of those, the scale and escapes, and a split row's partial store, fence and ticket — the rest
    is row sums and stores) and the producer's waits for an empty slot (clock64 counts at the CTA's own clock: loop
    cycles over loop ns), and the latest exit of the other CTAs on its SM in the same replay; the `show` CTAs with the
    latest median exit, each with how many replays had it among the latest 5 % of CTAs and its SM ('varies' if it
    moved between replays), then the median over all CTAs of each column.  A late CTA whose SM's other CTAs end late too
    points at its SM or its memory partition; one that ends late alone, at its own work — and its waits say which:
    full waits, records that reach it late; segment ends, its own row-end work.  Returns the lines of a markdown
    table."""
    per, late, sms = [[] for _ in range(ctas)], [0] * ctas, [set() for _ in range(ctas)]
    for buf in bufs:
        rows = cta_rows(buf, ctas)
        live = [c for c in range(ctas) if rows[c][0]]  # CTAs with records (the others return before any stamp)
        t0 = min(rows[c][0] for c in live)
        exit_us = {c: (rows[c][3] - t0) / 1e3 for c in live}
        for c in sorted(live, key=exit_us.get, reverse=True)[:max(1, len(live) // 20)]:
            late[c] += 1
        on_sm = {}  # SM id -> the CTAs that ran on it in this replay
        for c in live:
            on_sm.setdefault(rows[c][7], []).append(c)
        for c in live:
            r = rows[c]  # stamps 0 entry, 1 setup, 2 first full slot, 3 loop end; 7 SM id; 8 + i: w12_sw[i]
            sms[c].add(r[7])
            mate = max((exit_us[o] for o in on_sm[r[7]] if o != c), default=0.0)
            loop_ns, cyc = r[3] - r[2], r[14] - r[13]
            us = (lambda n: n * loop_ns / cyc / 1e3) if cyc > 0 and loop_ns > 0 else (lambda n: float("nan"))
            per[c].append((exit_us[c], (r[2] - r[1]) / 1e3, loop_ns / 1e3, r[11], us(r[8]), us(r[9]), us(r[10]),
                           us(r[12]), mate, us(r[4]), us(r[5]), us(r[6]), us(r[15])))
    cols = 13  # the figures appended per replay above
    med = {c: [statistics.median(v[i] for v in per[c]) for i in range(cols)] for c in range(ctas) if per[c]}
    exits = sorted(med[c][0] for c in med)
    pct = lambda q: exits[min(len(exits) - 1, int(q * len(exits)))]  # noqa: E731
    out = [f"**{label}**: exit µs median {pct(0.5):.1f}, p90 {pct(0.9):.1f}, max {exits[-1]:.1f} "
           f"({len(bufs)} replays)", "",
           "| " + " | ".join(LATE_COLS) + " |", "|---" * len(LATE_COLS) + "|"]

    def cells(v):  # records, exit, first record, loop, full wait, segment ends, escapes, partials (each: mid-loop),
        #             producer empty wait
        return (f"{v[3]:.0f} | {v[0]:.1f} | {v[1]:.1f} | {v[2]:.1f} | {v[4]:.1f} | {v[5]:.1f} ({v[6]:.1f}) | "
                f"{v[9]:.1f} ({v[10]:.1f}) | {v[11]:.1f} ({v[12]:.1f}) | {v[7]:.1f}")

    for c in sorted(med, key=lambda c: med[c][0], reverse=True)[:show]:
        sm = str(next(iter(sms[c]))) if len(sms[c]) == 1 else "varies"
        out.append(f"| {c} | {sm} | {cells(med[c])} | {late[c]} of {len(bufs)} | {med[c][8]:.1f} |")
    every = [statistics.median(med[c][i] for c in med) for i in range(cols)]
    out.append(f"| all CTAs (median) | | {cells(every)} | | {every[8]:.1f} |")
    return out + [""]


def run(lib_dir: Path, runs: int, out: str):
    from kernels import Mat

    from w12.kernels import gemm_cuda as gc
    sms = torch.cuda.get_device_properties(0).multi_processor_count

    def cases():
        for n, k, m, (cps, stages, warps, *al) in CASES:
            cfg, mt = gc.StreamConfig(cps, stages, warps=warps, aligned=bool(al)), Mat(n, k, 900 + m)
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            nb, kb = (n + 127) // 128, k // 64
            yield (f"{n}×{k} | {m} | stream {cps}/{stages}, {warps} warps" + (", aligned" if al else ""),
                   min(gc.stream_ctas(cfg, nb, kb, sms), nb * kb), lambda: mt.run(x, cuda=cfg),
                   lambda: torch.matmul(x, mt.w.t()))

    lines, wlines, late = trace_all(lib_dir, cases(), runs, phases, waits, 2, late_ctas)
    text = report(
        "stream kernel: one call's phases from globaltimer stamps", "stream_trace.py",
        f"phases: µs, medians over {runs} flushed replays, 'CTA in' and 'last CTA out' from the first CTA's entry, the "
        "others per CTA (median, or max); 'record loop' is consumer warp 0's, from its first full slot to its end", lines,
        "Where the record loop waits (clock64; consumer warp 0's lane 0 and the producer's; medians over the CTAs, then "
        "over the replays), as % of warp 0's loop", wlines, PHASES, WAIT_COLS)
    text += "\n".join(["", "## The CTAs that end last", "", *late])
    Path(out, "stream_trace.md").write_text(text)
    print(text)


if __name__ == "__main__":
    cli(__doc__, stamped_source, lambda a, ap: run(a.libs, a.runs, a.out))
