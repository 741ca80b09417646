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
kernel that faults or hangs: run it under `timeout`) keeps what it measured. With --clocks, nvidia-smi samples the SM
clock and the board power every 50 ms (OUT/clocks.csv), and the report adds, per library and M, the median SM clock
and the highest power drawn while that library (or cuBLAS) was being timed: whether a build runs at a lower clock.
With --no-escapes every matrix runs with empty escape lists (OUT/ab_kernel-noesc.md; W12 results wrong, timing
only): beside a run without it, what each build's escape path costs. With --skinny the ws and stream tables are
dropped in the process, so that every shape at 9–64 rows runs the skinny kernel's TABLE config: a change to the
skinny kernel's nt ≥ 2 loop is then timed on all ten shapes, not only on those the tables give it.

Before anything is timed, a child process runs every library once on every shape and M (each call synchronised): a
library that hangs (no call returns within --probe-s seconds) or faults there is dropped and named in the report, and
the rest are timed, so one broken variant does not cost the call its other builds (--probe-s 0 skips the screen).
"""

import argparse
import ctypes
import datetime
import math
import os
import selectors
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from revision import commit  # noqa: E402  (bench/revision.py)
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


class Clocks:
    """nvidia-smi sampling the SM clock (MHz) and the board power (W) every 50 ms into `path`, and the wall-clock spans
    during which each key (a library and a bucket) was timed; a no-op where nvidia-smi is missing."""

    # under `timeout`, so that a run killed from outside does not leave the sampler running
    QUERY = ["timeout", "900", "nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw", "--format=csv,noheader,nounits",
             "-lms", "50"]

    def __init__(self, path: str):
        self.path, self.spans, self.proc = path, {}, None
        with open(path, "w") as fh:  # the child keeps its own copy of the descriptor
            try:
                self.proc = subprocess.Popen(self.QUERY, stdout=fh, stderr=subprocess.DEVNULL)
            except OSError:
                pass

    def timed(self, key, fn):
        """fn(), its wall-clock span recorded under key."""
        t0 = datetime.datetime.now()
        try:
            return fn()
        finally:
            self.spans.setdefault(key, []).append((t0, datetime.datetime.now()))

    def stop(self) -> dict:
        """key -> (median SM MHz, max W, samples) over the samples inside the key's spans."""
        if self.proc is None:
            return {}
        self.proc.terminate()
        self.proc.wait()
        return span_stats(parse_clocks(Path(self.path).read_text()), self.spans)


def parse_clocks(text: str) -> list:
    """nvidia-smi's CSV lines `2026/12/04 23:05:01.123, 1980, 512.34` -> [(datetime, MHz, W)]; others skipped."""
    rows = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        try:
            rows.append((datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f"), float(parts[1]), float(parts[2])))
        except (ValueError, IndexError):
            continue
    return rows


def span_stats(rows: list, spans: dict) -> dict:
    """key -> (median MHz, max W, n) of the samples that fall inside any of the key's spans (keys without any: left out)."""
    stats = {}
    for key, ivs in spans.items():
        inside = [(mhz, w) for t, mhz, w in rows if any(a <= t <= b for a, b in ivs)]
        if inside:
            stats[key] = (statistics.median(m for m, _ in inside), max(w for _, w in inside), len(inside))
    return stats


def probe_child(libs: dict, ms):
    """The screen's child (--probe): every library once on every shape, M and kind, each call synchronised, with
    `run NAME WHERE` printed before it, `mat WHERE` before each matrix is built, and `done` at the end."""
    from kernels import SHAPES, Mat

    from w12.kernels import gemm_cuda as gc
    cdlls = {name: ctypes.CDLL(str(path)) for name, path in libs.items()}
    for si, (n, k) in enumerate(SHAPES):
        print(f"mat {n}×{k}", flush=True)
        mt = Mat(n, k, 300 + si)
        for m in ms:
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            for view in (False, True):
                cfg = gc.dispatched_config(m, n, k, view)
                for name, lib in cdlls.items():
                    print(f"run {name} {n}×{k} M={m} {'view' if view else 'W12'}", flush=True)
                    gc.library = lambda lib=lib: lib
                    mt.run(x, view=view, cuda=cfg)
                    torch.cuda.synchronize()
        del mt
        torch.cuda.empty_cache()
    print("done", flush=True)


def screen(child_cmd, names: list, timeout_s: float) -> dict:
    """Runs child_cmd(names) (a command line printing probe_child's lines) until it prints `done`; a library that hangs
    (no line for timeout_s seconds after its `run`) or fails (the child exits after its `run`) is dropped and the child
    restarted without it. Returns {dropped name: why}. Raises RuntimeError when the child fails, or is silent for
    10 · timeout_s, outside a library's call."""
    dropped = {}
    while left := [n for n in names if n not in dropped]:
        current, kind, detail = watch_child(child_cmd(left), timeout_s)
        if kind == "done":
            return dropped
        if current is None:
            raise RuntimeError(f"the probe child failed outside any library's call: {detail}" if kind == "failed"
                               else f"the probe child was silent for {detail} outside any library's call")
        name, where = current
        dropped[name] = (f"hung (no return within {detail}) at {where}" if kind == "hung"
                         else f"failed at {where}: {detail}")
    return dropped


def watch_child(cmd: list, timeout_s: float) -> tuple:
    """Runs cmd, reading probe_child's lines as they come: (the running call's (name, where) or None, "done" | "hung" |
    "failed", the silence allowed or the child's last stderr line). Between calls — CUDA's start, a matrix built, a
    first Triton compile — ten times timeout_s is allowed."""
    with tempfile.TemporaryFile("w+") as err, selectors.DefaultSelector() as sel:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err)
        sel.register(proc.stdout, selectors.EVENT_READ)
        buf, current, done = b"", None, False
        while True:
            limit = timeout_s if current else 10 * timeout_s
            if not sel.select(limit):  # silent: the running call has not returned
                proc.kill()
                proc.wait()
                return current, "hung", f"{limit:.0f} s"
            chunk = os.read(proc.stdout.fileno(), 65536)
            *lines, buf = (buf + chunk).split(b"\n")
            for line in (ln.decode() for ln in lines):
                words = line.split(" ", 2)
                current = (words[1], words[2]) if words[0] == "run" and len(words) == 3 else None
                done = done or line == "done"
            if not chunk:  # the child exited
                rc = proc.wait()
                if rc == 0 and done:
                    return current, "done", ""
                err.seek(0)
                return current, "failed", (err.read().strip().splitlines() or [f"exit status {rc}"])[-1]


def run_libs(libs: dict, ms, rounds: int, title: str, command: str, out: str, fname: str, clocks: bool = False,
             dropped: dict = None, no_escapes: bool = False):
    """Bits of every library against the first one's, then interleaved timing (see the module docstring).
    no_escapes: every matrix with empty escape lists (W12 wrong, timing only: the builds without their escape path)."""
    from kernels import SHAPES, Mat, bench

    from w12.kernels import gemm_cuda as gc

    os.makedirs(out, exist_ok=True)
    cdlls = {name: ctypes.CDLL(str(path)) for name, path in libs.items()}
    names = list(cdlls)
    keys = [(m, view) for m in ms for view in (False, True)]
    ratios = {(name, key): [] for name in names for key in keys}
    lines, mismatches = [], []
    sampler = Clocks(os.path.join(out, "clocks.csv")) if clocks else None
    timed = sampler.timed if sampler else (lambda key, fn: fn())

    def clock_lines(stats: dict) -> list:
        if not stats:
            return []
        cell = lambda key: "{:.0f} MHz / {:.0f} W".format(*stats[key][:2]) if key in stats else "–"  # noqa: E731
        return ["", "SM clock (median) / board power (max) while each was timed (nvidia-smi every 50 ms, OUT/clocks.csv):",
                "", "| bucket | cuBLAS | " + " | ".join(names) + " |", "|---" * (len(names) + 2) + "|",
                *(f"| M = {m} {'view' if view else 'W12'} | {cell(('cuBLAS', m))} | "
                  + " | ".join(cell((name, (m, view))) for name in names) + " |" for m, view in keys)]

    def report(done=False, stats=None):  # OUT/fname, rewritten after every row: a call that dies keeps what it measured
        geo = {key: math.exp(sum(map(math.log, r)) / len(r)) if r else float("nan") for key, r in ratios.items()}
        bits = (f"every library gave {names[0]}'s bits on every shape and M (W12 and view)" if not mismatches
                else "see the list at the end (cells marked ≠)")
        text = "\n".join([
            f"# {title} — {datetime.date.today()}", "",
            *([] if done else [f"**Incomplete**: written after {len(lines)} rows.", ""]),
            f"- GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}; "
            f"commit {commit()}",
            f"- command: {command}",
            f"- bits: {bits}; µs: CUDA graph replay, do_bench, L2 flushed, median of {rounds} interleaved rounds; "
            "configs as dispatched (gemm_cuda.dispatched_config)", "",
            "| geomean vs cuBLAS | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|",
            *(f"| M = {m} {'view' if view else 'W12'} | " + " | ".join(f"{geo[(v, (m, view))]:.3f}" for v in names)
              + " |" for m, view in keys), "",
            "| N×K | M | cuBLAS µs | " + " | ".join(f"W12 {v}" for v in names) + " | "
            + " | ".join(f"view {v}" for v in names) + " |",
            "|---" * (3 + 2 * len(names)) + "|", *lines, *clock_lines(stats or {}),
            *(["", "Dropped by the screen before timing:", *(f"- {n}: {why}" for n, why in dropped.items())]
              if dropped else []),
            *(["", f"Not {names[0]}'s bits:", *mismatches] if mismatches else [])]) + "\n"
        with open(os.path.join(out, fname), "w") as fh:
            fh.write(text)
        return text

    for si, (n, k) in enumerate(SHAPES):
        mt = Mat(n, k, 300 + si)
        if no_escapes:
            mt.escapes, mt.offs, mt.cols = mt.no_escapes()
        for m in ms:
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            t_cb = timed(("cuBLAS", m), lambda: bench(lambda: torch.matmul(x, mt.w.t())))
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
                        times[name].append(timed((name, (m, view)), lambda: bench(lambda: mt.run(x, view=view, cuda=cfg))))
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
    print(report(done=True, stats=sampler.stop() if sampler else None), flush=True)


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
    ap.add_argument("--clocks", action="store_true", help="sample the SM clock and power with nvidia-smi while timing")
    ap.add_argument("--no-escapes", action="store_true",
                    help="run W12 with empty escape lists (wrong results, timing only): what each build's escape path costs")
    ap.add_argument("--skinny", action="store_true",
                    help="drop the ws and stream tables in this process, so that every shape at 9–64 rows runs the "
                         "skinny kernel's TABLE config (a change to the skinny kernel's nt ≥ 2 loop, judged on every shape)")
    ap.add_argument("--probe-s", type=float, default=60,
                    help="seconds a library's call may take in the screen before it counts as hung (0: no screen)")
    ap.add_argument("--probe", help=argparse.SUPPRESS)  # NAME,NAME: the screen's child
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    if a.build:
        revs = dict(r.split("=", 1) for r in a.rev) or {"old": "HEAD", "new": "worktree"}
        for name, lib in build_libs({name: source_at(rev) for name, rev in revs.items()}, a.build).items():
            print(name, lib)
        (a.build / "names.txt").write_text("".join(f"{name}={resolve(rev)}\n" for name, rev in revs.items()))
    elif a.libs:
        if a.skinny:
            from w12.kernels import gemm_cuda as gc
            gc.WS_TABLE.clear()
            gc.STREAM_TABLE.clear()
        ms, lib = [int(v) for v in a.m.split(",")], (lambda name: a.libs / f"w12_gemv_{name}.so")
        if a.probe:
            return probe_child({name: lib(name) for name in a.probe.split(",")}, ms)
        revs = dict(line.split("=", 1) for line in (a.libs / "names.txt").read_text().split())
        dropped = screen(lambda left: [sys.executable, *sys.orig_argv[1:], "--probe", ",".join(left)], list(revs),
                         a.probe_s) if a.probe_s > 0 else {}
        for name, why in dropped.items():
            print(f"dropped {name}: {why}", flush=True)
        run_libs({name: lib(name) for name in revs if name not in dropped}, ms, a.rounds,
                 "W12 kernel builds side by side (bench/ab_kernel.py)"
                 + (", W12 with empty escape lists (wrong results, timing only)" if a.no_escapes else ""),
                 f"`python bench/ab_kernel.py --build DIR` (here; libraries {', '.join(f'{n} = {r}' for n, r in revs.items())}),"
                 f" then `W12_CUDA=1 python bench/ab_kernel.py --libs DIR --m {a.m} --rounds {a.rounds}"
                 f"{' --clocks' if a.clocks else ''}{' --no-escapes' if a.no_escapes else ''}{' --skinny' if a.skinny else ''}`", a.out,
                 "ab_kernel-noesc.md" if a.no_escapes else "ab_kernel.md", clocks=a.clocks, dropped=dropped,
                 no_escapes=a.no_escapes)
    else:
        ap.error("give --build DIR or --libs DIR")


if __name__ == "__main__":
    main()
