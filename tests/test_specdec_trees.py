"""Tree builders, tree attention inputs and greedy verification on small hand-made lattices."""

import itertools
import math

import pytest
import torch

from w12.specdec.errors import LatticeError, TreeError
from w12.specdec.lattice import Lattice
from w12.specdec.trees import Tree, acceptance_rates, best_first, chain, eagle2, make_builder, sequoia
from w12.specdec.verify import accept, walk

BUILDERS = ["chain", "best-first", "best-first-marginal", "eagle2", "sequoia"]


def random_lattice(P=5, k=4, cond=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(50, generator=g)[:k] for _ in range(P)])
    logp = torch.log_softmax(torch.randn(P, k + 1, generator=g, dtype=torch.float64) * 2, -1)[:, :k]
    c = torch.log_softmax(torch.randn(P, k, k + 1, generator=g, dtype=torch.float64) * 2, -1)[..., :k] if cond else None
    return Lattice(ids, logp, c)


def assert_valid(tree: Tree, lat: Lattice, budget: int, max_depth: int):
    tree.check()
    assert len(tree) - 1 <= budget and int(tree.depths.max()) <= max_depth
    ids = lat.ids.tolist()
    for i in range(1, len(tree)):                       # every node holds a candidate of its position
        assert int(tree.tokens[i]) in ids[int(tree.depths[i]) - 1]
        assert tree.scores[i] <= tree.scores[tree.parents[i]] + 1e-12
    kids = [(int(tree.parents[i]), int(tree.tokens[i])) for i in range(1, len(tree))]
    assert len(kids) == len(set(kids))                  # no duplicate child under one parent


@pytest.mark.parametrize("name", BUILDERS)
@pytest.mark.parametrize("budget,max_depth", [(0, None), (1, None), (7, 3), (16, None), (40, 4)])
@pytest.mark.parametrize("cond", [False, True])
def test_builders_give_valid_prefix_closed_trees(name, budget, max_depth, cond):
    lat = random_lattice(cond=cond, seed=budget)
    tree = make_builder(name, budget, max_depth)(lat, 7)
    assert int(tree.tokens[0]) == 7 and int(tree.parents[0]) == -1
    assert_valid(tree, lat, budget, max_depth if max_depth is not None else lat.positions)


def all_paths(lat: Lattice, conditioned: bool, max_depth: int):
    """Every lattice path as (ranks, path score), by brute force."""
    out = []
    for d in range(1, max_depth + 1):
        for ranks in itertools.product(range(lat.topk), repeat=d):
            s = lat.logp[0, ranks[0]].item()
            for i in range(1, d):
                s += (lat.cond[i, ranks[i - 1], ranks[i]] if conditioned and lat.cond is not None
                      else lat.logp[i, ranks[i]]).item()
            out.append((ranks, s))
    return out


@pytest.mark.parametrize("cond", [False, True])
@pytest.mark.parametrize("budget", [1, 5, 12, 30])
def test_best_first_is_the_top_budget_set_by_path_score(cond, budget):
    lat = random_lattice(P=4, k=3, cond=cond, seed=budget)
    tree = best_first(lat, 0, budget)
    best = sorted((s for _, s in all_paths(lat, True, 4)), reverse=True)[:budget]
    assert sorted(tree.scores[1:].tolist(), reverse=True) == pytest.approx(best)


def test_chain_follows_the_conditioned_argmax():
    lat = random_lattice(P=4, k=3, cond=True)
    tree = chain(lat, 0, 10)
    assert tree.parents.tolist() == [-1, 0, 1, 2, 3]
    rank = int(lat.logp[0].argmax())
    assert int(tree.tokens[1]) == int(lat.ids[0, rank])
    for d in range(1, 4):
        rank = int(lat.cond[d, rank].argmax())
        assert int(tree.tokens[d + 1]) == int(lat.ids[d, rank])


def test_eagle2_top1_is_the_chain_and_sequoia_follows_its_rates():
    lat = random_lattice(P=5, k=4)
    assert eagle2(lat, 0, 5, topk=1).tokens.tolist() == chain(lat, 0, 5).tokens.tolist()
    # rates that make rank 0 the only likely child at every depth: a static chain of the top-1 candidates
    rates = torch.tensor([[0.9, 0.0, 0.0, 0.0]] * 5, dtype=torch.float64)
    assert sequoia(lat, 0, 10, rates=rates).tokens.tolist() == chain(lat, 0, 5).tokens.tolist()


def test_padded_slots_are_never_used():
    ids = torch.tensor([[5, -1], [6, 7]])
    logp = torch.tensor([[0.0, -math.inf], [-0.1, -2.0]])
    for name in BUILDERS:
        tree = make_builder(name, 10)(Lattice(ids, logp), 1)
        assert -1 not in tree.tokens.tolist()


def test_mask_and_positions():
    tree = Tree(torch.tensor([9, 1, 2, 3, 4]), torch.tensor([-1, 0, 0, 1, 3]), torch.tensor([0, 1, 1, 2, 3]),
                torch.zeros(5, dtype=torch.float64)).check()
    m = tree.mask()
    assert m.tolist() == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0], [1, 1, 0, 1, 1]]
    assert tree.position_ids(10).tolist() == [10, 11, 11, 12, 13]


def test_accept_longest_matching_path_plus_bonus():
    tree = Tree(torch.tensor([9, 1, 2, 3, 4]), torch.tensor([-1, 0, 0, 1, 3]), torch.tensor([0, 1, 1, 2, 3]),
                torch.zeros(5, dtype=torch.float64))
    # target argmax after each node: root -> 1, node1 -> 3, node3 -> 8 (not a child): accept 1, 3, bonus 8
    assert accept(tree, [1, 3, 0, 8, 0]) == ([1, 3], 8)
    assert accept(tree, [2, 0, 5, 0, 0]) == ([2], 5)
    assert accept(tree, [7, 0, 0, 0, 0]) == ([], 7)
    assert accept(tree, torch.tensor([1, 3, 0, 4, 6])) == ([1, 3, 4], 6)
    assert walk(tree, [1, 3, 4, 6, 6]) == 4 and walk(tree, [2, 9]) == 2 and walk(tree, [1, 3, 4]) == 3


def test_acceptance_rates_count_ranks_per_depth():
    lat = Lattice(torch.tensor([[1, 2], [3, 4]]), torch.log(torch.tensor([[0.6, 0.3], [0.5, 0.4]])))
    rates = acceptance_rates([(lat, [1, 4]), (lat, [2, 3]), (lat, [9, 9])], depth=2, k=2)
    assert rates.tolist() == [[1 / 3, 1 / 3], [0.5, 0.5]]


def test_errors():
    with pytest.raises(TreeError, match="unknown tree builder"):
        make_builder("beam", 4)
    with pytest.raises(TreeError, match="budget"):
        best_first(random_lattice(), 0, -1)
    with pytest.raises(LatticeError, match=r"\[P, k\]"):
        Lattice(torch.zeros(2, 3, dtype=torch.int64), torch.zeros(2, 2))
    with pytest.raises(LatticeError, match="cond"):
        Lattice(torch.zeros(2, 3, dtype=torch.int64), torch.zeros(2, 3), torch.zeros(2, 3, 2))
    with pytest.raises(TreeError, match="parent"):
        Tree(torch.tensor([0, 1]), torch.tensor([-1, 1]), torch.tensor([0, 1]), torch.zeros(2)).check()


def test_lattice_dict_round_trip():
    lat = random_lattice(cond=True)
    lat.logp[1, 2] = -math.inf
    back = Lattice.from_dict(lat.to_dict())
    assert torch.equal(back.ids, lat.ids) and torch.equal(back.logp, lat.logp) and torch.equal(back.cond, lat.cond)
    with pytest.raises(LatticeError, match="not a lattice"):
        Lattice.from_dict({"ids": [[1]]})
