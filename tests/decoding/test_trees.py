"""Decode-tree buffers of a small static tree, checked value by value, and the placement of the heads' top-k
tokens on its nodes."""

import torch

from medusa import MedusaTree
from medusa.decoding.proposals import place_topk
from medusa.decoding.trees import static_tree

CPU = torch.device("cpu")
# nodes (sorted by depth, then path): 0 (), 1 (0), 2 (1), 3 (2), 4 (0,0), 5 (0,1), 6 (1,1), 7 (0,0,0)
CHOICES = [[0], [1], [2], [0, 0], [0, 1], [1, 1], [0, 0, 0]]
ANCESTORS = [[0, 0, 0, 0], [0, 1, 0, 0], [0, 2, 0, 0], [0, 3, 0, 0],
             [0, 1, 4, 0], [0, 1, 5, 0], [0, 2, 6, 0], [0, 1, 4, 7]]


def test_decode_tree_buffers_of_a_small_tree():
    dt = static_tree(MedusaTree.from_choices(CHOICES), CPU, torch.float32)
    assert (dt.num_nodes, dt.depth, dt.kmax) == (8, 3, 3)  # ranks 0..2 at depth 1
    assert dt.depths.tolist() == dt.depth_list == [0, 1, 1, 1, 2, 2, 2, 3]
    assert dt.parents.tolist() == [0, 0, 0, 0, 1, 1, 2, 4]  # the root's parent clamped to 0
    assert dt.children.tolist() == [[1, 2, 3], [4, 5, -1], [-1, 6, -1], [-1, -1, -1],
                                    [7, -1, -1], [-1, -1, -1], [-1, -1, -1], [-1, -1, -1]]
    assert dt.ancestors.tolist() == ANCESTORS
    # node i >= 1 in the flattened [K * kmax] top-k table: (depth - 1) * kmax + its rank
    assert dt.topk_index.tolist() == [0, 1, 2, 3, 4, 4, 6]
    # one row per leaf (3, 5, 6, 7): its path, padded with 0; valid marks the real nodes after the root
    assert dt.retrieve.tolist() == [[0, 3, 0, 0], [0, 1, 5, 0], [0, 2, 6, 0], [0, 1, 4, 7]]
    assert dt.retrieve_valid.tolist() == [[True, False, False], [True, True, False], [True, True, False],
                                          [True, True, True]]
    assert not dt.per_row and not hasattr(dt, "hydra_levels")  # its users keep what they derive from it


def test_float_mask_lets_each_node_see_itself_and_its_ancestors():
    dt = static_tree(MedusaTree.from_choices(CHOICES), CPU, torch.bfloat16)
    assert dt.float_mask.shape == (8, 8) and dt.dtype == torch.bfloat16
    neg = torch.finfo(torch.bfloat16).min
    for i, row in enumerate(ANCESTORS):
        seen = set(row)  # the node and its ancestors (the padding is 0, the root: an ancestor of all)
        for j in range(8):
            assert float(dt.float_mask[i, j]) == (0.0 if j in seen else neg), (i, j)
    assert int((dt.float_mask == 0).sum()) == 1 + 2 * 3 + 3 * 3 + 4  # 1 + depth per node, summed


def test_decode_tree_is_built_once_per_device_and_dtype():
    tree = MedusaTree.from_choices(CHOICES)
    dt = static_tree(tree, CPU, torch.float32)
    assert static_tree(tree, CPU, torch.float32) is dt
    half = static_tree(tree, CPU, torch.float16)
    assert half is not dt and half.float_mask.dtype == torch.float16
    assert torch.equal(half.float_mask == 0, dt.float_mask == 0)


def test_place_topk_places_head_ranks():
    tree = MedusaTree.from_choices([[0], [1], [0, 0], [0, 2]])
    dt = static_tree(tree, CPU, torch.float32)
    head_topk = torch.tensor([[[10, 11, 12]], [[20, 21, 22]]])  # [K=2, B=1, kmax=3]
    tokens = place_topk(torch.tensor([7]), head_topk, dt)
    assert tokens.tolist() == [[7, 10, 11, 20, 22]]  # nodes: (), (0), (1), (0,0), (0,2)


def test_place_topk_places_each_rows_head_ranks():
    dt = static_tree(MedusaTree.from_choices(CHOICES), CPU, torch.float32)
    k, r = torch.arange(3).view(3, 1, 1), torch.arange(3).view(1, 1, 3)
    b = torch.arange(2).view(1, 2, 1)
    head_topk = 100 * (k + 1) + 10 * b + r  # [K=3, B=2, kmax=3]: head k+1, row b, rank r
    tokens = place_topk(torch.tensor([7, 8]), head_topk, dt)  # [B, N]
    # node (r1..rd) holds head d's rank-rd token, whatever its parent: (0,1) and (1,1) hold the same
    assert tokens.tolist() == [[7, 100, 101, 102, 200, 201, 201, 300],
                               [8, 110, 111, 112, 210, 211, 211, 310]]
