"""DraftTreeShape: bounds, the candidate pool check, the tree.json round trip and its refusals."""

import json

import pytest

from medusa.tree import DraftTreeShape, is_draft_tree_file
from medusa.tree.tree import TreeError


def test_round_trip_and_detection(tmp_path):
    shape = DraftTreeShape(12, 5, 3, 2, lookup_tokens=4, min_prob=0.25,
                           calibration={"expected_tokens_per_step": 2.5})
    shape.to_json(tmp_path / "tree.json")
    data = json.loads((tmp_path / "tree.json").read_text())
    assert data["format"] == "medusa-draft-tree" and data["num_nodes"] == 12 and data["lookup_tokens"] == 4
    assert data["min_prob"] == 0.25
    back = DraftTreeShape.from_json(tmp_path / "tree.json")
    assert back == shape and back.calibration == {"expected_tokens_per_step": 2.5}
    assert is_draft_tree_file(tmp_path / "tree.json")
    medusa_tree = {"format": "medusa-tree", "version": 1, "choices": [[0]]}
    (tmp_path / "medusa.json").write_text(json.dumps(medusa_tree))
    assert not is_draft_tree_file(tmp_path / "medusa.json")
    assert not is_draft_tree_file(tmp_path / "absent.json")


@pytest.mark.parametrize("kwargs, words", [
    (dict(num_nodes=1), "num_nodes"), (dict(depth=0), "depth"), (dict(branch=True), "branch"),
    (dict(lookup_tokens=-1), "lookup_tokens"), (dict(num_nodes=2000), "num_nodes"),
    (dict(num_nodes=30, depth=2, branch=2, expand=2), "need 29 drafted candidates"),
    (dict(min_prob=1.0), "min_prob"), (dict(min_prob=-0.1), "min_prob"), (dict(min_prob=True), "min_prob"),
    (dict(min_prob="0.1"), "min_prob"),
])
def test_bad_shapes(kwargs, words):
    with pytest.raises(TreeError, match=words):
        DraftTreeShape(**kwargs)


@pytest.mark.parametrize("data, words", [
    ({"format": "medusa-tree"}, "not a draft tree"),
    ({"format": "medusa-draft-tree", "version": 9}, "version"),
    ({"format": "medusa-draft-tree", "version": 1, "nodes": 3}, "unknown key"),
    ({"format": "medusa-draft-tree", "version": 1, "depth": "5"}, "depth"),
    ({"format": "medusa-draft-tree", "version": 1, "calibration": [1]}, "calibration"),
    ({"format": "medusa-draft-tree", "version": 1, "min_prob": 2}, "min_prob"),
])
def test_bad_files_name_the_file(tmp_path, data, words):
    path = tmp_path / "tree.json"
    path.write_text(json.dumps(data))
    with pytest.raises(TreeError, match=words) as err:
        DraftTreeShape.from_json(path)
    assert str(path) in str(err.value)


def test_len_is_the_drafted_nodes():
    assert len(DraftTreeShape(12, 5, 3, 2, lookup_tokens=4)) == 12


@pytest.mark.parametrize("depth, branch, expand, pool", [(2, 2, 2, 6), (3, 3, 2, 15), (1, 5, 1, 5),
                                                        (3, 2, 3, 12), (4, 2, 3, 18)])
def test_the_pool_bound_is_exact(depth, branch, expand, pool):
    """The drafted candidates: ``branch`` under the root, then ``expand * branch`` per further level; a tree
    of exactly pool + 1 nodes is accepted, one node more is refused (decoding at the bound:
    tests/decoding/test_eagle3_proposer.py). Level 2 of (3, 2, 3) has 2 frontier nodes: 2 + 2*2 + 3*2 = 12."""
    assert len(DraftTreeShape(pool + 1, depth, branch, expand)) == pool + 1
    with pytest.raises(TreeError, match=f"need {pool + 1} drafted candidates.* give {pool}"):
        DraftTreeShape(pool + 2, depth, branch, expand)
