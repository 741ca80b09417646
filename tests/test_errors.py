"""One test per error (SPEC.md §9), from crafted bytes and tensors, and a fuzz test in which
loading mutated files raises nothing but W12Error."""

import json
import random
import struct

import pytest
import torch
from safetensors.torch import save_file

from w12.formats import errors as E
from w12.formats.container import W12File, matrix_tensors, write_file
from w12.formats.matrix import W12Matrix

NAME = "model.layers.0.mlp.up_proj.weight"


def matrix(n=130, k=70, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=g) * 0.02).to(torch.bfloat16)
    w[1, 2] = 0.0
    w[129, 5] = float("nan")
    return W12Matrix.from_bf16(w)


def header(shape=(130, 70), version=1, fmt="w12", name=NAME):
    return json.dumps({"format": fmt, "version": version, "matrices": {name: {"shape": list(shape)}}})


def save(path, tensors, w12_header):
    meta = {"format": "pt"} if w12_header is None else {"format": "pt", "w12": w12_header}
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata=meta)
    return path


def load_all(path):
    with W12File(path) as f:
        return [f.matrix(n).to_bf16() for n in f.matrix_names] + [f.tensor(n) for n in f.dense_names]


def crafted(tmp_path, mutate=None, hdr=None, drop=None):
    t = matrix_tensors(NAME, matrix())
    t = {k: v.clone() for k, v in t.items()}
    if mutate:
        mutate(t)
    if drop:
        del t[drop]
    return save(tmp_path / "f.safetensors", t, header() if hdr is None else hdr)


def raw_safetensors(path, header_obj: dict, data: bytes):
    """Hand-written bytes: 8-byte little-endian header length, JSON header, data."""
    h = json.dumps(header_obj).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + data)
    return path


# ---- header ------------------------------------------------------------------------------------
def test_missing_header(tmp_path):
    p = save(tmp_path / "f.safetensors", {"a": torch.zeros(2)}, None)
    with pytest.raises(E.HeaderError, match="not a W12 file"):
        W12File(p)


def test_header_not_json(tmp_path):
    with pytest.raises(E.HeaderError, match="not valid JSON"):
        W12File(crafted(tmp_path, hdr="{not json"))


def test_header_wrong_format(tmp_path):
    with pytest.raises(E.HeaderError, match="format"):
        W12File(crafted(tmp_path, hdr=header(fmt="w13")))


def test_unsupported_version(tmp_path):
    with pytest.raises(E.VersionError, match="version 1.*version 2"):
        W12File(crafted(tmp_path, hdr=header(version=2)))


@pytest.mark.parametrize("shape", [(0, 70), (130,), (130, -1), (2**31, 4), ("130", 70)])
def test_bad_shape(tmp_path, shape):
    with pytest.raises(E.ShapeError):
        W12File(crafted(tmp_path, hdr=json.dumps({"format": "w12", "version": 1,
                                                   "matrices": {NAME: {"shape": list(shape)}}})))


def test_missing_tensor(tmp_path):
    with pytest.raises(E.MissingTensorError, match="weight_esc_counts"):
        W12File(crafted(tmp_path, drop="model.layers.0.mlp.up_proj.weight_esc_counts"))


def test_orphan_companion(tmp_path):
    hdr = json.dumps({"format": "w12", "version": 1, "matrices": {}})
    with pytest.raises(E.MissingTensorError, match="not listed"):
        W12File(crafted(tmp_path, hdr=hdr))


def test_wrong_dtype(tmp_path):
    def mutate(t):
        t["model.layers.0.mlp.up_proj.weight_exponents"] = t["model.layers.0.mlp.up_proj.weight_exponents"].to(torch.int16)
    with pytest.raises(E.TensorLayoutError, match="weight_exponents.*U8"):
        W12File(crafted(tmp_path, mutate))


def test_wrong_shape_for_header(tmp_path):
    with pytest.raises(E.TensorLayoutError, match="must be U8"):
        W12File(crafted(tmp_path, hdr=header(shape=(300, 70))))


def test_truncated_file(tmp_path):
    p = crafted(tmp_path)
    p.write_bytes(p.read_bytes()[:-100])
    with pytest.raises(E.ContainerError):
        W12File(p)


def test_garbage_file(tmp_path):
    p = raw_safetensors(tmp_path / "g.safetensors", {"x": {"dtype": "U8", "shape": [10**12], "data_offsets": [0, 10**12]}}, b"")
    with pytest.raises(E.ContainerError):
        W12File(p)


# ---- matrix fields -----------------------------------------------------------------------------
def check(tmp_path, mutate, error, match):
    with pytest.raises(error, match=match):
        load_all(crafted(tmp_path, mutate))


def test_exponent_out_of_range(tmp_path):
    check(tmp_path, lambda t: t[NAME + "_exponents"].__setitem__(3, 255), E.ExponentError, "row 3")


def test_padded_row_exponent(tmp_path):
    check(tmp_path, lambda t: t[NAME + "_exponents"].__setitem__(200, 17), E.ExponentError, "padded row 200")


def test_negative_count(tmp_path):
    check(tmp_path, lambda t: t[NAME + "_esc_counts"].__setitem__((0, 0), -1), E.EscapeCountError, "count")


def test_count_too_large(tmp_path):
    check(tmp_path, lambda t: t[NAME + "_esc_counts"].__setitem__((0, 0), 9000), E.EscapeCountError, "8192")


def test_counts_do_not_add_up(tmp_path):
    check(tmp_path, lambda t: t[NAME + "_esc_counts"].__setitem__((0, 1), 5), E.TensorLayoutError, "escapes")


def test_escape_position_out_of_range(tmp_path):
    check(tmp_path, lambda t: t[NAME + "_escapes"].__setitem__((0, 0), 9000), E.EscapePositionError, "position")


def test_escape_positions_not_increasing(tmp_path):
    def mutate(t):
        t[NAME + "_esc_counts"][0, 0] = 2
        t[NAME + "_esc_counts"][1, 0] -= 1
        t[NAME + "_escapes"][1, 0] = 0  # record (0,0) now lists p=130 then p=0
    check(tmp_path, mutate, E.EscapePositionError, "strictly increasing")


def test_escape_in_padding(tmp_path):
    def mutate(t):
        t[NAME + "_escapes"][-1, 0] = 2 * 64 + 5  # record (1,0) row 130 ≥ N
    check(tmp_path, mutate, E.EscapePositionError, "padding")


def test_escape_code_not_zero(tmp_path):
    check(tmp_path, lambda t: t[NAME].__setitem__((0, 0, 1 * 64 + 2), 7), E.NonCanonicalError, "code must be 0")


def test_escape_value_in_window(tmp_path):
    check(tmp_path, lambda t: t[NAME + "_escapes"].__setitem__((0, 1), 0x3C00), E.NonCanonicalError, "window")


def test_padded_weight_not_zero(tmp_path):
    check(tmp_path, lambda t: t[NAME].__setitem__((1, 0, 5 * 64), 1), E.NonCanonicalError, "padded weight")


def test_encoder_input_errors():
    with pytest.raises(E.InputError, match="bfloat16"):
        W12Matrix.from_bf16(torch.zeros(4, 4))
    with pytest.raises(E.InputError, match="2-D"):
        W12Matrix.from_bf16(torch.zeros(4, dtype=torch.bfloat16))


def test_slice_errors():
    m = matrix()
    with pytest.raises(E.SliceError):
        m.slice_rows(5, 5)
    with pytest.raises(E.SliceError):
        m.slice_cols(0, 71)


def test_write_error(tmp_path):
    with pytest.raises(E.ContainerError, match="cannot write"):
        write_file(tmp_path / "missing-dir" / "f.safetensors", {}, {NAME: matrix()})


# ---- fuzz --------------------------------------------------------------------------------------
def mutations(data: bytes, rng: random.Random, count: int):
    hlen = struct.unpack("<Q", data[:8])[0]
    for i in range(count):
        b = bytearray(data)
        kind = i % 5
        if kind == 0:  # flip bits anywhere
            for _ in range(rng.randint(1, 8)):
                p = rng.randrange(len(b))
                b[p] ^= 1 << rng.randrange(8)
        elif kind == 1:  # flip bytes in the JSON header
            for _ in range(rng.randint(1, 4)):
                b[8 + rng.randrange(hlen)] = rng.randrange(256)
        elif kind == 2:  # overwrite a run of data with random bytes
            p = rng.randrange(8 + hlen, len(b))
            for j in range(p, min(len(b), p + rng.randint(1, 64))):
                b[j] = rng.randrange(256)
        elif kind == 3:  # truncate or extend
            b = b[:rng.randrange(len(b))] if rng.random() < 0.7 else b + bytes(rng.randrange(1, 100))
        else:  # change a digit in the header (shapes, offsets, counts)
            digits = [j for j in range(8, 8 + hlen) if chr(b[j]).isdigit()]
            b[rng.choice(digits)] = ord(str(rng.randrange(10)))
        yield bytes(b)


def test_fuzz_only_w12_errors(tmp_path):
    """≥ 1000 mutated files: loading and decoding either succeeds or raises a W12Error."""
    g = torch.Generator().manual_seed(1)
    w = (torch.randn(130, 70, generator=g) * 0.02).to(torch.bfloat16)
    w[1, 2], w[129, 5], w[7, 64] = 0.0, float("nan"), 1e30
    src = tmp_path / "src.safetensors"
    write_file(src, {"model.norm.weight": torch.ones(70, dtype=torch.bfloat16)}, {NAME: W12Matrix.from_bf16(w)})
    data = src.read_bytes()
    rng = random.Random(1234)
    outcomes = {"ok": 0, "w12error": 0}
    p = tmp_path / "m.safetensors"
    for mutated in mutations(data, rng, 1200):
        p.write_bytes(mutated)
        try:
            load_all(p)
            outcomes["ok"] += 1
        except E.W12Error:
            outcomes["w12error"] += 1
    assert sum(outcomes.values()) == 1200
    assert outcomes["w12error"] > 300, outcomes
