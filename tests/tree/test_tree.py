"""MedusaTree: masks / depths / paths for hand-written trees, validation, json, and property tests."""

import json
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from medusa import MedusaTree
from medusa.decoding.trees import static_tree
from medusa.tree import TreeError, default_tree


def test_hand_written_tree():
    tree = MedusaTree.from_choices([[1], [0, 0], [0], [0, 1], [0, 0, 0]])
    assert tree.paths == [(), (0,), (1,), (0, 0), (0, 1), (0, 0, 0)]
    assert tree.depths.tolist() == [0, 1, 1, 2, 2, 3]
    assert tree.parents == [-1, 0, 0, 1, 1, 3]
    expected = torch.tensor([
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 0, 1, 0, 0, 0],
        [1, 1, 0, 1, 0, 0],
        [1, 1, 0, 0, 1, 0],
        [1, 1, 0, 1, 0, 1],
    ], dtype=torch.bool)
    assert torch.equal(tree.attention_mask, expected)
    assert tree.retrieve_indices.tolist() == [[0, 2, -1, -1], [0, 1, 4, -1], [0, 1, 3, 5]]
    assert tree.topk_per_depth == [2, 2, 1]
    assert len(tree) == 6 and tree.depth == 3


def test_root_only_tree():
    tree = MedusaTree.from_choices([])
    assert tree.paths == [()] and tree.attention_mask.tolist() == [[True]] and tree.depth == 0


@pytest.mark.parametrize("choices, message", [
    ([[0], [-1]], "negative rank"),
    ([[0], [0, 0], [0, 0, 0]], "only 2 heads"),
    ([[0], [1, 0]], "no parent"),
    ([[0], [0]], "twice"),
    ([[]], "empty"),
    ([[0], ["a"]], "integer ranks"),
])
def test_validation_errors(choices, message):
    with pytest.raises(TreeError, match=message):
        MedusaTree(choices, num_heads=2)


def test_json_round_trip_and_errors(tmp_path):
    tree = MedusaTree.from_choices([[0], [1], [0, 0]], num_heads=3, calibration={"nodes": 4})
    path = tmp_path / "tree.json"
    tree.to_json(path)
    back = MedusaTree.from_json(path)
    assert back == tree and back.num_heads == 3 and back.calibration == {"nodes": 4}
    (tmp_path / "bare.json").write_text(json.dumps([[0], [0, 0]]))
    assert MedusaTree.from_json(tmp_path / "bare.json").paths == [(), (0,), (0, 0)]
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(TreeError, match="bad.json"):
        MedusaTree.from_json(tmp_path / "bad.json")
    (tmp_path / "deep.json").write_text(json.dumps({"format": "medusa-tree", "version": 1, "num_heads": 1,
                                                    "choices": [[0], [0, 0]]}))
    with pytest.raises(TreeError, match="deep.json"):
        MedusaTree.from_json(tmp_path / "deep.json")


def test_default_tree_and_buffers_cached_per_device():
    tree = default_tree(4)
    assert len(tree) == 64 and tree.depth <= 4
    assert tree.buffers("cpu") is tree.buffers(torch.device("cpu"))
    assert static_tree(tree, torch.device("cpu"), torch.float32) is static_tree(tree, torch.device("cpu"),
                                                                                 torch.float32)


@st.composite
def random_trees(draw):
    """Random valid trees: grow by giving a random existing node its next unused (or a skipped) rank."""
    paths = [()]
    children: dict[tuple, set] = {(): set()}
    for _ in range(draw(st.integers(0, 40))):
        parent = draw(st.sampled_from(paths))
        if len(parent) >= 5:
            continue
        rank = draw(st.integers(0, 6))
        child = parent + (rank,)
        if child in children:
            continue
        paths.append(child)
        children[child] = set()
        children[parent].add(rank)
    order = draw(st.permutations(paths[1:]))
    return [list(p) for p in order]


@settings(max_examples=150, deadline=None)
@given(random_trees())
def test_tree_properties(choices):
    tree = MedusaTree.from_choices(choices)
    n = len(tree)
    assert n == len(choices) + 1 and tree.paths[0] == ()
    assert set(tree.paths[1:]) == {tuple(c) for c in choices}
    index = {p: i for i, p in enumerate(tree.paths)}
    for i, p in enumerate(tree.paths):
        assert tree.depths[i] == len(p)
        if i:
            assert tree.parents[i] == index[p[:-1]] < i  # parents come first
        for j, q in enumerate(tree.paths):
            assert bool(tree.attention_mask[i, j]) == (p[:len(q)] == q and len(q) <= len(p))
    # Retrieval rows are exactly the root-to-leaf paths and cover every node.
    leaves = {i for i in range(n) if i not in tree.parents}
    rows = [[x for x in r if x >= 0] for r in tree.retrieve_indices.tolist()]
    assert {r[-1] for r in rows} == leaves and len(rows) == len(leaves)
    for r in rows:
        assert [tree.paths[x] for x in r] == [tree.paths[r[-1]][:d] for d in range(len(r))]
    assert {x for r in rows for x in r} == set(range(n))
    for d, k in enumerate(tree.topk_per_depth, start=1):
        assert k == 1 + max(p[-1] for p in tree.paths if len(p) == d)
    # Decoding buffers agree with the tree.
    dt = static_tree(tree, torch.device("cpu"), torch.float32)
    for i, p in enumerate(tree.paths[1:], start=1):
        assert dt.children[tree.parents[i], p[-1]] == i
    assert int((dt.children >= 0).sum()) == n - 1
    assert torch.equal(dt.float_mask == 0, tree.attention_mask)


@settings(max_examples=30, deadline=None)
@given(random_trees())
def test_json_round_trip_property(tmp_path_factory, choices):
    tree = MedusaTree.from_choices(choices)
    path = tmp_path_factory.mktemp("t") / "tree.json"
    tree.to_json(path)
    assert MedusaTree.from_json(path) == tree


@pytest.mark.parametrize("edit, needle", [
    (lambda d: d.update(choices=[[0]] + [[0, i] for i in range(1100)]), "1102 nodes; at most 1024"),
    (lambda d: d.update(choices=[[0], [10**12]]), "choice 1 asks for a rank past 999"),
    (lambda d: d.update(lookup_tokens=10**9), "lookup_tokens must be an integer in [0, 1024]"),
    (lambda d: d.update(lookup_tokens="8"), "lookup_tokens must be an integer"),
    (lambda d: d.update(num_heads=True), "num_heads must be an integer in [0, 64]"),
    (lambda d: d.update(calibration=[1]), "calibration must be an object"),
    (lambda d: d.update(calibration={"path_score": {"weight": ["x"], "bias": [0.0]}}),
     "path_score.weight must be a list of finite numbers"),
    (lambda d: d.update(calibration={"path_score": {"weight": [1.0], "bias": [0.0], "raw": [5]}}),
     "path_score.raw must list depths in [0, 1)"),
    (lambda d: d.update(choices="[[0]]"), "choices must be a list of paths"),
])
def test_tree_json_values_are_bounded_before_any_tensor_is_built(tmp_path, edit, needle):
    path = tmp_path / "tree.json"
    MedusaTree.from_choices([[0], [0, 0], [1]], num_heads=2).to_json(path)
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    with pytest.raises(TreeError, match=re.escape(needle)):
        MedusaTree.from_json(path)


def test_a_bare_list_tree_json_is_bounded_too(tmp_path):
    path = tmp_path / "tree.json"
    path.write_text(json.dumps([[0], [2000]]))
    with pytest.raises(TreeError, match="rank past 999"):
        MedusaTree.from_json(path)
