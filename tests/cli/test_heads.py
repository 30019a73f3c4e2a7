"""``medusa heads init`` (medusa/cli/heads.py): the Hydra projection option, the printed summary and dtype,
and an --out that is not new or empty refused before the base model loads. (Subprocess runs and Hydra
projections saved: tests/modeling/test_checkpoint.py.)"""

from __future__ import annotations

import argparse

import pytest
import torch

from medusa import MedusaModel
from medusa.cli import main
from medusa.cli.heads import _projection
from medusa.errors import MedusaError

from tiny_models import tiny_model


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
