"""closed_keys ranks every node strictly below its parent, whatever the float32 ties; pick_tree keeps the best
ancestor-closed set in level order."""

import torch

from medusa.decoding.draft_growth import closed_keys, pick_tree


def test_closed_keys_break_float32_ties_below_the_parent():
    raw = torch.tensor([[-17.0, 0.0, -17.0, -17.0, -17.0]])  # levels: [0, 1] [2, 3 of 0; 4 of 1]
    parent = torch.tensor([[-1, -1, 0, 0, 1]])
    key = closed_keys(raw, parent, [2, 3])
    assert key[0, 2] < key[0, 0] and key[0, 3] < key[0, 0]  # tied with their parent in float32: now below it
    assert key[0, 4] == -17.0  # already below its parent: unchanged
    assert key[0, 0] == -17.0 and key[0, 1] == 0.0  # the root's children keep their score


def test_closed_keys_stay_strict_at_minus_infinity():
    raw = torch.tensor([[float("-inf"), float("-inf"), float("-inf")]])
    key = closed_keys(raw, torch.tensor([[-1, 0, 1]]), [1, 1, 1])
    assert key[0, 0] > key[0, 1] > key[0, 2]


def test_pick_tree_keeps_parents_with_their_children():
    raw = torch.tensor([[-17.0, 0.0, -17.0, -17.0, -17.0]])
    parent = torch.tensor([[-1, -1, 0, 0, 1]])
    token = torch.tensor([[10, 11, 12, 13, 14]])
    levels = torch.tensor([1, 1, 2, 2, 2])
    for n in range(2, 7):
        tree, picked = pick_tree(torch.tensor([3]), closed_keys(raw, parent, [2, 3]), token, parent, levels,
                                 n, 2, 3, torch.float32)
        kept = set(picked[0].tolist())
        assert all(int(parent[0, i]) in kept for i in kept if int(parent[0, i]) >= 0)
        assert picked[0].tolist() == sorted(kept) and int(tree.tokens[0, 0]) == 3
        for i in range(1, n):
            assert int(tree.depths[0, i]) == int(tree.depths[0, tree.parents[0, i]]) + 1
