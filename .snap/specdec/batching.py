"""Batching policies (seed paper §2.2, §4.4): which rows each step drafts and verifies.

All three only *choose* rows, so they stay lossless (the verifier is unchanged):

* Node budget — `shared_budget`: one budget for the whole step, filled best-first across every request's
  lattice by path log-probability. Each request's lazy best-first order is non-increasing in path score,
  so the merged top-N takes a *prefix* of every request's order: each share is a prefix-closed tree
  (identical to `trees.best_first` with that share as its budget). `equal_split`: the same total budget
  divided evenly (best-first within each share) — the baseline. `CalibratedBudget`: the shared budget
  ranked by calibrated acceptance (`EdgeCalibration`: P(edge accepted | parent accepted) from the drafter's
  probability, depth, rank and whether the parent is on the drafter's own chain; fitted offline on held-out
  recordings or learnt online from verified steps only); still a prefix of each request's own order.
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
import math
import re
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

import torch

from .lattice import Lattice
from .trees import Tree, _child_order, _make, best_first_order


# --- node budget across requests ---------------------------------------------------------------

def _tree(lat: Lattice, root: int, nodes) -> Tree:
    return _make(lat, root, [(-1, -1, 0.0)] + list(nodes))


def _merge(lattices: list[Lattice], roots: list[int], total: int, gens) -> list[Tree]:
    """Take `total` nodes best-first across per-request lazy orders whose scores never increase (ties:
    lower request index, then that request's own order): every share is a prefix of its request's order."""
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


def shared_budget(lattices: list[Lattice], roots: list[int], total: int,
                  max_depths: list[int | None] | None = None) -> list[Tree]:
    """One budget of `total` draft nodes for the step, taken best-first across all requests by path
    score (ties: lower request index, then that request's own order). Returns one tree per request."""
    max_depths = max_depths or [None] * len(lattices)
    return _merge(lattices, roots, total, [best_first_order(l, d) for l, d in zip(lattices, max_depths)])


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


# --- calibrated node budget ----------------------------------------------------------------------
#
# Best-first by raw path log-probability maximises Σ_nodes Π_path p_edge, which is the expected number of
# accepted tokens only if the drafter's probabilities are calibrated. On the recorded SmolLM2 lattices they
# are not (bench/results/2026-11-29-batching-calibrated.md): a truncated self-drafter is overconfident
# (p ≈ 0.99 -> ~0.73 accepted), and an edge below a node that left the drafter's own top-1 chain is worth
# far less than its probability (that position was drafted after the chain's token, not this one).
# `EdgeCalibration` maps an edge's drafter probability to P(accepted | its parent was accepted), per depth,
# sibling rank and "parent on the chain"; the policy ranks nodes by the product of those along the path.
# Scores only choose nodes: the verifier is unchanged (lossless), and every calibrated edge probability is
# < 1, so path scores fall along every path and each request's share stays a prefix-closed tree.
# Measured (held-out, trunc-fp32): +3…+5 % τ over the equal split at 1-8 nodes/request, but at 4-8 nodes
# most of it is tree shape (the calibrated equal split gets it too); sharing itself adds +3…+4 % at 1
# node/request and -0.5…-0.8 % at 8 (ngram-fp32: +7…+9 % and +1 %).

P_BINS = (0.0, 1e-3, 3e-3, 0.01, 0.03, 0.1, 0.2, 0.4, 0.6, 0.8, 0.9, 0.97, 1.0)
RANKS = (0, 1, 2, 4)            # rank buckets: the best child, the runner-up, 3rd-4th, 5th and below


@dataclass
class EdgeCalibration:
    """P(a drafted edge is accepted | its parent node was accepted), from the drafter's edge probabilities.

    An edge is the c-th best child of its parent (c = 0, 1, ...: its rank among the parent's children by
    drafter score) with drafter probability p; p1 = the best child's probability. Its feature is x = p for
    the best child and x = p / (1 - p1) for the others (the drafter's probability of it given that the best
    child is wrong: a runner-up matters when the best child fails, whatever its raw p). Strata: depth (1,
    2, ..., `depth_cap` and deeper) × whether every ancestor is the drafter's top-1 candidate (lattice
    column 0) at its position — "on the chain" — × rank bucket (`ranks`). Within a stratum x is binned
    (`bins`); a bin's rate is (accepted + pool · pooled rate) / (edges + pool), the pooled rate being the
    same rank bucket and bin over all depths, itself (accepted + prior · mean p) / (edges + prior); a rank
    bucket with no data yet gives the drafter's own p (so an empty calibration is the raw policy). Rates
    are made non-decreasing in x (weighted pool-adjacent-violators), linearly interpolated between the
    bins' mean x, and clipped to [floor, ceil] with ceil < 1.
    by_rank=False: one rank bucket and x = p (a calibration of p alone, per depth and chain). keep_order:
    `calibrated_order` never ranks a child above an earlier sibling in the drafter's order (the c-th
    child's q is capped by the (c-1)-th's).

    Data: `observe(lattice, committed)` with the tokens a verified step committed after its root (its
    accepted draft tokens and the bonus token). Position i of the lattice is read only for i <
    len(committed), with its parent the committed path, so nothing past what the target produced is used.
    `fit(steps)` does the same offline over (lattice, continuation) pairs (e.g. `Record.steps()`).
    """
    bins: tuple[float, ...] = P_BINS
    depth_cap: int = 3
    by_rank: bool = True
    ranks: tuple[int, ...] = RANKS
    prior: float = 4.0
    pool: float = 20.0
    floor: float = 1e-6
    ceil: float = 0.99
    conditioned: bool = True
    keep_order: bool = True
    # (depth group, on chain, rank bucket, bin) -> [edges, accepted, Σ p, Σ x]
    counts: dict = field(default_factory=dict)
    _table: dict | None = field(default=None, repr=False)

    @classmethod
    def fit(cls, steps, **opts) -> "EdgeCalibration":
        cal = cls(**opts)
        for lat, cont in steps:
            cal.observe(lat, cont)
        return cal

    def _bin(self, x: float) -> int:
        for b in range(len(self.bins) - 2, -1, -1):
            if x >= self.bins[b]:
                return b
        return 0

    def feature(self, c: int, p: float, p1: float) -> tuple[int, float]:
        """(rank bucket, x) of the c-th best child (probability p; best child p1)."""
        if not self.by_rank:
            return 0, p
        rb = max(i for i, lo in enumerate(self.ranks) if c >= lo)
        return rb, p if c == 0 else min(1.0, p / (1 - p1)) if p1 < 1 else 1.0

    def _group(self, depth: int, chain: bool, rb: int) -> tuple[int, bool, int]:
        return min(depth, self.depth_cap), chain, rb

    def edges(self, lat: Lattice, committed: list[int]) -> list[tuple[int, bool, int, float, float, bool]]:
        """The edges one verified step reveals, as (depth, parent on chain, rank, p, p1, accepted): every
        candidate of position i < len(committed) under the committed path, down to where that path leaves
        the lattice."""
        ids = lat.lists()[0]
        seen, rank, chain = [], None, True
        for i in range(min(lat.positions, len(committed))):
            hit, order = None, _child_order(lat, i, rank, self.conditioned)
            p1 = math.exp(order[0][0]) if order else 0.0
            for c, (s, r) in enumerate(order):
                ok = ids[i][r] == committed[i]
                seen.append((i + 1, chain, c, math.exp(s), p1, ok))
                hit = r if ok else hit
            if hit is None:
                break
            chain, rank = chain and hit == 0, hit
        return seen

    def observe(self, lat: Lattice, committed: list[int]) -> None:
        """Count the edges of one verified step (see `edges`)."""
        for d, chain, c, p, p1, ok in self.edges(lat, committed):
            rb, x = self.feature(c, p, p1)
            n = self.counts.setdefault((*self._group(d, chain, rb), self._bin(x)), [0, 0, 0.0, 0.0])
            n[0] += 1
            n[1] += ok
            n[2] += p
            n[3] += x
        self._table = None

    def table(self) -> dict:
        """{(depth group, on chain, rank bucket): ([mean x per bin], [rate per bin]), "seen": rank buckets with
        data}, rebuilt after new data."""
        if self._table is not None:
            return self._table
        nb, nr = len(self.bins) - 1, len(self.ranks) if self.by_rank else 1
        mid = [(self.bins[b] + self.bins[b + 1]) / 2 for b in range(nb)]
        pooled = {(rb, b): [0, 0, 0.0, 0.0] for rb in range(nr) for b in range(nb)}
        for (_, _, rb, b), c in self.counts.items():
            for k in range(4):
                pooled[rb, b][k] += c[k]
        prate = {k: (c[1] + self.prior * (c[2] / c[0] if c[0] else mid[k[1]])) / (c[0] + self.prior)
                 for k, c in pooled.items()}
        pbar = {k: c[3] / c[0] if c[0] else mid[k[1]] for k, c in pooled.items()}
        table = {}
        for g in [(d, ch, rb) for d in range(1, self.depth_cap + 1) for ch in (True, False) for rb in range(nr)]:
            cs = [self.counts.get((*g, b), [0, 0, 0.0, 0.0]) for b in range(nb)]
            xs = [c[3] / c[0] if c[0] else pbar[g[2], b] for b, c in enumerate(cs)]
            ys = [(c[1] + self.pool * prate[g[2], b]) / (c[0] + self.pool) for b, c in enumerate(cs)]
            order = sorted(range(nb), key=lambda b: xs[b])
            xs, ys, ws = [xs[b] for b in order], [ys[b] for b in order], [cs[b][0] + self.pool for b in order]
            table[g] = (xs, _isotonic(ys, ws))
        table["seen"] = {rb for (rb, _), c in pooled.items() if c[0]}
        self._table = table
        return table

    def prob(self, depth: int, chain: bool, c: int, p: float, p1: float) -> float:
        """Calibrated P(accepted | parent accepted) of the c-th best child (probability p; best child p1)."""
        rb, x = self.feature(c, p, p1)
        table = self.table()
        if rb not in table["seen"]:                     # no data for this rank bucket yet: the drafter's p
            return min(max(p, self.floor), self.ceil)
        xs, ys = table[self._group(depth, chain, rb)]
        if x <= xs[0]:
            q = ys[0] * x / xs[0] if xs[0] > 0 else ys[0]
        elif x >= xs[-1]:
            q = ys[-1]
        else:
            b = next(b for b in range(1, len(xs)) if x <= xs[b])
            w = (x - xs[b - 1]) / (xs[b] - xs[b - 1]) if xs[b] > xs[b - 1] else 1.0
            q = ys[b - 1] + w * (ys[b] - ys[b - 1])
        return min(max(q, self.floor), self.ceil)


def _isotonic(ys: list[float], ws: list[float]) -> list[float]:
    """Weighted least-squares non-decreasing fit (pool adjacent violators)."""
    blocks = []                                    # [value, weight, count]
    for y, w in zip(ys, ws):
        blocks.append([y, w, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (a, wa, na), (b, wb, nb) = blocks[-2], blocks.pop()
            blocks[-1] = [(a * wa + b * wb) / (wa + wb), wa + wb, na + nb]
    return [v for v, _, n in blocks for _ in range(n)]


def calibrated_order(lat: Lattice, cal: EdgeCalibration, max_depth: int | None = None, mult: float = 1.0):
    """`best_first_order` with calibrated edge scores: lazily yield (parent index, rank, Σ log q) best
    first, q = min(ceil, mult · cal.prob(...)) < 1, so scores never increase and any prefix of the order is
    a prefix-closed tree (a child is queued only once its parent is emitted)."""
    def scores(d0: int, prev, on_chain: bool):
        raw = _child_order(lat, d0, prev, cal.conditioned)
        p1 = math.exp(raw[0][0]) if raw else 0.0
        sc, lo = [], 0.0
        for i, (s, r) in enumerate(raw):
            q = math.log(min(cal.ceil, mult * cal.prob(d0 + 1, on_chain, i, math.exp(s), p1)))
            lo = min(lo, q) if cal.keep_order else q
            sc.append((lo, r))
        return sorted(sc, key=lambda x: -x[0])          # stable: the drafter's order on ties

    yield from best_first_order(lat, max_depth, child_scores=scores)


@dataclass
class CalibratedBudget:
    """The node budget ranked by calibrated acceptance (a plan: (lattices, roots, total, max_depths) ->
    trees). split="shared": one budget best-first across requests (like `shared_budget`); "equal": the
    equal split, calibrated order within each share (a control).

    online=True: `update(lattice, committed, key)` after each verified step feeds `cal` (one calibration
    shared by all requests; starts as the drafter's raw p unless `cal` was fitted); online=False: `cal` is
    frozen (fitted offline with `EdgeCalibration.fit`). per_request > 0: also scale each request's edge
    probabilities by (per_request + its accepted edges) / (per_request + its expected accepted edges),
    counted over its own verified steps only (requests named by `keys` in the call and `key` in update).
    bench/batching_sim.py calls `update`; the batched engine (batch_engine.py) does not yet, so there the
    calibration stays as given (fit it offline)."""
    cal: EdgeCalibration = field(default_factory=EdgeCalibration)
    online: bool = True
    per_request: float = 0.0
    split: str = "shared"
    seen: dict = field(default_factory=dict)           # key -> [accepted edges, expected accepted edges]

    def mult(self, key) -> float:
        if not self.per_request or key not in self.seen:
            return 1.0
        acc, exp = self.seen[key]
        return (self.per_request + acc) / (self.per_request + exp)

    def orders(self, lattices, max_depths, keys):
        return [calibrated_order(l, self.cal, d, self.mult(k)) for l, d, k in zip(lattices, max_depths, keys)]

    def __call__(self, lattices: list[Lattice], roots: list[int], total: int,
                 max_depths: list[int | None] | None = None, keys: list | None = None) -> list[Tree]:
        R = len(lattices)
        max_depths, keys = max_depths or [None] * R, keys or [None] * R
        gens = self.orders(lattices, max_depths, keys)
        if self.split == "shared":
            return _merge(lattices, roots, total, gens)
        return [_tree(l, root, islice(g, total // R + (r < total % R)))
                for r, (l, root, g) in enumerate(zip(lattices, roots, gens))]

    def update(self, lat: Lattice, committed: list[int], key=None) -> None:
        """Learn from one verified step of one request: `committed` = the τ tokens it committed."""
        if not self.online and not self.per_request:
            return
        if self.per_request and key is not None:
            obs = self.cal.edges(lat, committed)
            s = self.seen.setdefault(key, [0.0, 0.0])
            s[0] += sum(ok for *_, ok in obs)
            s[1] += sum(self.cal.prob(d, ch, c, p, p1) for d, ch, c, p, p1, _ in obs)
        if self.online:
            self.cal.observe(lat, committed)

    def forget(self, key) -> None:
        self.seen.pop(key, None)


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


__all__ = ["best_first_order", "shared_budget", "equal_split", "POLICIES", "EdgeCalibration", "calibrated_order",
           "CalibratedBudget", "DraftBlock", "RowCurve",
           "llama8b_curve", "kernel_table", "FlatAdmission", "admit_always", "BatchStats"]
