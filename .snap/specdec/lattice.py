"""The lattice: what a drafter returns for one step.

For P positions after the committed prefix, the top-k candidate token ids and their log-probs
(position i predicts the token i+1 places after the tree's root). A parent-conditioned ("Markov head")
drafter also gives cond[i, a, b] = log p(ids[i, b] | token at i-1 is ids[i-1, a]) for i >= 1.
Unused slots (a drafter with fewer than k candidates) have id -1 and log-prob -inf; builders skip them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .errors import LatticeError


@dataclass
class Lattice:
    ids: torch.Tensor             # [P, k] int64
    logp: torch.Tensor            # [P, k] float64, marginal log p(ids[i, j]) at position i
    cond: torch.Tensor | None = None  # [P, k, k] float64 or None; cond[0] is unused (parent = root)

    def __post_init__(self):
        self.ids = torch.as_tensor(self.ids, dtype=torch.int64)
        self.logp = torch.as_tensor(self.logp, dtype=torch.float64)
        if self.ids.ndim != 2 or self.logp.shape != self.ids.shape:
            raise LatticeError(f"ids and logp must both be [P, k], found {list(self.ids.shape)} and {list(self.logp.shape)}")
        if self.cond is not None:
            self.cond = torch.as_tensor(self.cond, dtype=torch.float64)
            P, k = self.ids.shape
            if self.cond.shape != (P, k, k):
                raise LatticeError(f"cond must be [P, k, k] = [{P}, {k}, {k}], found {list(self.cond.shape)}")

    def lists(self):
        """(ids, logp, cond) as nested Python lists, computed once (tree builders read them often)."""
        if getattr(self, "_lists", None) is None:
            self._lists = (self.ids.tolist(), self.logp.tolist(), None if self.cond is None else self.cond.tolist())
        return self._lists

    @property
    def positions(self) -> int:
        return self.ids.shape[0]

    @property
    def topk(self) -> int:
        return self.ids.shape[1]

    @staticmethod
    def empty() -> "Lattice":
        return Lattice(torch.zeros(0, 0, dtype=torch.int64), torch.zeros(0, 0))

    @staticmethod
    def from_logits(logits: torch.Tensor, k: int, markov: torch.Tensor | None = None) -> "Lattice":
        """Top-k of log_softmax(logits[i]) for each of P rows. With `markov` ([P, k, V] logits of each
        position given each candidate parent at i-1), cond[i, a, :] = log_softmax(markov[i, a])[ids[i]]."""
        logp_all = torch.log_softmax(logits.double(), -1)
        logp, ids = logp_all.topk(min(k, logits.shape[-1]), -1)
        cond = None
        if markov is not None:
            lp = torch.log_softmax(markov.double(), -1)                        # [P, k, V]
            cond = torch.gather(lp, 2, ids[:, None, :].expand(-1, lp.shape[1], -1))
        return Lattice(ids, logp, cond)

    # --- JSON-friendly form (recordings are JSON, never pickle) ---------------------------------
    def to_dict(self) -> dict:
        d = {"ids": self.ids.tolist(), "logp": [[_f(x) for x in row] for row in self.logp.tolist()]}
        if self.cond is not None:
            d["cond"] = [[[_f(x) for x in r] for r in m] for m in self.cond.tolist()]
        return d

    @staticmethod
    def from_dict(d: dict) -> "Lattice":
        try:
            ids = torch.tensor(d["ids"], dtype=torch.int64)
            if ids.numel() == 0:
                return Lattice.empty()
            logp = torch.tensor([[_unf(x) for x in row] for row in d["logp"]], dtype=torch.float64)
            cond = d.get("cond")
            if cond is not None:
                cond = torch.tensor([[[_unf(x) for x in r] for r in m] for m in cond], dtype=torch.float64)
            return Lattice(ids, logp, cond)
        except (KeyError, TypeError, ValueError, RuntimeError) as e:
            raise LatticeError(f"not a lattice record ({e}); expected keys ids, logp[, cond]") from e


def _f(x: float):
    return x if math.isfinite(x) else None       # JSON has no -inf: store null


def _unf(x):
    return -math.inf if x is None else float(x)
