"""Triton INT8 pass and candidate selection of the certified LM head (maths: lm_head_int8.py).

Contract
--------
* q i8 [V, K] row-major, scale f32 [V], radius f32 [V] (D_v), x bf16 [M, K], xnorm f32 [M] (N_x, rounded up).
* Output of `candidates`: index i64 [M, S] (ascending token ids, -1 padded, S ≤ cap), counts i64 [M]
  (the full count, may exceed cap), finite bool [M] (false: a bound overflowed → full-head fallback).
  The exact rescoring of the survivors is torch (`CertifiedHead.rescore`).

Two launches
------------
1. `_int8_bounds_kernel`, grid (cdiv(V, BV), cdiv(M, BM)): one program = BV vocabulary rows × BM tokens.
       acc[BV, BM] = Σ_k q[v, k] · x[m, k]      int8 → bf16 (exact) tl.dot, fp32 accumulate (UPCAST: fp32)
       A = acc · s_v;  P = (N_x · D_v)(1 + 2^-16)·shrink + 2^-20|A| + 2^-96
       U = rne_bf16(A + P), L = rne_bf16(A − P)           (integer RNE: bit-exact, also in the interpreter)
   stores U f32 [M, V], the block maximum of L f32 [M, NP] and a non-finite flag i32 [M, NP].
2. `_select_kernel`, grid (M, cdiv(V, BS)): best = max of the NP block maxima (a fixed order: the same
   value on every run); flags = U ≥ best; one atomic per program reserves room in the row's list and
   tl.cumsum places the ids (the list order depends on arrival; the wrapper sorts it).
Bytes (V = 128256, K = 4096, M ≤ 32): 525 MB of int8 + 1.5 MB of scales/radii; U costs 4·M·V bytes
written and read again (16 MB at M = 32, 3%) -- fusing the selection would need a grid-wide barrier.
UPCAST (interpreter, set from TRITON_INTERPRET): fp32 operands with an ieee fp32 dot, because the
interpreter gets bf16 arithmetic wrong; on the GPU the int8 → bf16 operand feeds the tensor cores.
"""

import os

import torch
import triton
import triton.language as tl

from . import lm_head_int8 as _ref
from .lm_head_int8 import CertifiedHead, x_norm

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
# the padding constants of the bound (kernels/lm_head_int8.py), as constexpr globals a @triton.jit body may read
MUL_PAD = tl.constexpr(_ref.MUL_PAD)
REL_PAD = tl.constexpr(_ref.REL_PAD)
ABS_PAD = tl.constexpr(_ref.ABS_PAD)


@triton.jit
def _rne_bf16(t):
    """fp32 → nearest bf16 (ties to even), as fp32.  Integer trick: bit-exact on GPU and interpreter;
    inf stays inf, NaN may become inf (callers flag non-finite inputs separately)."""
    u = t.to(tl.uint32, bitcast=True)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return r.to(tl.float32, bitcast=True)


@triton.jit
def _int8_bounds_kernel(
    # inputs
    q_ptr, scale_ptr, radius_ptr, x_ptr, xnorm_ptr,
    # outputs
    up_ptr, lmax_ptr, bad_ptr,
    # sizes and strides
    M, V, K, NP, stride_q, stride_x, shrink,
    # meta
    BV: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, UPCAST: tl.constexpr, OUT_BF16: tl.constexpr,
):
    pid_v = tl.program_id(0)
    pid_m = tl.program_id(1)
    rv = pid_v * BV + tl.arange(0, BV)
    rm = pid_m * BM + tl.arange(0, BM)
    rk = tl.arange(0, BK)
    mv = rv < V
    mm = rm < M

    # ---- INT8 pass: acc[BV, BM] = q · xᵀ, fp32 accumulation, exact products ----------------------
    acc = tl.zeros((BV, BM), dtype=tl.float32)
    for k0 in range(0, K, BK):
        mk = (k0 + rk) < K
        q = tl.load(q_ptr + rv[:, None] * stride_q + (k0 + rk)[None, :], mask=mv[:, None] & mk[None, :], other=0)
        xt = tl.load(x_ptr + rm[None, :] * stride_x + (k0 + rk)[:, None], mask=mm[None, :] & mk[:, None], other=0)
        if UPCAST:
            acc = tl.dot(q.to(tl.float32), xt.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(q.to(tl.bfloat16), xt, acc)

    # ---- bounds: U, L (steps 4-5 of lm_head_int8.py) ---------------------------------------------
    s = tl.load(scale_ptr + rv, mask=mv, other=0.0)
    d = tl.load(radius_ptr + rv, mask=mv, other=0.0)
    nx = tl.load(xnorm_ptr + rm, mask=mm, other=0.0)
    a = acc * s[:, None]
    p = (d[:, None] * nx[None, :]) * (MUL_PAD * shrink) + REL_PAD * tl.abs(a) + ABS_PAD
    up = a + p
    lo = a - p
    bad = (up != up) | (lo != lo) | (tl.abs(up) == float("inf")) | (tl.abs(lo) == float("inf"))
    if OUT_BF16:
        up = _rne_bf16(up)
        lo = _rne_bf16(lo)
    valid = mv[:, None] & mm[None, :]
    tl.store(up_ptr + rm[None, :] * V + rv[:, None], up, mask=valid)

    # ---- per-block maximum of the lower bounds, non-finite flag ----------------------------------
    lmax = tl.max(tl.where(valid, lo, -float("inf")), axis=0)
    nbad = tl.max(tl.where(valid & bad, 1, 0), axis=0)
    tl.store(lmax_ptr + rm * NP + pid_v, lmax, mask=mm)
    tl.store(bad_ptr + rm * NP + pid_v, nbad, mask=mm)


@triton.jit
def _select_kernel(up_ptr, lmax_ptr, idx_ptr, cnt_ptr, V, NP, CAP,
                   BS: tl.constexpr, BP: tl.constexpr):
    m = tl.program_id(0)
    pid = tl.program_id(1)
    rp = tl.arange(0, BP)
    best = tl.max(tl.load(lmax_ptr + m * NP + rp, mask=rp < NP, other=-float("inf")), axis=0)
    rv = pid * BS + tl.arange(0, BS)
    mv = rv < V
    u = tl.load(up_ptr + m * V + rv, mask=mv, other=-float("inf"))
    flags = ((u >= best) & mv).to(tl.int32)
    n = tl.sum(flags, axis=0)
    base = tl.atomic_add(cnt_ptr + m, n)
    pos = base + tl.cumsum(flags, axis=0) - 1
    tl.store(idx_ptr + m * CAP + pos, rv, mask=(flags > 0) & (pos < CAP))


def default_blocks(m: int, k: int) -> dict:
    if INTERPRET:  # few, big programs: the interpreter pays per operation, not per element
        return dict(BV=256, BM=16, BK=min(triton.next_power_of_2(k), 1024), BS=4096, num_warps=4)
    return dict(BV=64, BM=16 if m <= 16 else 32, BK=256, BS=1024, num_warps=4)


def candidates(head: CertifiedHead, x: torch.Tensor, cap: int = 1024, shrink: float = 1.0, **blocks):
    """check → allocate → launch both kernels → (index i64 [M, S] ascending, counts i64 [M], finite bool [M])."""
    v, k = head.shape
    m = x.shape[0]
    if x.shape[1] != k or x.dtype != torch.bfloat16 or x.stride(1) != 1 or head.q.stride(1) != 1:
        raise ValueError(f"expected bf16 x [M, {k}] with unit column stride, found {x.dtype} {tuple(x.shape)}")
    cfg = {**default_blocks(m, k), **blocks}
    bv, bm, bk, bs, nw = cfg["BV"], cfg["BM"], cfg["BK"], cfg["BS"], cfg["num_warps"]
    np_ = triton.cdiv(v, bv)
    dev = x.device
    xn = x_norm(x).to(dev)
    up = torch.empty(m, v, dtype=torch.float32, device=dev)
    lmax = torch.empty(m, np_, dtype=torch.float32, device=dev)
    bad = torch.empty(m, np_, dtype=torch.int32, device=dev)
    _int8_bounds_kernel[(np_, triton.cdiv(m, bm))](
        head.q, head.scale, head.radius, x, xn, up, lmax, bad,
        m, v, k, np_, head.q.stride(0), x.stride(0), float(shrink),
        BV=bv, BM=bm, BK=bk, UPCAST=INTERPRET, OUT_BF16=head.weight.dtype == torch.bfloat16, num_warps=nw)
    idx = torch.full((m, cap), v, dtype=torch.int32, device=dev)
    cnt = torch.zeros(m, dtype=torch.int32, device=dev)
    _select_kernel[(m, triton.cdiv(v, bs))](up, lmax, idx, cnt, v, np_, cap,
                                            BS=bs, BP=triton.next_power_of_2(np_), num_warps=nw)
    counts = cnt.long()
    s = max(int(counts.clamp(max=cap).max()), 1)
    index = idx.sort(dim=1).values[:, :s].long()
    index = torch.where(index < v, index, -1)
    return index, counts, bad.amax(1) == 0
