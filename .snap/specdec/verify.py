"""Greedy tree verification: the longest root path the target agrees with, plus its bonus token."""

from __future__ import annotations

import torch

from .trees import Tree


def accept(tree: Tree, target_next: torch.Tensor | list[int]) -> tuple[list[int], int]:
    """target_next[i] = the target's argmax after node i (its logits row for node i).

    Walk from the root: the target wants t = target_next[node]; if a child of the node holds t, move there
    and repeat; otherwise t is the bonus token. Returns (accepted node indices, root excluded; bonus).
    Every accepted token equals the target's argmax on the path verified by this one pass, so greedy
    speculative output is the target's greedy output. τ = len(accepted) + 1.
    """
    nxt = target_next.tolist() if isinstance(target_next, torch.Tensor) else list(target_next)
    children = tree.children()
    path, node = [], 0
    while (child := children[node].get(nxt[node])) is not None:
        path.append(child)
        node = child
    return path, nxt[node]


def walk(tree: Tree, continuation: list[int]) -> int:
    """τ of one step when the target's greedy continuation from the root is known (exact replay):
    accepted nodes + 1, capped by the continuation's length."""
    children = tree.children()
    node, n = 0, 0
    while n < len(continuation) and (child := children[node].get(continuation[n])) is not None:
        node, n = child, n + 1
    return min(n + 1, max(len(continuation), 1))
