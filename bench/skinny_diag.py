"""Where the skinny kernel's time goes at M = 17–32: the landed kernel beside builds with parts of its work removed
(wrong results, timing only). One GPU call, through bench/ab_kernel.py.

    python bench/skinny_diag.py --build DIR         # here (nvcc): one library per variant, DIR/names.txt
    W12_CUDA=1 python bench/ab_kernel.py --libs DIR --m 16,32 --rounds 3 [--out OUT]   # on the GPU

Variants (bits of W12_SK_DIAG, patched into a copy of kernels/w12_gemv.cu at HEAD):
  full   0   the landed kernel (the bits the others are compared with)
  nodec  1   no W12 decode: decode4 gives v ^ n and v + n (2 ops instead of 8 per 4 weights)
  nomma  2   no mma.sync: each MMA's inputs folded into one accumulator (5 LOP3 and an add)
  nox    4   no X loads: load_x16 gives a constant of its address (so of the record)
  dm     3   no decode, no MMA;  mx 6 no MMA, no X;  loads 7: the weight loads and the loop alone
The patches reach every kernel that calls decode4 / mma16816 / load_x16 (the ws and stream kernels' decode too), so
only the rows that bench/ab_kernel.py labels with a skinny config (`cuda …`) say what they say. Why: session 30–33's
diagnostics removed one part at a time (no MMA, no decode, X L1-resident) and none moved 6144×4096 or 4096² at
M = 32 by more than 1 µs, while the nt = 4 build takes 4–5 µs more than nt = 2 at M = 16 on the same records
(kernels/w12_gemv_tried.md, "What bounds M = 17–32"). With the parts removed together, `loads` is the loop's own
floor at that config: if it is near `full`, the loop's structure (round trips per warp, CTAs per SM) is the bound,
not its work.
"""

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ab_kernel import build_libs, resolve, source_at  # noqa: E402

VARIANTS = {"full": 0, "nodec": 1, "nomma": 2, "nox": 4, "dm": 3, "mx": 6, "loads": 7}

DECODE = """    const uint32_t h01 = prmt(v, n, 0x1504u), h23 = prmt(v, n, 0x3726u);
    w01 = lop3_and_or(lop3_select(h01, keep, h01 >> 4), 0x87FF87FFu, 0x38003800u);
    w23 = lop3_and_or(lop3_select(h23, keep, h23 >> 4), 0x87FF87FFu, 0x38003800u);
"""
MMA = """  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
"""
XLOAD = """  a = __ldg(p);
  b = __ldg(p + 1);
"""
PATCHES = {
    DECODE: "#if W12_SK_DIAG & 1\n    w01 = v ^ n;\n    w23 = v + n;\n#else\n" + DECODE + "#endif\n",
    MMA: "#if W12_SK_DIAG & 2\n  c[0] += __uint_as_float((a0 ^ a1 ^ a2 ^ a3 ^ b0 ^ b1) & 0x3FFFFFu);\n#else\n" + MMA
         + "#endif\n",
    XLOAD: "#if W12_SK_DIAG & 4\n  const uint32_t kb = (uint32_t)(size_t)xk >> 7;\n  a = make_uint4(kb, kb + 1, kb + 2, kb + 3);\n"
           "  b = a;\n#else\n" + XLOAD + "#endif\n",
}


def variant(text: str, bits: int) -> str:
    for anchor, patch in PATCHES.items():
        if text.count(anchor) != 1:
            raise SystemExit(f"skinny_diag: the anchor below occurs {text.count(anchor)} times in w12_gemv.cu, "
                             f"expected once (the kernel changed: update PATCHES)\n{anchor}")
        text = text.replace(anchor, patch)
    return f"#define W12_SK_DIAG {bits}\n" + text


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", type=Path, required=True, help="write the libraries here (needs nvcc, no GPU)")
    a = ap.parse_args()
    base = source_at("HEAD")
    for name, lib in build_libs({name: variant(base, bits) for name, bits in VARIANTS.items()}, a.build).items():
        print(name, lib)
    head = resolve("HEAD")
    (a.build / "names.txt").write_text("".join(f"{name}={head}+W12_SK_DIAG={bits}\n"
                                               for name, bits in VARIANTS.items()))


if __name__ == "__main__":
    main()
