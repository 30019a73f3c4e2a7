"""DraftTreeShape: bounds, the candidate pool check, the tree.json round trip and its refusals."""

import json

import pytest

from medusa.tree import DraftTreeShape, is_draft_tree_file
from medusa.tree.tree import TreeError


def test_round_trip_and_detection(tmp_path):
    shape = DraftTreeShape(12, 5, 3, 2, lookup_tokens=4, calibration={"expected_tokens_per_step": 2.5})
    shape.to_json(tmp_path / "tree.json")
    data = json.loads((tmp_path / "tree.json").read_text())
    assert data["format"] == "medusa-draft-tree" and data["num_nodes"] == 12 and data["lookup_tokens"] == 4
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
])
def test_bad_files_name_the_file(tmp_path, data, words):
    path = tmp_path / "tree.json"
    path.write_text(json.dumps(data))
    with pytest.raises(TreeError, match=words) as err:
        DraftTreeShape.from_json(path)
    assert str(path) in str(err.value)


def test_len_is_the_drafted_nodes():
    assert len(DraftTreeShape(12, 5, 3, 2, lookup_tokens=4)) == 12
