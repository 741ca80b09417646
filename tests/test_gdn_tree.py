"""Tree verification on hybrid (attention + Gated DeltaNet) targets without per-node state snapshots.

Tiny random Qwen3-Next targets (float32, CPU, the pure-PyTorch GDN path):
* speculative output == model.generate(do_sample=False), trees of 16-64 nodes, both verification methods;
* path-recompute node outputs and committed states == the per-node-snapshot reference, bit for bit;
* the committed state == HF's per-token decode kernels stepped along the accepted tokens, bit for bit;
* state bytes held: recompute = paths x state (one layer at a time), snapshots = nodes x state x layers.
"""

import pytest
import torch
from transformers import DynamicCache, Qwen3NextConfig, Qwen3NextForCausalLM
from transformers.models.qwen3_next import modeling_qwen3_next as hf

from w12.specdec.drafters import BlockDrafter, NgramDrafter
from w12.specdec.engine import greedy_generate
from w12.specdec.gdn_tree import (GDN, commit, committed_state, gdn_project, hybrid_speculative_generate,
                                  root_paths, tree_forward, verify_gdn_paths, verify_gdn_snapshots)
from w12.specdec.trees import Tree, make_builder
from w12.specdec.verify import accept

torch.set_num_threads(1)
NEW = 24
VOCAB = 160


def tiny_hybrid(seed: int, moe: bool):
    torch.manual_seed(seed)
    if moe:   # Qwen3-Next-like: sparse MoE MLPs, GQA GDN heads, 6 layers with 2 attention layers
        cfg = Qwen3NextConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                              shared_expert_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                              num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                              linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=16,
                              linear_value_head_dim=24, linear_conv_kernel_dim=4, max_position_embeddings=256,
                              initializer_range=0.1,
                              layer_types=[GDN, "full_attention", GDN, GDN, "full_attention", GDN])
    else:     # dense MLPs, 3 GDN : 1 attention as in Qwen3-Next
        cfg = Qwen3NextConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_experts=0,
                              num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                              linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                              linear_value_head_dim=16, linear_conv_kernel_dim=4, max_position_embeddings=256,
                              initializer_range=0.1, layer_types=[GDN, GDN, GDN, "full_attention"])
    return Qwen3NextForCausalLM(cfg).eval()


TARGETS = {"dense": tiny_hybrid(0, False), "moe": tiny_hybrid(1, True)}
PROMPTS = [torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(i)).tolist()
           for i, n in enumerate([1, 5, 13, 29])]
REFS = {k: [greedy_generate(t, p, NEW, eos_token_id=[]).tokens for p in PROMPTS] for k, t in TARGETS.items()}


class Scripted(BlockDrafter):
    """Knows the greedy continuation. "noisy": the true token gets a random boost, so it lands at random
    ranks (or outside the lattice) and accepted paths leave the first branch; "oracle": it is the top
    candidate; "wrong": it is never a candidate."""

    def __init__(self, prompt, ref, mode, positions=8, topk=8):
        self.prompt, self.ref, self.mode, self.positions, self.topk = prompt, ref, mode, positions, topk

    def block(self, ids):
        assert ids[:len(self.prompt)] == self.prompt and ids[len(self.prompt):] == self.ref[:len(ids) - len(self.prompt)]
        cont = torch.tensor((self.ref[len(ids) - len(self.prompt):] + [0] * self.positions)[:self.positions])
        g = torch.Generator().manual_seed(len(ids))
        U = torch.randn(self.positions, VOCAB, generator=g)
        rows = torch.arange(self.positions)
        if self.mode == "noisy":
            U[rows, cont] += torch.rand(self.positions, generator=g) * 4
        elif self.mode == "oracle":
            U[rows, cont] += 100
        else:
            U[rows, cont] = -1e9
        return U, None


def test_qwen3_next_builds_and_generates_on_cpu():
    m = TARGETS["moe"]
    assert type(m).__name__ == "Qwen3NextForCausalLM"
    types = m.config.layer_types
    assert GDN in types and "full_attention" in types
    assert len(REFS["moe"][2]) == NEW
    cache = DynamicCache(config=m.config)
    m(input_ids=torch.tensor([PROMPTS[2]]), cache=cache, use_cache=True)
    i = types.index(GDN)
    conv, rec = cache.layers[i].conv_states[0], cache.layers[i].recurrent_states[0]
    gdn = m.model.layers[i].linear_attn
    assert conv.shape == (1, gdn.conv_dim, gdn.conv_kernel_size)
    assert rec.shape == (1, gdn.num_v_heads, gdn.head_k_dim, gdn.head_v_dim)


@pytest.mark.parametrize("kind", ["dense", "moe"])
@pytest.mark.parametrize("mode,builder,budget", [("noisy", "best-first", 16), ("noisy", "best-first", 32),
                                                 ("noisy", "best-first", 64), ("oracle", "best-first", 32),
                                                 ("wrong", "best-first", 48), ("noisy", "eagle2", 24),
                                                 ("noisy", "chain", 8)])
def test_recompute_is_lossless(kind, mode, builder, budget):
    target, build = TARGETS[kind], make_builder(builder, budget)
    for p, ref in zip(PROMPTS, REFS[kind]):
        gen = hybrid_speculative_generate(target, Scripted(p, ref, mode), p, build, NEW, eos_token_id=[])
        assert gen.tokens == ref
        if builder != "chain":
            assert max(m.nodes for m in gen.memory) >= min(budget + 1, 16)
        if mode == "oracle":
            assert max(gen.taus) >= 6


def test_ngram_drafter_and_snapshot_method_are_lossless():
    target = TARGETS["dense"]
    prompt = (PROMPTS[3] * 2)[:40]                 # repetition, so prompt lookup finds matches
    ref = greedy_generate(target, prompt, NEW, eos_token_id=[]).tokens
    build = make_builder("best-first", 16)
    for method in ("recompute", "snapshot"):
        assert hybrid_speculative_generate(target, NgramDrafter(positions=6, topk=4), prompt, build, NEW,
                                           method=method, eos_token_id=[]).tokens == ref
    p, ref = PROMPTS[1], REFS["dense"][1]
    gen = hybrid_speculative_generate(target, Scripted(p, ref, "noisy"), p, make_builder("best-first", 32),
                                      12, method="snapshot", eos_token_id=[])
    assert gen.tokens == ref[:12]


def _random_tree(n: int, seed: int) -> Tree:
    g = torch.Generator().manual_seed(seed)
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)]
    depths = [0]
    for p in parents[1:]:
        depths.append(depths[p] + 1)
    return Tree(torch.randint(0, VOCAB, (n,), generator=g), torch.tensor(parents), torch.tensor(depths),
                torch.zeros(n, dtype=torch.float64)).check()


def _prefilled(target, prompt):
    cache = DynamicCache(config=target.config)
    target(input_ids=torch.tensor([prompt]), cache=cache, use_cache=True)
    return cache


@pytest.mark.parametrize("n", [16, 33, 64])
def test_path_outputs_equal_snapshot_outputs_bitwise(n):
    """Per GDN layer: node outputs from path recompute == from per-node snapshots, bit for bit."""
    target = TARGETS["moe"]
    cache = _prefilled(target, PROMPTS[2])
    tree = _random_tree(n, n)
    i = target.config.layer_types.index(GDN)
    gdn = target.model.layers[i].linear_attn
    h = torch.randn(1, n, target.config.hidden_size, generator=torch.Generator().manual_seed(n))
    inp, _ = gdn_project(gdn, h)
    conv0, rec0 = cache.layers[i].conv_states[0], cache.layers[i].recurrent_states[0]
    before = conv0.clone(), rec0.clone()
    a, held = verify_gdn_paths(gdn, inp, root_paths(tree), conv0, rec0)
    b, (convs, recs) = verify_gdn_snapshots(gdn, inp, tree.parents.tolist(), conv0, rec0)
    assert torch.equal(a, b)
    assert torch.equal(conv0, before[0]) and torch.equal(rec0, before[1])   # committed state untouched
    per = conv0.nbytes + rec0.nbytes
    assert held == len(root_paths(tree)) * per and convs.nbytes + recs.nbytes == n * per


def _stock_chain_state(gdn, inp, rows, conv0, rec0):
    """HF's decode branch of Qwen3NextGatedDeltaNet.forward (seq_len 1), written out token by token."""
    conv, rec = conv0.clone(), rec0.clone()
    for r in rows:
        mixed = hf.causal_conv1d_update(inp.mixed_qkv[r][None, :, None], conv, gdn.conv1d.weight.squeeze(1),
                                        gdn.conv1d.bias, gdn.activation).transpose(1, 2)
        q, k, v = torch.split(mixed, [gdn.key_dim, gdn.key_dim, gdn.value_dim], dim=-1)
        q, k = q.reshape(1, 1, -1, gdn.head_k_dim), k.reshape(1, 1, -1, gdn.head_k_dim)
        G = gdn.num_v_heads // gdn.num_k_heads      # the module groups heads before the rule (Transformers < 5.19)
        q, k = q.repeat_interleave(G, dim=2), k.repeat_interleave(G, dim=2)
        v = v.reshape(1, 1, -1, gdn.head_v_dim)
        _, rec = hf.torch_recurrent_gated_delta_rule(q, k, v, g=inp.g[r][None, None], beta=inp.beta[r][None, None],
                                                     initial_state=rec, output_final_state=True,
                                                     use_qk_l2norm_in_kernel=True)
    return conv, rec


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_committed_state_is_the_chain_state_bitwise(kind):
    """Several tree steps: after each commit every GDN layer's state equals (1) the stock per-token chain
    over the accepted tokens' inputs and (2) the snapshot method's commit, bit for bit; the attention
    cache holds exactly the committed tokens."""
    target, p, ref = TARGETS[kind], PROMPTS[3], REFS[kind][3]
    cache, snap_cache = _prefilled(target, p), _prefilled(target, p)
    drafter, build = Scripted(p, ref, "noisy"), make_builder("best-first", 40)
    ids = p + [ref[0]]
    off_first_branch = 0
    while len(ids) < len(p) + NEW - 8:
        tree = build(drafter.draft(ids), ids[-1])
        before = committed_state(cache)
        logits, pend = tree_forward(target, cache, tree, len(ids) - 1, "recompute")
        slog, spend = tree_forward(target, snap_cache, tree, len(ids) - 1, "snapshot")
        assert torch.equal(logits, slog)
        path, bonus = accept(tree, logits.argmax(-1))
        rows = [0] + path
        off_first_branch += rows != list(range(len(rows)))
        commit(target, cache, pend, rows)
        commit(target, snap_cache, spend, rows)
        after, snap_after = committed_state(cache), committed_state(snap_cache)
        for i, (conv0, rec0) in before.items():
            conv, rec = _stock_chain_state(target.model.layers[i].linear_attn, pend.inputs[i], rows, conv0, rec0)
            assert torch.equal(after[i][0], conv) and torch.equal(after[i][1], rec)
            assert torch.equal(after[i][0], snap_after[i][0]) and torch.equal(after[i][1], snap_after[i][1])
        ids += [int(tree.tokens[i]) for i in path] + [int(bonus)]
        assert ids[len(p):] == ref[:len(ids) - len(p)]
        for layer in cache.layers:
            if hasattr(layer, "keys") and not hasattr(layer, "recurrent_states"):
                assert layer.keys.shape[-2] == len(ids) - 1
    assert off_first_branch > 0            # some accepted paths were not the tree's first rows


def test_committed_cache_continues_like_stock_decoding():
    """After speculative generation the cache (KV + GDN states) is a valid HF cache: one stock decode step
    from it gives the next greedy token, and its GDN states are within rounding of generate()'s own."""
    target, p = TARGETS["moe"], PROMPTS[2]
    full = greedy_generate(target, p, NEW + 1, eos_token_id=[]).tokens
    cache = DynamicCache(config=target.config)
    gen = hybrid_speculative_generate(target, Scripted(p, full, "noisy"), p, make_builder("best-first", 32),
                                      NEW, eos_token_id=[], cache=cache)
    assert gen.tokens == full[:NEW]
    # generate()'s token-by-token state after the same tokens (prefill + one decode step per token)
    ref_cache = _prefilled(target, p)
    for t in full[:NEW - 1]:
        target(input_ids=torch.tensor([[t]]), cache=ref_cache, use_cache=True)
    for i, layer in enumerate(cache.layers):
        if hasattr(layer, "recurrent_states"):
            torch.testing.assert_close(layer.recurrent_states[0], ref_cache.layers[i].recurrent_states[0],
                                       rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(layer.conv_states[0], ref_cache.layers[i].conv_states[0],
                                       rtol=1e-4, atol=1e-5)
    nxt = target(input_ids=torch.tensor([[gen.tokens[-1]]]), cache=cache, use_cache=True).logits[0, -1]
    assert int(nxt.argmax()) == full[NEW]


def test_memory_paths_vs_nodes():
    target, p, ref = TARGETS["dense"], PROMPTS[2], REFS["dense"][2]
    gdn_layers = target.config.layer_types.count(GDN)
    for budget in (16, 32, 64):
        for method in ("recompute", "snapshot"):
            gen = hybrid_speculative_generate(target, Scripted(p, ref, "noisy"), p, make_builder("best-first", budget),
                                              6 if method == "snapshot" else 12, method=method, eos_token_id=[])
            for m in gen.memory:
                assert m.gdn_layers == gdn_layers
                if method == "snapshot":
                    assert m.snapshot_bytes == m.nodes * m.state_per_layer * gdn_layers and m.path_state_bytes == 0
                else:
                    assert m.path_state_bytes == m.paths * m.state_per_layer and m.snapshot_bytes == 0
                    assert m.paths < m.nodes and m.path_steps >= m.nodes
                    assert m.recompute_bytes < m.nodes * m.state_per_layer * gdn_layers
