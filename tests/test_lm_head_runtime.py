"""The certified LM head as a runtime switch (issue 6): `W12Config(certified_lm_head=...)`, the custom ops,
the argmax-only sparse logits, and the `generate` wrapper that uses them only when nothing but the argmax
is needed.  CPU only: the CUDA kernels are checked by bench/lm_head.py on the GPU."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import w12
from w12.kernels.lm_head_int8 import (CertifiedHead, CertifiedLMHead, argmax_is_enough, exact_logits,
                                      install_certified_lm_head)

transformers = pytest.importorskip("transformers")
from transformers import AutoModelForCausalLM, LogitsProcessorList, MinLengthLogitsProcessor  # noqa: E402

from checkpoints import tiny_llama  # noqa: E402
from w12.convert.convert import convert  # noqa: E402

K = 128


def setup_module(module):
    torch.set_num_threads(1)
    w12.patch_transformers()


def bits(t):
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


def twins_weight(v=600, k=K, seed=0):
    """Random rows, rows 2i+1 = rows 2i for i < 32 (exact ties: the lower id must win)."""
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(v, k, generator=g) * 0.05).bfloat16()
    w[1:64:2] = w[0:64:2]
    return w


def aimed(w, n, seed=1):
    g = torch.Generator().manual_seed(seed)
    aim = torch.randint(0, 80, (n,), generator=g)
    x = w[aim].float() / w[aim].float().norm(dim=1, keepdim=True) * 30 + torch.randn(n, w.shape[1], generator=g)
    return x.bfloat16()


# ---------------------------------------------------------------------------------------------
# the ops (CPU implementations = the reference)
# ---------------------------------------------------------------------------------------------
def test_argmax_op_on_cpu_is_the_reference_padded_to_cap():
    w = twins_weight()
    h = CertifiedHead.from_weight(w)
    x = aimed(w, 37)
    x[3] = 0  # every row ties: 600 candidates > cap → fallback
    ids, index, logits, counts, amb, fb, best = torch.ops.w12.lm_head_argmax(
        x, h.q, h.scale, h.radius, h.wnorm, w, 64, h.u_acc, False)
    ref_ids, info = h.argmax(x, cap=64)
    full = F.linear(x, w)
    assert torch.equal(ids, ref_ids) and torch.equal(ids, full.argmax(1))
    assert index.shape == logits.shape == (37, 64) and (index[:, info.index.shape[1]:] == -1).all()
    assert torch.equal(index[:, :info.index.shape[1]], info.index)
    assert torch.equal(counts, info.counts) and torch.equal(fb, info.fallback) and fb[3] and counts[3] == 600
    assert torch.equal(amb, info.ambiguous)
    assert torch.equal(bits(best), bits(full.gather(1, ids[:, None])[:, 0]))  # the winner's exact logit


def test_ops_pass_opcheck():
    w = twins_weight(200)
    h = CertifiedHead.from_weight(w)
    x = aimed(w, 3)
    torch.library.opcheck(torch.ops.w12.lm_head_argmax.default,
                          (x, h.q, h.scale, h.radius, h.wnorm, w, 16, h.u_acc, False))
    torch.library.opcheck(torch.ops.w12.lm_head_exact.default, (x, w))


def test_exact_logits_on_cpu_is_f_linear():
    w = twins_weight()
    x = aimed(w, 5).view(5, 1, K)
    assert torch.equal(bits(exact_logits(x, w)), bits(F.linear(x, w)))


# ---------------------------------------------------------------------------------------------
# the module: full logits by default, argmax-equivalent sparse logits inside argmax_only()
# ---------------------------------------------------------------------------------------------
def test_module_sparse_logits_are_argmax_equivalent():
    lin = nn.Linear(K, 600, bias=False).to(torch.bfloat16)
    with torch.no_grad():
        lin.weight.copy_(twins_weight())
    mod = CertifiedLMHead(lin, cap=64)
    assert mod.weight is lin.weight and list(mod.state_dict()) == ["weight"]
    x = aimed(lin.weight.detach(), 48).view(6, 8, K)
    x[0, 0] = 0  # all tied: a fallback row keeps only the winner
    with torch.no_grad():
        full = lin(x)
        assert torch.equal(bits(mod(x)), bits(full))  # outside the context: the exact head, unchanged
        with mod.argmax_only():
            sparse = mod(x)
        assert torch.equal(bits(mod(x)), bits(full)) and mod.calls == 1
    assert sparse.shape == full.shape and sparse.dtype == full.dtype
    assert torch.equal(sparse.argmax(-1), full.argmax(-1))
    finite = torch.isfinite(sparse)
    assert torch.equal(bits(sparse[finite]), bits(full[finite]))  # every finite entry is an exact logit
    assert (finite.sum(-1) >= 1).all() and finite.sum() < full.numel() // 10
    assert finite[0, 0].sum() == 1 and mod.last.fallback[0]
    assert int(((full == full.amax(-1, keepdim=True)).sum(-1) > 1).sum()) > 0  # ties were exercised


def test_module_rebuilds_its_copy_when_the_weight_changes():
    lin = nn.Linear(K, 300, bias=False).to(torch.bfloat16)
    mod = CertifiedLMHead(lin)
    x = torch.randn(4, K).bfloat16()
    assert torch.equal(mod.argmax(x), lin(x).argmax(-1))
    with torch.no_grad():
        lin.weight.mul_(-1)  # in place: the INT8 copy is stale
    assert torch.equal(mod.argmax(x), lin(x).argmax(-1))
    with pytest.raises(ValueError, match="nn.Linear"):
        CertifiedLMHead(nn.Embedding(10, K))


# ---------------------------------------------------------------------------------------------
# when is the argmax enough?
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(bf16 dir, w12 dir) of a tiny random Llama (vocab 512, hidden 128), untied and tied."""
    out = {}
    for tie in (False, True):
        root = tmp_path_factory.mktemp(f"tie{int(tie)}")
        src = tiny_llama(str(root / "bf16"), seed=3, tie=tie)
        convert(src, str(root / "w12"))
        out[tie] = (src, str(root / "w12"))
    return out


@pytest.fixture(scope="module")
def model(tiny):
    m = AutoModelForCausalLM.from_pretrained(tiny[False][1], quantization_config=w12.W12Config(certified_lm_head=True))
    return m


@pytest.mark.parametrize("kwargs, enough", [
    ({"max_new_tokens": 4}, True),
    ({"max_new_tokens": 4, "do_sample": False, "return_dict_in_generate": True}, True),
    ({"do_sample": True}, False),
    ({"output_scores": True, "return_dict_in_generate": True}, False),
    ({"output_logits": True, "return_dict_in_generate": True}, False),
    ({"min_new_tokens": 3}, False),
    ({"repetition_penalty": 1.3}, False),
    ({"no_repeat_ngram_size": 2}, False),
    ({"num_beams": 2}, False),
    ({"suppress_tokens": [5]}, False),
    ({"logits_processor": "procs"}, False),
    ({"assistant_model": "self"}, False),
    ({"custom_generate": "fn"}, False),
    ({"generation_config": "sampling"}, False),
])
def test_argmax_is_enough(model, kwargs, enough):
    from transformers import GenerationConfig

    kwargs = dict(kwargs)
    if kwargs.get("logits_processor") == "procs":
        kwargs["logits_processor"] = LogitsProcessorList([MinLengthLogitsProcessor(3, 2)])
    if kwargs.get("assistant_model") == "self":
        kwargs["assistant_model"] = model
    if kwargs.get("custom_generate") == "fn":
        kwargs["custom_generate"] = lambda *a, **k: None
    if kwargs.get("generation_config") == "sampling":
        kwargs["generation_config"] = GenerationConfig(do_sample=True, top_k=5)
    ids = torch.ones(1, 3, dtype=torch.long)
    stock = type(model).generate.__get__(model)
    assert argmax_is_enough(model, stock, (ids,), kwargs) is enough


def test_argmax_is_enough_follows_the_models_generation_config(model):
    stock = type(model).generate.__get__(model)
    ids = torch.ones(1, 3, dtype=torch.long)
    saved = model.generation_config.do_sample
    try:
        model.generation_config.do_sample = True
        assert not argmax_is_enough(model, stock, (ids,), {})
        assert argmax_is_enough(model, stock, (ids,), {"do_sample": False})
    finally:
        model.generation_config.do_sample = saved
    assert not argmax_is_enough(model, stock, (ids, None, None, None, None, None, None, None, None, None, None, 1), {})


# ---------------------------------------------------------------------------------------------
# Transformers: W12Config(certified_lm_head=...) at load, generate on and off
# ---------------------------------------------------------------------------------------------
def prompts():
    return torch.randint(3, 512, (2, 7), generator=torch.Generator().manual_seed(5))


def gen(m, ids, **kw):
    return m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, pad_token_id=0, **kw)


@pytest.fixture(scope="module")
def off(tiny):
    return AutoModelForCausalLM.from_pretrained(tiny[False][1])


def test_greedy_tokens_equal_with_the_switch_on(model, off):
    head = model.lm_head
    assert isinstance(head, CertifiedLMHead) and not isinstance(off.lm_head, CertifiedLMHead)
    assert torch.equal(head.weight, off.lm_head.weight)
    ids = prompts()
    before = head.calls
    want = gen(off, ids, do_sample=False)
    got = gen(model, ids, do_sample=False)
    assert torch.equal(got, want) and got.shape[1] > ids.shape[1]
    assert head.calls - before >= 2  # prefill + decode steps went through the certified argmax
    assert torch.equal(gen(model, ids[:1]), gen(off, ids[:1]))  # M = 1, greedy by default
    with torch.no_grad():  # a plain forward is the exact head
        assert torch.equal(bits(model(ids).logits), bits(off(ids).logits))


@pytest.mark.parametrize("kw", [
    {"do_sample": True, "top_k": 20},
    {"do_sample": False, "output_scores": True, "output_logits": True, "return_dict_in_generate": True},
    {"do_sample": False, "min_new_tokens": 12},
    {"do_sample": False, "repetition_penalty": 1.5},
])
def test_callers_that_need_logits_get_full_logits(model, off, kw):
    ids = prompts()
    before = model.lm_head.calls
    torch.manual_seed(11)
    want = gen(off, ids, **kw)
    torch.manual_seed(11)
    got = gen(model, ids, **kw)
    assert model.lm_head.calls == before  # never the sparse logits
    if isinstance(want, torch.Tensor):
        assert torch.equal(got, want)
        return
    assert torch.equal(got.sequences, want.sequences)
    for a, b in zip(got.scores + got.logits, want.scores + want.logits):
        assert torch.equal(a, b) and torch.isfinite(a).all()


def test_strict_mode_and_pre_quantized_loading_attribute(tiny, off):
    m = AutoModelForCausalLM.from_pretrained(tiny[False][1],
                                             quantization_config=w12.W12Config(certified_lm_head="strict"))
    assert isinstance(m.lm_head, CertifiedLMHead) and m.lm_head.strict
    ids = prompts()
    assert torch.equal(gen(m, ids, do_sample=False), gen(off, ids, do_sample=False)) and m.lm_head.calls > 0
    plain = AutoModelForCausalLM.from_pretrained(tiny[False][1], quantization_config=w12.W12Config())
    assert not isinstance(plain.lm_head, CertifiedLMHead)


def test_on_the_fly_conversion_tied_head_and_save(tiny, tmp_path):
    src, _ = tiny[True]
    ref = AutoModelForCausalLM.from_pretrained(src)
    m = AutoModelForCausalLM.from_pretrained(src, quantization_config=w12.W12Config(certified_lm_head=True))
    assert isinstance(m.lm_head, CertifiedLMHead)
    assert m.lm_head.weight is m.model.embed_tokens.weight  # still tied
    ids = prompts()
    assert torch.equal(gen(m, ids, do_sample=False), gen(ref, ids, do_sample=False)) and m.lm_head.calls > 0
    m.save_pretrained(tmp_path / "out")
    import json

    qc = json.loads((tmp_path / "out" / "config.json").read_text())["quantization_config"]
    assert "certified_lm_head" not in qc  # a loading-time switch, not part of the checkpoint
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert not isinstance(again.lm_head, CertifiedLMHead)
    assert torch.equal(gen(again, ids, do_sample=False), gen(ref, ids, do_sample=False))


def test_install_on_a_plain_bf16_model_is_idempotent(tiny):
    src, _ = tiny[False]
    ref = AutoModelForCausalLM.from_pretrained(src)
    m = AutoModelForCausalLM.from_pretrained(src)
    head = install_certified_lm_head(m)
    assert install_certified_lm_head(m, strict=True) is head and head.strict
    assert m.generate._w12_certified
    ids = prompts()
    assert torch.equal(gen(m, ids), gen(ref, ids)) and head.calls > 0


def test_config_field_is_validated():
    with pytest.raises(ValueError, match="certified_lm_head"):
        w12.W12Config(certified_lm_head="yes")
    cfg = w12.W12Config(certified_lm_head="strict")
    assert cfg.get_loading_attributes() == {"certified_lm_head": "strict"}
    assert "certified_lm_head" not in cfg.to_dict()


def test_a_w12_lm_head_is_refused(tiny, tmp_path):
    from w12.convert.convert import Options
    from w12.runtime.hf_quantizer import W12LoadError

    src, _ = tiny[False]
    dst = str(tmp_path / "w12-with-head")
    convert(src, dst, Options(exclude=("*embed*",)))  # the LM head converted to W12 too
    with pytest.raises(W12LoadError, match="certified_lm_head.*nn.Linear"):
        AutoModelForCausalLM.from_pretrained(dst, quantization_config=w12.W12Config(certified_lm_head=True))


def test_sparse_logits_survive_torch_compile():
    lin = nn.Linear(K, 600, bias=False).to(torch.bfloat16)
    with torch.no_grad():
        lin.weight.copy_(twins_weight())
    mod = CertifiedLMHead(lin, cap=64)
    x = aimed(lin.weight.detach(), 4).view(4, 1, K)
    compiled = torch.compile(mod, backend="eager", fullgraph=True)
    with torch.no_grad(), mod.argmax_only():
        got = compiled(x)
    assert torch.equal(got.argmax(-1), lin(x).argmax(-1)) and math.isinf(got.min().item())
