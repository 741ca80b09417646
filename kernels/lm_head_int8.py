"""Certified INT8 LM head: the argmax of the exact BF16 head, reading an INT8 copy plus a few exact rows.

    head = CertifiedHead.from_weight(lm_head.weight)        # bf16 [V, K]; or .from_w12(W12Matrix)
    ids, info = head.argmax(x)                              # x: bf16 [M, K] (final hidden states)
    assert torch.equal(ids, F.linear(x, w).argmax(-1))      # the theorem below; info.counts = survivors

Contract
--------
* Weight W: bf16 [V, K], finite, no bias, K ≤ 2^20.  x: bf16 [M, K] (the exact head is `F.linear(x, W)`,
  bf16 in, fp32 accumulation, RNE to bf16 out -- what `nn.Linear` does on cuBLAS and on the CPU).
* Stored per row v: q_v int8 [K], s_v fp32 (= max|w_v| / 127), D_v fp32 (radius per unit ‖x‖₂, below),
  E_v fp32 (‖w_v − ŵ_v‖₂, for reports).  About K + 12 bytes per row instead of 2K.
* `argmax` returns the index torch.argmax(F.linear(x, W), -1) returns (first index among equal maxima)
  plus a `Survivors` record: candidate indices, their exact logits, counts, and per-row flags.

The maths (u_acc: unit roundoff of an fp32 accumulation step, default 2^-23, which covers IEEE RNE
(2^-24) and round-toward-zero accumulators; γ_n = n·u_acc / (1 − n·u_acc))
--------------------------------------------------------------------------------------------------
Let ŵ_v = s_v·q_v (real product), z_v = the exact head's fp32 accumulator for row v, F_v = rne_bf16(z_v)
its output, and A_v the INT8 pass's fp32 value fl(s_v · Σ_i q_vi x_i).
1. Exact head, any summation order: products of two bf16 are exact in fp32, so (Higham, Thm 3.1)
       |z_v − w_v·x| ≤ γ_K Σ|w_vi x_i| ≤ γ_K ‖w_v‖₂ ‖x‖₂.
2. INT8 pass: q (≤ 7 bits) × bf16 (8 bits) products are exact in fp32 (and in bf16 tensor cores), so
       |A_v − ŵ_v·x| ≤ γ_K s_v Σ|q_vi x_i| + u_acc |s_v T_v| ≤ γ_{K+1} ‖ŵ_v‖₂ ‖x‖₂,
   and by Cauchy–Schwarz |ŵ_v·x − w_v·x| ≤ ‖w_v − ŵ_v‖₂ ‖x‖₂.  x is never rounded (no activation quant).
3. Together |z_v − A_v| ≤ ‖x‖₂ · D_v with  D_v = ‖w_v − ŵ_v‖₂ + γ_{K+1}‖ŵ_v‖₂ + γ_K‖w_v‖₂,
   computed once in fp64, × (1 + 2^-30), rounded UP to fp32.  ‖x‖₂ (N_x) likewise in fp64, rounded up.
4. Runtime, in fp32: P_v = (N_x·D_v)·(1 + 2^-16) + 2^-20·|A_v| + 2^-96,  U_v = A_v + P_v,  L_v = A_v − P_v.
   Each of the ≤ 7 fp32 operations errs by ≤ 2^-24 relative; the (1 + 2^-16) and 2^-20|A_v| pads exceed
   their total, so the computed U_v ≥ A_v + N_x D_v ≥ z_v and L_v ≤ z_v.  The 2^-96 covers every
   underflow / flush-to-zero (≤ K·2^-119 for K ≤ 2^20) in both heads.
5. The output rounding costs nothing: rne_bf16 is monotone, so F_v = rne(z_v) ∈ [rne(L_v), rne(U_v)].
   Let best = max_j rne(L_j).  Candidates C = {v : rne(U_v) ≥ best}.  For v ∉ C:
       F_v ≤ rne(U_v) < best = rne(L_j*) ≤ F_j*,
   so v is strictly below some logit -- not a maximum, not even a tie.  Hence the set of maxima of F lies
   in C and the first-index argmax over C (rescored exactly, in ascending index order) is the first-index
   argmax over all of F.  (Exact head with fp32 output: the same with rne = identity.)
6. Rescoring reproduces F_c only if it computes z_c in the same order as the full head.  We rescore with
   the same op (`F.linear`, bf16) on the gathered rows; on the CPU this gives the same bits as the full
   head (tested), but a GEMM's summation order may depend on its shape (cuBLAS split-K, gemv vs gemm).
   So every row is also checked: with Δ_c = 2γ_K ‖w_c‖ N_x (two orders) and 2^-7|F_c| (two bf16
   roundings), the winner a is *order-independent* iff F_a − Δ_a − 2^-7|F_a| > F_c + Δ_c + 2^-7|F_c| for
   every other candidate c.  Rows failing that are `ambiguous`; `strict=True` answers them from the full
   exact head (same bits as the unwrapped model), otherwise the rescored answer is returned and flagged.
Non-finite bounds (overflow, inf/NaN in x) and rows with more than `cap` candidates fall back to the full
exact head too (`info.fallback`).  `shrink` < 1 scales the radius down: for tests that show the
certificate is load-bearing, never for use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

U_ACC = 2.0 ** -23   # default accumulation unit roundoff (RNE 2^-24 and truncating accumulators)
ABS_PAD = 2.0 ** -96  # absolute pad: underflow / flush-to-zero in both heads (K ≤ 2^20)
REL_PAD = 2.0 ** -20  # pad relative to |A_v| for the fp32 evaluation of the bounds
MUL_PAD = 1.0 + 2.0 ** -16
MAX_K = 1 << 20


def gamma(n: int, u: float = U_ACC) -> float:
    """γ_n = n·u / (1 − n·u), Higham's constant for an n-term fp sum (requires n·u < 1)."""
    if n * u >= 0.5:
        raise ValueError(f"γ_{n} with u = {u:g}: n·u = {n * u:g} is too large for a useful bound")
    return n * u / (1.0 - n * u)


def round_up_f32(t64: torch.Tensor) -> torch.Tensor:
    """fp64 → the smallest fp32 ≥ it (values here are ≥ 0)."""
    t = t64.float()
    return torch.where(t.double() < t64, torch.nextafter(t, torch.full_like(t, math.inf)), t)


def x_norm(x: torch.Tensor) -> torch.Tensor:
    """N_x: ‖x‖₂ per row, an fp32 upper bound (fp64 sum of exact squares, × (1 + 2^-30), rounded up)."""
    return round_up_f32(x.double().norm(dim=-1) * (1.0 + 2.0 ** -30))


@dataclass
class Survivors:
    """What `argmax` found, per row m of x (S = max count in the batch; padding index -1, logit -inf)."""
    index: torch.Tensor      # i64 [M, S] candidate token ids, ascending
    logits: torch.Tensor     # [M, S] their exact logits (head dtype), -inf on padding
    counts: torch.Tensor     # i64 [M] candidates per row
    ambiguous: torch.Tensor  # bool [M] winner could depend on the exact head's summation order (step 6)
    fallback: torch.Tensor   # bool [M] answered by the full exact head (non-finite bounds, cap, strict)


@dataclass(eq=False)
class CertifiedHead:
    q: torch.Tensor        # i8 [V, K]
    scale: torch.Tensor    # f32 [V]
    radius: torch.Tensor   # f32 [V]  D_v (step 3), rounded up
    err: torch.Tensor      # f32 [V]  ‖w_v − ŵ_v‖₂, rounded up
    wnorm: torch.Tensor    # f32 [V]  ‖w_v‖₂, rounded up (ambiguity test, step 6)
    weight: torch.Tensor   # bf16 [V, K] the exact weights (shared, not copied)
    u_acc: float = U_ACC

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def from_weight(cls, w: torch.Tensor, u_acc: float = U_ACC, chunk_rows: int = 8192) -> "CertifiedHead":
        """Per-row symmetric INT8: s_v = max|w_v| / 127 (fp32), q_v = round(w_v / s_v) clamped to ±127."""
        if not isinstance(w, torch.Tensor) or w.dtype != torch.bfloat16 or w.dim() != 2:
            raise ValueError(f"expected a 2-D bf16 weight, found {getattr(w, 'dtype', type(w))} "
                             f"{tuple(getattr(w, 'shape', ()))}")
        v, k = w.shape
        if k > MAX_K:
            raise ValueError(f"K = {k} > {MAX_K}: the absolute pad of the bound assumes K ≤ 2^20")
        if not torch.isfinite(w).all():
            raise ValueError("the LM head has inf/NaN weights; no bound is possible")
        g_k, g_k1 = gamma(k, u_acc), gamma(k + 1, u_acc)
        qs, ss, ds, es, ns = [], [], [], [], []
        for r0 in range(0, v, chunk_rows):
            wd = w[r0:r0 + chunk_rows].double()
            s = (wd.abs().amax(1) / 127).float()
            sd = s.double()[:, None]
            q = torch.where(sd > 0, torch.round(wd / torch.where(sd > 0, sd, 1.0)), 0.0).clamp(-127, 127)
            up = 1.0 + 2.0 ** -30  # fp64 sums of K ≤ 2^20 squares err by < K·2^-53 relative
            e = (wd - sd * q).norm(dim=1) * up
            wn = wd.norm(dim=1) * up
            qn = sd[:, 0] * q.norm(dim=1) * up
            qs.append(q.to(torch.int8))
            ss.append(s)
            ds.append(round_up_f32((e + g_k1 * qn + g_k * wn) * up))
            es.append(round_up_f32(e))
            ns.append(round_up_f32(wn))
        return cls(torch.cat(qs), torch.cat(ss), torch.cat(ds), torch.cat(es), torch.cat(ns), w, u_acc)

    @classmethod
    def from_w12(cls, matrix, u_acc: float = U_ACC) -> "CertifiedHead":
        """From a W12Matrix (w12.formats.matrix): decoded losslessly, then as from_weight."""
        return cls.from_weight(matrix.to_bf16(), u_acc)

    def to(self, device) -> "CertifiedHead":
        return CertifiedHead(*(t.to(device) for t in (self.q, self.scale, self.radius, self.err, self.wnorm,
                                                     self.weight)), self.u_acc)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape)

    # ---- step 2-5: the INT8 pass and the candidates (torch reference) ----------------------------
    def bounds(self, x: torch.Tensor, shrink: float = 1.0):
        """(A fp32, U, L) [M, V]: the INT8 scores and rne_bf16 of the upper / lower bounds (step 4-5),
        U and L in the head's dtype (bf16 comparisons are exact)."""
        a = (x.float() @ self.q.float().T).mul_(self.scale)      # fp32 accumulation, exact products
        p = a.abs().mul_(REL_PAD).add_(ABS_PAD)
        p.addcmul_(x_norm(x)[:, None], self.radius * (MUL_PAD * shrink))
        return a, (a + p).to(self.weight.dtype), (a - p).to(self.weight.dtype)

    def candidates(self, x: torch.Tensor, shrink: float = 1.0):
        """(mask bool [M, V], finite bool [M]): C = {v : rne(U_v) ≥ max_j rne(L_j)} per row."""
        _, up, lo = self.bounds(x, shrink)
        best = lo.amax(1, keepdim=True)
        finite = torch.isfinite(up.amax(1)) & torch.isfinite(lo.amin(1))  # amax/amin propagate NaN
        return up >= best, finite

    # ---- step 5-6: exact rescoring ---------------------------------------------------------------
    def rescore(self, x: torch.Tensor, index: torch.Tensor, counts: torch.Tensor, finite: torch.Tensor,
                cap: int | None = None, strict: bool = False):
        """index i64 [M, S] (ascending, -1 padded) → (ids, Survivors); shared by both backends."""
        m = x.shape[0]
        valid = index >= 0
        fallback = ~finite | (counts > cap if cap is not None else torch.zeros_like(finite))
        logits = torch.full(index.shape, -math.inf, dtype=self.weight.dtype, device=x.device)
        live = (~fallback).nonzero()[:, 0]
        for r0 in range(0, live.numel(), 1024):  # batched: x_r · W[idx_r]ᵀ, the same bf16 GEMM per row
            rows = live[r0:r0 + 1024]
            s = max(int(counts[rows].clamp(max=index.shape[1]).max()), 1)
            idx = index[rows, :s]
            out = torch.bmm(x[rows, None, :], self.weight[idx.clamp(min=0)].transpose(1, 2))[:, 0]
            logits[rows, :s] = torch.where(idx >= 0, out, -math.inf)
        pos = logits.argmax(1)  # first maximum = lowest token id (index is ascending)
        ids = index.gather(1, pos[:, None])[:, 0]
        fallback = fallback | (counts == 0)
        ambiguous = self._ambiguous(x, index, logits, valid, pos) & ~fallback
        if strict:
            fallback = fallback | ambiguous
        if fallback.any():
            full = F.linear(x, self.weight)  # the whole batch, exactly as the unwrapped model calls it
            ids = torch.where(fallback, full.argmax(1), ids)
        return ids, Survivors(index, logits, counts, ambiguous, fallback)

    def _ambiguous(self, x, index, logits, valid, pos):
        """Step 6: could another summation order of the exact head change the winner?"""
        lf = logits.float()
        delta = 2 * gamma(self.shape[1], self.u_acc) * x_norm(x)[:, None] * self.wnorm[index.clamp(min=0)]
        slack = torch.where(valid, delta + 2.0 ** -7 * (1 + 2.0 ** -6) * lf.abs() + ABS_PAD, 0.0)
        win_lo = (lf - slack).gather(1, pos[:, None])
        others_hi = torch.where(valid, lf + slack, -math.inf).scatter(1, pos[:, None], -math.inf)
        return (others_hi >= win_lo).any(1)

    # ---- the public entry points -----------------------------------------------------------------
    def argmax(self, x: torch.Tensor, backend: str = "torch", strict: bool = False, cap: int = 1024,
               shrink: float = 1.0):
        """ids i64 [M] = torch.argmax(F.linear(x, W), -1), and the Survivors record."""
        x = self._check_x(x)
        if backend == "triton":
            from . import lm_head_int8_triton as kt
            index, counts, finite = kt.candidates(self, x, cap=cap, shrink=shrink)
        elif backend == "torch":
            mask, finite = self.candidates(x, shrink)
            counts = mask.sum(1)
            rows, cols = mask.nonzero(as_tuple=True)  # row-major: ids ascending within a row
            col = torch.arange(rows.numel(), device=x.device) - (counts.cumsum(0) - counts)[rows]
            keep = col < cap
            index = torch.full((x.shape[0], max(int(counts.clamp(max=cap).max()), 1)), -1, dtype=torch.long,
                               device=x.device)
            index[rows[keep], col[keep]] = cols[keep]
        else:
            raise ValueError(f"unknown backend {backend!r}: expected 'torch' or 'triton'")
        return self.rescore(x, index, counts, finite, cap=cap, strict=strict)

    def check(self, x: torch.Tensor, shrink: float = 1.0) -> dict:
        """Audit against the full exact head: is every exact logit inside its certified interval?
        Returns violations (logits outside [rne(L), rne(U)]), rows whose exact argmax is not a candidate,
        and the worst |F − A| / (U − A) ratio (≤ 1 when the bound holds)."""
        x = self._check_x(x)
        f = F.linear(x, self.weight).float()
        a, up, lo = self.bounds(x, shrink)
        up, lo = up.float(), lo.float()
        mask = up >= lo.amax(1, keepdim=True)
        outside = (f > up) | (f < lo)
        missed = ~mask.gather(1, f.argmax(1, keepdim=True))[:, 0]
        p = x_norm(x)[:, None] * self.radius * shrink  # the radius before the rounding pads
        ratio = ((f - a).abs() / p.clamp(min=torch.finfo(torch.float32).tiny)).amax()
        return {"violations": int(outside.sum()), "rows_missed": int(missed.sum()), "max_ratio": float(ratio)}

    def _check_x(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2 or x.shape[1] != self.shape[1] or x.dtype != self.weight.dtype:
            raise ValueError(f"expected x of shape [M, {self.shape[1]}] and dtype {self.weight.dtype}, "
                             f"found {tuple(x.shape)} {x.dtype}")
        return x.contiguous()


class CertifiedLMHead(nn.Module):
    """An `nn.Linear` LM head (no bias) with a certified `.argmax(hidden)` for greedy decoding.

    `forward` is the unchanged exact head (full logits: sampling, output_scores, loss, ...).  The INT8
    copy is built lazily on first `.argmax` and rebuilt by `refresh()` if the weights change.  The linear
    stays a submodule, so a tied embedding stays tied.
    """

    def __init__(self, linear: nn.Linear, backend: str = "auto", strict: bool = False, cap: int = 1024,
                 u_acc: float = U_ACC):
        super().__init__()
        if linear.bias is not None:
            raise ValueError("CertifiedLMHead supports LM heads without bias only")
        if linear.weight.dtype != torch.bfloat16:
            raise ValueError(f"CertifiedLMHead needs a bf16 LM head, found {linear.weight.dtype}")
        self.linear, self.backend, self.strict, self.cap, self.u_acc = linear, backend, strict, cap, u_acc
        self._head: CertifiedHead | None = None
        self.last: Survivors | None = None

    @property
    def weight(self):
        return self.linear.weight

    def refresh(self) -> None:
        self._head = CertifiedHead.from_weight(self.linear.weight.detach(), self.u_acc)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.linear(hidden)

    @torch.no_grad()
    def argmax(self, hidden: torch.Tensor) -> torch.Tensor:
        """Token ids [...] = self(hidden).argmax(-1), without reading the whole BF16 head."""
        if self._head is None or self._head.weight.data_ptr() != self.linear.weight.data_ptr():
            self.refresh()
        backend = self.backend
        if backend == "auto":
            backend = "triton" if hidden.is_cuda else "torch"
        x = hidden.reshape(-1, hidden.shape[-1])
        ids, self.last = self._head.argmax(x, backend=backend, strict=self.strict, cap=self.cap)
        return ids.reshape(hidden.shape[:-1])
