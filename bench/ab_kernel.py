"""Two or more builds of kernels/w12_gemv.cu side by side at small M: same bits first, then timed. One GPU call.

    python bench/ab_kernel.py --build DIR [--rev NAME=REV ...]    # here (nvcc); default old=HEAD new=worktree
    W12_CUDA=1 python bench/ab_kernel.py --libs DIR [--m 1,2] [--rounds 3] [--out OUT]   # on the GPU

A change to the skinny kernel that must not change a bit (an epilogue, a load qualifier, a pipeline) is judged against
the build it replaces in the same process, not against a table from another day (run-to-run spread on the H200 is
about ±2 %). --build writes one library per NAME (REV: a git revision, `worktree` for the file as it is now, or
file:PATH for a variant written elsewhere, e.g. the worktree with other #define defaults) with cuda_build's flags but
-lineinfo. On the GPU, for every shape of bench/kernels.py and every M of --m, W12 and view, with the config gemm_cuda
dispatches: every library's output is compared with the first library's bits (one with other bits is listed — its
largest difference, and whether it repeats its own bits — and its cells marked ≠); then each is timed as
bench/kernels.py times (CUDA graph replay, do_bench, L2 flushed, median) in --rounds interleaved rounds (the median
round kept), beside cuBLAS. Prints and writes OUT/ab_kernel.md, rewritten after every row so that a call that dies (a
kernel that faults or hangs: run it under `timeout`) keeps what it measured.
"""

import argparse
import ctypes
import datetime
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
ROOT = Path(__file__).resolve().parents[1]
SOURCE = "kernels/w12_gemv.cu"


def build_libs(sources: dict, out: Path) -> dict:
    """nvcc (cuda_build's flags but -lineinfo: 4 MB per library instead of 11) of each name -> source text, in
    parallel; returns name -> library path."""
    from concurrent.futures import ThreadPoolExecutor

    from w12.kernels import cuda_build
    out.mkdir(parents=True, exist_ok=True)
    flags = [f for f in cuda_build.FLAGS if f != "-lineinfo"]

    def one(name):
        src = out / f"w12_gemv_{name.replace(':', '_')}.cu"
        src.write_text(sources[name])
        subprocess.run([cuda_build.nvcc_path(), *flags, "-o", str(src.with_suffix(".so")), str(src)], check=True)
        src.unlink()
        return src.with_suffix(".so")

    with ThreadPoolExecutor(len(sources)) as pool:
        return dict(zip(sources, pool.map(one, sources)))


def source_at(rev: str) -> str:
    if rev == "worktree":
        return (ROOT / SOURCE).read_text()
    if rev.startswith("file:"):  # a variant written elsewhere (e.g. the worktree with other #define defaults)
        return Path(rev[5:]).read_text()
    return subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{SOURCE}"], check=True, capture_output=True,
                          text=True).stdout


def resolve(rev: str) -> str:
    """A revision's short hash (`worktree` stays as it is), for the report."""
    if rev == "worktree" or rev.startswith("file:"):
        return rev
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", rev], check=True, capture_output=True,
                          text=True).stdout.strip()


def run_libs(libs: dict, ms, rounds: int, title: str, command: str, out: str, fname: str):
    """Bits of every library against the first one's, then interleaved timing (see the module docstring)."""
    from kernels import SHAPES, Mat, bench

    from w12.kernels import gemm_cuda as gc
    cdlls = {name: ctypes.CDLL(str(path)) for name, path in libs.items()}
    names = list(cdlls)
    keys = [(m, view) for m in ms for view in (False, True)]
    ratios = {(name, key): [] for name in names for key in keys}
    lines, mismatches = [], []

    def report(done=False):  # OUT/fname, rewritten after every row: a call that dies keeps what it measured
        geo = {key: math.exp(sum(map(math.log, r)) / len(r)) if r else float("nan") for key, r in ratios.items()}
        bits = (f"every library gave {names[0]}'s bits on every shape and M (W12 and view)" if not mismatches
                else "see the list at the end (cells marked ≠)")
        text = "\n".join([
            f"# {title} — {datetime.date.today()}", "",
            *([] if done else [f"**Incomplete**: written after {len(lines)} rows.", ""]),
            f"- GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}; "
            f"commit {os.environ.get('W12_REV', '?')}",
            f"- command: {command}",
            f"- bits: {bits}; µs: CUDA graph replay, do_bench, L2 flushed, median of {rounds} interleaved rounds; "
            "configs as dispatched (gemm_cuda.dispatched_config)", "",
            "| geomean vs cuBLAS | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|",
            *(f"| M = {m} {'view' if view else 'W12'} | " + " | ".join(f"{geo[(v, (m, view))]:.3f}" for v in names)
              + " |" for m, view in keys), "",
            "| N×K | M | cuBLAS µs | " + " | ".join(f"W12 {v}" for v in names) + " | "
            + " | ".join(f"view {v}" for v in names) + " |",
            "|---" * (3 + 2 * len(names)) + "|", *lines,
            *(["", f"Not {names[0]}'s bits:", *mismatches] if mismatches else [])]) + "\n"
        with open(os.path.join(out, fname), "w") as fh:
            fh.write(text)
        return text

    for si, (n, k) in enumerate(SHAPES):
        mt = Mat(n, k, 300 + si)
        for m in ms:
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            t_cb = bench(lambda: torch.matmul(x, mt.w.t()))
            cells = []
            for view in (False, True):
                cfg = gc.dispatched_config(m, n, k, view)
                ref, wrong = None, set()
                for name in names:
                    gc.library = lambda lib=cdlls[name]: lib
                    y = mt.run(x, view=view, cuda=cfg)
                    ref = y if ref is None else ref
                    if not torch.equal(y.view(torch.int16), ref.view(torch.int16)):  # reported, timed, marked ≠
                        again = [torch.equal(mt.run(x, view=view, cuda=cfg).view(torch.int16), y.view(torch.int16))
                                 for _ in range(3)]
                        diff = ((y.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
                        mismatches.append(f"- {name} {n}×{k} M={m} {'view' if view else 'W12'} {cfg}: not "
                                          f"{names[0]}'s bits (max |Δ| / max |ref| {diff:.1e}; its own bits on 3 "
                                          f"reruns: {again})")
                        print(mismatches[-1], flush=True)
                        wrong.add(name)
                times = {name: [] for name in names}
                for r in range(rounds):
                    for name in names[r % len(names):] + names[:r % len(names)]:
                        gc.library = lambda lib=cdlls[name]: lib
                        times[name].append(bench(lambda: mt.run(x, view=view, cuda=cfg)))
                for name in names:
                    t = statistics.median(times[name])
                    ratios[(name, (m, view))].append(t_cb / t)
                    cells.append(f"{t:.1f}" + (" ≠" if name in wrong else ""))
            row = f"| {n}×{k} | {m} | {t_cb:.1f} | " + " | ".join(cells) + " |"
            print(row, flush=True)
            lines.append(row)
            report()
        del mt
        torch.cuda.empty_cache()
    print(report(done=True), flush=True)


def build_or_run(doc: str, build, run):
    """The command line of a variant script: `--build DIR` calls build(DIR) (here, nvcc), `--libs DIR [--out OUT]` calls
    run(DIR, OUT) (on the GPU)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", type=Path, help="write the libraries here (needs nvcc, no GPU)")
    ap.add_argument("--libs", type=Path, help="time the libraries of this folder (needs the GPU)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    if not (a.build or a.libs):
        ap.error("give --build DIR or --libs DIR")
    build(a.build) if a.build else run(a.libs, a.out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", type=Path, help="write the libraries here (needs nvcc, no GPU)")
    ap.add_argument("--rev", action="append", default=[], help="NAME=REV (a git revision, `worktree`, or file:PATH of a variant source); repeatable")
    ap.add_argument("--libs", type=Path, help="time the libraries of this folder (needs the GPU)")
    ap.add_argument("--m", default="1,2", help="comma-separated M values (default 1,2)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    if a.build:
        revs = dict(r.split("=", 1) for r in a.rev) or {"old": "HEAD", "new": "worktree"}
        for name, lib in build_libs({name: source_at(rev) for name, rev in revs.items()}, a.build).items():
            print(name, lib)
        (a.build / "names.txt").write_text("".join(f"{name}={resolve(rev)}\n" for name, rev in revs.items()))
    elif a.libs:
        revs = dict(line.split("=", 1) for line in (a.libs / "names.txt").read_text().split())
        run_libs({name: a.libs / f"w12_gemv_{name}.so" for name in revs}, [int(v) for v in a.m.split(",")],
                 a.rounds, "Skinny-kernel builds side by side (bench/ab_kernel.py)",
                 f"`python bench/ab_kernel.py --build DIR` (here; libraries {', '.join(f'{n} = {r}' for n, r in revs.items())}),"
                 f" then `W12_CUDA=1 python bench/ab_kernel.py --libs DIR --m {a.m} --rounds {a.rounds}`", a.out,
                 "ab_kernel.md")
    else:
        ap.error("give --build DIR or --libs DIR")


if __name__ == "__main__":
    main()
