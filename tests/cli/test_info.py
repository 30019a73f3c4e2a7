"""``medusa info`` (medusa/cli/info.py): the printed summary of a checkpoint, with and without its tree and
draft vocabulary, and ``--json``. No base model is loaded. (heads init + info as subprocesses:
tests/cli/test_heads.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from medusa import MedusaModel, MedusaTree
from medusa.cli import main
from medusa.modeling.summary import summarize

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


def _hydra(base, projection, draft, num_heads=3, num_layers=2):
    """Fresh Hydra heads on ``base`` (a random draft vocabulary of ``draft`` ids when > 0)."""
    tm = torch.randperm(96, generator=torch.Generator().manual_seed(0))[:draft] if draft else None
    return MedusaModel.from_base(base, num_heads=num_heads, num_layers=num_layers, head_type="hydra",
                                 hydra_projection=projection, token_map=tm)


def test_summary_and_info_show_the_projection(tmp_path, capsys):
    base = tiny_model("llama")
    _hydra(base, "shared_lm_head", 24).save_pretrained(tmp_path / "ck")
    summary = summarize(tmp_path / "ck")
    assert summary["hydra_projection"] == "shared_lm_head" and summary["draft_vocab"] == 24
    # blocks only: head k's conditioned block R, W1 [d, d (k+2)] and b, then one ResBlock; no W2
    d = 32
    assert summary["parameters"] == sum(2 * d * d * (k + 2) + d + d * d + d for k in range(3))
    assert main(["info", str(tmp_path / "ck")]) == 0
    assert "hydra (projection: shared_lm_head), draft vocab 24, float32" in capsys.readouterr().out
    _hydra(base, "own", 0).save_pretrained(tmp_path / "own")
    assert main(["info", str(tmp_path / "own")]) == 0
    assert "hydra (projection: own), float32" in capsys.readouterr().out


def _cli(*args, cwd=None):
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "medusa", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=300)


def test_cli_bad_path_exit_2(tmp_path):
    r = _cli("info", str(tmp_path / "nope"))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "nope" in lines[0]
    r = _cli("--debug", "info", str(tmp_path / "nope"))
    assert r.returncode != 0 and "Traceback" in r.stderr
