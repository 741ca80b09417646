"""Tree verification for hybrid targets (attention + Gated DeltaNet), without per-node state snapshots.

Target: Transformers' Qwen3-Next (`Qwen3NextForCausalLM`, `layer_types` of "linear_attention" (GDN) and
"full_attention"), run on its pure-PyTorch GDN path (`torch_recurrent_gated_delta_rule`,
`causal_conv1d_update`) since fla / causal_conv1d are not installed.

A GDN layer keeps two fixed-size states per sequence: a conv state [C, K] (the last K pre-conv inputs of
its short causal depthwise conv1d; C = 2·key_dim + value_dim) and a recurrent state [HV, dk, dv]. In a
draft tree each node's output depends on the states reached along *its* root path, so:

* Snapshot verification (the reference, "Direction 1" of SGLang #27725 applied per node): step each node
  from its parent's snapshot and keep every node's (conv, recurrent) state until acceptance, in every GDN
  layer -> N x state per layer held. Commit = copy the accepted node's snapshot.
* Path-recompute verification (SpecPilot §4.2): for each GDN layer walk every root->leaf path from the
  committed state (all paths as one batch, shrinking as short paths end), reading each node's output off
  the first path that contains it; the path states are dropped when the layer is done. Only the per-node
  pre-conv inputs and gates (token-sized, not state-sized) are stashed for the commit. Commit = replay
  the accepted path (root + accepted nodes) token by token through the conv and the delta rule from the
  committed state, exactly as stock decoding steps a chain -> P x state per layer, transiently.

Both use the same per-token step (HF's `causal_conv1d_update` and `torch_recurrent_gated_delta_rule` with
one token, i.e. the decode path of `Qwen3NextGatedDeltaNet.forward`). Attention layers see the tree through
the usual 4-D mask; after acceptance their KV cache keeps the root and the accepted path only.

Bit-exactness: the committed state is the stock per-token recurrence over the accepted tokens' GDN inputs
(the tests compare it bit for bit with HF's kernels stepped one token at a time and with the snapshot
reference). It is not bit-identical to `generate()`'s own cache: there each token's GDN inputs come from a
1-row GEMM, here from an N-row GEMM of the tree pass, and CPU BLAS rounds those differently (~1e-7).
The *tokens* are the greedy tokens (the tests check against `generate(do_sample=False)`).

Memory accounting (`VerifyMemory`) counts the bytes of the state tensors each method holds, from the
tensors' own `nbytes`; allocator temporaries inside one step are not counted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.models.qwen3_next.modeling_qwen3_next import (
    causal_conv1d_update,
    torch_recurrent_gated_delta_rule,
)

from ..kernels.gdn_path_triton import root_paths as _root_paths
from .engine import Generation, _eos, emit, prefill, tree_inputs
from .errors import CacheLayoutError
from .trees import Tree
from .verify import accept

GDN, ATTN = "linear_attention", "full_attention"


# --- tree paths ---------------------------------------------------------------------------------

def root_paths(tree: Tree) -> list[list[int]]:
    """Every root->leaf path (node indices, root first), longest first (ties: leaf order)."""
    return _root_paths(tree.parents.tolist())


# --- one GDN layer, split into its pieces -------------------------------------------------------

@dataclass
class GDNInputs:
    """Per-node inputs of one GDN layer from the tree pass (what the commit replays): token-sized."""
    mixed_qkv: torch.Tensor  # [N, C] pre-conv q|k|v
    g: torch.Tensor          # [N, HV] log decay (fp32)
    beta: torch.Tensor       # [N, HV]

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in (self.mixed_qkv, self.g, self.beta))


def gdn_project(gdn, h: torch.Tensor):
    """h [1, N, H] (after input_layernorm) -> (GDNInputs, z [1, N, HV, dv]): the module's projections."""
    query, key, value, z, b, a = gdn.fix_query_key_value_ordering(gdn.in_proj_qkvz(h), gdn.in_proj_ba(h))
    mixed = torch.cat([x.reshape(x.shape[0], x.shape[1], -1) for x in (query, key, value)], -1)
    beta = b.sigmoid()
    g = -gdn.A_log.float().exp() * F.softplus(a.float() + gdn.dt_bias)
    return GDNInputs(mixed[0], g[0], beta[0]), z


def expand_key_heads(q: torch.Tensor, k: torch.Tensor, num_v_heads: int):
    """q, k [B, T, HK, dk] -> [B, T, HV, dk]: value head h reads key head h // (HV / HK), i.e.
    `repeat_interleave(HV // HK, dim=2)`, as Transformers' Qwen3-Next does. Done here, not left to
    `torch_recurrent_gated_delta_rule`: up to Transformers 5.18 the rule needs equal head counts (the module's
    forward expands q/k before calling it); from 5.19 it expands them itself (a no-op after this)."""
    HK = q.shape[2]
    if num_v_heads == HK:
        return q, k
    if num_v_heads % HK:
        raise ValueError(f"value heads {num_v_heads} must be a multiple of key heads {HK}")
    return q.repeat_interleave(num_v_heads // HK, dim=2), k.repeat_interleave(num_v_heads // HK, dim=2)


def gdn_step(gdn, conv_state: torch.Tensor, rec_state: torch.Tensor, x: torch.Tensor, g: torch.Tensor,
             beta: torch.Tensor):
    """One token for a batch of B sequences, exactly as `Qwen3NextGatedDeltaNet.forward` decodes one token
    (grouped heads: q/k expanded to the value heads by `expand_key_heads`, as the module does).

    conv_state [B, C, K] is updated in place; rec_state [B, HV, dk, dv] is not touched.
    x [B, C] pre-conv, g / beta [B, HV]. Returns (core output [B, HV, dv], new recurrent state)."""
    mixed = causal_conv1d_update(x[:, :, None], conv_state, gdn.conv1d.weight.squeeze(1), gdn.conv1d.bias,
                                 gdn.activation).transpose(1, 2)                      # [B, 1, C]
    q, k, v = torch.split(mixed, [gdn.key_dim, gdn.key_dim, gdn.value_dim], dim=-1)
    B = x.shape[0]
    q = q.reshape(B, 1, -1, gdn.head_k_dim)
    k = k.reshape(B, 1, -1, gdn.head_k_dim)
    v = v.reshape(B, 1, -1, gdn.head_v_dim)
    q, k = expand_key_heads(q, k, v.shape[2])
    out, rec = torch_recurrent_gated_delta_rule(q, k, v, g=g[:, None], beta=beta[:, None], initial_state=rec_state,
                                                output_final_state=True, use_qk_l2norm_in_kernel=True)
    return out[:, 0], rec


def gdn_output(gdn, core: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """core [N, HV, dv] + gate z [1, N, HV, dv] -> the layer output [1, N, H] (gated norm + out_proj)."""
    N = core.shape[0]
    y = gdn.norm(core.reshape(-1, core.shape[-1]).to(z.dtype), z.reshape(-1, z.shape[-1]))
    return gdn.out_proj(y.reshape(1, N, -1))


def state_bytes(conv_state: torch.Tensor, rec_state: torch.Tensor) -> int:
    """Bytes of one sequence's (conv, recurrent) state of one GDN layer."""
    return (conv_state.nbytes + rec_state.nbytes) // conv_state.shape[0]


# --- the two verification methods for one GDN layer ---------------------------------------------

def verify_gdn_paths(gdn, inp: GDNInputs, paths: list[list[int]], conv0: torch.Tensor, rec0: torch.Tensor):
    """Path recompute. Walks all root paths as one batch from the committed state (conv0 [1, C, K], rec0
    [1, HV, dk, dv]); at depth t only the paths longer than t step (paths are sorted longest first).
    Returns (core [N, HV, dv], bytes of path states held). No per-node state is kept."""
    P, N = len(paths), inp.mixed_qkv.shape[0]
    conv = conv0.expand(P, -1, -1).clone()
    rec = rec0.expand(P, -1, -1, -1).clone()
    held = conv.nbytes + rec.nbytes
    core = torch.empty(N, *rec.shape[1:2], rec.shape[-1], dtype=torch.float32, device=rec.device)
    done = torch.zeros(N, dtype=torch.bool, device=rec.device)
    for t in range(len(paths[0])):
        a = sum(len(p) > t for p in paths)                   # active paths: a prefix of the sorted list
        nodes = torch.tensor([p[t] for p in paths[:a]], device=rec.device)
        out, rec_a = gdn_step(gdn, conv[:a], rec[:a], inp.mixed_qkv[nodes], inp.g[nodes], inp.beta[nodes])
        rec[:a] = rec_a
        new = ~done[nodes]                                   # first path through a node provides its output
        core[nodes[new]] = out[new].float()
        done[nodes] = True
    return core, held


def verify_gdn_snapshots(gdn, inp: GDNInputs, parents: list[int], conv0: torch.Tensor, rec0: torch.Tensor):
    """Reference: every node stepped from its parent's snapshot; all N snapshots kept.
    Returns (core [N, HV, dv], snapshots (conv [N, C, K], rec [N, HV, dk, dv]))."""
    N = len(parents)
    convs = torch.empty(N, *conv0.shape[1:], dtype=conv0.dtype, device=conv0.device)
    recs = torch.empty(N, *rec0.shape[1:], dtype=rec0.dtype, device=rec0.device)
    core = torch.empty(N, *rec0.shape[1:2], rec0.shape[-1], dtype=torch.float32, device=rec0.device)
    for i, p in enumerate(parents):
        convs[i] = conv0[0] if p < 0 else convs[p]
        out, rec = gdn_step(gdn, convs[i:i + 1], rec0 if p < 0 else recs[p:p + 1],
                            inp.mixed_qkv[i:i + 1], inp.g[i:i + 1], inp.beta[i:i + 1])
        recs[i] = rec[0]
        core[i] = out[0].float()
    return core, (convs, recs)


def tree_conv(gdn, inp: GDNInputs, plan, conv0: torch.Tensor):
    """Post-conv q [N, HK, dk], k [N, HK, dk], v [N, HV, dv] of every node, each from the conv state its own
    root path reaches (the last K pre-conv inputs before the node; the committed conv0 [1, C, K] before the
    root): HF's `causal_conv1d_update` on the N windows at once. `plan`: kernels.gdn_path_triton.TreePlan.
    Returns (q, k, v, bytes of the N gathered conv windows -- token-sized x K, transient)."""
    K, N = conv0.shape[-1], inp.mixed_qkv.shape[0]
    table = torch.cat([conv0[0].T, inp.mixed_qkv.to(conv0.dtype)])            # [K + N, C]
    windows = table[plan.conv_index(K)].transpose(1, 2)                       # [N, C, K]: the parent's conv state
    mixed = causal_conv1d_update(inp.mixed_qkv[:, :, None], windows, gdn.conv1d.weight.squeeze(1),
                                 gdn.conv1d.bias, gdn.activation)[:, :, 0]     # [N, C]
    q, k, v = torch.split(mixed, [gdn.key_dim, gdn.key_dim, gdn.value_dim], dim=-1)
    return (q.view(N, -1, gdn.head_k_dim), k.view(N, -1, gdn.head_k_dim), v.view(N, -1, gdn.head_v_dim),
            windows.nbytes)


def verify_gdn_paths_triton(gdn, inp: GDNInputs, plan, conv0: torch.Tensor, rec0: torch.Tensor, kernel="path"):
    """Path recompute by kernels/gdn_path_triton.py (kernel "path" / "node": the recurrent kernel, "wy": the
    WY form): the conv per node (`tree_conv`), then every node's delta rule recomputed along its root path
    from rec0 inside the kernel -- no recurrent state is written to memory. CPU tensors without
    TRITON_INTERPRET run the kernel module's PyTorch fallback. Same maths as `verify_gdn_paths`, equal to
    fp32 rounding (not bit for bit). Returns (core [N, HV, dv] fp32, bytes held: the conv windows)."""
    from w12.kernels.gdn_path_triton import tree_outputs

    q, k, v, held = tree_conv(gdn, inp, plan, conv0)
    core = tree_outputs(q, k, v, inp.g, inp.beta, rec0.float(), plan, method=kernel)
    return core.to(q.dtype).float(), held        # rounded to q's dtype, as the reference's output is


def replay_path(gdn, inp: GDNInputs, rows: list[int], conv0: torch.Tensor, rec0: torch.Tensor):
    """Commit: the committed state stepped through `rows` (root + accepted nodes) one token at a time.
    Returns the new (conv [1, C, K], rec [1, HV, dk, dv]); the inputs are not modified."""
    conv, rec = conv0.clone(), rec0
    for i in rows:
        _, rec = gdn_step(gdn, conv, rec, inp.mixed_qkv[i:i + 1], inp.g[i:i + 1], inp.beta[i:i + 1])
    return conv, rec


# --- the whole target over one tree -------------------------------------------------------------

@dataclass
class VerifyMemory:
    """Bytes of GDN state held during one tree verification (one sequence, all GDN layers)."""
    nodes: int
    paths: int
    gdn_layers: int
    state_per_layer: int        # one (conv + recurrent) state of one layer
    snapshot_bytes: int = 0     # snapshot method: N states x layers, all held until the commit
    path_state_bytes: int = 0   # recompute method: P path states of one layer (freed after each layer)
    stash_bytes: int = 0        # recompute method: per-node token-sized inputs, all layers, until the commit
    path_steps: int = 0         # recompute work: Σ path lengths per layer (snapshots: N)

    @property
    def recompute_bytes(self) -> int:
        return self.path_state_bytes + self.stash_bytes


@dataclass
class Pending:
    """What a verification leaves for the commit."""
    method: str
    start: int                                          # committed KV length (the root's position)
    inputs: dict = field(default_factory=dict)          # layer -> GDNInputs (recompute)
    snapshots: dict = field(default_factory=dict)       # layer -> (convs, recs) (snapshot)
    memory: VerifyMemory | None = None


def _gdn_layer(cache, i):
    layer = cache.layers[i]
    conv, rec = layer.conv_states[0], layer.recurrent_states[0]
    if conv is None or rec is None or conv.shape[0] != 1:
        raise CacheLayoutError(f"GDN layer {i}: expected a prefilled batch-1 conv and recurrent state")
    return layer, conv, rec


# recompute on the GPU kernels (kernels/gdn_path_triton.py): method -> kernel; the commit is the same replay
TRITON_METHODS = {"recompute_triton": "path", "recompute_wy": "wy"}


def _plan(parents: list[int], device):
    from w12.kernels.gdn_path_triton import TreePlan

    return TreePlan(parents, device)


@torch.no_grad()
def tree_forward(model, cache, tree: Tree, start: int, method: str = "recompute"):
    """One target pass over `tree` (root = last committed token, not cached yet; `start` = cached length).
    Returns (logits [N, V], Pending). The cache's attention layers get the N tree rows appended; GDN states
    are read, not written (the commit writes them)."""
    if method not in ("recompute", "snapshot", *TRITON_METHODS):
        raise ValueError(f"method must be 'recompute', 'snapshot', 'recompute_triton' or 'recompute_wy', "
                         f"found {method!r}")
    inner, cfg = model.model, model.config
    x, pos, mask = tree_inputs(tree, start, model.dtype)
    paths = root_paths(tree)
    parents = tree.parents.tolist()
    types = cfg.layer_types[:cfg.num_hidden_layers]
    pend = Pending(method, start)
    mem = VerifyMemory(len(tree), len(paths), types.count(GDN), 0, path_steps=sum(map(len, paths))
                       if method != "snapshot" else len(tree))
    plan = _plan(parents, inner.embed_tokens.weight.device) if method in TRITON_METHODS else None
    h = inner.embed_tokens(x)
    pe = inner.rotary_emb(h, pos)
    for i, layer in enumerate(inner.layers[:cfg.num_hidden_layers]):
        residual, hn = h, layer.input_layernorm(h)
        if types[i] == GDN:
            gdn = layer.linear_attn
            _, conv0, rec0 = _gdn_layer(cache, i)
            mem.state_per_layer = state_bytes(conv0, rec0)
            inp, z = gdn_project(gdn, hn)
            if method == "recompute":
                core, held = verify_gdn_paths(gdn, inp, paths, conv0, rec0)
                pend.inputs[i] = inp
                mem.path_state_bytes = max(mem.path_state_bytes, held)
                mem.stash_bytes += inp.nbytes
            elif plan is not None:
                core, held = verify_gdn_paths_triton(gdn, inp, plan, conv0, rec0, TRITON_METHODS[method])
                pend.inputs[i] = inp
                mem.path_state_bytes = max(mem.path_state_bytes, held)
                mem.stash_bytes += inp.nbytes
            else:
                core, snaps = verify_gdn_snapshots(gdn, inp, parents, conv0, rec0)
                pend.snapshots[i] = snaps
                mem.snapshot_bytes += snaps[0].nbytes + snaps[1].nbytes
            out = gdn_output(gdn, core, z)
        else:
            out, _ = layer.self_attn(hidden_states=hn, position_embeddings=pe, attention_mask=mask,
                                     position_ids=pos, cache=cache)
        h = residual + out
        residual = h
        m = layer.mlp(layer.post_attention_layernorm(h))
        h = residual + (m[0] if isinstance(m, tuple) else m)
    logits = model.lm_head(inner.norm(h))[0]
    pend.memory = mem
    return logits, pend


@torch.no_grad()
def commit(model, cache, pending: Pending, rows: list[int]) -> None:
    """Make `rows` (root + accepted nodes, in path order) the committed continuation: GDN layers get the
    state after those tokens (replayed, or the last row's snapshot); attention layers keep only those rows."""
    start = pending.start
    for i, layer in enumerate(cache.layers):
        if pending.method != "snapshot" and i in pending.inputs:
            lay, conv0, rec0 = _gdn_layer(cache, i)
            conv, rec = replay_path(model.model.layers[i].linear_attn, pending.inputs[i], rows, conv0, rec0)
        elif pending.method == "snapshot" and i in pending.snapshots:
            lay, _, _ = _gdn_layer(cache, i)
            convs, recs = pending.snapshots[i]
            conv, rec = convs[rows[-1]:rows[-1] + 1], recs[rows[-1]:rows[-1] + 1]
        elif type(layer) is DynamicLayer:
            idx = torch.tensor(rows) + start
            layer.keys = torch.cat([layer.keys[..., :start, :], layer.keys[..., idx, :]], -2)
            layer.values = torch.cat([layer.values[..., :start, :], layer.values[..., idx, :]], -2)
            continue
        else:
            raise CacheLayoutError(f"layer {i}: cannot commit a {type(layer).__name__}")
        lay.conv_states[0].copy_(conv)
        lay.recurrent_states[0].copy_(rec)
        if hasattr(lay, "cumulative_length_linear"):
            # transformers >= 5.25 counts the tokens folded into a linear-attention state, and a hybrid cache's
            # get_seq_length() reads that count from layer 0 (a GDN layer): the state now holds start + len(rows)
            lay.cumulative_length_linear.fill_(start + len(rows))


def committed_state(cache) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """layer -> (conv, recurrent) copies of every GDN layer's committed state."""
    return {i: (l.conv_states[0].clone(), l.recurrent_states[0].clone())
            for i, l in enumerate(cache.layers) if hasattr(l, "recurrent_states")}


# --- greedy speculative generation ---------------------------------------------------------------

@dataclass
class HybridGeneration(Generation):
    memory: list[VerifyMemory] = field(default_factory=list)   # one per tree pass


@torch.no_grad()
def hybrid_speculative_generate(target, drafter, prompt: list[int], build, max_new_tokens: int,
                                method: str = "recompute", eos_token_id=None, cache=None) -> HybridGeneration:
    """Greedy speculative decoding of a Qwen3-Next-style hybrid target with tree verification
    (`method` = "recompute" (path recompute + replay commit), "snapshot" (per-node snapshots), or
    "recompute_triton" / "recompute_wy" (path recompute by the GPU kernels + replay commit)).
    Output = the target's greedy output. Pass `cache` (an empty DynamicCache) to inspect it afterwards."""
    eos, ids = _eos(target, eos_token_id), list(prompt)
    gen, t0 = HybridGeneration([]), time.perf_counter()
    cache = DynamicCache(config=target.config) if cache is None else cache
    # Prefill exactly as generate() does, so the first token and the starting state are its own.
    if prefill(target, ids, cache, gen, max_new_tokens, eos, t0):
        return gen
    while len(gen.tokens) < max_new_tokens:
        td = time.perf_counter()
        tree = build(drafter.draft(ids), ids[-1])
        gen.draft_seconds += time.perf_counter() - td
        start = len(ids) - 1                       # KV rows cached: everything but the root
        logits, pend = tree_forward(target, cache, tree, start, method)
        path, bonus = accept(tree, logits.argmax(-1))
        new, hit = emit(gen, ids, [int(tree.tokens[i]) for i in path] + [int(bonus)], max_new_tokens, eos)
        # Invariant: the cache holds every committed token but the last (the next root).
        commit(target, cache, pend, [0] + path[:len(new) - 1])
        gen.memory.append(pend.memory)
        if hit:
            break
    gen.seconds = time.perf_counter() - t0
    return gen
