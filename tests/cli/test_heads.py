"""``medusa heads init`` (medusa/cli/heads.py): the Hydra projection option, the printed summary and dtype,
and an --out that is not new or empty refused before the base model loads. Also as subprocesses:
init + info, and a missing base (exit 2)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from medusa import MedusaModel
from medusa.cli import main
from medusa.cli.heads import _projection
from medusa.errors import MedusaError

from tiny_models import STORIES, require_shared, tiny_model


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("base") / "llama"
    tiny_model("llama").save_pretrained(path)
    return path


def test_projection_defaults_to_the_recipe_key_and_needs_hydra():
    unset = argparse.Namespace(hydra_projection=None, head_type="linear")
    assert _projection(unset) == "own"  # the recipe default (heads.hydra_projection)
    shared = argparse.Namespace(hydra_projection="shared_lm_head", head_type="hydra")
    assert _projection(shared) == "shared_lm_head"
    with pytest.raises(MedusaError, match="--hydra-projection own only applies to --head-type hydra "
                                          r"\(got --head-type shared_lm_head\)"):
        _projection(argparse.Namespace(hydra_projection="own", head_type="shared_lm_head"))


def test_init_prints_what_it_wrote_in_the_dtype_asked(base_dir, tmp_path, capsys):
    out = tmp_path / "heads"
    capsys.readouterr()
    assert main(["heads", "init", "--base", str(base_dir), "--num-heads", "3", "--num-layers", "0",
                 "--dtype", "bfloat16", "--out", str(out)]) == 0
    params = 3 * 96 * 32  # no ResBlocks: W2 only
    assert capsys.readouterr().out.strip() == f"wrote {out}: 3 heads x 0 layer(s), {params:,} parameters"
    model = MedusaModel.from_pretrained(out, base_model=str(base_dir))
    assert model.config.dtype == "bfloat16" and model.num_heads == 3
    assert {p.dtype for p in model.heads.parameters()} == {torch.bfloat16}


def test_an_occupied_out_is_refused_and_left_alone(base_dir, tmp_path, capsys):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "mine.txt").write_text("the user's")
    assert main(["heads", "init", "--base", str(base_dir), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "exists and is not empty" in err[0]
    assert [p.name for p in out.iterdir()] == ["mine.txt"]


def _cli(*args, cwd=None):
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "medusa", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=300)


def test_cli_heads_init_and_info(tmp_path):
    require_shared(STORIES)
    out = tmp_path / "heads"
    r = _cli("heads", "init", "--base", str(STORIES), "--num-heads", "3", "--num-layers", "2",
             "--out", str(out))
    assert r.returncode == 0, r.stderr
    r = _cli("info", str(out))
    assert r.returncode == 0, r.stderr
    assert "3 x 2 ResBlock(s)" in r.stdout and "stories260K" in r.stdout and "llama" in r.stdout
    params = 3 * 2 * (64 * 64 + 64) + 3 * 512 * 64
    assert f"{params:,}" in r.stdout
    r = _cli("info", str(out), "--json")
    assert json.loads(r.stdout)["parameters"] == params


@pytest.mark.parametrize("flag,expected", [([], "own"), (["--hydra-projection", "own"], "own"),
                                           (["--hydra-projection", "shared_lm_head"], "shared_lm_head")])
def test_cli_heads_init_hydra_projection(tmp_path, capsys, flag, expected):
    from medusa.cli import main

    tiny_model("llama").save_pretrained(tmp_path / "base")
    out = tmp_path / "heads"
    assert main(["heads", "init", "--base", str(tmp_path / "base"), "--num-heads", "2",
                 "--head-type", "hydra", *flag, "--out", str(out)]) == 0
    assert f"(hydra, projection: {expected})" in capsys.readouterr().out
    assert json.loads((out / "medusa_config.json").read_text())["hydra_projection"] == expected
    loaded = MedusaModel.from_pretrained(out)
    assert loaded.config.hydra_projection == expected
    assert (loaded.heads.lm_heads is None) == (expected == "shared_lm_head")
    state = load_file(str(out / "medusa_heads.safetensors"))
    assert any(k.startswith("lm_heads.") for k in state) == (expected == "own")


@pytest.mark.parametrize("head_type", ["linear", "shared_lm_head"])
def test_cli_heads_init_hydra_projection_needs_hydra(tmp_path, capsys, head_type):
    from medusa.cli import main

    tiny_model("llama").save_pretrained(tmp_path / "base")
    capsys.readouterr()  # drop save_pretrained's progress bar
    code = main(["heads", "init", "--base", str(tmp_path / "base"), "--head-type", head_type,
                 "--hydra-projection", "own", "--out", str(tmp_path / "o")])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: --hydra-projection own only applies "
                                                                 "to --head-type hydra")
    assert head_type in lines[0] and not (tmp_path / "o").exists()


def test_cli_bad_base_exit_2(tmp_path):
    r = _cli("heads", "init", "--base", str(tmp_path / "missing_model"), "--num-heads", "2",
             "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith("error:")
    assert not (tmp_path / "o").exists()


def test_draft_vocab_narrows_a_trained_map_to_its_first_ids(base_dir, tmp_path, capsys):
    """``medusa heads draft-vocab``: ids 0..N-1 of the map, each with its trained row; the tree kept; a size
    past the current vocabulary (or heads without one) refused with exit 2."""
    model = MedusaModel.from_base(str(base_dir), num_heads=2, num_layers=1, head_type="eagle3",
                                  heads_dtype=torch.float32)
    model.use_draft_vocab(torch.tensor([7, 3, 11, 5, 2, 40]))
    with torch.no_grad():
        model.heads.lm_head.weight.add_(torch.randn_like(model.heads.lm_head.weight))
    model.save_pretrained(tmp_path / "wide")
    assert main(["heads", "draft-vocab", str(tmp_path / "wide"), "--size", "4",
                 "--out", str(tmp_path / "narrow")]) == 0
    assert "draft vocabulary 6 -> 4 tokens" in capsys.readouterr().out
    narrow = MedusaModel.from_pretrained(tmp_path / "narrow")
    assert narrow.config.draft_vocab == 4 and narrow.heads.token_map.tolist() == [7, 3, 11, 5]
    assert torch.equal(narrow.heads.lm_head.weight, model.heads.lm_head.weight[:4])
    assert main(["heads", "draft-vocab", str(tmp_path / "wide"), "--size", "7",
                 "--out", str(tmp_path / "past")]) == 2
    assert "--size 7: " in capsys.readouterr().err and not (tmp_path / "past").exists()
