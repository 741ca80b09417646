"""TLV (specdec/tlv.py): the 8-bit view switch, a Q pass that leaves the committed cache bit-identical,
lossless output with every drafter kind (and with a deliberately wrong Q pass), and exact replay."""

import pytest
import torch
from torch import nn
from transformers import DynamicCache

from test_specdec_engine import PROMPTS, NoisyBlock, Scripted, tiny
from w12.runtime.w12_linear import W12Linear, decode_view_torch, set_cpu_decode_cache, view8_mode
from w12.specdec.drafters import ModelDrafter, NgramDrafter, truncated_copy
from w12.specdec.engine import divergence, greedy_generate, speculative_generate, tree_inputs
from w12.specdec.errors import TreeError
from w12.specdec.lattice import Lattice
from w12.specdec.replay import record, replay
from w12.specdec.tlv import (_tree_pass, combine, model_q, record_q, replay_tlv, tlv_generate, view_q)
from w12.specdec.trees import make_builder

torch.set_num_threads(1)
NEW = 20


@pytest.fixture(autouse=True, scope="module")
def decode_cache():
    """Decode each W12 layer once in this module (exact), and leave the default (off) for the others."""
    set_cpu_decode_cache(1 << 26)
    yield
    set_cpu_decode_cache(0)


def to_w12(model):
    """Every nn.Linear inside the decoder layers -> W12Linear of its BF16-rounded weight (fp32 compute)."""
    for layer in model.model.layers:
        for name, mod in list(layer.named_modules()):
            for cname, child in list(mod.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(mod, cname, W12Linear.from_linear(child.to(torch.bfloat16)))
    return model


W12T = {k: to_w12(tiny(k, i)) for i, k in [(0, "llama"), (2, "qwen3")]}
REFS = {k: [greedy_generate(t, p, NEW, eos_token_id=[]).tokens for p in PROMPTS] for k, t in W12T.items()}


class OffPath(Scripted):
    """Scripted, also usable after a prefix that left the greedy path (TLV's draft ② after a wrong C):
    then it drafts tokens that are never the target's."""

    def draft(self, ids):
        p = next(p for p in PROMPTS if ids[:len(p)] == p)
        ref = self.refs[PROMPTS.index(p)]
        if ids[len(p):] == ref[:len(ids) - len(p)]:
            return super().draft(ids)
        return Lattice(torch.tensor([[(7 * i + t) % 250 + 1 for t in range(self.k)] for i in range(self.positions)]),
                       torch.full((self.positions, self.k), -1.0))


def drafters(kind):
    refs, t = REFS[kind], W12T[kind]
    return {"oracle": OffPath(refs, "oracle"), "wrong": OffPath(refs, "wrong"),
            "random-model": ModelDrafter(tiny(kind, 17), 4, 4), "truncated": ModelDrafter(truncated_copy(t, 1), 3, 4),
            "ngram": NgramDrafter(6, 3), "noisy-block": NoisyBlock(refs, t.config.vocab_size)}


BUILDS = ["chain", "best-first", "eagle2", "sequoia", "best-first-marginal"]


def test_view_mode_switch():
    torch.manual_seed(0)
    w = torch.randn(200, 130) * 0.05
    w[3, 7], w[150, 100], w[20, 5] = 40.0, 1e-9, 0.0                 # escapes / zero
    lin = W12Linear.from_linear(nn.Linear(130, 200, bias=True).to(torch.bfloat16))
    lin.load_matrix(__import__("w12.formats.matrix", fromlist=["W12Matrix"]).W12Matrix.from_bf16(w.to(torch.bfloat16)))
    assert lin.weight_escapes.shape[0] > 0
    ref = lin.matrix().view8_to_bf16()
    assert torch.equal(decode_view_torch(lin.weight, lin.weight_exponents, 200, 130).view(torch.int16), ref.view(torch.int16))
    x = torch.randn(3, 130)
    exact = lin(x)
    with view8_mode(lin) as n:
        assert n == 1
        yq = lin(x)
    assert torch.equal(yq, nn.functional.linear(x, ref.float(), lin.bias.float()))
    assert not torch.equal(yq, exact)
    assert torch.equal(lin(x), exact) and "_view8_w" not in lin.__dict__      # back to exact, decode dropped


@pytest.mark.parametrize("which", ["view", "model"])
def test_q_pass_leaves_committed_cache_bit_identical(which):
    target = W12T["llama"]
    prompt = PROMPTS[3] + PROMPTS[4]
    cache = DynamicCache(config=target.config)
    target(input_ids=torch.tensor([prompt]), cache=cache, use_cache=True)
    before = [(l.keys.clone(), l.values.clone()) for l in cache.layers]
    lat = NgramDrafter(6, 3).draft(prompt + prompt[:5])
    tree = make_builder("best-first", 12)(lat, prompt[-1])
    q = view_q(target) if which == "view" else model_q(tiny("llama", 31))
    qn = q(tree, cache, len(prompt))
    assert qn.shape == (len(tree),)
    assert cache.get_seq_length() == len(prompt)
    for (k, v), l in zip(before, cache.layers):
        assert torch.equal(k, l.keys) and torch.equal(v, l.values)
    # and the exact pass after it is what it would have been with no Q pass
    fresh = DynamicCache(config=target.config)
    target(input_ids=torch.tensor([prompt]), cache=fresh, use_cache=True)
    x, pos, mask = tree_inputs(tree, len(prompt), target.dtype)
    a = target(input_ids=x, position_ids=pos, attention_mask=mask, cache=cache, use_cache=True).logits
    b = target(input_ids=x, position_ids=pos, attention_mask=mask, cache=fresh, use_cache=True).logits
    assert torch.equal(a, b)


def test_view_q_needs_w12_layers():
    with pytest.raises(TreeError, match="8-bit view"):
        view_q(tiny("llama", 0))


def test_combine_shapes():
    lat = NgramDrafter(4, 2).draft([1, 2, 3, 1, 2, 4, 1, 2])
    sub = make_builder("best-first", 5)(lat, 9)
    t = combine([7, 8, 9], 5, sub).check()
    assert t.tokens[:4].tolist() == [5, 7, 8, 9] and len(t) == 4 + len(sub) - 1
    assert all(int(t.parents[i]) >= 3 for i in range(4, len(t)))


@pytest.mark.parametrize("kind", list(W12T))
def test_lossless_every_drafter_view_q(kind):
    target, stats, agree = W12T[kind], {}, []
    for dname, drafter in drafters(kind).items():
        for i, (prompt, ref) in enumerate(list(zip(PROMPTS, REFS[kind]))[:3]):
            gen = tlv_generate(target, drafter, prompt, BUILDS[i % len(BUILDS)], [4, 8, 16][i % 3], NEW,
                               eos_token_id=[], audit=(i == 0))
            assert gen.tokens == ref, (kind, dname, i, divergence(target, prompt, ref, gen.tokens))
            stats.setdefault(dname, []).append(gen.tau)
            agree += gen.q_agree
            assert set(gen.stage_seconds) == {"draft1", "q", "draft2", "exact", "append"}
    print(kind, {d: round(sum(v) / len(v), 2) for d, v in stats.items()},
          "Q agreement on C", sum(a for a, _ in agree) / sum(n for _, n in agree))
    # a useless drafter still gets ~2 tokens per exact pass: Q's bonus token, confirmed, + the exact bonus
    assert max(stats["wrong"]) <= 2.0 and min(stats["oracle"]) > 3


def test_wrong_q_is_still_exact_with_fewer_tokens_per_pass():
    target, drafter = W12T["llama"], OffPath(REFS["llama"], "oracle")
    bad_q = model_q(tiny("llama", 77))                          # random weights: a deliberately wrong Q pass
    taus = {"exact-q": [], "view": [], "wrong": [], "single": []}
    for prompt, ref in zip(PROMPTS[:6], REFS["llama"]):
        for name, q in [("exact-q", model_q(target)), ("view", None), ("wrong", bad_q)]:
            gen = tlv_generate(target, drafter, prompt, "best-first", 8, NEW, q=q, eos_token_id=[])
            assert gen.tokens == ref
            taus[name] += gen.taus[:-1]
        taus["single"] += speculative_generate(target, drafter, prompt, make_builder("best-first", 8), NEW,
                                               eos_token_id=[]).taus[:-1]
    mean = {k: sum(v) / len(v) for k, v in taus.items()}
    print(mean)
    assert mean["wrong"] == 1.0 < mean["view"] <= mean["exact-q"] and mean["exact-q"] > mean["single"]


class CorruptQ:
    """Q = the exact argmax, made wrong wherever the predicted token's index is a multiple of 3: a
    function of the context only, so replay from q_next is exact."""

    def __init__(self, target):
        self.target = target

    def __call__(self, tree, cache, start):
        nxt = _tree_pass(self.target, tree, cache, start)
        flip = (start + tree.depths + 1) % 3 == 0
        return torch.where(flip, (nxt + 1) % self.target.config.vocab_size, nxt)


@pytest.mark.parametrize("qkind", ["exact", "corrupt"])
def test_replay_matches_live(qkind):
    target = W12T["llama"]
    V = target.config.vocab_size
    for i, (prompt, ref) in enumerate(list(zip(PROMPTS, REFS["llama"]))[:8]):
        drafter = NgramDrafter(6, 3) if i % 2 else OffPath(REFS["llama"], "oracle")
        q = model_q(target) if qkind == "exact" else CorruptQ(target)
        name, n = BUILDS[i % 4], [4, 8, 16][i % 3]
        gen = tlv_generate(target, drafter, prompt, name, n, NEW, q=q, eos_token_id=[])
        assert gen.tokens == ref
        rec = record(drafter, prompt, ref)
        Lp = len(prompt)
        q_next = [t if qkind == "exact" or (Lp + m) % 3 else (t + 1) % V for m, t in enumerate(ref)]
        assert replay_tlv(rec, name, n, q_next=q_next) == gen.taus, (i, qkind)


def test_record_q_and_agreement_model():
    target = W12T["llama"]
    prompt, ref = PROMPTS[5], REFS["llama"][5]
    assert record_q(target, prompt, ref, q_model=target)[1:] == ref[1:]     # exact Q: q_next = greedy tokens
    qv = record_q(target, prompt, ref)                                     # the 8-bit view
    assert len(qv) == len(ref)
    rec = record(OffPath(REFS["llama"], "oracle"), prompt, ref)
    full = replay_tlv(rec, "best-first", 8, q_agree=1.0)
    none = replay_tlv(rec, "best-first", 8, q_agree=0.0)
    assert sum(full) == sum(none) == len(ref) - 1
    assert len(full) < len(none) and set(none) == {1}
    assert len(full) <= len(replay(rec, make_builder("best-first", 8)))


# --- GPU step costs (bench/gpu_step_costs.py) and the projection that reads them ---------------------

def _bench(name):
    import importlib
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    return importlib.import_module(name)


def test_gpu_step_costs_forward_is_hf_forward():
    """The timed forward (static KV slots, grouped-query SDPA, explicit masks) gives HF's logits: a causal
    pass after a prefill, and a tree pass as the reference engine runs it (tree_inputs + DynamicCache)."""
    g = _bench("gpu_step_costs")
    assert g.check_semantics("cpu", 0) < 1e-5
    cfg = g.llama_config(True)
    torch.manual_seed(0)
    model = g.build_model(cfg, "cpu", 0).float()
    kv, ctx = g.StaticKV(cfg, 80, "cpu", torch.float32), 40
    ids = torch.randint(0, cfg.vocab_size, (1, ctx))
    g.Pass(model, kv, 0, ids[0], torch.arange(ctx), torch.ones(ctx, ctx, dtype=torch.bool).tril()).logits()
    tree1, full, _ = g.tlv_trees(12, 3, 5, cfg.vocab_size)
    for tree in (tree1, full):
        ours = g.tree_pass(model, kv, ctx, tree).logits()[0]
        cache = DynamicCache(config=model.config)
        model(input_ids=ids, cache=cache, use_cache=True)
        x, pos, mask = tree_inputs(tree, ctx, model.dtype)
        ref = model(input_ids=x, position_ids=pos, attention_mask=mask, cache=cache, use_cache=True).logits[0]
        assert g.rel_err(ours, ref) < 1e-5


def costs_doc(budgets=(16, 32)):
    return {"schema": "w12-gpu-step-costs/1", "model": "synthetic", "device": "test", "ctx": 512,
            "curve": {"rows": [1, 17, 33], "bf16_ms": [7.0, 7.1, 7.2], "w12_ms": [6.0, 8.0, 9.0]},
            "tlv": {"chain": 2, "draft_ms": 0.5, "draft_assumption": "ASSUMED test drafter",
                    "budgets": {str(n): {"rows": n + 1, "q_ms": 0.6 * n / 4, "exact_ms": n / 4, "single_ms": n / 4,
                                         "single_bf16_ms": 7.0, "append_ms": 0.05, "host_ms": 0.1} for n in budgets}}}


def test_tlv_projection_reads_measured_costs(tmp_path):
    import json
    proj = _bench("tlv_projection")
    p = tmp_path / "costs.json"
    p.write_text(json.dumps(costs_doc()))
    costs = proj.stage_costs(p)
    assert list(costs["budgets"]) == [16, 32] and costs["draft"] == 0.5
    assert costs["budgets"][32] == {"rows": 33, "q": 4.8, "exact": 8.0, "single": 8.0, "single_bf16": 7.0,
                                    "append": 0.05, "host": 0.1}
    rows = proj.measured_rows(costs, [("t", 2.0, 3.6)])
    r = next(r for r in rows if r["n"] == 32)
    single = 0.5 + 8.0 + 0.15                                   # draft + step + append + host
    cycle = 2 * 0.5 + (4.8 + 0.1) + 8.0 + 0.15                  # 2 drafts + (Q + host) + exact + (append + host)
    assert r["single_ms"] == pytest.approx(single) and r["cycle_ms"] == pytest.approx(cycle)
    assert r["speedup"] == pytest.approx((3.6 / cycle) / (2.0 / single))
    assert r["q_over_exact"] == pytest.approx(0.6)
    # at the reported break-even Q the projected rates are equal; below it TLV wins, above it TLV loses
    at = lambda q: proj.project(2.0, 3.6, 0.5, q + 0.1, 8.0, 0.15, single_step=single)["speedup"]
    assert at(r["q_max_ms"]) == pytest.approx(1.0)
    assert at(r["q_max_ms"] - 0.1) > 1 > at(r["q_max_ms"] + 0.1)
    assert r["q_max_over_exact"] == pytest.approx(r["q_max_ms"] / 8.0)
    assert r["speedup_vs_bf16"] == pytest.approx((3.6 / cycle) / (2.0 / (0.5 + 7.0 + 0.15)))
    # τ measured on real text (the SmolLM2 exact replay): 376 tokens over 253 single / 132 TLV passes at N = 32
    taus = proj.replay_taus()
    assert taus[32] == (pytest.approx(376 / 253), pytest.approx(376 / 132), 8)
    report = tmp_path / "proj.md"
    out = proj.main(["--costs", str(p), "--report", str(report)])
    assert len(out) == 2 * 2                                    # (paper τ, our τ) × (N = 16, 32)
    text = report.read_text()
    assert "PROJECTIONS" in text and "TLV loses when Q / exact" in text and "ASSUMED test drafter" in text
    bad = costs_doc()
    del bad["tlv"]["budgets"]["16"]["q_ms"]
    p.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="lack"):
        proj.stage_costs(p)


def test_gpu_step_costs_tiny_run_feeds_both_consumers(tmp_path):
    """End to end on the CPU: the tiny run writes the JSON that RowCurve.from_json and the projection read."""
    from w12.specdec.batching import RowCurve
    g, proj = _bench("gpu_step_costs"), _bench("tlv_projection")
    out = tmp_path / "tiny.json"
    doc = g.main(["--tiny", "--json", str(out), "--rows", "1,2,4", "--budgets", "4", "--ctx", "16"])
    assert doc["check"]["w12_vs_bf16_rel_err"] == 0.0 and doc["check"]["view_vs_bf16_rel_err"] > 0
    for kind in ("bf16", "w12", "view"):
        assert RowCurve.from_json(out, kind).rows == [1, 2, 4]
    costs = proj.stage_costs(out)
    assert costs["budgets"][4]["rows"] == 5 and "ASSUMED" in costs["draft_assumption"]
    assert proj.measured_rows(costs, [("t", 1.5, 2.8)])[0]["speedup"] > 0


def test_tlv_projection_reads_the_50_prompt_tau_file(tmp_path):
    """bench/tlv_smollm2.py --suite writes tau-50.json; the projection pairs each N's stage times with the τ
    replayed at that N, one source per drafter asked for, and skips budgets it has no τ for."""
    import json
    proj = _bench("tlv_projection")
    rp = lambda *v: {n: {"single": v[2 * i], "tlv": v[2 * i + 1]} for i, n in enumerate(("16", "32", "64"))}
    (tmp_path / "tau-50.json").write_text(json.dumps({"source": "test suite", "drafters": {
        "ngram": {"prompts": 50, "tlv_live": {"32": 3.1}, "replay": rp(1.5, 2.8, 1.6, 3.0, 1.7, 3.3)},
        "trunc24": {"prompts": 50, "tlv_live": {"32": 3.5}, "replay": rp(1.7, 3.2, 1.8, 3.4, 1.9, 3.9)}}}))
    src = proj.suite_taus(tmp_path, ["ngram", "trunc24"])
    assert [s[1] for s in src] == [{16: (1.5, 2.8), 32: (1.6, 3.0), 64: (1.7, 3.3)},
                                   {16: (1.7, 3.2), 32: (1.8, 3.4), 64: (1.9, 3.9)}]
    assert "50 prompts" in src[0][0] and "ngram" in src[0][0] and "matching N" in src[0][0] and "3.10" in src[0][0]
    costs_path = tmp_path / "costs.json"
    costs_path.write_text(json.dumps(costs_doc()))                 # stage times at N = 16, 32 only
    rows = proj.measured_rows(proj.stage_costs(costs_path), src)
    assert [(r["n"], r["tau_s"], r["tau_t"]) for r in rows] == [(16, 1.5, 2.8), (32, 1.6, 3.0), (16, 1.7, 3.2),
                                                                (32, 1.8, 3.4)]
    # a per-N source with no τ at a measured N contributes no row there
    assert [r["n"] for r in proj.measured_rows(proj.stage_costs(costs_path), [("x", {32: (1.0, 2.0)})])] == [32]
    report = tmp_path / "proj.md"
    out = proj.main(["--costs", str(costs_path), "--report", str(report), "--tau-dir", str(tmp_path),
                     "--tau-drafters", "ngram,trunc24"])
    assert len(out) == 3 * 2                                   # (paper, ngram, trunc24) × (N = 16, 32)
    text = report.read_text()
    assert "test suite" in text and "--tau-drafters ngram,trunc24" in text and "trunc24 drafter" in text
    assert len(proj.main(["--costs", str(costs_path), "--tau-dir", str(tmp_path)])) == 2 * 2   # default: ngram only
    with pytest.raises(ValueError, match="no drafter"):
        proj.suite_taus(tmp_path, ["nope"])
    assert proj.suite_taus(tmp_path / "absent") == []
