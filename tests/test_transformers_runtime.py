"""Transformers integration (issue 5): W12 checkpoints load through a stock `from_pretrained` after
`w12.patch_transformers()` and behave bit-for-bit like the BF16 model they came from.

References are always `from_pretrained(<bf16 dir>)` (never a `.to(torch.bfloat16)` copy: that would
also cast the fp32 rotary buffers). CPU only; models are tiny except the SmolLM2/MiniLM fixtures.
"""

import json
import os
import shutil

import pytest
import torch

import w12
from w12.convert.checkpoint import verify
from w12.convert.convert import Options, convert
from checkpoints import read_tensors  # tests/checkpoints.py

transformers = pytest.importorskip("transformers")
from transformers import AutoModel, AutoModelForCausalLM, CompileConfig  # noqa: E402
from transformers.quantizers import auto as qauto  # noqa: E402

from w12.runtime.w12_linear import W12Linear, decode_op, decode_torch, escape_index, set_cpu_decode_cache  # noqa: E402

PROMPTS = "/work/shared/data/prompts/mt-bench.jsonl"


def setup_module(module):
    torch.set_num_threads(1)
    w12.patch_transformers()


# ---------------------------------------------------------------------------------------------
# checkpoints
# ---------------------------------------------------------------------------------------------
def _save_bf16(model, path, **kw):
    model.to(torch.bfloat16).save_pretrained(path, **kw)
    return str(path)


def build_tiny(kind, path, tie=False, **kw):
    torch.manual_seed(0)
    if kind == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = LlamaConfig(vocab_size=320, hidden_size=128, intermediate_size=200, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                          tie_word_embeddings=tie)
        model = LlamaForCausalLM(cfg)
    else:
        from transformers import Qwen3Config, Qwen3ForCausalLM

        cfg = Qwen3Config(vocab_size=320, hidden_size=128, intermediate_size=192, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=256,
                          tie_word_embeddings=tie, attention_bias=True)
        model = Qwen3ForCausalLM(cfg)
    with torch.no_grad():  # a few values outside any window, so escapes exist
        for p in model.parameters():
            if p.dim() == 2:
                p.view(-1)[:3] = torch.tensor([0.0, 1e-30, 30.0])
    return _save_bf16(model, path, **kw)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """{kind: (bf16_dir, w12_dir)} for a tiny Llama (untied) and a tiny Qwen3 (tied, with q/k/v bias)."""
    out = {}
    for kind, tie in (("llama", False), ("qwen3", True)):
        root = tmp_path_factory.mktemp(kind)
        src = build_tiny(kind, root / "bf16", tie=tie)
        convert(src, str(root / "w12"))
        out[kind] = (src, str(root / "w12"))
    return out


def bits(t):
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


def assert_same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(bits(a), bits(b))


def greedy(model, ids, n, **kw):
    return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                          do_sample=False, pad_token_id=0, **kw)


# ---------------------------------------------------------------------------------------------
# registration / guard
# ---------------------------------------------------------------------------------------------
def test_patch_is_idempotent_and_config_keeps_unknown_keys():
    w12.patch_transformers()
    w12.patch_transformers()
    from w12.runtime.hf_config import W12Config
    from w12.runtime.hf_quantizer import W12HfQuantizer

    assert qauto.AUTO_QUANTIZER_MAPPING["w12"] is W12HfQuantizer
    assert qauto.AUTO_QUANTIZATION_CONFIG_MAPPING["w12"] is W12Config
    assert w12.W12Config is W12Config
    cfg = qauto.AutoQuantizationConfig.from_dict({"quant_method": "w12", "format_version": 1, "future_key": [1]})
    assert isinstance(cfg, W12Config) and cfg.to_dict()["future_key"] == [1] and cfg.quant_method == "w12"


def test_unpatched_load_raises(tiny, monkeypatch):
    """Without the registration Transformers skips the unknown quant_method; our records tensor is stored
    under `P.weight` with another shape, so the stock loader raises on the size mismatch."""
    monkeypatch.delitem(qauto.AUTO_QUANTIZER_MAPPING, "w12")
    monkeypatch.delitem(qauto.AUTO_QUANTIZATION_CONFIG_MAPPING, "w12")
    for kind in ("llama", "qwen3"):
        with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):
            AutoModelForCausalLM.from_pretrained(tiny[kind][1])


def test_other_format_version_is_refused(tiny, tmp_path):
    dst = tmp_path / "v2"
    shutil.copytree(tiny["llama"][1], dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["quantization_config"]["format_version"] = 2
    (dst / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="version 2"):
        AutoModelForCausalLM.from_pretrained(dst)


def test_corrupt_matrix_is_rejected_at_load(tiny, tmp_path):
    """SPEC.md §9: a row exponent out of range is caught before any forward."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    dst = tmp_path / "bad"
    shutil.copytree(tiny["llama"][1], dst)
    path = dst / "model.safetensors"
    with safe_open(path, "pt") as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    tensors["model.layers.0.mlp.up_proj.weight_exponents"][3] = 255
    save_file(tensors, str(path), metadata=meta)
    with pytest.raises(w12.W12Error, match="up_proj"):
        AutoModelForCausalLM.from_pretrained(dst)


# ---------------------------------------------------------------------------------------------
# pre-quantized loads: exact
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_tiny_load_is_exact(tiny, kind):
    src, dst = tiny[kind]
    ref = AutoModelForCausalLM.from_pretrained(src)
    model, info = AutoModelForCausalLM.from_pretrained(dst, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")), info
    layers = [m for m in model.modules() if isinstance(m, W12Linear)]
    assert len(layers) == 14 and model.dtype == torch.bfloat16
    assert not any(isinstance(m, W12Linear) for m in (model.lm_head, model.model.embed_tokens))
    assert sum(m.weight_escapes.shape[0] for m in layers) >= 3 * len(layers)
    if kind == "qwen3":
        assert model.model.layers[0].self_attn.q_proj.bias is not None
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # still tied
    ids = torch.randint(0, 320, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert_same(ref(ids).logits, model(ids).logits)
    assert torch.equal(greedy(ref, ids, 16), greedy(model, ids, 16))
    # no BF16 copy of a converted weight anywhere in the model
    assert all(b.dtype != torch.bfloat16 for m in layers for b in m.buffers())


@pytest.mark.parametrize("device_map", ["cpu", "auto"])
def test_device_map_on_cpu(tiny, device_map):
    src, dst = tiny["llama"]
    ref = AutoModelForCausalLM.from_pretrained(src)
    model = AutoModelForCausalLM.from_pretrained(dst, device_map=device_map)
    assert model.model.layers[1].mlp.down_proj.weight.device.type == "cpu"
    ids = torch.arange(1, 12)[None]
    with torch.no_grad():
        assert_same(ref(ids).logits, model(ids).logits)


def test_static_cache_compiled_generate_is_exact(tiny):
    """generate(cache_implementation="static") compiles the decode step when is_compileable is True; on
    the CPU via CompileConfig(backend="eager") + _compile_all_devices. One graph, no graph break."""
    import torch._dynamo.utils as dynamo_utils

    src, dst = tiny["llama"]
    ref = AutoModelForCausalLM.from_pretrained(src)
    model = AutoModelForCausalLM.from_pretrained(dst)
    cc = CompileConfig(backend="eager")
    cc._compile_all_devices = True
    ids = torch.randint(0, 320, (1, 7), generator=torch.Generator().manual_seed(2))
    want = greedy(ref, ids, 8, cache_implementation="static", compile_config=cc)
    dynamo_utils.counters.clear()
    got = greedy(model, ids, 8, cache_implementation="static", compile_config=cc)
    assert torch.equal(want, got)
    assert getattr(model, "_compiled_call", None) is not None
    assert dynamo_utils.counters["stats"]["unique_graphs"] >= 1 and not dynamo_utils.counters["graph_break"]


def test_dequantize_is_exact(tiny):
    src, dst = tiny["qwen3"]
    ref = AutoModelForCausalLM.from_pretrained(src)
    model = AutoModelForCausalLM.from_pretrained(dst).dequantize()
    assert not any(isinstance(m, W12Linear) for m in model.modules())
    assert getattr(model, "hf_quantizer", None) is None
    for (name, a), (_, b) in zip(ref.named_parameters(), model.named_parameters()):
        assert_same(a, b), name


# ---------------------------------------------------------------------------------------------
# on-the-fly conversion and save_pretrained
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_on_the_fly_then_sharded_save_round_trip(tiny, kind, tmp_path):
    src, converted = tiny[kind]
    ref = AutoModelForCausalLM.from_pretrained(src)
    model, info = AutoModelForCausalLM.from_pretrained(src, quantization_config=w12.W12Config(),
                                                       output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")), info
    assert sum(isinstance(m, W12Linear) for m in model.modules()) == 14
    ids = torch.randint(0, 320, (1, 10), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert_same(ref(ids).logits, model(ids).logits)

    out = tmp_path / "saved"
    model.save_pretrained(out, max_shard_size="150KB")
    assert len([f for f in os.listdir(out) if f.endswith(".safetensors")]) > 2  # sharded: per-file headers
    report = verify(out)  # against the SHA-256 recorded in the headers
    assert report.ok and report.matrices == 14, report.mismatches
    report = verify(out, src)  # against the original BF16 checkpoint, by bits
    assert report.ok, report.mismatches
    # same tensors, byte for byte, as `w12 convert`; same quantization_config where it matters
    a, b = read_tensors(out), read_tensors(converted)
    assert set(a) == set(b)
    for k in a:
        assert torch.equal(a[k].view(torch.uint8) if a[k].dim() else a[k], b[k].view(torch.uint8) if b[k].dim() else b[k]), k
    qa = json.loads((out / "config.json").read_text())["quantization_config"]
    qb = json.loads(open(os.path.join(converted, "config.json")).read())["quantization_config"]
    for key in ("quant_method", "format_version", "modules_to_not_convert", "converted_count", "cast_from"):
        assert qa[key] == qb[key], key
    reloaded = AutoModelForCausalLM.from_pretrained(out)
    assert torch.equal(greedy(ref, ids, 8), greedy(reloaded, ids, 8))


def test_save_of_a_loaded_checkpoint_verifies(tiny, tmp_path):
    src, dst = tiny["qwen3"]
    model = AutoModelForCausalLM.from_pretrained(dst)
    model.save_pretrained(tmp_path / "again")
    assert verify(tmp_path / "again", src).ok
    a, b = read_tensors(tmp_path / "again"), read_tensors(dst)
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_on_the_fly_refuses_fp32_without_cast(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path / "fp32")  # float32
    with pytest.raises(ValueError, match="cast_bf16"):
        AutoModelForCausalLM.from_pretrained(tmp_path / "fp32", quantization_config=w12.W12Config())
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "fp32", quantization_config=w12.W12Config(cast_bf16=True))
    assert model.config.quantization_config.cast_from == "float32"


# ---------------------------------------------------------------------------------------------
# W12Linear
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape,bias", [((130, 70), True), ((64, 64), False), ((1, 1), True)])
def test_w12_linear_matches_nn_linear(shape, bias):
    torch.manual_seed(0)
    lin = torch.nn.Linear(shape[1], shape[0], bias=bias, dtype=torch.bfloat16)
    with torch.no_grad():
        lin.weight.view(-1)[:1] = 0.0
    layer = W12Linear.from_linear(lin)
    x = torch.randn(3, 5, shape[1], dtype=torch.bfloat16)
    with torch.no_grad():
        assert_same(lin(x), layer(x))
    assert_same(layer.dequantize(), lin.weight.detach())
    idx, b = escape_index(layer.weight_esc_counts, layer.weight_escapes, *shape)
    assert_same(decode_torch(layer.weight, layer.weight_exponents, idx, b, *shape), lin.weight.detach())  # CUDA fallback


def test_cpu_decode_cache_is_off_by_default_and_exact():
    from w12.runtime import w12_linear as wl

    assert wl._CACHE.max_bytes == 0
    lin = torch.nn.Linear(96, 200, dtype=torch.bfloat16)
    layer = W12Linear.from_linear(lin)
    x = torch.randn(2, 96, dtype=torch.bfloat16)
    set_cpu_decode_cache(1 << 20)
    try:
        with torch.no_grad():
            a, b = layer(x), layer(x)
        assert len(wl._CACHE.items) == 1
        assert_same(a, lin(x)) and assert_same(b, lin(x))
    finally:
        set_cpu_decode_cache(0)
    assert not wl._CACHE.items


def test_decode_op_is_opaque_to_compile():
    lin = torch.nn.Linear(64, 128, dtype=torch.bfloat16)
    layer = W12Linear.from_linear(lin)
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    f = torch.compile(layer, backend="eager", fullgraph=True)
    with torch.no_grad():
        assert_same(f(x), lin(x))
    assert decode_op._opoverload is not None


# ---------------------------------------------------------------------------------------------
# real models
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    from w12.convert.fixtures import smollm2_bf16

    src = str(smollm2_bf16())
    dst = str(tmp_path_factory.mktemp("smollm2") / "w12")
    convert(src, dst)
    return src, dst


def chat_prompts(n):
    with open(PROMPTS) as f:
        return [json.loads(line)["turns"][0] for _, line in zip(range(n), f)]


def test_smollm2_chat_greedy_is_exact(smollm2):
    """3 mt-bench prompts (W12_SMOLLM2_PROMPTS=20 for a longer run) through the chat template, 64 new tokens
    each: identical tokens. The (documented, default-off) CPU decode cache keeps this test fast; per-call
    decoding is covered by the tiny models."""
    from transformers import AutoTokenizer

    src, dst = smollm2
    tok = AutoTokenizer.from_pretrained(src)
    ref = AutoModelForCausalLM.from_pretrained(src)
    model = AutoModelForCausalLM.from_pretrained(dst)
    assert model.config.tie_word_embeddings and not isinstance(model.lm_head, W12Linear)
    set_cpu_decode_cache(1 << 30)
    try:
        prompts = chat_prompts(int(os.environ.get("W12_SMOLLM2_PROMPTS", "3")))
        for prompt in prompts:
            enc = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                          return_tensors="pt", return_dict=True)
            kw = dict(max_new_tokens=64, do_sample=False)
            want = ref.generate(**enc, **kw)
            got = model.generate(**enc, **kw)
            assert torch.equal(want, got), (prompt, tok.decode(want[0]), tok.decode(got[0]))
    finally:
        set_cpu_decode_cache(0)


def test_minilm_cast_is_bit_identical(tmp_path):
    from w12.convert.fixtures import minilm_fp32

    src = str(minilm_fp32())
    dst = str(tmp_path / "w12")
    convert(src, dst, Options(cast_bf16=True))
    ref = AutoModel.from_pretrained(src, dtype=torch.bfloat16)
    model = AutoModel.from_pretrained(dst)
    n = sum(isinstance(m, W12Linear) for m in model.modules())
    assert n == 6 * 6 + 1  # q, k, v, attn out, intermediate, output per layer + pooler
    enc = {"input_ids": torch.tensor([[101, 7592, 2088, 1010, 2023, 2003, 1037, 3231, 102, 0]]),
           "attention_mask": torch.tensor([[1] * 9 + [0]])}
    with torch.no_grad():
        a, b = ref(**enc), model(**enc)
    assert_same(a.last_hidden_state, b.last_hidden_state)
    assert_same(a.pooler_output, b.pooler_output)
