"""SASS instructions per record in the skinny kernel's main loop, per build. No GPU: nvcc and cuobjdump only.

    python bench/sass_loop.py                       # kernels/w12_gemv.cu as it is now (built with cuda_build's flags)
    python bench/sass_loop.py --so LIB.so [--so …]  # built libraries, e.g. bench/ab_kernel.py --build's
    python bench/sass_loop.py --match 'ILi1ELb0E'   # only the kernels whose mangled name matches

Session 50 found that ptxas rebuilt every load address from the thread index for every record (the nt = 1 W12 loop
~155 instructions per record, 64 of them the decode): an instruction count here, before a device call, says whether
a change to the loop did what it meant to. The loop is the largest backward branch whose body holds an MMA; per record
= its instructions / (its MMAs / 4·NT). cuobjdump is not in this machine's CUDA install: the PyPI wheel
`nvidia-cuda-cuobjdump` holds one (`pip download --no-deps nvidia-cuda-cuobjdump -d D && unzip D/*.whl -d D`, then
CUOBJDUMP=D/nvidia/cu13/bin/cuobjdump).
"""

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAME = re.compile(r"w12_gemv_kernelILi(\d+)ELb([01])ELi(\d+)ELi(\d+)ELb([01])ELb([01])E")


def cuobjdump() -> str:
    found = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    if not found and Path("/usr/local/cuda/bin/cuobjdump").exists():
        found = "/usr/local/cuda/bin/cuobjdump"
    if not found:
        raise SystemExit("sass_loop: no cuobjdump (set CUOBJDUMP=PATH; this file's docstring says where to get one)")
    return found


def build_now() -> str:
    """kernels/w12_gemv.cu as it is now, through cuda_build (its flags and its cache)."""
    sys.path.insert(0, str(ROOT))
    from kernels import cuda_build  # the repository layout (the installed package is w12.kernels)

    try:
        return str(cuda_build.build("w12_gemv"))
    except cuda_build.CudaBuildError as e:
        raise SystemExit(f"sass_loop: {e}")


def loops(sass: str, match: str):
    """(config label, instructions, MMAs, opcode counts) of each matching skinny kernel's main loop."""
    for f in re.split(r"\n\s*Function : ", sass)[1:]:
        name = f.split("\n", 1)[0].strip()
        m = NAME.search(name)
        if not m or not re.search(match, name):
            continue
        ins = [(int(a, 16), s.strip()) for a, s in re.findall(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", f)]
        best = []
        for at, s in ins:
            b = re.search(r"BRA\s+(?:!?U?P\d, )?0x([0-9a-f]+)", s)
            if b and int(b.group(1), 16) < at:
                body = [x for x in ins if int(b.group(1), 16) <= x[0] <= at]
                if any("HMMA" in x[1] for x in body) and len(body) > len(best):
                    best = body
        nt, view, warps, u, trace, xreg = m.groups()
        label = f"nt {nt} {'view' if view == '1' else 'W12'} {warps} warps U {u}{' trace' if trace == '1' else ''}" \
                f"{' xreg' if xreg == '1' else ''}"
        ops = collections.Counter(re.sub(r"^@!?U?P\d+\s+", "", s).split()[0].split(".")[0] for _, s in best)
        yield label, len(best), ops["HMMA"], int(nt), ops


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--so", action="append", default=[], help="a built library (repeatable); default: build now")
    ap.add_argument("--match", default="", help="regex on the mangled kernel name")
    a = ap.parse_args()
    tool = cuobjdump()
    for lib in a.so or [build_now()]:
        sass = subprocess.run([tool, "-sass", lib], capture_output=True, text=True, check=True).stdout
        print(f"## {lib}\n\n| skinny build | loop instructions | MMAs | per record | top opcodes |\n|---|---|---|---|---|")
        for label, n, mma, nt, ops in sorted(loops(sass, a.match)):
            per = n / (mma / (4 * nt)) if mma else float("nan")
            top = ", ".join(f"{k} {v}" for k, v in ops.most_common(6))
            print(f"| {label} | {n} | {mma} | {per:.1f} | {top} |")
        print()


if __name__ == "__main__":
    main()
