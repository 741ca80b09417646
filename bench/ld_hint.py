"""Does the M = 1 kernel stream faster with an L2 prefetch-size or eviction hint on its weight loads? One GPU call.

    python bench/ld_hint.py --build DIR           # here (nvcc): one library per variant of ld_stream
    W12_CUDA=1 python bench/ld_hint.py --libs DIR [--out OUT]   # on the GPU

The skinny kernel reads every weight byte with `ld_stream` (kernels/w12_gemv.cu: ld.global.nc.L1::no_allocate.v4);
under ncu it streams its bytes no faster than a PyTorch reduction, while cuBLAS's TMA kernels stream theirs 5–30 %
faster (2026-12-02-kernels-ncu-m1-h200-s12.md). The variants change only that instruction's qualifiers, so every
variant must give the same bits as the built-in one (checked first, per shape, W12 and view); then each is timed
at M = 1 as bench/kernels.py times (CUDA graph replay, do_bench, L2 flushed, median), interleaved per shape,
beside cuBLAS. Prints and writes OUT/ld_hint.md.
"""

import argparse
import ctypes
import datetime
import math
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
ROOT = Path(__file__).resolve().parents[1]
BASE = 'asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"'
POLICY = ('uint64_t pol; asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol)); '
          'asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"')
VARIANTS = {  # name -> the ld_stream asm that replaces BASE (operands unchanged but for the policy's %5)
    "base": BASE,
    "L2::128B": BASE.replace("no_allocate.v4", "no_allocate.L2::128B.v4"),
    "L2::256B": BASE.replace("no_allocate.v4", "no_allocate.L2::256B.v4"),
    "evict_first": POLICY,
    "cs": BASE.replace("ld.global.nc.L1::no_allocate.v4", "ld.global.cs.v4"),  # streaming: evict first, L1 and L2
    "no_nc": BASE.replace("ld.global.nc.L1::no_allocate.v4", "ld.global.L1::no_allocate.v4"),  # not the read-only path
}


def variant_source(name: str) -> str:
    text = (ROOT / "kernels" / "w12_gemv.cu").read_text()
    assert text.count(BASE) == 1, "ld_stream's asm changed: update bench/ld_hint.py"
    new = VARIANTS[name]
    if name == "evict_first":  # the policy operand
        text = text.replace(': "l"(p));\n  return r;', ': "l"(p), "l"(pol));\n  return r;', 1)
    return text.replace(BASE, new)


def build(out: Path):
    """nvcc with cuda_build's flags but -lineinfo (4 MB per library instead of 11), all variants at once."""
    import subprocess
    from concurrent.futures import ThreadPoolExecutor

    from w12.kernels import cuda_build
    out.mkdir(parents=True, exist_ok=True)
    flags = [f for f in cuda_build.FLAGS if f != "-lineinfo"]

    def one(name):
        src = out / f"w12_gemv_{name.replace(':', '_')}.cu"
        src.write_text(variant_source(name))
        subprocess.run([cuda_build.nvcc_path(), *flags, "-o", str(src.with_suffix(".so")), str(src)], check=True)
        src.unlink()
        return src.with_suffix(".so")

    with ThreadPoolExecutor(len(VARIANTS)) as pool:
        for name, lib in zip(VARIANTS, pool.map(one, VARIANTS)):
            print(name, lib)


def run(libs: Path, out: str):
    from kernels import SHAPES, Mat, bench

    from w12.kernels import gemm_cuda as gc
    cdlls = {name: ctypes.CDLL(str(libs / f"w12_gemv_{name.replace(':', '_')}.so")) for name in VARIANTS}
    lines, ratios = [], {(v, view): [] for v in VARIANTS for view in (False, True)}
    for si, (n, k) in enumerate(SHAPES):
        mt = Mat(n, k, 300 + si)
        x = torch.randn(1, k, device="cuda").to(torch.bfloat16)
        t_cb = bench(lambda: torch.matmul(x, mt.w.t()))
        cells = []
        for view in (False, True):
            cfg = gc.pick_config(1, n, k, view)
            ref = None
            for name, lib in cdlls.items():
                gc.library = lambda lib=lib: lib
                y = mt.run(x, view=view, cuda=cfg)
                ref = y if ref is None else ref
                assert torch.equal(y, ref), f"{name} {n}x{k} view={view}: not the base variant's bits"
                t = bench(lambda: mt.run(x, view=view, cuda=cfg))
                ratios[(name, view)].append(t_cb / t)
                cells.append(f"{t:.1f}")
        row = f"| {n}×{k} | {t_cb:.1f} | " + " | ".join(cells) + " |"
        print(row, flush=True)
        lines.append(row)
        del mt
        torch.cuda.empty_cache()
    geo = {key: math.exp(sum(map(math.log, r)) / len(r)) for key, r in ratios.items()}
    names = list(VARIANTS)
    text = "\n".join([
        f"# M = 1 skinny kernel with L2 hints on its weight loads — {datetime.date.today()}", "",
        f"- GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}; commit {os.environ.get('W12_REV', '?')}",
        "- command: `python bench/ld_hint.py --build DIR` (here), then `W12_CUDA=1 python bench/ld_hint.py --libs DIR`",
        "- every variant gave the base variant's bits on every shape (W12 and view); µs: CUDA graph replay, do_bench, "
        "L2 flushed, median; configs as dispatched (gemm_cuda.pick_config)", "",
        "| geomean vs cuBLAS | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|",
        "| W12 | " + " | ".join(f"{geo[(v, False)]:.3f}" for v in names) + " |",
        "| view | " + " | ".join(f"{geo[(v, True)]:.3f}" for v in names) + " |", "",
        "| N×K | cuBLAS µs | " + " | ".join(f"W12 {v}" for v in names) + " | " + " | ".join(f"view {v}" for v in names) + " |",
        "|---" * (2 + 2 * len(names)) + "|", *lines]) + "\n"
    with open(os.path.join(out, "ld_hint.md"), "w") as fh:
        fh.write(text)
    print(text)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", type=Path)
    ap.add_argument("--libs", type=Path)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    build(a.build) if a.build else run(a.libs, a.out)
