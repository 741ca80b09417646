"""Token forcing on a tiny random model: an exact system passes, a planted logit bias is rejected."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, LogitsProcessor, LogitsProcessorList

from w12.specdec.token_forcing import check, decide, force, phase0_delta, wilson


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    m = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    with torch.no_grad():  # sharper distributions than a fresh init, like a trained model's
        m.lm_head.weight.mul_(8)
    return m


class Bias(LogitsProcessor):
    """A planted defect: +bias on a fixed subset of the vocabulary."""

    def __init__(self, vocab, bias, frac=0.2):
        g = torch.Generator().manual_seed(7)
        self.mask = torch.rand(vocab, generator=g) < frac
        self.bias = bias

    def __call__(self, input_ids, scores):
        return scores + self.bias * self.mask.to(scores.dtype)


def generate(model, prompt, n, processors=None):
    out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, pad_token_id=0,
                         logits_processor=processors)
    return out[0, len(prompt):].tolist()


def ar_uncached(model, prompt, n):
    """Plain autoregressive decoding without a cache: a full forward per token (other rounding)."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids]), use_cache=False).logits[0, -1].argmax()))
    return ids[len(prompt):]


def test_force_margins(model):
    prompt, out = [1, 5, 9], generate(model, [1, 5, 9], 8)
    f = force(model, prompt, out)
    assert len(f.margins) == 8 and all(m >= 0 for m in f.margins)
    wrong = [(t + 1) % 256 for t in out]
    g = force(model, prompt, wrong)
    assert sum(m > 0 for m in g.margins) >= 7


def test_exact_system_passes_planted_defect_rejected(model):
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 256, (6,), generator=g).tolist() for _ in range(12)]
    n = 24
    stock = [generate(model, p, n) for p in prompts]
    ar = [ar_uncached(model, p, n) for p in prompts]
    delta, _ = phase0_delta(model, prompts, stock, ar)
    assert delta >= 1 / 8 and (delta * 8) == int(delta * 8)
    stock_rep = check(model, prompts, stock)
    exact = check(model, prompts, ar)  # another exact system
    assert not decide(exact, stock_rep, delta).reject
    biased = [generate(model, p, n, LogitsProcessorList([Bias(256, 0.1)])) for p in prompts]
    bad = check(model, prompts, biased)
    decision = decide(bad, stock_rep, delta)
    assert decision.reject, (bad.summary(delta), stock_rep.summary(delta))
    assert bad.rate < 0.2  # a small bias: most tokens are still the scorer's argmax


def test_wilson():
    lo, hi = wilson(5, 100)
    assert lo < 0.05 < hi and 0 <= lo and hi <= 1
