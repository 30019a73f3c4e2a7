"""benchmarks.ship: a calibrated checkpoint trimmed to its tree's depth and dtype, and copied (tied to
the base it was trained on) into the folder that ships with the project. On a tiny Llama, no packaged
model."""

from __future__ import annotations

import json
import stat

import pytest
import torch
from export_helpers import perturb, save_tiny_base
from safetensors.torch import load_file

from benchmarks.ship import ship_heads, tie_to_packaged, trim_to_tree
from medusa import MedusaModel, MedusaTree
from medusa.errors import CheckpointError
from medusa.modeling.config import MedusaConfig
from medusa.modeling.heads_file import read_heads_file
from medusa.modeling.packaged import PACKAGED_KEY, weights_fingerprint
from medusa.tree.draft_tree import DraftTreeShape


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    return save_tiny_base(tmp_path_factory.mktemp("base") / "llama")


def _calibrated(path, base_dir):
    """3 heads, a tree of depth 2, and a plot (what calibration leaves beside the heads)."""
    model = perturb(MedusaModel.from_base(str(base_dir), num_heads=3, num_layers=1))
    model.tree = MedusaTree.from_choices([[0], [0, 0], [1]], num_heads=3)
    model.save_pretrained(path)
    (path / "tree.png").write_bytes(b"a plot")
    return path, model


def test_trim_to_tree_drops_the_heads_the_tree_never_calls(tmp_path, base_dir):
    ck, model = _calibrated(tmp_path / "final", base_dir)
    assert trim_to_tree(ck, torch.bfloat16) == {"num_heads": 2, "dropped_heads": 1, "dtype": "bfloat16"}
    state = load_file(ck / "medusa_heads.safetensors")
    blocks = sorted(f"blocks.{k}.0.linear.{p}" for k in range(2) for p in ("weight", "bias"))
    assert sorted(state) == blocks + ["lm_heads.0.weight", "lm_heads.1.weight"]
    assert all(v.dtype == torch.bfloat16 for v in state.values())
    config = MedusaConfig.load(ck)
    assert (config.num_heads, config.dtype) == (2, "bfloat16")
    assert json.loads((ck / "tree.json").read_text())["num_heads"] == 2
    again = MedusaModel.from_pretrained(ck, base_model=str(base_dir))
    for k in range(2):  # the kept heads are the first two, cast
        assert torch.equal(again.heads.state_dict()[f"lm_heads.{k}.weight"],
                           model.heads.state_dict()[f"lm_heads.{k}.weight"].to(torch.bfloat16))
    assert trim_to_tree(ck, None) == {"num_heads": 2, "dropped_heads": 0, "dtype": "bfloat16"}


def test_tie_to_packaged_copies_ties_and_trims(tmp_path, base_dir):
    ck, _ = _calibrated(tmp_path / "final", base_dir)
    dest = tmp_path / "ship" / "medusa1"
    dest.parent.mkdir()
    info = tie_to_packaged(ck, dest, base_dir, hub_id="org/tiny")
    assert info["num_heads"] == 2 and info["dir"] == str(dest) and info["gguf_sha256"] is None  # no marker
    config = MedusaConfig.load(dest)
    base = MedusaModel.from_base(str(base_dir), num_heads=1).base_model
    assert config.extra[PACKAGED_KEY] == {"name": "llama", "gguf_sha256": None,
                                          "weights": weights_fingerprint(base)}
    assert config.base_model_name_or_path == "org/tiny" and config.dtype == "bfloat16"
    assert sorted(p.name for p in dest.iterdir()) == ["medusa_config.json", "medusa_heads.safetensors.xz",
                                                      "tree.json"]  # no plots
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o644 for p in dest.iterdir())
    assert info["bytes"] == sum(p.stat().st_size for p in dest.iterdir())
    assert (ck / "tree.png").is_file() and MedusaConfig.load(ck).num_heads == 3  # the source is untouched
    with pytest.raises(CheckpointError, match="already exists; delete it to ship the heads again"):
        tie_to_packaged(ck, dest, base_dir)


def test_ship_heads_ties_every_set(tmp_path, base_dir):
    finals = {name: _calibrated(tmp_path / name, base_dir)[0] for name in ("medusa1", "hydra")}
    shipped = ship_heads(str(base_dir), finals, tmp_path / "data_heads")
    assert shipped["dest"] == str(tmp_path / "data_heads") and list(shipped["heads"]) == ["medusa1", "hydra"]
    for name in finals:
        assert MedusaConfig.load(tmp_path / "data_heads" / name).extra[PACKAGED_KEY]["name"] == "llama"


def test_the_eagle3_drafter_ships_in_bf16_and_decodes_in_its_config_dtype(tmp_path, base_dir):
    """The drafter is stored in bfloat16 (half the bytes the repository carries) while its config keeps the
    float32 it decodes in: from_pretrained casts the stored floats up, the token map stays int64."""
    model = perturb(MedusaModel.from_base(str(base_dir), num_heads=3, head_type="eagle3"))
    model.tree = DraftTreeShape(num_nodes=4, depth=2, branch=2, expand=2)
    model.save_pretrained(tmp_path / "final")
    dest = tmp_path / "ship" / "eagle3"
    dest.parent.mkdir()
    info = tie_to_packaged(tmp_path / "final", dest, base_dir)
    assert (info["dtype"], info["stored_dtype"], info["dropped_heads"]) == ("float32", "bfloat16", 0)
    state = read_heads_file(dest / "medusa_heads.safetensors.xz")
    assert {v.dtype for v in state.values() if v.is_floating_point()} == {torch.bfloat16}
    assert MedusaConfig.load(dest).dtype == "float32"
    again = MedusaModel.from_pretrained(dest, base_model=str(base_dir))
    assert again.tree == model.tree
    for key, value in model.heads.state_dict().items():
        loaded = again.heads.state_dict()[key]
        want = value.to(torch.bfloat16).to(torch.float32) if value.is_floating_point() else value
        assert loaded.dtype == want.dtype and torch.equal(loaded, want), key
