"""``medusa info`` (medusa/cli/info.py): the printed summary of a checkpoint, with and without its tree and
draft vocabulary, and ``--json``. No base model is loaded. (heads init + info as subprocesses:
tests/modeling/test_checkpoint.py.)"""

from __future__ import annotations

import json

import pytest
import torch

from medusa import MedusaModel, MedusaTree
from medusa.cli import main

from tiny_models import tiny_model


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("info")
    plain = MedusaModel.from_base(tiny_model("llama"), num_heads=2, num_layers=1)
    plain.save_pretrained(root / "plain")
    draft = MedusaModel.from_base(tiny_model("llama"), num_heads=3, num_layers=2, token_map=torch.arange(40))
    draft.tree = MedusaTree.from_choices([[0], [0, 0], [1]], num_heads=3)
    draft.save_pretrained(root / "draft")
    return root


def test_info_without_a_tree(checkpoints, capsys):
    assert main(["info", str(checkpoints / "plain")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"checkpoint   {checkpoints / 'plain'}"
    assert lines[1].startswith("base model   ") and lines[1].endswith("(llama, hidden 32, vocab 96)")
    assert lines[2] == "heads        2 x 1 ResBlock(s), linear, float32"
    assert lines[3] == f"parameters   {2 * (32 * 32 + 32) + 2 * 96 * 32:,}"
    assert lines[-1] == "tree         none (decoding uses the built-in default; run `medusa calibrate`)"


def test_info_with_a_tree_and_a_draft_vocabulary(checkpoints, capsys):
    assert main(["info", str(checkpoints / "draft")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == "heads        3 x 2 ResBlock(s), linear, draft vocab 40, float32"
    assert lines[3] == f"parameters   {3 * 2 * (32 * 32 + 32) + 3 * 40 * 32:,}"  # the token map not counted
    assert lines[-1] == "tree         4 nodes, depth 2"
    assert main(["info", str(checkpoints / "draft"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["num_heads"], summary["draft_vocab"], summary["tree"]["nodes"]) == (3, 40, 4)
    assert summary["parameters"] == 3 * 2 * (32 * 32 + 32) + 3 * 40 * 32 and not summary["merged_backbone"]
