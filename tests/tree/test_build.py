import itertools

import pytest

from medusa.tree import MedusaTree, default_tree
from medusa.tree.build import (
    build_tree_choices,
    default_accuracy_profile,
    default_tree_choices,
    expected_tokens_per_step,
)


def _prefix_closed_subsets(candidates, size):
    for combo in itertools.combinations(candidates, size):
        s = set(combo)
        if all(len(p) == 1 or p[:-1] in s for p in combo):
            yield combo


@pytest.mark.parametrize("accuracy", [
    [[0.6, 0.2], [0.5, 0.3], [0.4, 0.2]],
    [[0.3, 0.25], [0.9, 0.05], [0.2, 0.1]],
])
@pytest.mark.parametrize("num_nodes", [2, 4, 6])
def test_greedy_is_optimal_against_brute_force(accuracy, num_nodes):
    choices = build_tree_choices(accuracy, num_nodes)
    assert len(choices) == num_nodes - 1
    MedusaTree.from_choices(choices, num_heads=3)  # prefix-closed, valid
    candidates = [p for d in range(1, 4) for p in itertools.product(range(2), repeat=d)]
    best = max(expected_tokens_per_step(s, accuracy)
               for s in _prefix_closed_subsets(candidates, num_nodes - 1))
    assert expected_tokens_per_step(choices, accuracy) == pytest.approx(best)


def test_expected_tokens_by_hand():
    acc = [[0.5, 0.25], [0.4, 0.1]]
    assert expected_tokens_per_step([(0,), (1,), (0, 0)], acc) == pytest.approx(1 + 0.5 + 0.25 + 0.5 * 0.4)
    assert expected_tokens_per_step([(0,), (5,)], acc) == pytest.approx(1.5)  # ranks past the table: 0


def test_max_depth_and_budget():
    acc = default_accuracy_profile(5)
    choices = build_tree_choices(acc, 40, max_depth=2)
    assert len(choices) == 39 and max(len(c) for c in choices) == 2
    assert build_tree_choices(acc, 1) == []
    with pytest.raises(ValueError):
        build_tree_choices(acc, 0)


def _swaps(choices, heads, ranks):
    """Every tree one leaf-for-frontier-node swap away from ``choices`` (still prefix-closed)."""
    tree = set(choices)
    leaves = [p for p in tree if not any(p + (r,) in tree for r in range(ranks))]
    frontier = [p + (r,) for p in [(), *tree] if len(p) < heads for r in range(ranks) if p + (r,) not in tree]
    for leaf in leaves:
        for node in frontier:
            if node[:-1] != leaf:
                yield [p for p in choices if p != leaf] + [node]


@pytest.mark.parametrize("heads", [1, 3, 5])
def test_default_tree_is_locally_optimal_on_its_profile(heads):
    """The 64-node default tree (11 with one head: its 10 ranks) cannot gain expected tokens per step by
    trading any leaf for any other node, and smaller defaults are worth less."""
    profile = default_accuracy_profile(heads)
    tree = default_tree(heads)
    assert len(tree) == (11 if heads == 1 else 64) and tree.depth <= heads
    value = expected_tokens_per_step(tree.choices, profile)
    swaps = list(_swaps(tree.choices, heads, len(profile[0])))
    assert bool(swaps) == (heads > 1)  # one head: all of its ranks are in the tree, nothing to trade
    assert all(expected_tokens_per_step(s, profile) <= value + 1e-12 for s in swaps)
    smaller = [expected_tokens_per_step(default_tree_choices(heads, n), profile) for n in (2, 4, 8)]
    assert smaller == sorted(smaller) and smaller[-1] < value


@pytest.mark.parametrize("heads", [1, 5, 7])
def test_default_profile_is_a_plausible_accuracy_table(heads):
    """Probabilities: a head's ranks never gain accuracy, its top-k mass stays below 1, and a deeper head's
    top-1 and top-k are never above a shallower one's (it guesses further ahead)."""
    profile = default_accuracy_profile(heads, topk=10)
    assert len(profile) == heads and all(len(row) == 10 for row in profile)
    for row in profile:
        assert all(0 < a for a in row) and sum(row) < 1
        assert all(a >= b for a, b in zip(row, row[1:]))
    for shallow, deep in zip(profile, profile[1:]):
        assert shallow[0] >= deep[0] and sum(shallow) >= sum(deep)


def test_default_tree_is_optimal_on_its_profile_for_small_budgets():
    """Brute force on the profile's top 3 ranks of 3 heads: no prefix-closed tree of the size beats it."""
    acc = [row[:3] for row in default_accuracy_profile(3)]
    candidates = [p for d in range(1, 4) for p in itertools.product(range(3), repeat=d)]
    for num_nodes in (2, 4, 5):
        choices = build_tree_choices(acc, num_nodes)
        best = max(expected_tokens_per_step(s, acc)
                   for s in _prefix_closed_subsets(candidates, num_nodes - 1))
        assert expected_tokens_per_step(choices, acc) == pytest.approx(best)


@pytest.mark.parametrize("num_nodes", [2, 3, 5, 7])
def test_frequencies_rank_first_and_the_product_breaks_ties(num_nodes):
    """With measured path frequencies the builder keeps the tree of most accepted positions (brute force),
    even where the product of accuracies ranks the nodes the other way round."""
    acc = [[0.2, 0.6], [0.7, 0.1], [0.5, 0.4]]  # the product prefers rank 1 at depth 1
    freq = {(0,): 0.5, (1,): 0.3, (0, 0): 0.3, (0, 1): 0.1, (1, 0): 0.1, (0, 0, 0): 0.2, (0, 0, 1): 0.05}
    choices = build_tree_choices(acc, num_nodes, frequencies=freq)
    assert len(choices) == num_nodes - 1
    MedusaTree.from_choices(choices, num_heads=3)  # prefix-closed, valid
    candidates = [p for d in range(1, 4) for p in itertools.product(range(2), repeat=d)]
    best = max(sum(freq.get(p, 0.0) for p in s) for s in _prefix_closed_subsets(candidates, num_nodes - 1))
    assert sum(freq.get(p, 0.0) for p in choices) == pytest.approx(best)
    tied = build_tree_choices(acc, 3, frequencies={(0,): 0.4, (1,): 0.4})
    assert tied == [(1,), (0,)]  # equal frequency: the larger product (0.6 > 0.2) first
