"""Draft trees: one prefix-closed tree type and the builders that turn a lattice into one.

Node 0 is the root: the last committed token, whose KV is not cached yet. A node at depth d >= 1 holds a
candidate of lattice position d-1; parents come before children (parents[i] < i). Every builder takes
(lattice, root_token) and keeps at most `budget` draft nodes (root not counted) and depth <= max_depth.

Edge score of a child b under parent a at position i: s(b | a) = cond[i, a, b] when the lattice is
parent-conditioned (and the builder uses it), else the marginal logp[i, b]. Path score of a node =
Σ edge scores from the root. Scores are log-probs <= 0, so path scores fall along every path and the
top-N nodes by path score always form a prefix-closed tree (ties: the parent was created first).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from functools import partial
from itertools import islice

import torch

from .errors import TreeError
from .lattice import Lattice


@dataclass
class Tree:
    tokens: torch.Tensor   # [n] int64, tokens[0] = root
    parents: torch.Tensor  # [n] int64, -1 for the root, parents[i] < i
    depths: torch.Tensor   # [n] int64, root 0
    scores: torch.Tensor   # [n] float64 path score, root 0

    def __len__(self):
        return len(self.tokens)

    def mask(self) -> torch.Tensor:
        """[n, n] bool, mask[i, j] = node j is node i or one of its ancestors (tree attention)."""
        n = len(self)
        m = torch.eye(n, dtype=torch.bool)
        for i in range(1, n):
            m[i] |= m[self.parents[i]]
        return m

    def position_ids(self, start: int) -> torch.Tensor:
        """Position of each node when the root sits at `start`: start + depth."""
        return start + self.depths

    def children(self) -> list[dict[int, int]]:
        """children()[i] maps a token to the child of node i that holds it."""
        out = [{} for _ in range(len(self))]
        for i in range(1, len(self)):
            out[int(self.parents[i])][int(self.tokens[i])] = i
        return out

    def check(self) -> "Tree":
        p = self.parents.tolist()
        if p and p[0] != -1:
            raise TreeError("node 0 must be the root (parent -1)")
        for i in range(1, len(p)):
            if not 0 <= p[i] < i or int(self.depths[i]) != int(self.depths[p[i]]) + 1:
                raise TreeError(f"node {i}: parent {p[i]} must come earlier and be one level up")
        return self


# --- shared pieces -----------------------------------------------------------------------------

def _child_order(lat: Lattice, pos: int, parent_rank: int | None, conditioned: bool) -> list[tuple[float, int]]:
    """Candidates of lattice position `pos` as (edge score, rank), best first; invalid slots dropped."""
    ids, logp, cond = lat.lists()
    s = cond[pos][parent_rank] if cond is not None and conditioned and parent_rank is not None and pos > 0 else logp[pos]
    order = sorted(range(len(s)), key=lambda r: (-s[r], r))
    return [(s[r], r) for r in order if ids[pos][r] >= 0 and s[r] > -math.inf]


def _make(lat: Lattice, root: int, nodes: list[tuple[int, int, float]]) -> Tree:
    """nodes: (parent index, rank at lattice position depth-1, path score), root first."""
    tokens, parents, depths = [int(root)], [-1], [0]
    for p, r, _ in nodes[1:]:
        depths.append(depths[p] + 1)
        tokens.append(int(lat.ids[depths[-1] - 1, r]))
        parents.append(p)
    return Tree(torch.tensor(tokens), torch.tensor(parents), torch.tensor(depths),
                torch.tensor([s for *_, s in nodes], dtype=torch.float64))


def _limits(lat: Lattice, budget: int, max_depth: int | None) -> int:
    if budget < 0 or (max_depth is not None and max_depth < 0):
        raise TreeError(f"budget and max_depth must be >= 0, found {budget} and {max_depth}")
    return lat.positions if max_depth is None else min(max_depth, lat.positions)


# --- builders ----------------------------------------------------------------------------------

def chain(lat: Lattice, root: int, budget: int, max_depth: int | None = None, conditioned: bool = True) -> Tree:
    """Stock: the best candidate at each position (given the chosen parent), one node per depth."""
    D = min(_limits(lat, budget, max_depth), budget)
    nodes, rank = [(-1, -1, 0.0)], None
    for d in range(D):
        order = _child_order(lat, d, rank, conditioned)
        if not order:
            break
        s, rank = order[0]
        nodes.append((d, rank, nodes[-1][2] + s))
    return _make(lat, root, nodes)


def best_first_order(lat: Lattice, max_depth: int | None = None, conditioned: bool = True, child_scores=None):
    """Lazily yield the nodes of highest path score Σ s(child | parent), best first: (parent index, rank,
    path score), root excluded (node i of the output is index i + 1 of the tree); scores non-increasing.

    DDTree's heap with one cursor per parent, so child lists may depend on the parent, as with a Markov
    head. Heap entries are (−(score(parent) + s_c), tie, parent, c): "the c-th best child of parent".
    Popping one emits the node and pushes its next sibling (c+1) and its own best child (0). Each pop is
    the best remaining node whose parent is emitted, so any prefix of the order is the exact top set.

    `child_scores(parent depth, parent rank or None, on_chain)` -> [(s, rank)] best first replaces the
    drafter's scores (on_chain: the parent is the all-rank-0 path); batching.calibrated_order uses it.
    """
    D = lat.positions if max_depth is None else min(max_depth, lat.positions)
    if D <= 0:
        return
    nodes, depth, chain, orders, heap, tie = [(-1, -1, 0.0)], [0], [True], {}, [], 0

    def push(p: int, c: int):
        nonlocal tie
        if p not in orders:
            prev = nodes[p][1] if p else None
            orders[p] = (child_scores(depth[p], prev, chain[p]) if child_scores is not None
                         else _child_order(lat, depth[p], prev, conditioned))
        if c < len(orders[p]):
            heapq.heappush(heap, (-(nodes[p][2] + orders[p][c][0]), tie, p, c))
            tie += 1

    push(0, 0)
    while heap:
        neg, _, p, c = heapq.heappop(heap)
        r = orders[p][c][1]
        nodes.append((p, r, -neg))
        depth.append(depth[p] + 1)
        chain.append(chain[p] and r == 0)
        push(p, c + 1)
        if depth[-1] < D:
            push(len(nodes) - 1, 0)
        yield nodes[-1]


def best_first(lat: Lattice, root: int, budget: int, max_depth: int | None = None, conditioned: bool = True) -> Tree:
    """The `budget` nodes of highest path score Σ s(child | parent): the first `budget` of
    `best_first_order`."""
    D = _limits(lat, budget, max_depth)
    return _make(lat, root, [(-1, -1, 0.0)] + list(islice(best_first_order(lat, D, conditioned), budget)))


def eagle2(lat: Lattice, root: int, budget: int, max_depth: int | None = None, conditioned: bool = True,
           topk: int = 4) -> Tree:
    """EAGLE-2: expand by beam, then rerank. At each depth the `topk` best frontier nodes (by path score)
    each propose their `topk` best children; every proposed node joins a pool; finally the `budget`
    best of the pool by path score are kept (prefix-closed, see the module docstring)."""
    D = _limits(lat, budget, max_depth)
    pool, frontier = [(-1, -1, 0.0)], [0]
    for d in range(D):
        new = []
        for p in frontier:
            for s, r in _child_order(lat, d, pool[p][1] if p else None, conditioned)[:topk]:
                pool.append((p, r, pool[p][2] + s))
                new.append(len(pool) - 1)
        frontier = sorted(new, key=lambda i: (-pool[i][2], i))[:topk]
        if not frontier:
            break
    keep = sorted(sorted(range(1, len(pool)), key=lambda i: (-pool[i][2], i))[:budget])
    index = {0: 0, **{old: new + 1 for new, old in enumerate(keep)}}
    return _make(lat, root, [pool[0]] + [(index[pool[i][0]], pool[i][1], pool[i][2]) for i in keep])


def sequoia(lat: Lattice, root: int, budget: int, max_depth: int | None = None, conditioned: bool = True,
            rates: torch.Tensor | None = None) -> Tree:
    """Sequoia-style static tree. rates[d, r] = P(the target's token at depth d+1 is the parent's r-th
    ranked child | the walk reached depth d). With independent positions the expected accepted length is
    1 + Σ_nodes Π_path rates, so the best static shape of `budget` nodes is the best-first tree over
    log(rates) (what Sequoia's DP finds). The shape (a tree of ranks) is fixed in advance and then filled
    with this lattice's candidates: rank r under a node = that node's r-th best child in the lattice."""
    if rates is None:
        rates = sequoia_prior(max(lat.positions, 1), max(lat.topk, 1))
    rates = torch.as_tensor(rates, dtype=torch.float64)
    D = min(_limits(lat, budget, max_depth), rates.shape[0])
    k = rates.shape[1]
    shape_lat = Lattice(torch.arange(k).repeat(D, 1), rates[:D].log())
    shape = best_first(shape_lat, 0, budget, D)
    nodes, where = [(-1, -1, 0.0)], {0: 0}        # shape node -> tree node
    for i in range(1, len(shape)):
        p = where.get(int(shape.parents[i]))
        if p is None:
            continue
        order = _child_order(lat, int(shape.depths[i]) - 1, nodes[p][1] if p else None, conditioned)
        r = int(shape.tokens[i])
        if r < len(order):
            nodes.append((p, order[r][1], nodes[p][2] + order[r][0]))
            where[i] = len(nodes) - 1
    return _make(lat, root, nodes)


def sequoia_prior(depth: int, k: int) -> torch.Tensor:
    """A generic rate table when no recording is at hand: 0.6 for the best child, halving per rank."""
    return (0.6 * 0.5 ** torch.arange(k, dtype=torch.float64)).repeat(depth, 1)


def acceptance_rates(steps, depth: int, k: int, conditioned: bool = True) -> torch.Tensor:
    """Estimate Sequoia's rates[d, r] from (lattice, target continuation) pairs: walk the target's tokens
    down the lattice; at depth d count which ranked child (in `_child_order`) the target took."""
    hits = torch.zeros(depth, k, dtype=torch.float64)
    seen = torch.zeros(depth, dtype=torch.float64)
    for lat, cont in steps:
        rank = None
        for d in range(min(depth, lat.positions, len(cont))):
            seen[d] += 1
            order = [r for _, r in _child_order(lat, d, rank, conditioned)]
            ranked = [int(lat.ids[d, r]) for r in order]
            if int(cont[d]) not in ranked:
                break
            j = ranked.index(int(cont[d]))
            if j >= k:
                break
            hits[d, j] += 1
            rank = order[j]
    return hits / seen.clamp(min=1)[:, None]


BUILDERS = {
    "chain": chain,
    "best-first": best_first,
    "best-first-marginal": partial(best_first, conditioned=False),
    "eagle2": eagle2,
    "sequoia": sequoia,
}


def make_builder(name: str, budget: int, max_depth: int | None = None, **opts):
    """A callable (lattice, root_token) -> Tree for one builder name and node budget."""
    if name not in BUILDERS:
        raise TreeError(f"unknown tree builder {name!r}; expected one of {', '.join(BUILDERS)}")
    return partial(BUILDERS[name], budget=budget, max_depth=max_depth, **opts)
