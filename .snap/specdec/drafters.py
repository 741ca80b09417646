"""Drafters behind one small interface: `draft(ids) -> Lattice`, where ids = every committed token
(prompt + output; the last one is the tree's root) and the lattice covers the next P positions.

* ModelDrafter — any Hugging Face causal LM sharing the target's tokenizer; drafts P tokens one at a
  time (its own argmax) and records its top-k at each step as the lattice.
* NgramDrafter — prompt lookup: continuations of the longest earlier match of the context's last n
  tokens; counts give marginal and parent-conditioned scores.
* BlockDrafter — the interface of a parallel drafter: P positions from one pass, optionally with a
  Markov head B(parent, ·) as in DSpark: log p_i(v | x_{i-1}) = log_softmax(U_i + B(x_{i-1}))[v].
"""

from __future__ import annotations

import copy
import math
from collections import Counter

import torch
from transformers import DynamicCache

from .errors import DrafterError
from .lattice import Lattice


class ModelDrafter:
    """Sequential drafting with any HF causal LM: P steps of its own top-1, top-k recorded at each."""

    def __init__(self, model, positions: int = 8, topk: int = 16):
        self.model, self.positions, self.topk = model, positions, topk
        self._ids: list[int] = []
        self._cache = None

    @torch.no_grad()
    def draft(self, ids: list[int]) -> Lattice:
        # Reuse the cache of the longest common prefix with the previous call (always >= 1 token to feed).
        m = 0
        while m < min(len(ids) - 1, len(self._ids)) and ids[m] == self._ids[m]:
            m += 1
        if self._cache is None or m == 0:
            self._cache, m = DynamicCache(config=self.model.config), 0
        else:
            self._cache.crop(-(self._cache.get_seq_length() - m))
        rows = [self._step(ids[m:])]
        for _ in range(self.positions - 1):
            rows.append(self._step([int(rows[-1].topk(1).indices)]))   # continue with its own top-1
        self._cache.crop(-(self.positions - 1))
        self._ids = list(ids)
        return Lattice.from_logits(torch.stack(rows), self.topk)

    def _step(self, new: list[int]) -> torch.Tensor:
        out = self.model(input_ids=torch.tensor([new]), cache=self._cache, use_cache=True, logits_to_keep=1)
        return out.logits[0, -1].float()

    @torch.no_grad()
    def record_dense(self, prompt: list[int], tokens: list[int]) -> list[Lattice]:
        """The lattice after every prefix prompt + tokens[:j], j < T, in P batched passes instead of T·P:
        pass 0 runs the trunk (prompt + tokens[:-1]) causally; pass s adds one node per j, at position
        Lp + j + s - 1, that sees trunk[:Lp + j] and the earlier nodes of its own branch j."""
        Lp, T = len(prompt), len(tokens)
        if T == 0:
            return []
        trunk = list(prompt) + list(tokens[:-1])
        cache = DynamicCache(config=self.model.config)
        logits = self.model(input_ids=torch.tensor([trunk]), cache=cache, use_cache=True).logits[0, Lp - 1:].float()
        rows = [[row] for row in logits]
        C0, j = len(trunk), torch.arange(T)
        dtype = self.model.dtype
        for s in range(1, self.positions):
            g = torch.stack([r[-1].topk(1).indices[0] for r in rows])
            C = cache.get_seq_length()
            keys = torch.arange(C + T)
            visible = keys[None, :] < (Lp + j)[:, None]                                 # trunk prefix
            for s2 in range(1, s + 1):                                                   # own branch
                visible[j, C0 + (s2 - 1) * T + j] = True
            mask = torch.zeros(visible.shape, dtype=dtype).masked_fill_(~visible, torch.finfo(dtype).min)
            out = self.model(input_ids=g[None], position_ids=(Lp + j + s - 1)[None], attention_mask=mask[None, None],
                             cache=cache, use_cache=True).logits[0].float()
            for r, row in zip(rows, out):
                r.append(row)
        return [Lattice.from_logits(torch.stack(r), self.topk) for r in rows]


def truncated_copy(model, layers: int):
    """A drafter made of the target's first `layers` decoder layers + its final norm and LM head."""
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not 0 < layers <= len(inner.layers):
        raise DrafterError(f"cannot truncate {type(model).__name__} to {layers} layers (need model.model.layers "
                           f"with at least that many)")
    small = copy.deepcopy(model)
    small.model.layers = small.model.layers[:layers]
    small.config.num_hidden_layers = layers
    if getattr(small.config, "layer_types", None):
        small.config.layer_types = small.config.layer_types[:layers]
    return small


class NgramDrafter:
    def __init__(self, positions: int = 8, topk: int = 4, max_n: int = 4, min_n: int = 1):
        self.positions, self.topk, self.max_n, self.min_n = positions, topk, max_n, min_n

    def draft(self, ids: list[int]) -> Lattice:
        conts = []
        for n in range(self.max_n, self.min_n - 1, -1):       # longest suffix with an earlier match
            key = ids[-n:] if len(ids) > n else None
            conts = [ids[i + n:i + n + self.positions] for i in range(len(ids) - n - 1, -1, -1)
                     if key is not None and ids[i:i + n] == key]
            if conts:
                break
        P, k = max((len(c) for c in conts), default=0), self.topk
        if P == 0:
            return Lattice.empty()
        # marginal: log(count of v at offset i / matches); conditioned: log(count(a -> b) / count(a)).
        ids_t = torch.full((P, k), -1, dtype=torch.int64)
        logp = torch.full((P, k), -math.inf, dtype=torch.float64)
        cond = torch.full((P, k, k), -math.inf, dtype=torch.float64)
        for i in range(P):
            counts = Counter(c[i] for c in conts if len(c) > i)   # most recent match first on ties
            for r, (v, cnt) in enumerate(counts.most_common(k)):
                ids_t[i, r], logp[i, r] = v, math.log(cnt / len(conts))
        cand = ids_t.tolist()
        for i in range(1, P):
            for a in range(k):
                pa = [c for c in conts if len(c) > i and c[i - 1] == cand[i - 1][a]]
                for b in range(k):
                    cnt = sum(c[i] == cand[i][b] for c in pa)
                    if cnt:
                        cond[i, a, b] = math.log(cnt / len(pa))
        return Lattice(ids_t, logp, cond)


class BlockDrafter:
    """Parallel block drafter. Subclasses implement `block(ids) -> (U [P, V] logits, markov)` where
    markov is None or a callable B(parents [m] int64) -> [m, V] bias added to U_i for a parent token."""

    positions: int = 8
    topk: int = 16

    def block(self, ids: list[int]):
        raise NotImplementedError

    def draft(self, ids: list[int]) -> Lattice:
        U, markov = self.block(ids)
        U = U.double()
        if markov is None:
            return Lattice.from_logits(U, self.topk)
        U = U.clone()
        U[0] = U[0] + markov(torch.tensor([ids[-1]]))[0]          # the root is known: condition on it
        lat = Lattice.from_logits(U, self.topk)
        k = lat.topk
        rows = [U[0].expand(k, -1)] + [U[i][None] + markov(lat.ids[i - 1]) for i in range(1, len(U))]
        return Lattice.from_logits(U, self.topk, torch.stack(rows))
