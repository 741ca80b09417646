"""Does the M = 1 kernel stream faster with an L2 prefetch-size or eviction hint on its weight loads? One GPU call.

    python bench/ld_hint.py --build DIR           # here (nvcc): one library per variant of ld_stream
    W12_CUDA=1 python bench/ld_hint.py --libs DIR [--out OUT]   # on the GPU

The skinny kernel reads every weight byte with `ld_stream` (kernels/w12_gemv.cu: ld.global.nc.L1::no_allocate.v4);
under ncu it streams its bytes no faster than a PyTorch reduction, while cuBLAS's TMA kernels stream theirs 5–30 %
faster (2026-12-02-kernels-ncu-m1-h200-s12.md). The variants change only that instruction's qualifiers, so every
variant must give the same bits as the built-in one (checked first, per shape, W12 and view); then each is timed
at M = 1 as bench/kernels.py times (CUDA graph replay, do_bench, L2 flushed, median), interleaved per shape,
beside cuBLAS (bench/ab_kernel.py's run_libs). Prints and writes OUT/ld_hint.md.
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ab_kernel import build_libs, build_or_run, run_libs  # noqa: E402

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
    for name, lib in build_libs({name: variant_source(name) for name in VARIANTS}, out).items():
        print(name, lib)


def run(libs: Path, out: str):
    run_libs({name: libs / f"w12_gemv_{name.replace(':', '_')}.so" for name in VARIANTS}, [1], 1,
             "M = 1 skinny kernel with L2 hints on its weight loads",
             "`python bench/ld_hint.py --build DIR` (here), then `W12_CUDA=1 python bench/ld_hint.py --libs DIR`",
             out, "ld_hint.md")


if __name__ == "__main__":
    build_or_run(__doc__, build, run)
