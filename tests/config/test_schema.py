"""The recipe's dataclasses (medusa/config/schema.py): their keys and defaults are the recipe YAML format."""

import dataclasses

from medusa.config.schema import HeadsConfig, Recipe


def test_recipe_sections_and_keys():
    data = Recipe().to_dict()
    assert list(data) == ["model", "method", "dtype", "quantization", "heads", "data", "train", "lora",
                          "medusa2", "output_dir", "report_to"]
    assert list(data["heads"]) == ["num_heads", "num_layers", "head_type", "hydra_projection", "decay",
                                   "init_from", "draft_vocab", "feature_layers", "teacher_loss"]
    assert data["train"]["lr"] == 1e-3 and data["train"]["mixed_precision"] is None
    assert data["medusa2"]["schedule"] == "constant" and data["data"]["format"] == "auto"


def test_sections_are_independent_instances():
    a, b = Recipe(), Recipe()
    a.heads.num_heads = 3
    assert b.heads.num_heads == 5 and dataclasses.asdict(HeadsConfig())["head_type"] == "linear"
