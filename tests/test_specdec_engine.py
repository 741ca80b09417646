"""Lossless speculative generation on tiny random Llama/Qwen3 targets: the output equals
`model.generate(do_sample=False)` token for token, for every drafter and tree builder."""

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from w12.specdec.drafters import BlockDrafter, ModelDrafter, NgramDrafter, truncated_copy
from w12.specdec.engine import divergence, greedy_generate, keep_rows, speculative_generate
from w12.specdec.errors import DrafterError
from w12.specdec.lattice import Lattice
from w12.specdec.trees import make_builder

torch.set_num_threads(1)
NEW = 20


def tiny(kind: str, seed: int):
    torch.manual_seed(seed)
    if kind == "llama":
        cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, vocab_size=256, max_position_embeddings=256, initializer_range=0.1)
        return LlamaForCausalLM(cfg).eval()
    if kind == "llama-mha":
        cfg = LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=2,
                          num_key_value_heads=2, vocab_size=512, max_position_embeddings=256, initializer_range=0.1,
                          tie_word_embeddings=True)
        return LlamaForCausalLM(cfg).eval()
    cfg = Qwen3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, vocab_size=320, max_position_embeddings=256,
                      initializer_range=0.1)
    return Qwen3ForCausalLM(cfg).eval()


TARGETS = {k: tiny(k, i) for i, k in enumerate(["llama", "llama-mha", "qwen3"])}
PROMPTS = [torch.randint(0, 256, (int(n),), generator=torch.Generator().manual_seed(i)).tolist()
           for i, n in enumerate(torch.randint(1, 24, (20,), generator=torch.Generator().manual_seed(99)))]
REFS = {k: [greedy_generate(t, p, NEW, eos_token_id=[]).tokens for p in PROMPTS] for k, t in TARGETS.items()}


class Scripted:
    """Knows the target's greedy continuation of each prompt. mode "oracle": the true token is the
    top candidate of every position; "wrong": the true token is never a candidate. Other candidates
    get small scores so the trees still branch."""

    def __init__(self, refs, mode, positions=5, k=3, vocab=256):
        self.refs, self.mode, self.positions, self.k, self.vocab = refs, mode, positions, k, vocab

    def draft(self, ids):
        p = next(p for p in PROMPTS if ids[:len(p)] == p and ids[len(p):] == self.refs[PROMPTS.index(p)][:len(ids) - len(p)])
        cont = self.refs[PROMPTS.index(p)][len(ids) - len(p):] + [0] * self.positions
        rows = []
        for i in range(self.positions):
            others = [t for t in range(1, self.vocab) if t != cont[i]][(7 * i + len(ids)) % 50:][:self.k]
            rows.append(([cont[i]] + others[:self.k - 1]) if self.mode == "oracle" else others)
        logp = torch.log(torch.tensor([[0.7] + [0.3 / (self.k - 1)] * (self.k - 1)] * self.positions))
        return Lattice(torch.tensor(rows), logp)


class NoisyBlock(BlockDrafter):
    """Test parallel block drafter with a Markov head: the true next tokens at random ranks of U, and a
    random low-rank bias B(parent, ·) = W1[parent] · W2."""

    def __init__(self, refs, vocab, positions=4, topk=4):
        self.refs, self.positions, self.topk = refs, positions, topk
        g = torch.Generator().manual_seed(5)
        self.W1, self.W2 = torch.randn(vocab, 8, generator=g), torch.randn(8, vocab, generator=g) * 0.3
        self.vocab = vocab

    def block(self, ids):
        p = next(p for p in PROMPTS if ids[:len(p)] == p)
        cont = self.refs[PROMPTS.index(p)][len(ids) - len(p):] + [0] * self.positions
        g = torch.Generator().manual_seed(len(ids))
        U = torch.randn(self.positions, self.vocab, generator=g)
        U[torch.arange(self.positions), torch.tensor(cont[:self.positions])] += torch.rand(self.positions, generator=g) * 4
        return U, lambda parents: self.W1[parents] @ self.W2


def drafters(kind):
    refs, t = REFS[kind], TARGETS[kind]
    vocab = t.config.vocab_size
    small = tiny(kind, 17)
    return {"oracle": Scripted(refs, "oracle"), "wrong": Scripted(refs, "wrong"),
            "random-model": ModelDrafter(small, 4, 4), "truncated": ModelDrafter(truncated_copy(t, 1), 3, 4),
            "ngram": NgramDrafter(6, 3), "noisy-block": NoisyBlock(refs, vocab)}


BUILDS = ["chain", "best-first", "eagle2", "sequoia", "best-first-marginal"]


@pytest.mark.parametrize("kind", list(TARGETS))
def test_lossless_against_generate(kind):
    target, stats = TARGETS[kind], {}
    for dname, drafter in drafters(kind).items():
        for i, (prompt, ref) in enumerate(zip(PROMPTS, REFS[kind])):
            build = make_builder(BUILDS[i % len(BUILDS)], [4, 8, 16][i % 3])
            gen = speculative_generate(target, drafter, prompt, build, NEW, eos_token_id=[])
            assert gen.tokens == ref, (kind, dname, i, divergence(target, prompt, ref, gen.tokens))
            stats.setdefault(dname, []).append(gen.tau)
    print(kind, {d: round(sum(v) / len(v), 2) for d, v in stats.items()})
    assert max(stats["wrong"]) == 1.0 and min(stats["oracle"]) > 3


@pytest.mark.parametrize("name,budget", [("chain", 4), ("best-first", 12), ("eagle2", 12), ("sequoia", 10)])
def test_oracle_tau_is_tree_depth_plus_one_and_wrong_tau_is_one(name, budget):
    target = TARGETS["llama"]
    for mode in ["oracle", "wrong"]:
        drafter = Scripted(REFS["llama"], mode)
        for prompt, ref in list(zip(PROMPTS, REFS["llama"]))[:6]:
            depths, build = [], make_builder(name, budget)

            def spy(lat, root):
                tree = build(lat, root)
                depths.append(int(tree.depths.max()))
                return tree

            gen = speculative_generate(target, drafter, prompt, spy, NEW, eos_token_id=[])
            assert gen.tokens == ref
            want = [d + 1 for d in depths] if mode == "oracle" else [1] * len(depths)
            assert gen.taus[:-1] == want[:-1] and gen.taus[-1] <= want[-1]   # the last pass is cut at NEW


def test_eos_stops_like_generate():
    target, prompt = TARGETS["qwen3"], PROMPTS[3]
    eos = REFS["qwen3"][3][5]                       # a token the target emits: generation stops there
    ref = greedy_generate(target, prompt, NEW, eos_token_id=eos).tokens
    gen = speculative_generate(target, NgramDrafter(4, 2), prompt, make_builder("best-first", 8), NEW, eos_token_id=eos)
    assert gen.tokens == ref and ref[-1] == eos and len(ref) <= 6


def test_keep_rows_gathers_accepted_rows_and_crops_chains():
    cache = DynamicCache(config=TARGETS["llama"].config)
    TARGETS["llama"](input_ids=torch.arange(10)[None], cache=cache, use_cache=True)
    keys = cache.layers[0].keys.clone()
    keep_rows(cache, 4, [0, 2, 5])
    assert torch.equal(cache.layers[0].keys, keys[..., [0, 1, 2, 3, 4, 6, 9], :])
    keep_rows(cache, 2, [0, 1])
    assert torch.equal(cache.layers[0].keys, keys[..., [0, 1, 2, 3], :]) and cache.get_seq_length() == 4


def test_dense_recording_matches_sequential_drafting():
    model = TARGETS["qwen3"]
    drafter = ModelDrafter(truncated_copy(model, 1), positions=4, topk=5)
    prompt, tokens = PROMPTS[0], REFS["qwen3"][0][:9]
    dense = drafter.record_dense(prompt, tokens)
    for j, lat in enumerate(dense):
        seq = drafter.draft(prompt + tokens[:j])
        assert torch.equal(lat.ids, seq.ids) and torch.allclose(lat.logp, seq.logp, atol=1e-5)


def test_ngram_lattice_counts_continuations():
    lat = NgramDrafter(positions=3, topk=2, max_n=2).draft([1, 2, 3, 4, 1, 2, 5, 6, 1, 2])
    assert lat.ids.tolist() == [[5, 3], [6, 4], [1, -1]]       # most recent match first on ties
    assert torch.allclose(lat.logp[0].exp(), torch.tensor([0.5, 0.5], dtype=torch.float64))
    assert lat.cond[1, 0].exp().tolist()[0] == pytest.approx(1.0)  # 5 is always followed by 6
    assert NgramDrafter().draft([1, 2, 3]).positions == 0


def test_truncated_copy_rejects_impossible_depths():
    with pytest.raises(DrafterError, match="truncate"):
        truncated_copy(TARGETS["llama"], 5)
