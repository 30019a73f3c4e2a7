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
    best = max(expected_tokens_per_step(s, accuracy) for s in _prefix_closed_subsets(candidates, num_nodes - 1))
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


def test_default_tree_is_the_builder_on_the_profile():
    for heads in (1, 3, 5, 7):
        tree = default_tree(heads)
        assert len(tree) == min(64, 11) if heads == 1 else len(tree) == 64
        assert tree.depth <= heads
        assert tree.choices == sorted(map(tuple, build_tree_choices(default_accuracy_profile(heads), 64)),
                                      key=lambda p: (len(p), p))
        assert default_tree_choices(heads, 64) == build_tree_choices(default_accuracy_profile(heads), 64)
    profile = default_accuracy_profile(5)
    assert [round(r[0], 2) for r in profile] == [0.73, 0.58, 0.47, 0.41, 0.35]
    assert [round(sum(r[:5]), 2) for r in profile] == [0.93, 0.83, 0.73, 0.65, 0.59]
