"""GDN tree-verification kernels (kernels/gdn_path_triton.py) on the CPU, through the Triton interpreter.

* every node's core output from the recurrent kernel (path and node schedules) and the WY kernel equals
  the path-recompute reference (Transformers' recurrence walked along the root paths) and the per-node
  snapshot reference, to fp32 rounding, for random trees of 16-64 nodes (GQA heads, dv not a power of 2);
* a chain equals the stock sequential computation (outputs and final state);
* hooked into specdec/gdn_tree.py: same core outputs as `verify_gdn_paths` / `verify_gdn_snapshots` on a
  real (tiny) Qwen3-Next GDN module, and speculative generation with it is lossless;
* grouped heads (2 key heads, 4 value heads): the references the bench calls equal Qwen3NextGatedDeltaNet
  itself, and the kernels equal them, also with a rule that does not group heads (Transformers < 5.19);
* bad trees and inputs raise.
"""

import pytest
import torch
from transformers import Qwen3NextConfig
from transformers.models.qwen3_next import modeling_qwen3_next as hf

from w12.kernels import gdn_path_triton as gk
from w12.specdec import gdn_tree
from w12.specdec.gdn_tree import (GDN, GDNInputs, gdn_output, gdn_project, hybrid_speculative_generate, root_paths,
                                  tree_conv, tree_forward, verify_gdn_paths, verify_gdn_paths_triton,
                                  verify_gdn_snapshots)
from w12.specdec.trees import Tree, make_builder

torch.set_num_threads(1)
# the interpreter converts the kernel's loaded loop bound with a NumPy deprecation warning
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")
TOL = dict(rtol=1e-5, atol=2e-6)


def random_parents(n: int, seed: int, depth: int = 8) -> list[int]:
    """Random tree of n nodes, each node's parent among the last `depth`... earlier nodes (deep-ish trees)."""
    g = torch.Generator().manual_seed(seed)
    return [-1] + [int(torch.randint(max(0, i - depth), i, (1,), generator=g)) for i in range(1, n)]


def random_inputs(n, hk=1, hv=2, dk=16, dv=16, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    return dict(q=r(n, hk, dk).to(dtype), k=r(n, hk, dk).to(dtype), v=r(n, hv, dv).to(dtype),
                g=-torch.rand(n, hv, generator=g) * 0.7, beta=torch.rand(n, hv, generator=g),
                state=r(hv, dk, dv) * 0.3)


def snapshot_outputs(q, k, v, g, beta, state, parents):
    """Per-node snapshot reference: each node stepped (HF's recurrence, one token) from its parent's state."""
    q, k = gk.expand_key_heads(q, k, v.shape[1])
    states, outs = [], []
    for i, p in enumerate(parents):
        one = lambda x: x[i][None, None].float()  # noqa: E731
        out, s = hf.torch_recurrent_gated_delta_rule(one(q), one(k), one(v), g=one(g), beta=one(beta),
                                                     initial_state=state[None] if p < 0 else states[p],
                                                     output_final_state=True, use_qk_l2norm_in_kernel=True)
        states.append(s)
        outs.append(out[0, 0])
    return torch.stack(outs)


@pytest.mark.parametrize("n,dv,seed", [(16, 16, 0), (40, 24, 1), (64, 16, 2)])
def test_kernels_match_path_and_snapshot_references(n, dv, seed):
    parents = random_parents(n, seed)
    x = random_inputs(n, dv=dv, seed=seed)
    plan = gk.plan_tree(parents)
    ref = gk.tree_outputs(**x, tree=plan, method="torch")
    snap = snapshot_outputs(**x, parents=parents)
    torch.testing.assert_close(ref, snap, rtol=0, atol=0)      # the two references agree bit for bit
    assert plan.max_len >= 4 and len(plan.paths) > 1
    for method in ("path", "node", "wy"):
        if method == "node" and n > 40:
            continue                                            # interpreter time; the schedule is covered
        o = gk.tree_outputs(**x, tree=plan, method=method)
        torch.testing.assert_close(o, ref, **TOL)


def test_path_schedule_writes_each_node_once():
    parents = random_parents(33, 5)
    plan = gk.plan_tree(parents)
    rows, lens, first = plan.schedules["path"]
    written = [int(rows[r, t]) for r in range(rows.shape[0]) for t in range(int(first[r]), int(lens[r]))]
    assert sorted(written) == list(range(33))
    assert plan.paths == root_paths(Tree(torch.zeros(33, dtype=torch.long), torch.tensor(parents),
                                         torch.zeros(33, dtype=torch.long), torch.zeros(33)))


def test_chain_equals_stock_sequential_recurrence():
    n = 12
    x = random_inputs(n, hk=2, hv=4, dk=16, dv=16, seed=7)
    q, k, v, g, beta, S0 = x.values()
    q, k = q.repeat_interleave(2, dim=1), k.repeat_interleave(2, dim=1)     # value head h: key head h // 2
    out, final = hf.torch_recurrent_gated_delta_rule(q[None], k[None], v[None], g=g[None], beta=beta[None],
                                                     initial_state=S0[None], output_final_state=True,
                                                     use_qk_l2norm_in_kernel=True)
    o, sf = gk.chain_outputs(**x)
    torch.testing.assert_close(o, out[0], **TOL)
    torch.testing.assert_close(sf, final[0], **TOL)
    chain = [-1] + list(range(n - 1))
    for method in ("path", "wy"):
        torch.testing.assert_close(gk.tree_outputs(**x, tree=chain, method=method), out[0], **TOL)
    assert torch.equal(S0, x["state"])                          # the committed state is not modified


def test_cpu_fallback_without_interpreter(monkeypatch):
    monkeypatch.setattr(gk, "INTERPRET", False)
    parents = random_parents(20, 3)
    x = random_inputs(20, seed=3)
    o = gk.tree_outputs(**x, tree=parents, method="path")
    assert torch.equal(o, snapshot_outputs(**x, parents=parents))
    o, sf = gk.chain_outputs(**random_inputs(5, seed=4))
    assert o.shape == (5, 2, 16) and sf.shape == (2, 16, 16)


# --- hooked into specdec/gdn_tree.py on a tiny Qwen3-Next ------------------------------------------

def tiny_config(**kw):
    base = dict(vocab_size=160, hidden_size=64, intermediate_size=128, num_experts=0, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_key_heads=1,
                linear_num_value_heads=2, linear_key_head_dim=16, linear_value_head_dim=24,
                linear_conv_kernel_dim=4, max_position_embeddings=256, initializer_range=0.1,
                layer_types=[GDN, GDN, GDN, "full_attention"])
    return Qwen3NextConfig(**{**base, **kw})


def test_module_level_matches_verify_gdn_paths_and_snapshots():
    torch.manual_seed(0)
    gdn = hf.Qwen3NextGatedDeltaNet(tiny_config(), 0).eval()
    n, g = 33, torch.Generator().manual_seed(1)
    inp = GDNInputs(torch.randn(n, gdn.conv_dim, generator=g), -torch.rand(n, gdn.num_v_heads, generator=g),
                    torch.rand(n, gdn.num_v_heads, generator=g))
    conv0 = torch.randn(1, gdn.conv_dim, gdn.conv_kernel_size, generator=g)
    rec0 = torch.randn(1, gdn.num_v_heads, gdn.head_k_dim, gdn.head_v_dim, generator=g) * 0.3
    before = conv0.clone(), rec0.clone()
    parents = random_parents(n, 11)
    paths = [list(p) for p in gk.root_paths(parents)]
    with torch.no_grad():
        ref, _ = verify_gdn_paths(gdn, inp, paths, conv0, rec0)
        snap, (convs, _) = verify_gdn_snapshots(gdn, inp, parents, conv0, rec0)
        plan = gk.plan_tree(parents)
        for kernel in ("path", "wy"):
            core, held = verify_gdn_paths_triton(gdn, inp, plan, conv0, rec0, kernel)
            torch.testing.assert_close(core, ref, **TOL)
            torch.testing.assert_close(core, snap, **TOL)
            assert held == convs.nbytes                  # only the N conv windows: no recurrent state
    assert torch.equal(conv0, before[0]) and torch.equal(rec0, before[1])


def test_tree_forward_and_generation_with_the_kernels():
    torch.manual_seed(0)
    model = hf.Qwen3NextForCausalLM(tiny_config(num_hidden_layers=2, layer_types=[GDN, "full_attention"])).eval()
    prompt = torch.randint(0, 160, (9,), generator=torch.Generator().manual_seed(0)).tolist()
    ref = hybrid_speculative_generate(model, _Noisy(), prompt, make_builder("best-first", 24), 8,
                                      method="recompute", eos_token_id=[])
    for method in ("recompute_wy", "recompute_triton"):
        gen = hybrid_speculative_generate(model, _Noisy(), prompt, make_builder("best-first", 24), 8,
                                          method=method, eos_token_id=[])
        assert gen.tokens == ref.tokens
        for m, r in zip(gen.memory, ref.memory):
            assert m.paths == r.paths and m.stash_bytes == r.stash_bytes
            assert m.path_state_bytes < r.path_state_bytes    # conv windows only, no recurrent path states
    with pytest.raises(ValueError):
        tree_forward(model, None, make_builder("chain", 2)(_Noisy().draft(prompt), 1), 0, method="triton")


class _Noisy:
    """A random drafter: its tokens are mostly wrong, so trees are bushy and few nodes are accepted."""

    def draft(self, ids):
        from w12.specdec.lattice import Lattice

        return Lattice.from_logits(torch.randn(6, 160, generator=torch.Generator().manual_seed(len(ids))), 4)


# --- grouped heads (Qwen3-Next: 16 key heads, 32 value heads) ----------------------------------------

_RULE = hf.torch_recurrent_gated_delta_rule


def _rule_without_grouping(query, key, value, **kw):
    """Transformers' rule as up to 5.18 (the H200 image had 5.17): equal head counts only -- there
    Qwen3NextGatedDeltaNet.forward repeat_interleaves q/k to the value heads before calling it."""
    assert query.shape[2] == key.shape[2] == value.shape[2], "rule called with ungrouped q/k heads"
    return _RULE(query, key, value, **kw)


def test_grouped_heads_match_transformers(monkeypatch):
    """2 key heads, 4 value heads: value head h reads key head h // 2 (repeat_interleave, not a tile).
    The references the bench calls (`verify_gdn_paths`, `verify_gdn_snapshots`; `tree_outputs` "torch")
    reproduce Qwen3NextGatedDeltaNet.forward, and the kernels (the bench's `tree_conv` + `tree_outputs`)
    equal them on a tree -- with a rule that does not group heads itself."""
    torch.manual_seed(0)
    gdn = hf.Qwen3NextGatedDeltaNet(tiny_config(linear_num_key_heads=2, linear_num_value_heads=4), 0).eval()
    HV, dk, dv = gdn.num_v_heads, gdn.head_k_dim, gdn.head_v_dim
    T, g = 8, torch.Generator().manual_seed(2)
    h = torch.randn(1, T, gdn.hidden_size, generator=g)
    with torch.no_grad():
        module = gdn(h)                   # Transformers itself: its own grouping and rule, zero state
    monkeypatch.setattr(gdn_tree, "torch_recurrent_gated_delta_rule", _rule_without_grouping)
    monkeypatch.setattr(hf, "torch_recurrent_gated_delta_rule", _rule_without_grouping)
    chain = [list(range(T))]
    zeros = torch.zeros(1, gdn.conv_dim, gdn.conv_kernel_size), torch.zeros(1, HV, dk, dv)
    with torch.no_grad():
        inp, z = gdn_project(gdn, h)
        core, _ = verify_gdn_paths(gdn, inp, chain, *zeros)
        torch.testing.assert_close(gdn_output(gdn, core, z), module, rtol=1e-5, atol=1e-6)
        with monkeypatch.context() as m:  # the test tells the mappings apart: a tile is not Transformers'
            m.setattr(gdn_tree, "expand_key_heads", lambda q, k, hv: (q.repeat(1, 1, hv // q.shape[2], 1),
                                                                      k.repeat(1, 1, hv // k.shape[2], 1)))
            tiled, _ = verify_gdn_paths(gdn, inp, chain, *zeros)
            assert not torch.allclose(gdn_output(gdn, tiled, z), module, rtol=1e-3, atol=1e-4)

        n = 20
        parents = random_parents(n, 4)
        inp = GDNInputs(torch.randn(n, gdn.conv_dim, generator=g), -torch.rand(n, HV, generator=g),
                        torch.rand(n, HV, generator=g))
        conv0 = torch.randn(1, gdn.conv_dim, gdn.conv_kernel_size, generator=g)
        rec0 = torch.randn(1, HV, dk, dv, generator=g) * 0.3
        ref, _ = verify_gdn_paths(gdn, inp, gk.root_paths(parents), conv0, rec0)
        snap, _ = verify_gdn_snapshots(gdn, inp, parents, conv0, rec0)
        assert torch.equal(ref, snap)
        plan = gk.plan_tree(parents)
        q, k, v, _ = tree_conv(gdn, inp, plan, conv0)
        assert q.shape[1] == 2 and v.shape[1] == 4
        for method in ("torch", "path", "node", "wy"):
            o = gk.tree_outputs(q, k, v, inp.g, inp.beta, rec0, plan, method=method)
            torch.testing.assert_close(o, ref, **TOL)


# --- errors ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("parents", [[0, 0], [-1, 1], [-1, 0, 3], []])
def test_bad_trees_raise(parents):
    with pytest.raises(gk.GDNTreeError):
        gk.plan_tree(parents)


def test_bad_inputs_raise():
    x = random_inputs(4)
    chain = [-1, 0, 1, 2]
    with pytest.raises(gk.GDNInputError):
        gk.tree_outputs(**{**x, "v": x["v"][:, :1]}, tree=chain)               # wrong head count
    with pytest.raises(gk.GDNInputError):
        gk.tree_outputs(**{**x, "state": x["state"].double()}, tree=chain)    # state not fp32
    with pytest.raises(gk.GDNInputError):
        gk.tree_outputs(**x, tree=[-1, 0], method="path")                      # tree of another size
    with pytest.raises(gk.GDNInputError):
        gk.tree_outputs(**x, tree=chain, method="rows")
    with pytest.raises(gk.GDNInputError):
        gk.tree_outputs(**x, tree=chain, method="wy", precision="bf16")
