"""Golden bytes: the worked example of SPEC.md §10 and a tiny matrix with specials, pinned as literals.
Any change to the bit layout changes these bytes."""

import hashlib

import torch

from w12.formats import reference
from w12.formats.matrix import W12Matrix


def bf16(bits):
    return torch.tensor(bits, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)


def test_spec_worked_example():
    w = bf16([[0x3F80, 0xBF00 - 0x10000, 0x0000, 0x4040]])
    m = W12Matrix.from_bf16(w, backend="reference")
    assert m.records[0, 0, :4].tolist() == [0x70, 0xE8, 0x00, 0x7C]
    assert m.records[0, 0, 8192].item() == 0
    assert int(m.records.to(torch.int64).sum()) == 0x70 + 0xE8 + 0x7C  # every other byte is zero
    assert m.exponents[:2].tolist() == [128, 16]
    assert m.esc_counts.tolist() == [[1]]
    assert m.escapes.tolist() == [[2, 0]]
    b, lo = reference.unpack_codes(m.records, 128, 64)
    assert reference.scaled_decode(b[0, :4], lo[0, :4]).view(torch.bfloat16).tolist() == [0.5, -0.25, 2**-15, 1.5]


GOLDEN_BITS = [
    [0x3F80, 0x3C00, 0x8001, 0x7FC1, 0xC2F7, 0x0000, 0x3E55],  # 1.0, 2^-7, -denormal, NaN(payload 0x41), -123.5, 0, 0.208
    [0x8000, 0x7F80, 0x3B9A, 0x3B9B, 0x3B00, 0x0001, 0xFF80],  # -0, +inf, small normals, 2^-9, +denormal, -inf
]
GOLDEN = {  # the full encoding, checked by hand: row 0's window is [118, 133] (top: -123.5), row 1's [104, 119]
    "row0_view": [0x48, 0x10, 0x00, 0x00, 0xFF, 0x00, 0x35],
    "row1_view": [0x00, 0x00, 0x79, 0x79, 0x70, 0x00, 0x00],
    "row0_nib": [0x00, 0x00, 0x00, 0x00, 0x07, 0x00, 0x05],
    "row1_nib": [0x00, 0x00, 0x0A, 0x0B, 0x00, 0x00, 0x00],
    "exponents": [133, 119],
    "escapes": [[2, -32767], [3, 32705], [5, 0], [64, -32768], [65, 32640], [69, 1], [70, -128]],
    "records_sha256": "c1fc1a9d277678ac97f4fb3dd1da019043f05a7c0aa9bb2372582ecf641d08b1",
}


def test_golden_bytes():
    w = bf16([[b - 0x10000 if b > 0x7FFF else b for b in row] for row in GOLDEN_BITS])
    m = W12Matrix.from_bf16(w, backend="reference")
    rec = m.records[0, 0]
    assert rec[0:7].tolist() == GOLDEN["row0_view"]
    assert rec[64:71].tolist() == GOLDEN["row1_view"]
    assert rec[8192:8199].tolist() == GOLDEN["row0_nib"]
    assert rec[8224:8231].tolist() == GOLDEN["row1_nib"]
    assert m.exponents[:2].tolist() == GOLDEN["exponents"]
    assert m.escapes.tolist() == GOLDEN["escapes"]
    assert m.esc_counts.tolist() == [[len(GOLDEN["escapes"])]]
    assert hashlib.sha256(m.records.numpy().tobytes()).hexdigest() == GOLDEN["records_sha256"]
    assert torch.equal(m.to_bf16("reference").view(torch.int16), w.view(torch.int16))
