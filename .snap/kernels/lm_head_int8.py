"""Certified INT8 LM head: the argmax of the exact BF16 head, reading an INT8 copy plus a few exact rows.

    head = CertifiedHead.from_weight(lm_head.weight)        # bf16 [V, K]; or .from_w12(W12Matrix)
    ids, info = head.argmax(x)                              # x: bf16 [M, K] (final hidden states)
    assert torch.equal(ids, F.linear(x, w).argmax(-1))      # the theorem below; info.counts = survivors
    ids, info = head.to("cuda").argmax(x, backend="cuda")   # Hopper kernels (lm_head_int8.cu), no host sync
    install_certified_lm_head(model)                        # Transformers: greedy `generate` uses it

Contract
--------
* Weight W: bf16 [V, K], finite, no bias, K ≤ 2^20.  x: bf16 [M, K] (the exact head is `F.linear(x, W)`,
  bf16 in, fp32 accumulation, RNE to bf16 out -- what `nn.Linear` does on cuBLAS and on the CPU).
* Stored per row v: q_v int8 [K], s_v fp32 (= max|w_v| / 127), D_v fp32 (radius per unit ‖x‖₂, below),
  E_v fp32 (‖w_v − ŵ_v‖₂, for reports).  About K + 12 bytes per row instead of 2K.
* `argmax` returns the index torch.argmax(F.linear(x, W), -1) returns (first index among equal maxima)
  plus a `Survivors` record: candidate indices, their exact logits, counts, and per-row flags.  On the
  CPU that is exact; on CUDA "the exact head" is the fixed-order kernel of step 6.

The maths (u_acc: unit roundoff of one fp32 accumulation step, default 2^-22 -- see "Accumulation model";
γ_n = n·u_acc / (1 − n·u_acc))
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
6. Rescoring must reproduce the exact head's own summation order; the backends do it differently.
   CPU (backends "torch", "triton"): the survivors are rescored with the same op (`F.linear`, bf16) on
   the gathered rows, which on the CPU gives the full head's bits (tested): ids == argmax of F.linear.
   CUDA (backend "cuda"): cuBLAS's per-row order depends on the GEMM shape (split-K, gemv vs gemm) and
   cannot be replayed on a gathered subset.  So the CUDA path's exact head is a fixed-order kernel,
   `exact_logits(x, W)`: one warp per (row, token); lane l sums the 8-element chunks 32j + l (j, then
   the element, ascending) with fma.rn from 0, then an xor butterfly 16, 8, 4, 2, 1; F = rne_bf16(z).
   Its bits depend on (w_v, x_m) only -- not on M, on which rows are computed, nor on the launch -- and
   the rescoring runs the same sequence.  Hence
     (G1) ids == the first-index argmax of exact_logits(x, W), always;
     (G2) where `ambiguous` is False, ids == the argmax of every head of the accumulation model, cuBLAS
          `F.linear` included: another order z' of the same logit has |z' − z| ≤ 2γ_K Σ_k|w_k x_k|, so
          its bf16 value lies in [lo_c, hi_c] = [rne(z − d_c), rne(z + d_c)] (d_c rounded up and padded
          as in step 4); the winner a is order-independent iff every other candidate c has hi_c < lo_a,
          or hi_c == lo_a and c > a (a wins that tie).  Non-candidates are excluded by step 5 for every
          head of the model.
   The CPU check is coarser (the gathered F.linear yields bf16 only): Δ_c = 2γ_K ‖w_c‖ N_x, plus 2^-7|F_c|
   for the two bf16 roundings.  `strict=True` answers ambiguous (CUDA: and fallback) rows from the full
   `F.linear` (on CUDA that costs one host synchronisation per call: a strict call cannot be captured in
   a CUDA graph).
Non-finite bounds (overflow, inf/NaN in x) and rows with more than `cap` candidates fall back
(`info.fallback`): on the CPU to the full exact head; on CUDA every candidate is rescored anyway (every
row when the bounds are not finite), so ids is still the fixed-order head's argmax, but the survivor list
keeps only `cap` of them and no ambiguity is computed (G2 is not claimed for fallback rows).
`shrink` < 1 scales the radius down: for tests that show the certificate is load-bearing, never for use.

Accumulation model (what u_acc = 2^-22 covers)
----------------------------------------------
Products of two bf16 (and of int8 × bf16) are exact in fp32.  Additions in any order, each IEEE RNE
(2^-24), round-toward-zero (2^-23), or a block FMA that adds n ≥ 1 exact products to the accumulator
after aligning all to the largest exponent with truncation and no guard bits (NVIDIA tensor cores:
Fasi, Higham, Mikaitis, Pranesh, "Numerical behavior of NVIDIA tensor cores", PeerJ CS 2021).  Such a
block errs by < (n + 1)·2^-23 of its absolute sum, so a K-term dot product by
< K(1 + 1/n)·2^-23·Σ|w_k x_k| ≤ γ_K(2^-22)·Σ|w_k x_k|.  The CUDA kernels here use IEEE fp32 FMA with
denormals kept.  Outside the model: reductions of partial sums in bf16, which cuBLAS may use while
`torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction` is True (torch's default); that only
touches G2, and bench/lm_head.py measures G2 against cuBLAS as configured.

The CUDA path (kernels/lm_head_int8.cu, wrapped as the custom op torch.ops.w12.lm_head_argmax)
---------------------------------------------------------------------------------------------
One call, two kernels and no host synchronisation (CUDA-graph capturable): the INT8 pass (fp32 FMA,
128-bit streaming loads, ‖x‖₂ in fp64 on the device) fused with the bounds and per-block maxima of
rne(L); then selection (U ≥ the max of those maxima: order-independent, deterministic) fused with the
rescoring of each candidate by the fixed-order head (the winner by a packed atomicMax of (logit, −index):
first index among equal maxima, deterministic), the last block of each token computing ids, flags and
the ambiguity.  Tokens are processed
4 at a time: the INT8 copy is read once per 4 tokens, so the runtime uses the certified path for
M ≤ 4 (CUDA_MAX_TOKENS) and the plain head above.  Needs sm_90 (cuda_build.py), K % 16 == 0 and
16-byte-aligned contiguous rows; elsewhere the op runs the Triton pass + torch rescoring (host syncs).

Runtime (Transformers)
----------------------
`CertifiedLMHead` is an `nn.Linear` (the same `weight` Parameter, so ties and state-dict keys stay) whose
forward returns the full exact logits, except inside `argmax_only()`, where it returns logits that are
−inf except the exact logits of the survivors and the winner: the same argmax, first index included.
`install_certified_lm_head(model)` swaps the model's output embedding for one and wraps
`model.generate`, entering the context only when the call needs nothing but the argmax
(`argmax_is_enough`: greedy, one beam, no assistant, no scores or logits returned, no logits processor);
every other call -- sampling, output_scores/output_logits, min_new_tokens, repetition_penalty, beam
search, a plain `model(...)` -- gets the full exact logits.  `W12Config(certified_lm_head=True | "strict")`
installs it when a model loads (runtime/hf_quantizer.py).
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import functools
import inspect
import math
import types
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

U_ACC = 2.0 ** -22   # default accumulation unit roundoff: IEEE, truncating and tensor-core block FMA (above)
ABS_PAD = 2.0 ** -96  # absolute pad: underflow / flush-to-zero in both heads (K ≤ 2^20)
REL_PAD = 2.0 ** -20  # pad relative to |A_v| for the fp32 evaluation of the bounds
MUL_PAD = 1.0 + 2.0 ** -16
MAX_K = 1 << 20
CUDA_CAP = 256        # listed candidates per token on the CUDA path (more: still exact, flagged fallback)
CUDA_MAX_TOKENS = 4   # the INT8 pass reads the copy once per 4 tokens: above this the plain head is faster
# (at one token the pass gives each warp 4 rows, so one x load from shared memory serves 4 rows; the
# environment variable W12_LMH_M1 = 10·rows + steps in flight picks another shape, for measurements only)
CUDA_MAX_K = 12288    # the CUDA kernels stage 4 tokens of x in fp32 in shared memory (≤ 192 KB)


class LMHeadKernelError(RuntimeError):
    """The CUDA kernels of the certified head are unavailable or a launch failed (cudaError_t code)."""


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
    fallback: torch.Tensor   # bool [M] non-finite bounds, > cap candidates, or strict (see step 6)
    best: torch.Tensor | None = None  # [M] the exact logit of the answer (head dtype)


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
        best = logits.gather(1, pos[:, None])[:, 0]
        fallback = fallback | (counts == 0)
        ambiguous = self._ambiguous(x, index, logits, valid, pos) & ~fallback
        if strict:
            fallback = fallback | ambiguous
        if fallback.any():
            full = F.linear(x, self.weight)  # the whole batch, exactly as the unwrapped model calls it
            fids = full.argmax(1)
            ids = torch.where(fallback, fids, ids)
            best = torch.where(fallback, full.gather(1, fids[:, None])[:, 0], best)
        return ids, Survivors(index, logits, counts, ambiguous, fallback, best)

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
        """ids i64 [M] = torch.argmax(F.linear(x, W), -1), and the Survivors record.
        backend "cuda": the kernels of lm_head_int8.cu (step 6, G1/G2); Survivors then has S = cap columns
        (fallback rows: the first cap candidates found)."""
        x = self._check_x(x)
        if backend == "cuda":
            out = cuda_certified(x, self.q, self.scale, self.radius, self.weight, cap, self.u_acc, shrink)
            if strict:
                out = _strict(x, self.weight, out)
            return _survivors(*out)
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
            raise ValueError(f"unknown backend {backend!r}: expected 'torch', 'triton' or 'cuda'")
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


# =================================================================================================
# The CUDA path (kernels/lm_head_int8.cu): check → allocate → launch, no host synchronisation
# =================================================================================================
_LIB: dict = {}


def cuda_library():
    """The ctypes library of lm_head_int8.cu, or None (no Hopper GPU, no nvcc, W12_CUDA=0: cuda_build.py)."""
    if "lib" not in _LIB:
        from .cuda_build import load

        lib = load("lm_head_int8")
        if lib is not None:
            p, i, l, f = ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_float
            lib.w12_lmh_certified.argtypes = [p] * 5 + [i] * 3 + [l] * 3 + [f, f, i, p, l, p] + [p] * 7 + [i, p]
            lib.w12_lmh_certified.restype = i
            lib.w12_lmh_exact_logits.argtypes = [p, p, i, i, i, l, l, p, l, p]
            lib.w12_lmh_exact_logits.restype = i
            lib.w12_lmh_workspace_bytes.argtypes = [i, i]
            lib.w12_lmh_workspace_bytes.restype = ctypes.c_size_t
        _LIB["lib"] = lib
    return _LIB["lib"]


def cuda_supported(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Can the CUDA kernels take these operands (device, library, K % 16, aligned contiguous rows)?"""
    return (x.is_cuda and weight.is_cuda and weight.shape[1] % 16 == 0 and weight.shape[1] <= CUDA_MAX_K
            and x.is_contiguous()
            and weight.is_contiguous() and x.data_ptr() % 16 == 0 and weight.data_ptr() % 16 == 0
            and cuda_library() is not None)


def _ptr(t: torch.Tensor) -> ctypes.c_void_p:
    return ctypes.c_void_p(t.data_ptr())


@functools.lru_cache(maxsize=64)
def _f32_up(value: float) -> float:
    """The smallest fp32 ≥ value (a Python float that ctypes passes exactly)."""
    return float(round_up_f32(torch.tensor(value, dtype=torch.float64)))


@functools.lru_cache(maxsize=64)
def _amb_coef(k: int, u_acc: float) -> float:
    """d_c = coef · S_c bounds |z' − z| for any two orders (step 6): 2γ_K(u_acc) · (1 + γ_K(2^-24)) for the
    fp32 sum S_c of |w x| (non-negative terms), · (1 + 2^-16) for the fp32 product, rounded up."""
    return _f32_up(2 * gamma(k, u_acc) * (1 + gamma(k, 2.0 ** -24)) * MUL_PAD * (1 + 2.0 ** -40))


def _launch(name: str, x: torch.Tensor, *args) -> None:
    lib = cuda_library()
    if lib is None:
        raise LMHeadKernelError("the CUDA kernels of the certified head are not available here "
                                "(needs a Hopper GPU and nvcc: see w12.kernels.cuda_build)")
    with torch.cuda.device(x.device):
        stream = ctypes.c_void_p(torch.cuda.current_stream(x.device).cuda_stream)
        err = getattr(lib, name)(*args, stream)
    if err:
        raise LMHeadKernelError(f"{name} failed with cudaError_t {err}")


def cuda_certified(x, q, scale, radius, weight, cap: int = CUDA_CAP, u_acc: float = U_ACC, shrink: float = 1.0,
                   stages: int = 3, u: torch.Tensor | None = None):
    """(ids i64 [M], index i64 [M, cap] (arrival order, -1 padded), logits [M, cap] (-inf padded),
    counts i64 [M], ambiguous bool [M], fallback bool [M], best [M]).  stages=1: the INT8 pass kernel alone
    (for timing; the outputs are then not written).  u: an int16 [M, ⌈V/8⌉·8] buffer that receives the
    bits of rne(U) (audits); by default a temporary."""
    v, k = weight.shape
    m = x.shape[0]
    shapes_ok = (x.dim() == 2 and x.shape[1] == k and q.shape == (v, k) and scale.shape == radius.shape == (v,)
                 and k % 16 == 0 and k <= CUDA_MAX_K and cap > 0)
    types_ok = (x.dtype == weight.dtype == torch.bfloat16 and q.dtype == torch.int8
                and scale.dtype == radius.dtype == torch.float32)
    layout_ok = all(t.is_cuda and t.device == x.device and t.is_contiguous() and t.data_ptr() % 16 == 0
                    for t in (x, q, scale, radius, weight))
    if not (shapes_ok and types_ok and layout_ok):
        raise ValueError(f"cuda_certified: expected contiguous 16-byte-aligned CUDA tensors x bf16 [M, K], q i8 "
                         f"[V, K], scale/radius f32 [V], weight bf16 [V, K], K % 16 == 0, K ≤ {CUDA_MAX_K}; found "
                         f"x {x.dtype} {tuple(x.shape)}, q {q.dtype} {tuple(q.shape)}, weight {weight.dtype} "
                         f"{tuple(weight.shape)} on {x.device}")
    dev = x.device
    ldu = (v + 7) // 8 * 8
    if u is None:
        u = torch.empty(m, ldu, dtype=torch.int16, device=dev)  # rne(U) bits
    elif u.shape != (m, ldu) or u.dtype != torch.int16 or u.device != dev or not u.is_contiguous():
        raise ValueError(f"cuda_certified: u must be a contiguous int16 [{m}, {ldu}] tensor on {dev}")
    ws = torch.empty(cuda_library().w12_lmh_workspace_bytes(m, cap), dtype=torch.uint8, device=dev)
    ids = torch.empty(m, dtype=torch.int64, device=dev)
    index = torch.empty(m, cap, dtype=torch.int64, device=dev)
    logits = torch.empty(m, cap, dtype=torch.bfloat16, device=dev)
    counts = torch.empty(m, dtype=torch.int64, device=dev)
    amb = torch.empty(m, dtype=torch.bool, device=dev)
    fb = torch.empty(m, dtype=torch.bool, device=dev)
    best = torch.empty(m, dtype=torch.bfloat16, device=dev)
    _launch("w12_lmh_certified", x, _ptr(q), _ptr(scale), _ptr(radius), _ptr(weight), _ptr(x), m, v, k,
            q.stride(0), weight.stride(0), x.stride(0), _f32_up(MUL_PAD * shrink), _amb_coef(k, u_acc), cap,
            _ptr(u), ldu, _ptr(ws), _ptr(ids), _ptr(index), _ptr(logits), _ptr(counts), _ptr(amb), _ptr(fb),
            _ptr(best), stages)
    return ids, index, logits, counts, amb, fb, best


def cuda_exact_logits(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The CUDA path's exact head (step 6): bf16 [M, V] from the fixed-order kernel."""
    v, k = weight.shape
    if not (cuda_supported(x, weight) and x.dtype == weight.dtype == torch.bfloat16 and x.shape[-1] == k
            and x.dim() == 2):
        raise ValueError(f"cuda_exact_logits: expected contiguous aligned CUDA bf16 x [M, {k}] and weight, "
                         f"found x {x.dtype} {tuple(x.shape)} on {x.device}")
    out = torch.empty(x.shape[0], v, dtype=torch.bfloat16, device=x.device)
    _launch("w12_lmh_exact_logits", x, _ptr(weight), _ptr(x), x.shape[0], v, k, weight.stride(0), x.stride(0),
            _ptr(out), v)
    return out


def _strict(x, weight, out):
    """strict mode on CUDA: ambiguous and fallback rows answered by F.linear (one host sync, strict only)."""
    ids, index, logits, counts, amb, fb, best = out
    redo = amb | fb
    if not bool(redo.any()):
        return out
    full = F.linear(x, weight)
    fids = full.argmax(1)
    best = torch.where(redo, full.gather(1, fids[:, None])[:, 0], best)
    return torch.where(redo, fids, ids), index, logits, counts, amb, redo, best


def _survivors(ids, index, logits, counts, amb, fb, best):
    """The op's outputs → (ids, Survivors) with ascending candidate ids (-1 padding last)."""
    big = torch.iinfo(torch.int64).max
    key, perm = torch.where(index >= 0, index, big).sort(1)
    index = torch.where(key == big, -1, key)
    return ids, Survivors(index, logits.gather(1, perm), counts, amb, fb, best)


def _pad(t: torch.Tensor, width: int, value) -> torch.Tensor:
    return F.pad(t, (0, width - t.shape[1]), value=value)


# ---- torch custom ops (torch.compile and CUDA graphs capture them as single nodes) ----------------
@torch.library.custom_op("w12::lm_head_argmax", mutates_args=())
def lm_head_argmax(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, radius: torch.Tensor,
                   wnorm: torch.Tensor, weight: torch.Tensor, cap: int, u_acc: float, strict: bool
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                              torch.Tensor]:
    """The certified argmax: (ids, index [M, cap], logits [M, cap], counts, ambiguous, fallback, best).
    CUDA with the kernels: no host sync (strict=False); elsewhere the reference (CPU) or the Triton pass."""
    if cuda_supported(x, weight):
        out = cuda_certified(x, q, scale, radius, weight, cap, u_acc)
        return _strict(x, weight, out) if strict else out
    head = CertifiedHead(q, scale, radius, wnorm, wnorm, weight, u_acc)  # err is not used by argmax
    ids, info = head.argmax(x, backend="triton" if x.is_cuda else "torch", strict=strict, cap=cap)
    return (ids, _pad(info.index, cap, -1), _pad(info.logits, cap, -math.inf), info.counts, info.ambiguous,
            info.fallback, info.best)


@lm_head_argmax.register_fake
def _(x, q, scale, radius, wnorm, weight, cap, u_acc, strict):
    m = x.shape[0]
    i64, b = torch.int64, torch.bool
    return (x.new_empty(m, dtype=i64), x.new_empty(m, cap, dtype=i64), x.new_empty(m, cap, dtype=weight.dtype),
            x.new_empty(m, dtype=i64), x.new_empty(m, dtype=b), x.new_empty(m, dtype=b),
            x.new_empty(m, dtype=weight.dtype))


@torch.library.custom_op("w12::lm_head_exact", mutates_args=())
def lm_head_exact(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The exact head the certified argmax equals: CUDA kernels → the fixed-order head; else F.linear."""
    if cuda_supported(x, weight):
        return cuda_exact_logits(x, weight)
    return F.linear(x, weight)


@lm_head_exact.register_fake
def _(x, weight):
    return x.new_empty(x.shape[0], weight.shape[0], dtype=weight.dtype)


def exact_logits(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [..., K] → [..., V]: the exact head of step 6 for x's device (G1 is stated against it)."""
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    return torch.ops.w12.lm_head_exact(x2, weight).reshape(*x.shape[:-1], weight.shape[0])


# =================================================================================================
# Runtime: the module, the argmax-only context, and the Transformers `generate` wrapper
# =================================================================================================
class CertifiedLMHead(nn.Linear):
    """An `nn.Linear` LM head (bf16, no bias) with a certified argmax for greedy decoding.

    `forward` is the unchanged exact head (full logits), except inside `argmax_only()`: there it returns
    logits that are −inf except the exact logits of the survivors and of the winner (argmax-equivalent),
    for at most `max_tokens` rows (default: 4 on CUDA, unlimited elsewhere; more rows get full logits).
    `weight` is the wrapped layer's Parameter (shared: ties and state-dict keys are unchanged).  The INT8
    copy is a plain attribute (not saved), rebuilt by `sync()` when the weight was replaced, moved or
    modified in place.
    """

    def __init__(self, linear: nn.Linear, backend: str = "auto", strict: bool = False, cap: int = CUDA_CAP,
                 u_acc: float = U_ACC, max_tokens: int | None = None):
        if not isinstance(linear, nn.Linear):
            raise ValueError(f"CertifiedLMHead wraps an nn.Linear LM head, found {type(linear).__name__} (an LM "
                             "head converted to W12 cannot be certified: convert with the default --exclude)")
        if linear.bias is not None:
            raise ValueError("CertifiedLMHead supports LM heads without bias only")
        if linear.weight.dtype != torch.bfloat16:
            raise ValueError(f"CertifiedLMHead needs a bf16 LM head, found {linear.weight.dtype}")
        super().__init__(linear.in_features, linear.out_features, bias=False, device="meta")
        self.weight = linear.weight
        self.backend, self.strict, self.cap, self.u_acc, self.max_tokens = backend, strict, cap, u_acc, max_tokens
        self._head: CertifiedHead | None = None
        self._src = None
        self._argmax_only = False
        self.last: Survivors | None = None  # eager calls only
        self.calls = 0                      # certified calls (eager only: under torch.compile it stays put)

    # ---- the INT8 copy ---------------------------------------------------------------------------
    @torch.no_grad()
    def sync(self) -> CertifiedHead:
        w = self.weight
        src = (w.data_ptr(), w.device, w._version)
        if self._head is None or self._src != src:
            self._head = CertifiedHead.from_weight(w.detach(), self.u_acc)
            self._src = src
        return self._head

    def refresh(self) -> None:
        self._head = None
        self.sync()

    # ---- modes -----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def argmax_only(self):
        """Inside: forward may return argmax-equivalent sparse logits (the caller needs the argmax only)."""
        self.sync()
        prev, self._argmax_only = self._argmax_only, True
        try:
            yield self
        finally:
            self._argmax_only = prev

    def _token_limit(self, hidden: torch.Tensor) -> int:
        if self.max_tokens is not None:
            return self.max_tokens
        return CUDA_MAX_TOKENS if hidden.is_cuda else 1 << 62

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if not self._argmax_only or hidden.numel() // hidden.shape[-1] > self._token_limit(hidden):
            return F.linear(hidden, self.weight)
        return self.sparse_logits(hidden)

    def sparse_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., V]: −inf except the survivors' exact logits (not for fallback rows) and the winner's."""
        h = self._head if self._head is not None else self.sync()
        x = hidden.reshape(-1, hidden.shape[-1]).contiguous()
        ids, index, logits, counts, amb, fb, best = torch.ops.w12.lm_head_argmax(
            x, h.q, h.scale, h.radius, h.wnorm, self.weight, self.cap, self.u_acc, self.strict)
        v = self.out_features
        keep = (index >= 0) & ~fb[:, None]
        out = torch.full((x.shape[0], v + 1), -math.inf, dtype=self.weight.dtype, device=x.device)
        out.scatter_(1, torch.where(keep, index, v), torch.where(keep, logits, -math.inf))  # column v: a sink
        out.scatter_(1, ids[:, None], best[:, None])
        if not torch.compiler.is_compiling():
            self.calls += 1
            self.last = Survivors(index, logits, counts, amb, fb, best)
        return out[:, :v].reshape(*hidden.shape[:-1], v)

    @torch.no_grad()
    def argmax(self, hidden: torch.Tensor) -> torch.Tensor:
        """Token ids [...] = self(hidden).argmax(-1), without reading the whole BF16 head."""
        head = self.sync()
        backend = self.backend
        if backend == "auto":
            backend = ("cuda" if cuda_supported(hidden, self.weight) else "triton") if hidden.is_cuda else "torch"
        x = hidden.reshape(-1, hidden.shape[-1])
        ids, self.last = head.argmax(x, backend=backend, strict=self.strict, cap=self.cap)
        self.calls += 1
        return ids.reshape(hidden.shape[:-1])


# generation-config fields that make Transformers build a logits processor (or another decoding mode)
# unless they hold one of these values; a processor may mask or reorder tokens outside the survivors
_NEUTRAL = {
    "do_sample": (None, False), "num_beams": (None, 1), "num_beam_groups": (None, 1), "output_scores": (None, False),
    "output_logits": (None, False), "repetition_penalty": (None, 1.0), "encoder_repetition_penalty": (None, 1.0),
    "no_repeat_ngram_size": (None, 0), "encoder_no_repeat_ngram_size": (None, 0), "bad_words_ids": (None,),
    "min_length": (None, 0), "min_new_tokens": (None, 0), "forced_bos_token_id": (None,),
    "forced_eos_token_id": (None,), "forced_decoder_ids": (None,), "suppress_tokens": (None,),
    "begin_suppress_tokens": (None,), "sequence_bias": (None,), "guidance_scale": (None, 1.0),
    "exponential_decay_length_penalty": (None,), "renormalize_logits": (None, False),
    "remove_invalid_values": (None, False), "watermarking_config": (None,), "token_healing": (None, False),
    "diversity_penalty": (None, 0.0), "penalty_alpha": (None,), "dola_layers": (None,), "constraints": (None,),
    "force_words_ids": (None,), "prompt_lookup_num_tokens": (None,), "assistant_early_exit": (None,),
}
_NONE_ARGS = ("prefix_allowed_tokens_fn", "assistant_model", "negative_prompt_ids", "negative_prompt_attention_mask",
              "custom_generate", "assistant_tokenizer")


def _is(value, allowed) -> bool:
    return any(value is a if a is None or isinstance(a, bool) else (not isinstance(value, bool) and value == a)
               for a in allowed)


def argmax_is_enough(model, generate_fn, args: tuple, kwargs: dict) -> bool:
    """Does `model.generate(*args, **kwargs)` use nothing of the logits but their argmax?  Conservative:
    anything unknown (an unbindable call, a field outside the neutral set, a non-empty logits processor
    list as Transformers builds it, an exception on the way) answers False."""
    try:
        return _argmax_is_enough(model, generate_fn, args, kwargs)
    except Exception:  # another Transformers version or an invalid call: full logits (generate will complain)
        return False


def _argmax_is_enough(model, generate_fn, args, kwargs) -> bool:
    sig = inspect.signature(generate_fn)
    bound = sig.bind(*args, **kwargs).arguments
    var_kw = next((p.name for p in sig.parameters.values() if p.kind is p.VAR_KEYWORD), None)
    extra = dict(bound.pop(var_kw, None) or {}) if var_kw else {}
    if any(bound.get(a) is not None or extra.get(a) is not None for a in _NONE_ARGS):
        return False
    if bound.get("logits_processor") or extra.get("cache_implementation") == "paged":
        return False
    config = bound.get("generation_config") or getattr(model, "generation_config", None)
    if config is None:
        return False
    config = copy.deepcopy(config)
    config.update(**{k: v for k, v in extra.items() if hasattr(config, k)})
    if getattr(config, "cache_implementation", None) == "paged":
        return False
    if not all(_is(getattr(config, name, None), allowed) for name, allowed in _NEUTRAL.items()):
        return False
    build = getattr(model, "_get_logits_processor", None)  # the processors generate would build, if knowable
    if build is not None:
        procs = build(generation_config=config, input_ids_seq_length=1,
                      encoder_input_ids=torch.zeros(1, 1, dtype=torch.long), prefix_allowed_tokens_fn=None,
                      logits_processor=None, device="cpu", model_kwargs={})
        if len(procs):
            return False
    return True


def _wrap_generate(model) -> None:
    """model.generate = the previous generate, inside the head's argmax_only() when argmax_is_enough."""
    current = model.__dict__.get("generate")
    if getattr(current, "_w12_certified", False):
        return
    stock = current if current is not None else types.MethodType(type(model).generate, model)

    @functools.wraps(stock)
    def generate(self, *args, **kwargs):
        head = self.get_output_embeddings()
        if isinstance(head, CertifiedLMHead) and argmax_is_enough(self, stock, args, kwargs):
            with head.argmax_only():
                return stock(*args, **kwargs)
        return stock(*args, **kwargs)

    generate._w12_certified = True
    model.generate = types.MethodType(generate, model)


def install_certified_lm_head(model, strict: bool = False, cap: int = CUDA_CAP, max_tokens: int | None = None,
                              build: bool = True) -> CertifiedLMHead:
    """Swap `model.get_output_embeddings()` (a bf16 nn.Linear, no bias) for a CertifiedLMHead sharing its
    weight, and wrap `model.generate`.  Idempotent (a second call updates strict / cap / max_tokens).
    `build`: make the INT8 copy now (else at the first greedy call)."""
    head = model.get_output_embeddings()
    if isinstance(head, CertifiedLMHead):
        head.strict, head.cap, head.max_tokens = strict, cap, max_tokens
    else:
        name = next((n for n, mod in model.named_modules() if mod is head), None)
        if head is None or name is None:
            raise ValueError(f"{type(model).__name__} has no output embedding module to certify")
        head = CertifiedLMHead(head, strict=strict, cap=cap, max_tokens=max_tokens)
        model.set_submodule(name, head)
    if build and head.weight.device.type != "meta":
        head.sync()
    _wrap_generate(model)
    return head
