"""``MedusaConfig`` (medusa/modeling/config.py): the JSON round trip, corrupt and unknown-key configs refused,
and where a checkpoint's base model lives (``base_location``)."""

import json
import re

import pytest

from medusa import CheckpointError, MedusaModel
from medusa.modeling.config import BASE_SUBDIR, MedusaConfig, base_location


def test_config_round_trip_and_no_projection_key_for_medusa_heads(tmp_path):
    config = MedusaConfig(base_model_name_or_path="org/base", base_model_type="llama", hidden_size=32,
                          vocab_size=96, num_heads=3, draft_vocab=24)
    config.save(tmp_path)
    assert "hydra_projection" not in json.loads((tmp_path / "medusa_config.json").read_text())
    assert MedusaConfig.load(tmp_path).to_dict() == config.to_dict()


def test_base_location_order(tmp_path):
    config = MedusaConfig(base_model_name_or_path="org/base", base_model_type="llama", hidden_size=32,
                          vocab_size=96)
    assert base_location(tmp_path, config, base="given") == "given"
    assert base_location(tmp_path, config) == "org/base"
    config.base_model_subdir = BASE_SUBDIR
    assert base_location(tmp_path, config) == str(tmp_path / BASE_SUBDIR)
    config.base_model_subdir, config.base_model_name_or_path = None, ""
    with pytest.raises(CheckpointError, match="base_model_name_or_path is empty; pass base_model="):
        base_location(tmp_path, config)


def test_corrupt_config(saved):
    base, ck = saved
    (ck / "medusa_config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="medusa_config.json: corrupt JSON"):
        MedusaModel.from_pretrained(ck, base_model=base)


def test_unknown_config_key(saved):
    base, ck = saved
    cfg = json.loads((ck / "medusa_config.json").read_text())
    cfg["num_hedas"] = 3
    (ck / "medusa_config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="unknown key.*num_hedas"):
        MedusaModel.from_pretrained(ck, base_model=base)


@pytest.mark.parametrize("key, value, needle", [
    ("dtype", "garbage", "dtype: expected one of float32, bfloat16, float16"),
    ("dtype", 32, "dtype: expected a string"),
    ("hidden_size", "32", "hidden_size: expected an integer"),
    ("vocab_size", 10**12, "vocab_size: expected an integer in [1, 16777216]"),
    ("head_type", ["linear"], "head_type: expected a string"),
    ("recipe", "lr=1", "recipe: expected an object"),
    ("base_model_subdir", "../../elsewhere", "base_model_subdir: expected the name of a folder inside"),
    ("feature_layers", [1, "x"], "feature_layers: expected a list of layer indices"),
    ("feature_layers", [0, 1, 2], "feature_layers: only for head_type: eagle3 (got linear)"),
    ("draft_vocab", 97, "draft_vocab: 97 exceeds vocab_size 96"),
])
def test_config_field_of_the_wrong_type_is_one_error_naming_it(tmp_path, key, value, needle):
    config = MedusaConfig(base_model_name_or_path="org/base", base_model_type="llama", hidden_size=32,
                          vocab_size=96)
    config.save(tmp_path)
    data = json.loads((tmp_path / "medusa_config.json").read_text())
    data[key] = value
    (tmp_path / "medusa_config.json").write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match=re.escape(needle)):
        MedusaConfig.load(tmp_path)


@pytest.mark.parametrize("layers", [[0, 1], [0, 1, 2, 3], [1]])
def test_eagle3_feature_layers_are_three_indices(tmp_path, layers):
    config = MedusaConfig(base_model_name_or_path="org/base", base_model_type="llama", hidden_size=32,
                          vocab_size=96, head_type="eagle3", feature_layers=layers)
    config.save(tmp_path)
    with pytest.raises(CheckpointError, match="feature_layers: expected three layer indices"):
        MedusaConfig.load(tmp_path)
