"""Gated DeltaNet (GDN) tree verification on the GPU: every node's core output, no per-node state stored.

Maths (Transformers' `torch_recurrent_gated_delta_rule` with `use_qk_l2norm_in_kernel=True`, which
specdec/gdn_tree.py `gdn_step` calls one token at a time). Per value head h (key head h // G, G = HV / HK:
Transformers' `repeat_interleave(G)` of the key heads, not a tile),
state S [dk, dv] (fp32), one token t with post-conv q_t, k_t [dk], v_t [dv], log decay g_t ≤ 0, beta_t:

    q_t ← q_t · rsqrt(Σ q_t² + 1e-6) / sqrt(dk)        k_t ← k_t · rsqrt(Σ k_t² + 1e-6)
    S'  = exp(g_t) · S_{t−1}                           (decay)
    δ_t = β_t · (v_t − S'ᵀ k_t)                        (delta rule: the error of the decayed memory)
    S_t = S' + k_t δ_tᵀ                                (rank-one update)
    o_t = S_tᵀ q_t                                      (core output, before the gated norm)

In a draft tree, node i's state is this recurrence along *its* root path, starting from the committed
state S0. Two kernels compute o for all N nodes; neither writes a state to global memory.

1. `_gdn_rows_kernel` (recurrent form), grid (R rows, HV, cdiv(dv, BV)). One program walks one row — a
   list of nodes, root first — for one head and BV value columns, keeping S[:, cols] ([dk, BV] fp32) in
   registers (the dv columns of S evolve independently: δ, the update and o are column-wise given k, q).
   Schedules (`schedule=`):
     "path": rows = the root->leaf paths (longest first). Path r stores o only for its nodes that no earlier
             path contains; those form a suffix of the path (the covered nodes are ancestor-closed), so
             each node is written exactly once, by the first path through it. Work Σ_leaves depth — the
             least total steps; default.
     "node": rows = each node's own root path, storing only its last node. Work Σ_nodes depth (more), but
             N·HV·dv/BV programs (more parallel) and no shared paths to plan.
   Optionally it stores the final state of one row (`final_row`): the commit replay of the accepted path.
2. `_gdn_tree_wy_kernel` (WY / chunk form), grid (HV, cdiv(dv, BV)). The whole tree is one chunk whose
   causal mask is the ancestor mask. With Γ_t = Σ_{s ⪯ t} g_s (s ⪯ t: s is t or an ancestor of t),
   E_ts = exp(Γ_t − Γ_s)·[s ⪯ t] and unrolling the recurrence along t's root path:
       S_t  = e^{Γ_t} S0 + Σ_{s ⪯ t} E_ts k_s δ_sᵀ
       (I + A) Δ = diag(β)(V − diag(e^Γ) K S0),   A_ts = β_t E_ts (k_t·k_s) [s ≺ t] (strictly lower)
       O = diag(e^Γ) Q S0 + ((Q Kᵀ) ∘ E) Δ
   A is nilpotent (A^L = 0, L = nodes on the longest root path), so (I + A)⁻¹ = Σ_{j<L} (−A)^j
   = Π_{i<m} (I + (−A)^{2^i}) with 2^m ≥ L: m = ceil(log2 L) squarings of a BN×BN matrix. Every step is
   a tl.dot (tensor cores with precision "tf32"; "ieee" = exact fp32 FMA; "tf32x3" in between).
   One program per (head, BV columns); BN (≥ N, a power of two ≥ 16) rows; N ≤ 128.

Contract (`tree_outputs`): q, k [N, HK, dk], v [N, HV, dv] (any float dtype, last dim contiguous: strided
views of the conv output are fine), g, beta [N, HV], state S0 [HV, dk, dv] or [1, HV, dk, dv] fp32, and the
tree as a `TreePlan` (or its parent array: parents[0] = -1, parents[i] < i). Returns o [N, HV, dv] fp32 —
the value `torch_recurrent_gated_delta_rule` computes in fp32 before casting to the query dtype. S0 is
not modified. CUDA tensors (or TRITON_INTERPRET=1) run the kernels; CPU tensors otherwise run the
pure-PyTorch path walk `tree_outputs_torch` (Transformers' recurrence, as specdec/gdn_tree.py does).

The interpreter (TRITON_INTERPRET=1) gets bf16 arithmetic wrong; both kernels upcast every load to fp32
and compute in fp32, so they are exact there too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch
import triton
import triton.language as tl

from w12.formats.errors import W12Error
from w12.kernels.ops import on_input_gpu

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
EPS = 1e-6          # l2norm epsilon of Transformers / fla
MAX_WY_NODES = 128  # the WY kernel keeps BN×BN and BN×dk blocks in registers


class GDNTreeError(W12Error):
    """A parent array is not a tree with parents before children (root first, parents[i] < i)."""


class GDNInputError(W12Error):
    """Inputs of `tree_outputs` disagree in shape, device or dtype, or an option is unknown."""


# --- the tree, planned once per draft tree (shared by all GDN layers) --------------------------------

def _check_parents(parents: list[int]) -> None:
    if not parents or parents[0] != -1:
        raise GDNTreeError("node 0 must be the root (parent -1)")
    for i, p in enumerate(parents[1:], 1):
        if not 0 <= p < i:
            raise GDNTreeError(f"node {i}: parent {p} must be an earlier node")


def root_paths(parents: list[int]) -> list[list[int]]:
    """Every root->leaf path (root first), longest first (ties: leaf order); specdec/gdn_tree.py uses it."""
    has_child = set(parents[1:])
    paths = []
    for leaf in (i for i in range(len(parents)) if i not in has_child):
        p, node = [], leaf
        while node != -1:
            p.append(node)
            node = parents[node]
        paths.append(p[::-1])
    return sorted(paths, key=len, reverse=True)


def _rows(paths: list[list[int]], first: list[int], device) -> tuple[torch.Tensor, ...]:
    """(rows [R, L] int32 padded with 0, lengths [R] int32, first stored position [R] int32)."""
    L = max(map(len, paths))
    rows = torch.tensor([p + [0] * (L - len(p)) for p in paths], dtype=torch.int32)
    lens = torch.tensor([len(p) for p in paths], dtype=torch.int32)
    return rows.to(device), lens.to(device), torch.tensor(first, dtype=torch.int32).to(device)


@dataclass
class TreePlan:
    """What the kernels need of one tree, built once per tree on `device` (host work: O(N · depth))."""
    parents: list[int]
    device: torch.device
    paths: list[list[int]] = field(init=False)
    schedules: dict = field(init=False)         # "path" / "node" -> (rows, lens, first)
    anc: torch.Tensor = field(init=False)       # [BN, BN] fp32, anc[t, s] = 1 if s ⪯ t (padding 0)
    max_len: int = field(init=False)            # nodes on the longest root path
    _conv: dict = field(init=False, default_factory=dict)

    def __post_init__(self):
        _check_parents(self.parents)
        self.device = torch.device(self.device)
        self.paths = root_paths(self.parents)
        seen, first = set(), []
        for p in self.paths:                     # covered nodes are a prefix of each path
            first.append(next((t for t, n in enumerate(p) if n not in seen), len(p)))
            seen.update(p)
        own = [self._path_to(i) for i in range(len(self.parents))]
        self.schedules = {"path": _rows(self.paths, first, self.device),
                          "node": _rows(own, [len(p) - 1 for p in own], self.device)}
        self.max_len = len(self.paths[0])
        bn = self.block_nodes
        anc = torch.zeros(bn, bn)
        for i, p in enumerate(self.parents):
            if p >= 0:
                anc[i] = anc[p]
            anc[i, i] = 1
        self.anc = anc.to(self.device)
        self.device = self.anc.device             # "cuda" -> "cuda:0", comparable with the tensors' device

    def __len__(self):
        return len(self.parents)

    @property
    def block_nodes(self) -> int:
        return max(16, triton.next_power_of_2(len(self.parents)))

    def _path_to(self, i: int) -> list[int]:
        p = []
        while i != -1:
            p.append(i)
            i = self.parents[i]
        return p[::-1]

    def conv_index(self, K: int) -> torch.Tensor:
        """[N, K] int64 rows of the table cat(S_conv0ᵀ [K, C], x [N, C]): the conv state node i starts from
        (the last K pre-conv inputs before it on its root path; rows 0..K-1 = the committed conv state)."""
        if K not in self._conv:
            after = {-1: list(range(K))}        # conv state after each node (as table rows)
            for i, p in enumerate(self.parents):
                after[i] = after[p][1:] + [K + i]
            self._conv[K] = torch.tensor([after[p] for p in self.parents]).to(self.device)
        return self._conv[K]


def plan_tree(parents, device="cpu") -> TreePlan:
    """TreePlan of a parent array (list, or int tensor [N])."""
    parents = parents.tolist() if isinstance(parents, torch.Tensor) else [int(p) for p in parents]
    return TreePlan(parents, device)


# --- kernel 1: recurrent form, one program per (row, head, BV value columns) -------------------------

@triton.jit
def _gdn_rows_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, b_ptr, s0_ptr, rows_ptr, lens_ptr, first_ptr, o_ptr, sf_ptr,
    sq_n, sq_h, sk_n, sk_h, sv_n, sv_h, sg_n, sb_n, so_n, so_h,
    DK, DV, L, final_row, q_div,
    G: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, L2NORM: tl.constexpr, STORE_FINAL: tl.constexpr,
):
    r = tl.program_id(0)
    h = tl.program_id(1)
    hk = h // G
    rk = tl.arange(0, BK)
    rv = tl.program_id(2) * BV + tl.arange(0, BV)
    mk = rk < DK
    mv = rv < DV
    m2 = mk[:, None] & mv[None, :]
    s_off = h * DK * DV + rk[:, None] * DV + rv[None, :]
    S = tl.load(s0_ptr + s_off, mask=m2, other=0.0).to(tl.float32)        # [BK, BV] in registers
    n_len = tl.load(lens_ptr + r)
    first = tl.load(first_ptr + r)
    for t in range(0, n_len):
        node = tl.load(rows_ptr + r * L + t).to(tl.int64)
        q = tl.load(q_ptr + node * sq_n + hk * sq_h + rk, mask=mk, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + node * sk_n + hk * sk_h + rk, mask=mk, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + node * sv_n + h * sv_h + rv, mask=mv, other=0.0).to(tl.float32)
        gt = tl.load(g_ptr + node * sg_n + h).to(tl.float32)
        bt = tl.load(b_ptr + node * sb_n + h).to(tl.float32)
        if L2NORM:
            q = q * (1.0 / tl.sqrt(tl.sum(q * q, 0) + 1e-6))
            k = k * (1.0 / tl.sqrt(tl.sum(k * k, 0) + 1e-6))
        q = q / q_div
        S = S * tl.exp(gt)                                                  # S' = e^g S
        kv = tl.sum(S * k[:, None], 0)                                      # S'ᵀ k       [BV]
        delta = (v - kv) * bt                                               # δ = β (v − S'ᵀ k)
        S = S + k[:, None] * delta[None, :]                                 # S = S' + k δᵀ
        o = tl.sum(S * q[:, None], 0)                                       # o = Sᵀ q
        tl.store(o_ptr + node * so_n + h * so_h + rv, o, mask=mv & (t >= first))
    if STORE_FINAL:
        if r == final_row:
            tl.store(sf_ptr + s_off, S, mask=m2)


# --- kernel 2: WY form, the tree as one chunk with the ancestor mask --------------------------------

@triton.jit
def _gdn_tree_wy_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, b_ptr, s0_ptr, anc_ptr, o_ptr,
    sq_n, sq_h, sk_n, sk_h, sv_n, sv_h, sg_n, sb_n, so_n, so_h,
    N, DK, DV, q_div,
    G: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, NSQ: tl.constexpr,
    L2NORM: tl.constexpr, PREC: tl.constexpr,
):
    h = tl.program_id(0)
    hk = h // G
    rn = tl.arange(0, BN)
    rk = tl.arange(0, BK)
    rv = tl.program_id(1) * BV + tl.arange(0, BV)
    mn, mk, mv = rn < N, rk < DK, rv < DV
    Q = tl.load(q_ptr + rn[:, None] * sq_n + hk * sq_h + rk[None, :], mask=mn[:, None] & mk[None, :], other=0.0)
    K = tl.load(k_ptr + rn[:, None] * sk_n + hk * sk_h + rk[None, :], mask=mn[:, None] & mk[None, :], other=0.0)
    V = tl.load(v_ptr + rn[:, None] * sv_n + h * sv_h + rv[None, :], mask=mn[:, None] & mv[None, :], other=0.0)
    Q, K, V = Q.to(tl.float32), K.to(tl.float32), V.to(tl.float32)
    g = tl.load(g_ptr + rn * sg_n + h, mask=mn, other=0.0).to(tl.float32)
    beta = tl.load(b_ptr + rn * sb_n + h, mask=mn, other=0.0).to(tl.float32)
    S0 = tl.load(s0_ptr + h * DK * DV + rk[:, None] * DV + rv[None, :], mask=mk[:, None] & mv[None, :], other=0.0)
    if L2NORM:
        Q = Q * (1.0 / tl.sqrt(tl.sum(Q * Q, 1) + 1e-6))[:, None]
        K = K * (1.0 / tl.sqrt(tl.sum(K * K, 1) + 1e-6))[:, None]
    Q = Q / q_div
    anc = tl.load(anc_ptr + rn[:, None] * BN + rn[None, :]) > 0             # s ⪯ t
    strict = anc & (rn[:, None] != rn[None, :])                             # s ≺ t
    gam = tl.sum(tl.where(anc, g[None, :], 0.0), 1)                         # Γ_t = Σ_{s ⪯ t} g_s
    E = tl.where(anc, tl.exp(tl.where(anc, gam[:, None] - gam[None, :], 0.0)), 0.0)
    A = tl.where(strict, beta[:, None] * E * tl.dot(K, tl.trans(K), input_precision=PREC), 0.0)
    eye = tl.where(rn[:, None] == rn[None, :], 1.0, 0.0)
    T = eye                                                                 # T = (I + A)⁻¹ = Π (I + (−A)^{2^i})
    P = -A
    for _ in tl.static_range(NSQ):
        T = T + tl.dot(T, P, input_precision=PREC)
        P = tl.dot(P, P, input_precision=PREC)
    eg = tl.exp(gam)[:, None]
    rhs = beta[:, None] * (V - eg * tl.dot(K, S0, input_precision=PREC))    # β (V − e^Γ K S0)
    D = tl.dot(T, rhs, input_precision=PREC)                                # Δ
    QK = tl.dot(Q, tl.trans(K), input_precision=PREC) * E
    O = eg * tl.dot(Q, S0, input_precision=PREC) + tl.dot(QK, D, input_precision=PREC)
    tl.store(o_ptr + rn[:, None] * so_n + h * so_h + rv[None, :], O, mask=mn[:, None] & mv[None, :])


# --- torch wrappers ---------------------------------------------------------------------------------

def _check(q, k, v, g, beta, state, plan):
    """-> (state [HV, dk, dv] fp32 contiguous, N, HK, HV, dk, dv)."""
    state = state[0] if state.dim() == 4 else state
    if state.dim() != 3 or state.dtype != torch.float32:
        raise GDNInputError(f"state must be fp32 [HV, dk, dv] or [1, HV, dk, dv], found {state.dtype} "
                            f"{list(state.shape)}")
    HV, dk, dv = state.shape
    N, HK = q.shape[0], q.shape[1]
    want = {"q": (q, (N, HK, dk)), "k": (k, (N, HK, dk)), "v": (v, (N, HV, dv)), "g": (g, (N, HV)),
            "beta": (beta, (N, HV))}
    for name, (t, shape) in want.items():
        if tuple(t.shape) != shape or t.device != state.device or not t.is_floating_point():
            raise GDNInputError(f"{name}: expected float {list(shape)} on {state.device}, found {t.dtype} "
                                f"{list(t.shape)} on {t.device}")
        if t.stride(-1) != 1:
            raise GDNInputError(f"{name}: the last dimension must be contiguous")
    if HV % HK or N != len(plan) or plan.device != state.device:
        raise GDNInputError(f"HV = {HV} must be a multiple of HK = {HK}, and the tree must have N = {N} nodes "
                            f"on {state.device} (it has {len(plan)} on {plan.device})")
    return state.contiguous(), N, HK, HV, dk, dv


def _strides(q, k, v, g, beta, o):
    return (q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), g.stride(0),
            beta.stride(0), o.stride(0), o.stride(1))


def _rows_launch(q, k, v, g, beta, state, plan, schedule, final_row=None, bv=None, num_warps=None):
    S0, N, HK, HV, dk, dv = _check(q, k, v, g, beta, state, plan)
    if schedule not in plan.schedules:
        raise GDNInputError(f"schedule must be one of {sorted(plan.schedules)}, found {schedule!r}")
    rows, lens, first = plan.schedules[schedule]
    o = torch.zeros(N, HV, dv, dtype=torch.float32, device=S0.device)
    sf = torch.empty_like(S0) if final_row is not None else o
    BK = max(16, triton.next_power_of_2(dk))
    BV = bv or min(32 if not INTERPRET else 64, max(16, triton.next_power_of_2(dv)))
    grid = (rows.shape[0], HV, triton.cdiv(dv, BV))
    _gdn_rows_kernel[grid](q, k, v, g, beta, S0, rows, lens, first, o, sf, *_strides(q, k, v, g, beta, o),
                           dk, dv, rows.shape[1], -1 if final_row is None else final_row, float(dk) ** 0.5,
                           G=HV // HK, BK=BK, BV=BV, L2NORM=True, STORE_FINAL=final_row is not None,
                           num_warps=num_warps or 4)
    return o, (sf if final_row is not None else None)


def _wy_launch(q, k, v, g, beta, state, plan, precision="ieee", bv=None, num_warps=None):
    S0, N, HK, HV, dk, dv = _check(q, k, v, g, beta, state, plan)
    if N > MAX_WY_NODES:
        raise GDNInputError(f"the WY kernel takes at most {MAX_WY_NODES} nodes, found {N}")
    if precision not in ("ieee", "tf32", "tf32x3"):
        raise GDNInputError(f"precision must be 'ieee', 'tf32' or 'tf32x3', found {precision!r}")
    o = torch.zeros(N, HV, dv, dtype=torch.float32, device=S0.device)
    BK = max(16, triton.next_power_of_2(dk))
    BV = bv or min(32 if not INTERPRET else 64, max(16, triton.next_power_of_2(dv)))
    nsq = (plan.max_len - 1).bit_length()                                   # 2^nsq ≥ longest path
    grid = (HV, triton.cdiv(dv, BV))
    _gdn_tree_wy_kernel[grid](q, k, v, g, beta, S0, plan.anc, o, *_strides(q, k, v, g, beta, o), N, dk, dv,
                              float(dk) ** 0.5, G=HV // HK, BN=plan.block_nodes, BK=BK, BV=BV, NSQ=nsq,
                              L2NORM=True, PREC=precision, num_warps=num_warps or 4)
    return o


def expand_key_heads(q: torch.Tensor, k: torch.Tensor, num_v_heads: int):
    """q, k [N, HK, dk] -> [N, HV, dk] by `repeat_interleave(HV // HK, dim=1)`: value head h reads key head
    h // G, as Transformers' Qwen3-Next and the kernels do. Transformers' rule groups heads itself only from
    5.19 on (before, the module expands q/k before calling it), so the references expand them here."""
    G = num_v_heads // q.shape[1]
    return (q, k) if G == 1 else (q.repeat_interleave(G, dim=1), k.repeat_interleave(G, dim=1))


def tree_outputs_torch(q, k, v, g, beta, state, plan: TreePlan) -> torch.Tensor:
    """Reference / CPU fallback: all root paths walked as one batch with Transformers'
    `torch_recurrent_gated_delta_rule`, one token per step (specdec/gdn_tree.py `verify_gdn_paths` without
    the conv). Returns o [N, HV, dv] fp32 (the recurrence's fp32 value, before its cast to q.dtype)."""
    from transformers.models.qwen3_next.modeling_qwen3_next import torch_recurrent_gated_delta_rule as rule

    S0, N, HK, HV, dk, dv = _check(q, k, v, g, beta, state, plan)
    paths = plan.paths
    rec = S0.expand(len(paths), -1, -1, -1).clone()
    o = torch.empty(N, HV, dv, dtype=torch.float32, device=S0.device)
    done = torch.zeros(N, dtype=torch.bool, device=S0.device)
    f = lambda x: x.float()                       # noqa: E731 -- the rule casts its output to q's dtype
    q, k = expand_key_heads(q, k, HV)
    for t in range(plan.max_len):
        a = sum(len(p) > t for p in paths)
        nodes = torch.tensor([p[t] for p in paths[:a]], device=S0.device)
        out, rec_a = rule(f(q[nodes])[:, None], f(k[nodes])[:, None], f(v[nodes])[:, None], g=g[nodes][:, None],
                          beta=beta[nodes][:, None], initial_state=rec[:a], output_final_state=True,
                          use_qk_l2norm_in_kernel=True)
        rec[:a] = rec_a
        new = ~done[nodes]
        o[nodes[new]] = out[:, 0][new]
        done[nodes] = True
    return o


def _chain_torch(q, k, v, g, beta, state):
    """Transformers' recurrence over the whole chain in one call (the stock sequential computation)."""
    from transformers.models.qwen3_next.modeling_qwen3_next import torch_recurrent_gated_delta_rule as rule

    S0 = state if state.dim() == 4 else state[None]
    q, k = expand_key_heads(q, k, v.shape[1])
    o, sf = rule(q[None].float(), k[None].float(), v[None].float(), g=g[None], beta=beta[None], initial_state=S0,
                 output_final_state=True, use_qk_l2norm_in_kernel=True)
    return o[0], sf[0]


def use_triton(x: torch.Tensor) -> bool:
    """Kernels for CUDA tensors, and for CPU tensors under the interpreter."""
    return x.is_cuda or INTERPRET


def tree_outputs(q, k, v, g, beta, state, tree, method: str = "path", **launch) -> torch.Tensor:
    """Core output o [N, HV, dv] fp32 of every tree node (see the module docstring for the contract).
    `tree`: a TreePlan or a parent array. method: "path" / "node" (recurrent kernel, schedule), "wy"
    (`precision=` "ieee" / "tf32" / "tf32x3"), or "torch" (the reference). Launch options: bv, num_warps."""
    plan = tree if isinstance(tree, TreePlan) else plan_tree(tree, state.device)
    if method == "torch" or not use_triton(state):
        return tree_outputs_torch(q, k, v, g, beta, state, plan)
    # Triton launches on the current device: make the state's GPU current (a model split over GPUs).
    if method == "wy":
        return on_input_gpu(lambda s: _wy_launch(q, k, v, g, beta, s, plan, **launch), state)
    return on_input_gpu(lambda s: _rows_launch(q, k, v, g, beta, s, plan, method, **launch)[0], state)


def chain_outputs(q, k, v, g, beta, state, **launch) -> tuple[torch.Tensor, torch.Tensor]:
    """A chain of N tokens (the stock sequential recurrence, e.g. the commit replay of an accepted path):
    (o [N, HV, dv] fp32, final state [HV, dk, dv] fp32), by the recurrent kernel with one row."""
    plan = plan_tree([-1] + list(range(q.shape[0] - 1)), state.device)
    if not use_triton(state):
        return _chain_torch(q, k, v, g, beta, state)
    return on_input_gpu(lambda s: _rows_launch(q, k, v, g, beta, s, plan, "path", final_row=0, **launch), state)
