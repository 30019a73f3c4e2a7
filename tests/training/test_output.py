"""What a training run writes and refuses (medusa/training/output.py): the inputs an output_dir may not hold,
the trackers' flat config, and no final/ before the last step. The end-to-end writing is in test_loop.py and
test_checkpoint.py."""

from __future__ import annotations

from types import SimpleNamespace

from medusa.config import Recipe
from medusa.training.output import finish, run_inputs, tracker_config


def test_run_inputs_names_the_local_inputs_by_key():
    recipe = Recipe(model="models/base")
    recipe.data.train, recipe.data.chat_template = "data/train.jsonl", "templates/chat.jinja"
    inputs = run_inputs(recipe)
    assert inputs["model"] == "models/base" and inputs["data.train"] == "data/train.jsonl"
    assert inputs["data.chat_template"] == "templates/chat.jinja"
    recipe.data.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"  # inline: not a file
    assert run_inputs(recipe)["data.chat_template"] is None


def test_tracker_config_is_flat_and_scalar():
    flat = tracker_config({"train": {"lr": 1e-3, "seed": 0}, "heads": {"feature_layers": [2, 5]}, "x": None})
    assert flat == {"train.lr": 1e-3, "train.seed": 0, "heads.feature_layers": "[2, 5]", "x": None}


def test_finish_before_the_last_step_writes_nothing(tmp_path):
    run = SimpleNamespace(plan=SimpleNamespace(total_steps=10), out_dir=tmp_path)
    assert finish(run, 9) == (None, None)
    assert list(tmp_path.iterdir()) == []
