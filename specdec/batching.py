"""Batching policies (seed paper §2.2, §4.4): which rows each step drafts and verifies.

All three only *choose* rows, so they stay lossless (the verifier is unchanged):

* Node budget — `shared_budget`: one budget for the whole step, filled best-first across every request's
  lattice by path log-probability. Each request's lazy best-first order is non-increasing in path score,
  so the merged top-N takes a *prefix* of every request's order: each share is a prefix-closed tree
  (identical to `trees.best_first` with that share as its budget). `equal_split`: the same total budget
  divided evenly (best-first within each share) — the baseline.
* Draft block — `DraftBlock`: each request picks its number of draft positions from a menu (16/12/8)
  from its recent acceptance (EMA of accepted draft tokens per step) and its draft confidence (mean top-1
  probability of the lattice's first positions); the tree's depth is capped at that length.
* Prompt admission — `FlatAdmission`: a waiting prompt's rows are merged into the verification step only
  when the step's rows + the prompt's rows stay in the flat region of the step-time curve; otherwise the
  prompt waits (forced after `max_wait` steps, or at once when nothing else is running).
* `RowCurve`: step time vs rows (the curve the policies read). `RowCurve.from_json` reads the curve
  measured on the GPU by bench/gpu_step_costs.py (whole Llama-3.1-8B-shaped forward of R rows: all layers,
  attention over a static KV cache, LM head; BF16, W12 exact or the 8-bit view). `llama8b_curve` is the
  fallback: it derives a step (4 projections × 32 layers + LM head; GEMMs only, no attention) from the
  H200 kernel table.
"""

from __future__ import annotations

import heapq
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .lattice import Lattice
from .trees import Tree, _make, best_first_order


# --- node budget across requests ---------------------------------------------------------------

def _tree(lat: Lattice, root: int, nodes) -> Tree:
    return _make(lat, root, [(-1, -1, 0.0)] + list(nodes))


def shared_budget(lattices: list[Lattice], roots: list[int], total: int,
                  max_depths: list[int | None] | None = None) -> list[Tree]:
    """One budget of `total` draft nodes for the step, taken best-first across all requests by path
    score (ties: lower request index, then that request's own order). Returns one tree per request."""
    max_depths = max_depths or [None] * len(lattices)
    gens = [best_first_order(l, d) for l, d in zip(lattices, max_depths)]
    taken = [[] for _ in lattices]
    heap = []
    for r, g in enumerate(gens):
        if (n := next(g, None)) is not None:
            heap.append((-n[2], r, n))
    heapq.heapify(heap)
    for _ in range(total):
        if not heap:
            break
        _, r, n = heapq.heappop(heap)
        taken[r].append(n)
        if (m := next(gens[r], None)) is not None:
            heapq.heappush(heap, (-m[2], r, m))
    return [_tree(l, root, t) for l, root, t in zip(lattices, roots, taken)]


def equal_split(lattices: list[Lattice], roots: list[int], total: int,
                max_depths: list[int | None] | None = None) -> list[Tree]:
    """The baseline: `total` split evenly (the first `total % R` requests get one more), best-first
    within each share. A share a lattice cannot fill is wasted."""
    R = len(lattices)
    max_depths = max_depths or [None] * R
    out = []
    for r, (lat, root, d) in enumerate(zip(lattices, roots, max_depths)):
        share = total // R + (r < total % R) if R else 0
        g = best_first_order(lat, d)
        out.append(_tree(lat, root, [n for _, n in zip(range(share), g)]))
    return out


POLICIES = {"shared": shared_budget, "equal": equal_split}


# --- per-request draft block ---------------------------------------------------------------------

@dataclass
class DraftBlock:
    """Draft length per request from a menu (longest first). Long when the request has been accepting
    (EMA of accepted draft tokens >= hi) and its drafter is confident (mean top-1 prob of the first
    `probe` positions >= conf_hi); short when acceptance < lo or confidence < conf_lo; else the middle."""
    menu: tuple[int, ...] = (16, 12, 8)
    hi: float = 4.0
    lo: float = 1.5
    conf_hi: float = 0.6
    conf_lo: float = 0.3
    alpha: float = 0.5
    probe: int = 4

    def init(self) -> dict:
        return {"acc": (self.hi + self.lo) / 2, "conf": (self.conf_hi + self.conf_lo) / 2}

    def choose(self, state: dict) -> int:
        acc, conf = state["acc"], state["conf"]
        if acc >= self.hi and conf >= self.conf_hi:
            return self.menu[0]
        if acc < self.lo or conf < self.conf_lo:
            return self.menu[-1]
        return self.menu[len(self.menu) // 2]

    def update(self, state: dict, accepted: int, lat: Lattice) -> None:
        state["acc"] = (1 - self.alpha) * state["acc"] + self.alpha * accepted
        if lat.positions:
            top = lat.logp[:self.probe].max(-1).values.clamp(min=-50).exp()
            state["conf"] = (1 - self.alpha) * state["conf"] + self.alpha * float(top.mean())

    def scaled(self, f: float) -> "DraftBlock":
        """The same policy for lattices `f` times as deep (e.g. 0.5 for 8-position recordings)."""
        return DraftBlock(tuple(max(1, round(m * f)) for m in self.menu), self.hi * f, self.lo * f,
                          self.conf_hi, self.conf_lo, self.alpha, self.probe)


# --- the row-cost curve -----------------------------------------------------------------------

@dataclass
class RowCurve:
    """Step time (seconds) vs rows, piecewise linear between measured points; linear extrapolation past
    the last point from the last segment (marked in reports)."""
    rows: list[int]
    seconds: list[float]
    label: str = ""

    def __call__(self, m: float) -> float:
        xs, ys = self.rows, self.seconds
        m = max(m, xs[0])
        for i in range(1, len(xs)):
            if m <= xs[i]:
                return ys[i - 1] + (ys[i] - ys[i - 1]) * (m - xs[i - 1]) / (xs[i] - xs[i - 1])
        return ys[-1] + (ys[-1] - ys[-2]) * (m - xs[-1]) / (xs[-1] - xs[-2])

    @classmethod
    def from_json(cls, path, kind: str = "w12") -> "RowCurve":
        """The curve measured by bench/gpu_step_costs.py: {"curve": {"rows": [R...], "<kind>_ms": [ms...]}},
        kind = bf16 | w12 | view; milliseconds in the file, seconds in the curve."""
        doc = json.loads(Path(path).read_text())
        curve = doc.get("curve") or {}
        rows, ms = curve.get("rows"), curve.get(f"{kind}_ms")
        if rows is None or ms is None:
            have = sorted(k[:-3] for k in curve if k.endswith("_ms"))
            raise ValueError(f"{path}: no measured {kind!r} row-cost curve (has {have or 'none'})")
        if len(rows) != len(ms) or len(rows) < 2:
            raise ValueError(f"{path}: {kind} curve needs >= 2 points and one time per row count")
        if any(b <= a for a, b in zip(rows, rows[1:])) or any(not t > 0 for t in ms):
            raise ValueError(f"{path}: {kind} curve rows must increase and times be positive")
        where = ", ".join(str(doc[k]) for k in ("model", "device") if doc.get(k))
        return cls([int(r) for r in rows], [float(t) * 1e-3 for t in ms],
                   f"measured {kind} step ({where}; ctx {doc.get('ctx')}) from {Path(path).name}")

    def flat_limit(self, base_rows: int, tol: float = 0.05) -> int:
        """The most rows whose step time stays within (1 + tol) of the time at `base_rows` (the flat
        region of the GEMM curve above the rows the step needs anyway)."""
        t0, m = self(base_rows), base_rows
        while self(m + 1) <= t0 * (1 + tol) and m < 4096:
            m += 1
        return m


LLAMA8B = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
LLAMA8B_HEAD, LLAMA8B_LAYERS = (128256, 4096), 32


def kernel_table(path) -> dict[tuple[int, int, int], dict[str, float]]:
    """{(N, K, M): {"cublas": µs, "w12": µs, "view": µs}} from the full table of a kernels report."""
    out = {}
    for line in Path(path).read_text().splitlines():
        m = re.match(r"\|\s*(\d+)×(\d+)\s*\|\s*(\d+)\s*\|\s*([\d.]+)\s*\|\s*([\d.]+)\s*\|\s*([\d.]+)\s*\|", line)
        if m:
            N, K, M = map(int, m.groups()[:3])
            out[(N, K, M)] = dict(zip(("cublas", "w12", "view"), map(float, m.groups()[3:])))
    return out


def llama8b_curve(path, kernel: str = "cublas") -> RowCurve:
    """Llama-3.1-8B-shaped target step time vs rows M, derived from per-shape GEMM times:
    (qkv + o + gate_up + down) × 32 layers + LM head. GEMMs only: attention, norms, KV traffic and launch
    gaps are not in the table, so this is the weight-streaming part of a step."""
    tab = kernel_table(path)
    Ms = sorted({M for (N, K, M) in tab if (N, K) == LLAMA8B_HEAD})
    secs = []
    for M in Ms:
        layer = sum(tab[(N, K, M)][kernel] for N, K in LLAMA8B.values())
        secs.append((layer * LLAMA8B_LAYERS + tab[(*LLAMA8B_HEAD, M)][kernel]) * 1e-6)
    return RowCurve(Ms, secs, f"Llama-3.1-8B step (GEMMs only) derived from {Path(path).name}, {kernel}")


# --- prompt admission ---------------------------------------------------------------------------

@dataclass
class FlatAdmission:
    """Admit a waiting prompt into this step iff step rows + prompt rows <= the curve's flat limit above
    the step's own rows; a prompt that waited `max_wait` steps, or meets an empty batch, is admitted."""
    curve: RowCurve
    tol: float = 0.05
    max_wait: int = 8

    def __call__(self, step_rows: int, prompt_rows: int, waited: int, running: int) -> bool:
        if running == 0 or waited >= self.max_wait:
            return True
        return step_rows + prompt_rows <= self.curve.flat_limit(max(step_rows, 1), self.tol)


def admit_always(step_rows, prompt_rows, waited, running) -> bool:
    return True


@dataclass
class BatchStats:
    steps: int = 0
    rows: list[int] = field(default_factory=list)          # real rows verified per step (all requests)
    prompt_rows: list[int] = field(default_factory=list)   # of which prompt rows
    batch: list[int] = field(default_factory=list)         # requests in the step

    def note(self, rows, prompt_rows, batch):
        self.steps += 1
        self.rows.append(rows)
        self.prompt_rows.append(prompt_rows)
        self.batch.append(batch)


__all__ = ["best_first_order", "shared_budget", "equal_split", "POLICIES", "DraftBlock", "RowCurve",
           "llama8b_curve", "kernel_table", "FlatAdmission", "admit_always", "BatchStats"]
