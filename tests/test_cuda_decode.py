"""The CUDA kernels' decode (kernels/w12_gemv.cu: decode4, nib_keep) checked bit by bit on the CPU, where CI runs:
PTX prmt and lop3 emulated, every constant read from the kernel source, every view byte × nibble byte × byte
position × nibble half against formats.reference.scaled_decode (SPEC.md §4). The GPU benches check the compiled
kernels (bench/kernels.py, bench/ab_kernel.py); this pins the bit trick itself to the spec."""

import re
from pathlib import Path

import numpy as np
import torch

from w12.formats.reference import scaled_decode

SOURCE = (Path(__file__).resolve().parents[1] / "kernels" / "w12_gemv.cu").read_text()
M32 = np.uint64(0xFFFFFFFF)


def body(name: str) -> str:
    """The text of the device function `name`: its one line, or its signature to the closing brace."""
    start = re.search(rf"__forceinline__ \w+ {name}\(", SOURCE).start()
    line = SOURCE[start:SOURCE.index("\n", start)]
    return line if line.rstrip().endswith("}") else SOURCE[start:SOURCE.index("\n}\n", start)]


def consts(text: str) -> list:
    return [int(h, 16) for h in re.findall(r"0x([0-9A-Fa-f]+)u", text)]


def prmt(a, b, sel: int):
    """PTX prmt.b32, default mode: output byte i = byte (sel nibble i & 7) of [b:a], its sign replicated if bit 3."""
    src = [(a >> np.uint64(8 * i)) & np.uint64(0xFF) for i in range(4)] + \
          [(b >> np.uint64(8 * i)) & np.uint64(0xFF) for i in range(4)]
    out = np.zeros_like(a)
    for i in range(4):
        s = (sel >> (4 * i)) & 0xF
        byte = src[s & 7]
        if s & 8:
            byte = np.where(byte & np.uint64(0x80), np.uint64(0xFF), np.uint64(0))
        out |= byte << np.uint64(8 * i)
    return out


def lop3(a, b, c, lut: int):
    """PTX lop3.b32: bit = lut[(a, b, c) as a 3-bit index, a the high bit]."""
    out = np.zeros_like(a)
    for idx in range(8):
        if lut >> idx & 1:
            out |= (a if idx & 4 else ~a & M32) & (b if idx & 2 else ~b & M32) & (c if idx & 1 else ~c & M32)
    return out


def lut_of(helper: str) -> int:
    return int(re.search(r'lop3\.b32 %0, %1, %2, %3, 0x([0-9A-Fa-f]+);', body(helper)).group(1), 16)


def decode4(v, n, keep, view: bool):
    """decode4<VIEW> as written in the kernel, its constants taken from the source."""
    src = body("decode4")
    view_part, w12_part = src.split("} else {")
    and_or, select = lut_of("lop3_and_or"), lut_of("lop3_select")
    if view:
        s01, m01, c01, s23, m23, c23 = consts(view_part)
        t01, t23 = prmt(v, np.zeros_like(v), s01), prmt(v, np.zeros_like(v), s23)
        return (lop3((t01 << np.uint64(4)) & M32, np.uint64(m01), np.uint64(c01), and_or),
                lop3((t23 << np.uint64(4)) & M32, np.uint64(m23), np.uint64(c23), and_or))
    s01, s23, m01, c01, m23, c23 = consts(w12_part)
    out = []
    for sel, m, c in ((s01, m01, c01), (s23, m23, c23)):
        h = prmt(v, n, sel)
        out.append(lop3(lop3(h, keep, h >> np.uint64(4), select), np.uint64(m), np.uint64(c), and_or))
    return out


def test_decode4_is_the_spec_decode_for_every_byte_and_nibble():
    high, low = consts(body("nib_keep"))  # t >= 2 (columns 32..63: high nibbles) ? high : low
    b = np.repeat(np.arange(256, dtype=np.uint64), 256)
    nib = np.tile(np.arange(256, dtype=np.uint64), 256)
    rng = np.random.default_rng(0)
    for pos in range(4):  # the weight's byte in the 32-bit words; the other bytes random
        shift = np.uint64(8 * pos)
        clear = ~(np.uint64(0xFF) << shift) & M32
        v = (rng.integers(0, 2**32, b.size, dtype=np.uint64) & clear) | (b << shift)
        n = (rng.integers(0, 2**32, b.size, dtype=np.uint64) & clear) | (nib << shift)
        for keep, lo in ((low, nib & np.uint64(0xF)), (high, nib >> np.uint64(4))):
            for view in (False, True):
                words = decode4(v, n, np.full_like(v, keep), view)
                got = (words[pos // 2] >> np.uint64(16 * (pos % 2))) & np.uint64(0xFFFF)
                want = scaled_decode(torch.from_numpy(b.astype(np.int64)),
                                     torch.full((b.size,), 8) if view else torch.from_numpy(lo.astype(np.int64)))
                want = want.numpy().astype(np.int64) & 0xFFFF
                bad = np.flatnonzero(got.astype(np.int64) != want)
                assert bad.size == 0, (f"decode4 (view={view}, keep={keep:#x}) at byte {pos}: view byte "
                                       f"{int(b[bad[0]]):#x}, nibble byte {int(nib[bad[0]]):#x} gave "
                                       f"{int(got[bad[0]]):#06x}, SPEC.md §4 says {int(want[bad[0]]):#06x}")
