"""Where the ws kernel's time per record goes: the landed kernel beside builds with parts of its main loop removed
(wrong results, timing only). One GPU call.

    python bench/ws_diag.py --build DIR [--variants 0,24,28] [--new NAME=REV ...]   # here (nvcc): a library each
    W12_CUDA=1 python bench/ws_diag.py --libs DIR [--out OUT]    # on the GPU

Variants (bits of W12_WS_DIAG, patched into a copy of kernels/w12_gemv.cu's ws consumer loop):
  0 full           the landed kernel (checked against the reference first); in every variant the nt = 16 loop
                   takes records one at a time (the record-pair loop switched off), so the parts compare
  1 no decode      the A fragments are the record's raw words (LDS kept, no PRMT/LOP3 decode)
  2 no mma         no wgmma / commit / wait: the decoded fragments are folded into one accumulator (8 LOP3)
  3 neither        loads only
  5 mma only       no LDS, no decode: constant fragments, wgmma as landed
  7 ring only      the producer's ring, the barriers, the escapes and the epilogue
  8 no escapes     the main loop adds no escape corrections (the prologue and the epilogue kept)
  13 mma only, no escapes
  16 no ring       the producer copies nothing and the consumers do not wait for it (stale shared memory): the
                   consumers' chain alone; 24 = no ring, no escapes; 28 = mma only, no ring, no escapes
  32 offset        warpgroup 1 starts ~400 clocks after warpgroup 0 (a spin on clock64): out of lockstep while
                   nothing re-synchronizes them (a ring that keeps ahead); 56 = 24 + offset, 60 = 28 + offset
  new*             kernels/w12_gemv.cu at --new NAME=REV (a revision or `worktree`): must give the full build's bits
--variants picks which to build (0 always; all of them: ~4 MB each, near the device's 64 MiB carry).
If time(full) ≈ time(no decode) + time(no mma) − time(neither), the decode and the MMAs do not overlap.
"""

import argparse
import ctypes
import datetime
import os
import re
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from revision import commit  # noqa: E402  (bench/revision.py)
VARIANTS = {0: "full", 1: "no decode", 2: "no mma", 3: "neither", 5: "mma only", 7: "ring only", 8: "no escapes",
            13: "mma only, no escapes", 24: "no ring, no escapes", 28: "mma only, no ring, no escapes",
            32: "offset", 56: "no ring, no escapes, offset", 60: "mma only, no ring, no escapes, offset"}
CASES = [(151936, 5120, 32), (151936, 5120, 128), (28672, 4096, 32), (28672, 4096, 128), (6144, 4096, 32),
         (6144, 4096, 128), (4096, 14336, 64)]
BITS = [(1000, 4160, 48, "WsConfig(8, 3)"), (300, 1024, 128, "WsConfig(16, 1)"), (300, 1088, 20, "WsConfig(4, 3)"),
        (200, 64 * 7, 9, "WsConfig(2, 1)"), (300, 1088, 128, "WsConfig(16, 1)"), (1000, 4160, 100, "WsConfig(16, 3)")]

# The one-record loop's text patches: each anchor occurs once in the kernel (ESCAPES: one or more lines, each an escape
# call of the loop's record — ws_escapes_to, or a variant's form beside it — never the helpers' own bodies: the loop's
# calls pass the warp's exponents as `s_e + 16 * warp`).
DECODE = "      ws_decode<VIEW>(slot, v0, v1, n0, n1, nkeep, fa);\n"
MMA = "      fence_acc(acc);\n      wg_fence();\n      ws_mma<NT>(acc, fa, saddr(slot));\n      wg_commit();\n"
WAIT0 = "      wg_wait0();\n      __syncwarp();\n      if (lane == 0) mbar_arrive(empty + s);"
ESCAPES = re.compile(r"^( +)(ws_escapes\w*<[\w, ]+>\(my_toff, my_ent, e_lo, i, a, slot, s_e \+ 16 \* warp, .*;)\n",
                     re.M)
WAIT = "      mbar_wait(full + s, (i / STAGES) & 1);\n"  # the consumers' wait in the one-record loop
PRODUCE = "    ws_produce<NT, VIEW, STAGES>(ring, full, empty, rec, xq, nb, KB, a, nrec, Mpad, m0, lane, wfirst != 0);\n"
START = "    int i = 0;\n"
PAIRS = re.compile(r"for \(; [^;]* && i \+ 1 < nrec; i \+= 2\)")  # the record-pair loop: off in every variant
ANCHORS = ("DECODE", "MMA", "WAIT0", "WAIT", "PRODUCE", "START")
DECODE_PATCH = """#if W12_WS_DIAG & 4
#pragma unroll
      for (int k = 0; k < 4; ++k)
        for (int j = 0; j < 4; ++j) fa[k][j] = 0x3C003C00u ^ (uint32_t)(i * 16 + 4 * k + j);
#elif W12_WS_DIAG & 1
      {
        const uint4 qa = *reinterpret_cast<const uint4*>(slot + v0), qb = *reinterpret_cast<const uint4*>(slot + v1);
        const uint4 ra = *reinterpret_cast<const uint4*>(slot + n0), rb = *reinterpret_cast<const uint4*>(slot + n1);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          fa[k][0] = word(qa, k); fa[k][1] = word(qb, k); fa[k][2] = word(ra, k); fa[k][3] = word(rb, k);
        }
      }
#else
""" + DECODE + "#endif\n"
FOLD = """      {
        uint32_t h = 0;
#pragma unroll
        for (int k = 0; k < 4; ++k) h ^= fa[k][0] ^ fa[k][1] ^ fa[k][2] ^ fa[k][3];
        acc[0][0] += __uint_as_float(h & 0x3FFFFFu);
      }
"""


def check_anchors(src: str):
    """AssertionError unless every anchor occurs once in the kernel's text `src` and the loop has an escape call."""
    for name in ANCHORS:
        assert src.count(globals()[name]) == 1, f"bench/ws_diag.py: {name} does not occur once in w12_gemv.cu"
    assert ESCAPES.search(src), "bench/ws_diag.py: no escape call of the one-record loop in w12_gemv.cu"
    assert len(PAIRS.findall(src)) == 1, "bench/ws_diag.py: PAIRS does not occur once in w12_gemv.cu"


def variant_source(diag: int, src: str) -> str:
    """The kernel's text `src` with W12_WS_DIAG = diag: 1 decode → raw words, 4 → constants; 2 the MMA → a fold (and no
    wait); 8 the loop's escape calls → nothing; 16 no ring; 32 warpgroup 1 late; the pair loop off in every variant."""
    check_anchors(src)
    src = (src.replace(DECODE, DECODE_PATCH).replace(MMA, f"#if W12_WS_DIAG & 2\n{FOLD}#else\n{MMA}#endif\n")
           .replace(WAIT0, "#if !(W12_WS_DIAG & 2)\n" + WAIT0.replace("\n", "\n#endif\n", 1)))
    src = PAIRS.sub("for (; false && i + 1 < nrec; i += 2)", src)
    src = ESCAPES.sub(lambda mt: f"#if W12_WS_DIAG & 8\n{mt[1]};\n#else\n{mt[1]}{mt[2]}\n#endif\n", src)
    offset = "    if (warp >= 4) {\n      const long long t0 = clock64();\n      while (clock64() - t0 < 400) {}\n    }\n"
    for text, cond, code in [(WAIT, "!(W12_WS_DIAG & 16)", WAIT), (PRODUCE, "!(W12_WS_DIAG & 16)", PRODUCE),
                             (START, "W12_WS_DIAG & 32", offset)]:  # code under #if cond, in place of / before text
        src = src.replace(text, f"#if {cond}\n{code}#endif\n" + (text if code is not text else ""))
    return f"#define W12_WS_DIAG {diag}\n" + src


def config_for(gc, n, k, m):
    cfg = gc.WS_TABLE.get((n, k, gc.m_bucket(m)))
    if cfg is not None:
        return cfg
    nt, split = next(v for v in gc.WS_NTS if m <= 8 * v), 1
    tiles = (n + 127) // 128 * ((m + 8 * nt - 1) // (8 * nt))
    while split < 8 and tiles * split * 2 <= 264 and split * 2 <= k // 64:  # about two CTAs per SM
        split *= 2
    return gc.WsConfig(nt, split)


def run(libs: dict, rounds: int, out: str):
    from kernels import Mat, bench, rel

    from w12.kernels import gemm_cuda as gc
    cdlls = {d: ctypes.CDLL(str(p)) for d, p in libs.items()}
    news = [d for d in cdlls if str(d).startswith("new")]
    checks = []
    for n, k, m, cfg in [(n, k, m, eval("gc." + c)) for n, k, m, c in BITS]:  # odd record counts per split and partial tiles: the new builds' bits, not timed
        mt = Mat(n, k, 17 + m)
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        for view in (False, True):
            gc.library = lambda lib=cdlls[0]: lib
            y0 = mt.run(x, view=view, cuda=cfg)
            err = float("nan") if view else rel(y0, x.float() @ mt.w.float().t())  # the view: bits only
            for name in news:
                gc.library = lambda lib=cdlls[name]: lib
                same = torch.equal(mt.run(x, view=view, cuda=cfg).view(torch.int16), y0.view(torch.int16))
                checks.append(f"- {n}×{k} M={m} {cfg}{' view' if view else ''}: full rel. error {err:.1e}; {name} "
                              f"same bits {same}")
                print(checks[-1], flush=True)
    lines, mats = [], {}
    for n, k, m in CASES:
        if (n, k) not in mats:
            mats.clear()
            torch.cuda.empty_cache()
            mats[(n, k)] = Mat(n, k, 700 + n % 97)
        mt = mats[(n, k)]
        cfg = config_for(gc, n, k, m)
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        t_cb = bench(lambda: torch.matmul(x, mt.w.t()))
        gc.library = lambda lib=cdlls[0]: lib
        y0 = mt.run(x, cuda=cfg)
        err = rel(y0, x.float() @ mt.w.float().t())
        assert err < 1e-2, f"full build wrong: {n}x{k} M={m} rel {err:.2e}"
        same = []
        for name in [d for d in cdlls if str(d).startswith("new")]:
            gc.library = lambda lib=cdlls[name]: lib
            same.append(f"{name} {torch.equal(mt.run(x, cuda=cfg).view(torch.int16), y0.view(torch.int16))}")
        same = ", ".join(same) or "-"
        times = {d: [] for d in cdlls}
        order = list(cdlls)
        for r in range(rounds):
            for d in order[r % len(order):] + order[:r % len(order)]:
                gc.library = lambda lib=cdlls[d]: lib
                times[d].append(bench(lambda: mt.run(x, cuda=cfg)))
        t = {d: statistics.median(v) for d, v in times.items()}
        recs = (n + 127) // 128 * (k // 64)
        ns_rec = {d: t[d] * 1e3 / (recs / 132) for d in t}  # ns per record per SM (132 SMs, all busy)
        add = t[1] + t[2] - t[3] if {1, 2, 3} <= set(t) else float("nan")
        row = (f"| {n}×{k} | {m} | {cfg} | {t_cb:.1f} | {err:.1e} | {same} | "
               + " | ".join(f"{t[d]:.1f} ({ns_rec[d]:.0f})" for d in cdlls) + f" | {add:.1f} |")
        print(row, flush=True)
        lines.append(row)
    text = "\n".join([
        f"# ws kernel: time with parts of the main loop removed — {datetime.date.today()}", "",
        f"- GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}; commit {commit()}",
        "- command: `python bench/ws_diag.py --build DIR` here, then `W12_CUDA=1 python bench/ws_diag.py --libs DIR`",
        f"- µs: CUDA graph replay, do_bench, L2 flushed, median of {rounds} interleaved rounds; in brackets ns per "
        "record per SM (records / 132); 'additive' = no decode + no mma − neither; variants: "
        + ", ".join(f"{d} {v}" for d, v in VARIANTS.items() if d in cdlls) + ", new = the worktree's kernel", "",
        "| N×K | M | config | cuBLAS µs | full: rel. error | new* = full bits | "
        + " | ".join(VARIANTS.get(d, d) for d in cdlls) + " | additive |", "|---" * (7 + len(cdlls)) + "|",
        *lines, "", "Bits of the new builds on odd record counts and partial tiles:", *checks]) + "\n"
    Path(out, "ws_diag.md").write_text(text)
    print(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", type=Path, help="write one library per variant here (needs nvcc, no GPU)")
    ap.add_argument("--libs", type=Path, help="time the libraries of this folder (needs the GPU)")
    ap.add_argument("--new", action="append", help="NAME=REV (git revision or `worktree`; NAME starts with `new`): a "
                    "build to check against the full build's bits and time beside it; repeatable")
    ap.add_argument("--variants", default=",".join(map(str, VARIANTS)), help="which variants to build (0 always)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    if a.build:
        from ab_kernel import build_libs, source_at
        head = source_at("HEAD")
        sources = {f"diag{d}": variant_source(d, head) for d in sorted({0, *map(int, a.variants.split(","))})}
        for spec in a.new or []:
            name, rev = spec.split("=", 1)
            sources[name] = source_at(rev)
        for name, lib in build_libs(sources, a.build).items():
            print(name, lib)
    elif a.libs:
        libs = {d: a.libs / f"w12_gemv_diag{d}.so" for d in VARIANTS if (a.libs / f"w12_gemv_diag{d}.so").exists()}
        for lib in sorted(a.libs.glob("w12_gemv_new*.so")):
            libs[lib.stem.removeprefix("w12_gemv_")] = lib
        run(libs, a.rounds, a.out)
    else:
        ap.error("give --build or --libs")


if __name__ == "__main__":
    main()
