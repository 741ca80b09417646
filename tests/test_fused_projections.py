"""Projection groups (runtime/fused.py, issue 5): q/k/v and gate/up of one parent share ONE W12 GEMM.

CPU only. The fused path runs `torch.ops.w12.gemm_packed`; on the CPU that op is its reference implementation,
reached through `set_cpu_gemm_op(True)` (the `gemm_op` fixture). Fused results are compared with the same
layers unfused through the same op, bit for bit; shapes stay small (K ≤ 256), where the CPU fp32 matmul
of the reference gives each output channel the same bits whatever the number of channels.
"""

import json
import os

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import w12
from w12.convert.checkpoint import verify
from w12.convert.convert import convert
from w12.formats.matrix import W12Matrix
from w12.runtime.fused import FUSED_NAMES, fused_groups
from w12.runtime.w12_linear import _STASH, BUFFER_NAMES, W12Linear, prepare, set_cpu_gemm_op
from checkpoints import read_tensors  # tests/checkpoints.py

transformers = pytest.importorskip("transformers")
from transformers import AutoModelForCausalLM, CompileConfig  # noqa: E402

K = 192  # not a multiple of 64: the last tile of every row is padded


def setup_module(module):
    torch.set_num_threads(1)
    w12.patch_transformers()


@pytest.fixture
def gemm_op():
    from w12.runtime.w12_linear import kernel_backend

    assert kernel_backend() is not None, "w12.kernels must import on the CPU (reference GEMM op)"
    set_cpu_gemm_op(True)
    try:
        yield
    finally:
        set_cpu_gemm_op(False)


def bits(t):
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


def assert_same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(bits(a), bits(b))


def bf16_linear(n, k, bias, escapes, seed):
    """nn.Linear in BF16 with a few weights outside any window (escapes) unless escapes=False."""
    g = torch.Generator().manual_seed(seed)
    lin = nn.Linear(k, n, bias=bias, dtype=torch.bfloat16)
    with torch.no_grad():
        w = torch.randn(n, k, generator=g) * 0.02
        lin.weight.copy_(w if escapes else w.sign() * (0.01 + w.abs().clamp(max=0.05)))  # no tiny values: no escapes
        if bias:
            lin.bias.copy_(torch.randn(n, generator=g))
        if escapes:
            flat = lin.weight.view(-1)
            flat[[0, 5, 6, (n // 2 + 3) * k + 70, n * k - 1]] = torch.tensor([0.0, 1e-30, 30.0, -1e-25, 1e4],
                                                                   dtype=torch.bfloat16)
    return lin


class Block(nn.Module):
    """A decoder-layer-like block: attention projections (q, k, v) and a gated MLP (gate, up, down)."""

    def __init__(self, bias=False):
        super().__init__()
        self.attn = nn.Module()
        self.mlp = nn.Module()
        shapes = {"q_proj": (256, bias, True), "k_proj": (128, bias, False), "v_proj": (128, bias, True)}
        for i, (name, (n, b, esc)) in enumerate(shapes.items()):
            setattr(self.attn, name, W12Linear.from_linear(bf16_linear(n, K, b, esc, i)))
        for i, name in enumerate(("gate_proj", "up_proj")):
            setattr(self.mlp, name, W12Linear.from_linear(bf16_linear(384, K, False, True, 10 + i)))
        self.mlp.down_proj = W12Linear.from_linear(bf16_linear(K, 384, False, True, 20))

    def forward(self, x):
        """[..., K + 512 + 768]: the block's output, then every projection's output, side by side."""
        a, m = self.attn, self.mlp
        q, k, v = a.q_proj(x), a.k_proj(x), a.v_proj(x)
        h = x + (q[..., :K] * 0.5 + k.sum(-1, keepdim=True) - v.mean(-1, keepdim=True))
        gate, up = m.gate_proj(h), m.up_proj(h)
        return torch.cat([h + m.down_proj(torch.nn.functional.silu(gate) * up), q, k, v, gate, up], -1)


class CountGemm(TorchDispatchMode):
    """Records the `n` of every W12 GEMM op call (eager): torch.ops.w12.gemm_packed, which layers call, and
    torch.ops.w12.gemm."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.w12.gemm_packed.default:
            self.calls.append(args[2])
        elif func is torch.ops.w12.gemm.default:
            self.calls.append(args[-1])
        return func(*args, **(kwargs or {}))


def x_for(seed, shape=(2, 3, K)):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


# ---------------------------------------------------------------------------------------------
# storage
# ---------------------------------------------------------------------------------------------
def test_fused_tensors_are_the_encoding_of_the_concatenated_matrix(gemm_op):
    """SPEC.md §3/§5/§6: with N a multiple of 128 per member, the concatenated tensors ARE the W12 encoding
    of torch.cat(weights); members become dim-0 views of them (the bytes live once)."""
    from w12.kernels.gemm import prepare_escapes
    from w12.kernels.ops import unpack_matrix

    block = Block()
    members = [block.attn.q_proj, block.attn.k_proj, block.attn.v_proj]
    before = [{b: getattr(m, b).clone() for b in BUFFER_NAMES} for m in members]
    weights = [m.dequantize() for m in members]
    assert members[0].weight_escapes.shape[0] >= 5 and members[1].weight_escapes.shape[0] == 0  # k: no escapes
    prepare(block)
    assert fused_groups(block) == 2
    want = W12Matrix.from_bf16(torch.cat(weights))
    q = members[0]
    for name, t in zip(FUSED_NAMES[1:], (want.exponents, want.esc_counts, want.escapes)):
        assert_same(getattr(q, name), t)
    offs, cols = prepare_escapes(want.esc_counts, want.escapes)
    nb, kb = want.records.shape[:2]
    for got, expected in zip(unpack_matrix(q._fused_packed, nb, kb, want.escapes.shape[0]),
                             (want.records, want.exponents, want.escapes, offs, cols)):
        assert_same(got, expected)
    fused_ptr = {b: getattr(q, f).untyped_storage().data_ptr() for b, f in zip(BUFFER_NAMES, FUSED_NAMES)}
    for m, old in zip(members, before):
        for b in BUFFER_NAMES:
            t = getattr(m, b)
            assert_same(t, old[b])  # the member's own tensors, unchanged ...
            assert t.untyped_storage().data_ptr() == fused_ptr[b]  # ... and a view of the fused tensor


def test_prepared_layers_hold_their_bytes_once_and_save_unshared(gemm_op, tmp_path):
    """prepare() packs an unfused layer's records + tables into `_w12_packed` and re-points `weight` at its
    records part (no second copy); the state dict still has the checkpoint's tensors, and the save path's
    `unshared_state_dict` turns every view into a tensor of its own that safetensors writes."""
    from safetensors.torch import load_file, save_file

    from w12.runtime.fused import unshared_state_dict

    block = Block()
    down = block.mlp.down_proj
    records = down.weight.clone()
    prepare(block)
    assert down.weight.untyped_storage().data_ptr() == down._w12_packed.untyped_storage().data_ptr()
    assert_same(down.weight, records)
    sd = unshared_state_dict(block, block.state_dict())
    assert all(t.untyped_storage().nbytes() == t.numel() * t.element_size() for t in sd.values())
    save_file(sd, str(tmp_path / "m.safetensors"))
    back = load_file(str(tmp_path / "m.safetensors"))
    assert set(back) == set(sd) and all(torch.equal(back[k], sd[k]) for k in sd)


def test_hooked_layer_keeps_its_own_tensors(gemm_op):
    """A layer with an accelerate hook (which may swap `weight` per call) is not packed: prepare() builds only
    its escape tables, forward runs `torch.ops.w12.gemm` on its own buffers, with the same bits."""
    block = Block(bias=True)
    x = x_for(6, (2, 3, block.mlp.down_proj.in_features))
    down = block.mlp.down_proj
    prepare(block, fuse=False)
    with torch.no_grad():
        want = down(x)
    down._hf_hook = object()  # what accelerate's add_hook_to_module sets
    try:
        prepare(block)
        assert "_w12_packed" not in down._buffers and "_esc_offsets" in down._buffers
        with torch.no_grad(), CountGemm() as c:
            assert_same(down(x), want)
        assert c.calls == [down.out_features]
    finally:
        del down._hf_hook


def test_only_eligible_siblings_fuse(gemm_op):
    block = Block()
    block.attn.k_proj = W12Linear.from_linear(bf16_linear(64, K, False, True, 3))  # 64 rows: not a tile multiple
    block.mlp.up_proj = W12Linear.from_linear(bf16_linear(384, 128, False, True, 4))  # another input width
    prepare(block)
    assert fused_groups(block) == 0
    assert all(m.w12_group is None for m in block.modules() if isinstance(m, W12Linear))


def test_default_cpu_and_fuse_off_make_no_groups(gemm_op, monkeypatch):
    block = Block()
    prepare(block, fuse=False)
    assert fused_groups(block) == 0
    monkeypatch.setenv("W12_FUSE", "0")
    prepare(block)
    assert fused_groups(block) == 0
    monkeypatch.setenv("W12_FUSE", "yes")
    with pytest.raises(ValueError, match="W12_FUSE"):
        prepare(block)
    monkeypatch.delenv("W12_FUSE")
    prepare(block)
    assert fused_groups(block) == 2
    prepare(block, fuse=False)  # dissolves
    assert fused_groups(block) == 0 and not any(n in block.attn.q_proj._buffers for n in FUSED_NAMES)
    set_cpu_gemm_op(False)
    prepare(block)  # the default CPU path (decode + F.linear) is never fused
    assert fused_groups(block) == 0


# ---------------------------------------------------------------------------------------------
# forward
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bias", [False, True])
def test_fused_forward_is_bit_identical_with_one_gemm_per_group(gemm_op, bias):
    block = Block(bias=bias)
    x = x_for(1)
    prepare(block, fuse=False)
    with torch.no_grad(), CountGemm() as c:
        want = block(x)
    assert c.calls == [256, 128, 128, 384, 384, K]
    prepare(block)
    with torch.no_grad(), CountGemm() as c:
        got = block(x)
    assert c.calls == [512, 768, K]
    assert_same(want, got)
    assert not _STASH  # the last member of each group cleared it


def test_fused_model_on_the_default_cpu_path_equals_nn_linear(gemm_op):
    """Fused, then the switch off: every member decodes its own view buffers + F.linear, as BF16 does."""
    block = Block(bias=True)
    prepare(block)
    assert fused_groups(block) == 2
    set_cpu_gemm_op(False)
    with torch.no_grad(), CountGemm() as c:
        for name, m in block.named_modules():
            if isinstance(m, W12Linear):
                x = x_for(2, (2, 3, m.in_features))
                assert_same(m(x), torch.nn.functional.linear(x, m.dequantize(), m.bias)), name
    assert c.calls == []


def test_out_of_order_calls_and_other_inputs_fall_back(gemm_op):
    block = Block(bias=True)
    q, k, v = block.attn.q_proj, block.attn.k_proj, block.attn.v_proj
    x, x2 = x_for(4), x_for(5)
    prepare(block, fuse=False)
    with torch.no_grad():
        want = {(name, i): m(t) for name, m in (("q", q), ("k", k), ("v", v)) for i, t in ((0, x), (1, x2))}
    prepare(block)
    cases = [  # (calls, expected GEMM widths)
        ([("k", 0), ("q", 0), ("v", 0)], [128, 512]),        # k first: its own GEMM; then q fuses, v slices
        ([("q", 0), ("k", 1), ("v", 0)], [512, 128]),        # k on another input: its own GEMM
        ([("q", 0), ("v", 0), ("k", 0)], [512, 128]),        # v (the last) clears the stash: k runs alone
        ([("q", 0), ("q", 1), ("k", 0), ("v", 1)], [512, 512, 128]),  # q again on x2: the stash follows it
        ([("v", 1), ("k", 1)], [128, 128]),
    ]
    mods = {"q": q, "k": k, "v": v}
    for calls, widths in cases:
        with torch.no_grad(), CountGemm() as c:
            for name, i in calls:
                assert_same(mods[name]((x, x2)[i]), want[(name, i)])
        assert c.calls == widths, calls
    with torch.no_grad(), w12.runtime.w12_linear.view8_mode(block), CountGemm() as c:
        y = q(x), k(x)
    assert c.calls == [] and y[1].shape == (2, 3, 128)  # view8: the member's own (view) path


def test_load_matrix_and_state_dict_keep_working(gemm_op):
    block = Block(bias=True)
    x = x_for(6)
    prepare(block, fuse=False)
    with torch.no_grad():
        want = block(x)
    plain_sd = {k: v.clone() for k, v in block.state_dict().items()}
    prepare(block)
    sd = block.state_dict()
    assert set(sd) == set(plain_sd) and all(torch.equal(sd[k], plain_sd[k]) for k in sd)
    fresh = Block(bias=True)
    fresh.load_state_dict(sd)
    prepare(fresh)
    block.load_state_dict(plain_sd)  # copies into the views: the fused tensors see the same bytes
    with torch.no_grad():
        assert_same(fresh(x), want)
        assert_same(block(x), want)
    m = block.attn.k_proj
    m.load_matrix(m.matrix())  # replacing a member's tensors dissolves its group
    assert fused_groups(block) == 1 and m.w12_group is None and "_fused_packed" not in block.attn.q_proj._buffers
    with torch.no_grad():
        assert_same(block(x), want)


# ---------------------------------------------------------------------------------------------
# torch.compile
# ---------------------------------------------------------------------------------------------
def counting_backend(counts):
    def backend(gm, example_inputs):
        counts.append(sum(1 for n in gm.graph.nodes if n.op == "call_function"
                          and n.target in (torch.ops.w12.gemm_packed, torch.ops.w12.gemm_packed.default)))
        return gm
    return backend


def test_compile_fullgraph_has_one_gemm_per_group(gemm_op):
    import torch._dynamo

    block = Block(bias=True)
    x = x_for(7)
    prepare(block)
    with torch.no_grad():
        want = block(x)
        torch._dynamo.reset()
        counts = []
        f = torch.compile(block, backend=counting_backend(counts), fullgraph=True)
        assert_same(f(x), want)
        y2 = f(x_for(8))  # a new input: same graph, no recompile
        assert counts == [3]  # q|k|v, gate|up, down
        prepare(block, fuse=False)
        assert_same(y2, block(x_for(8)))
        torch._dynamo.reset()
        counts.clear()
        assert_same(torch.compile(block, backend=counting_backend(counts), fullgraph=True)(x), want)
        assert counts == [6]
        prepare(block)
        torch._dynamo.reset()
        explain = torch._dynamo.explain(block)(x)
    assert explain.graph_count == 1 and explain.graph_break_count == 0
    torch._dynamo.reset()


def test_compiled_layers_read_one_w12_tensor_each(gemm_op):
    """A compiled model re-checks (guards) every tensor its graph reads on every call: each W12 layer (and
    each fused group) hands the GEMM op ONE packed tensor (records + tables), like an nn.Linear its weight."""
    import torch._dynamo

    block = Block(bias=False)
    seen = []

    def backend(gm, example_inputs):
        seen.append([n.target for n in gm.graph.nodes if n.op == "placeholder"])
        return gm

    with torch.no_grad():
        for fuse, gemms in ((False, 6), (True, 3)):
            prepare(block, fuse=fuse)
            torch._dynamo.reset()
            seen.clear()
            torch.compile(block, backend=backend, fullgraph=True)(x_for(3))
            w12_inputs = [t for t in seen[0] if "packed" in t]
            assert len(w12_inputs) == gemms, w12_inputs
            assert not [t for t in seen[0] if any(s in t for s in ("weight", "tables", "exponents", "escapes", "esc_"))]
    torch._dynamo.reset()


def test_packed_tables_round_trip_and_alignment():
    from w12.kernels.gemm import prepare_escapes
    from w12.kernels.ops import pack_matrix, pack_tables, unpack_matrix, unpack_tables

    for nnz_rows in (0, 3):
        w = (torch.randn(256, K, generator=torch.Generator().manual_seed(nnz_rows)) * 0.02).to(torch.bfloat16)
        w[:nnz_rows, 5] = 300.0  # out of every window: escapes
        m = W12Matrix.from_bf16(w)
        offs, cols = prepare_escapes(m.esc_counts, m.escapes)
        nb, kb = m.records.shape[:2]
        tables = pack_tables(m.exponents, m.escapes, offs, cols)
        parts = unpack_tables(tables, nb, kb, m.escapes.shape[0])
        for got, want in zip(parts, (m.exponents, m.escapes, offs, cols)):
            assert_same(got, want)
        assert all(p.data_ptr() % 16 == 0 for p in parts)  # the CUDA kernels' alignment
        packed = pack_matrix(m.records, m.exponents, m.escapes, offs, cols)
        parts = unpack_matrix(packed, nb, kb, m.escapes.shape[0])
        for got, want in zip(parts, (m.records, m.exponents, m.escapes, offs, cols)):
            assert_same(got, want)
        assert all(p.data_ptr() % 16 == 0 for p in parts)
        odd = torch.empty(m.records.numel() + 1, dtype=torch.uint8)[1:].view(m.records.shape)
        odd.copy_(m.records)  # records at an odd storage offset (as a safetensors load may give): copied bytewise
        assert_same(unpack_matrix(pack_matrix(odd, m.exponents, m.escapes, offs, cols), nb, kb, m.escapes.shape[0])[0],
                    m.records)
    with pytest.raises(ValueError, match="NB"):
        pack_tables(m.exponents[:100], m.escapes, offs, cols)


# ---------------------------------------------------------------------------------------------
# Transformers
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A tiny Llama whose q/k/v (256/128/128 rows) and gate/up (384 rows) fuse: (bf16 dir, w12 dir)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=320, hidden_size=256, intermediate_size=384, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.view(-1)[:3] = torch.tensor([0.0, 1e-30, 30.0])
    root = tmp_path_factory.mktemp("fused-llama")
    model.to(torch.bfloat16).save_pretrained(root / "bf16")
    convert(str(root / "bf16"), str(root / "w12"))
    return str(root / "bf16"), str(root / "w12")


def greedy(model, ids, n, **kw):
    return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                          do_sample=False, pad_token_id=0, **kw)


def _load(path, fuse, monkeypatch):
    monkeypatch.setenv("W12_FUSE", "1" if fuse else "0")
    model = AutoModelForCausalLM.from_pretrained(path)
    assert fused_groups(model) == (4 if fuse else 0)
    return model


def test_llama_from_pretrained_fuses_and_generates_the_same_tokens(llama, gemm_op, monkeypatch):
    import torch._dynamo

    src, dst = llama
    plain, fused = _load(dst, False, monkeypatch), _load(dst, True, monkeypatch)
    ids = torch.randint(0, 320, (1, 9), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        assert_same(plain(ids).logits, fused(ids).logits)
    assert torch.equal(greedy(plain, ids, 12), greedy(fused, ids, 12))
    # the decode step as Transformers compiles it (static cache), and the op count of a compiled forward
    cc = CompileConfig(backend="eager")
    cc._compile_all_devices = True
    assert torch.equal(greedy(plain, ids, 8, cache_implementation="static", compile_config=cc),
                       greedy(fused, ids, 8, cache_implementation="static", compile_config=cc))
    for model, want in ((fused, 2 * 4), (plain, 2 * 7)):
        torch._dynamo.reset()
        counts = []
        with torch.no_grad():
            out = torch.compile(model, backend=counting_backend(counts), fullgraph=True)(ids).logits
        assert counts == [want]
    with torch.no_grad():
        assert_same(out, fused(ids).logits)
    torch._dynamo.reset()
    # default CPU behaviour: not fused, decode + F.linear, bit-identical to the BF16 model
    set_cpu_gemm_op(False)
    monkeypatch.delenv("W12_FUSE")
    default = AutoModelForCausalLM.from_pretrained(dst)
    assert fused_groups(default) == 0
    with torch.no_grad():
        assert_same(default(ids).logits, AutoModelForCausalLM.from_pretrained(src)(ids).logits)


@pytest.mark.parametrize("shard", [None, "300KB"])
def test_save_pretrained_of_a_fused_model_round_trips(llama, gemm_op, monkeypatch, tmp_path, shard):
    src, dst = llama
    model = _load(dst, True, monkeypatch)
    out = tmp_path / "saved"
    model.save_pretrained(out, **({"max_shard_size": shard} if shard else {}))
    files = [f for f in os.listdir(out) if f.endswith(".safetensors")]
    assert (len(files) > 1) == (shard is not None)
    report = verify(out)
    assert report.ok and report.matrices == 14, report.mismatches
    assert verify(out, src).ok
    a, b = read_tensors(out), read_tensors(dst)
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads((out / "config.json").read_text())["quantization_config"]["quant_method"] == "w12"
    assert fused_groups(model) == 4  # saving leaves the model fused
    # what the quantizer hands to the writer: the grouped members' tensors as separate CPU copies
    from w12.runtime.fused import unshared_state_dict

    sd = model.state_dict()
    copies = unshared_state_dict(model, sd)
    grouped = [k for k in sd if k.endswith(BUFFER_NAMES) and "_proj." in k and ".o_proj." not in k
               and ".down_proj." not in k]
    assert len(grouped) == 2 * 5 * 4
    assert len({copies[k].untyped_storage().data_ptr() for k in grouped}) == len(grouped)
    assert all(torch.equal(copies[k], sd[k]) for k in sd)
    reloaded = _load(out, True, monkeypatch)
    ids = torch.arange(1, 10)[None]
    with torch.no_grad():
        assert_same(reloaded(ids).logits, model(ids).logits)
