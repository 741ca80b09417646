"""The W12 format core: exactness on every BF16 pattern, overhead, slicing, the container."""

import torch

from w12.formats import fast, reference
from w12.formats.container import W12File, write_file
from w12.formats.layout import E_HI, E_LO
from w12.formats.matrix import W12Matrix
from w12.convert.fixtures import llm_like_bf16 as llm_like

ALL_PATTERNS = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(512, 128)




def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


def test_every_pattern_at_every_window_position():
    """All 65 536 patterns (±0, denormals, ±inf, NaN payloads) under every top exponent 16..254."""
    windows = torch.arange(E_LO, E_HI + 1, dtype=torch.int32)
    bits = ALL_PATTERNS.repeat(len(windows), 1)
    forced = windows.repeat_interleave(ALL_PATTERNS.shape[0])
    enc_ref = reference.encode(bits, exponents=forced)
    enc_fast = fast.encode(bits, exponents=forced)
    for a, b in zip(enc_ref, enc_fast):
        assert torch.equal(a, b)
    m = W12Matrix(*enc_fast, shape=tuple(bits.shape))
    assert bits_equal(m.to_bf16("fast"), bits)
    assert bits_equal(m.to_bf16("reference"), bits)
    # in-window count: per window, the 2·16·128 normal patterns of its 16 binades are coded, the rest escaped
    assert m.nnz == len(windows) * (65536 - 2 * 16 * 128)


def test_chosen_window_round_trip_all_patterns():
    m = W12Matrix.from_bf16(ALL_PATTERNS.view(torch.bfloat16))
    assert bits_equal(m.to_bf16(), ALL_PATTERNS)
    assert torch.equal(m.records, W12Matrix.from_bf16(ALL_PATTERNS.view(torch.bfloat16), "reference").records)


def test_bits_per_weight_llm_shapes():
    for n, k in ((4096, 4096), (14336, 4096)):
        w = llm_like(n, k, seed=n)
        m = W12Matrix.from_bf16(w)
        assert bits_equal(m.to_bf16(), w)
        print(f"{n}×{k}: {m.bits_per_weight:.4f} bits/weight, escape rate {m.escape_rate:.2e}")
        assert m.bits_per_weight <= 12.02


def test_view8_is_midpoint_approximation():
    w = llm_like(256, 320, seed=3)
    m = W12Matrix.from_bf16(w)
    q = m.view8_to_bf16()
    assert bits_equal(q, reference.decode(m.records, m.exponents, m.esc_counts, m.escapes, 256, 320, lo_fill=8))
    exact = m.to_bf16().float()
    coded = reference.decode(m.records, m.exponents, m.esc_counts, m.escapes, 256, 320, lo_fill=None)
    rel = ((q.float() - exact).abs() / exact.abs().clamp_min(1e-30))
    escaped = torch.zeros_like(exact, dtype=torch.bool)
    rows, cols = reference.escape_coordinates(m.esc_counts, m.escapes)
    escaped[rows, cols] = True
    assert float(rel[~escaped].max()) <= 8 / 128  # at most half of the discarded range, relative to 1.m
    assert bits_equal(coded, w)


def test_slices_match_bf16_slices():
    w = llm_like(300, 200, seed=5)
    w[0, 0] = 0.0
    w[140, 150] = float("inf")
    m = W12Matrix.from_bf16(w)
    for n0, n1 in ((0, 128), (128, 300), (256, 300), (5, 77)):
        assert bits_equal(m.slice_rows(n0, n1).to_bf16(), w[n0:n1])
    for k0, k1 in ((0, 64), (64, 200), (128, 200), (3, 77)):
        assert bits_equal(m.slice_cols(k0, k1).to_bf16(), w[:, k0:k1])


def test_tensor_parallel_shards():
    """TP = 2, 4, 8 along N (column-parallel) and K (row-parallel): each shard equals the BF16 slice."""
    w = llm_like(1024, 1024, seed=7)
    m = W12Matrix.from_bf16(w)
    for tp in (2, 4, 8):
        rows, cols = 1024 // tp, 1024 // tp
        for r in range(tp):
            shard_n = m.slice_rows(r * rows, (r + 1) * rows)
            shard_k = m.slice_cols(r * cols, (r + 1) * cols)
            assert shard_n.records.data_ptr() == m.records[r * rows // 128].data_ptr()  # zero-copy
            assert bits_equal(shard_n.to_bf16(), w[r * rows:(r + 1) * rows])
            assert bits_equal(shard_k.to_bf16(), w[:, r * cols:(r + 1) * cols])


def test_container_round_trip(tmp_path):
    w = llm_like(130, 70, seed=9)
    w[3, 3] = 0.0
    m = W12Matrix.from_bf16(w)
    norm = torch.randn(70).to(torch.bfloat16)
    path = tmp_path / "model.safetensors"
    write_file(path, {"model.norm.weight": norm}, {"model.layers.0.mlp.up_proj.weight": m}, sha256={})
    with W12File(path) as f:
        assert f.matrix_names == ["model.layers.0.mlp.up_proj.weight"]
        assert f.dense_names == ["model.norm.weight"]
        assert bits_equal(f.matrix("model.layers.0.mlp.up_proj.weight").to_bf16(), w)
        assert bits_equal(f.tensor("model.norm.weight"), norm)
    assert not list(tmp_path.glob("*.tmp-*"))


def test_bits_per_weight_minilm_real_weights():
    """Real trained weights (all-MiniLM-L6-v2 cast to BF16): the linear layers `w12 convert` converts."""
    from safetensors import safe_open

    from w12.convert.fixtures import minilm_fp32

    bits = weights = escapes = 0
    with safe_open(minilm_fp32() / "model.safetensors", framework="pt") as f:
        for name in f.keys():
            t = f.get_tensor(name)
            if t.dim() == 2 and "embeddings" not in name:
                w = t.to(torch.bfloat16)
                m = W12Matrix.from_bf16(w)
                assert bits_equal(m.to_bf16(), w)
                bits += m.bits_per_weight * m.n * m.k
                weights += m.n * m.k
                escapes += m.nnz
    print(f"MiniLM linear layers: {bits / weights:.4f} bits/weight, escape rate {escapes / weights:.2e}")
    assert weights > 10_000_000
    assert bits / weights <= 12.05
