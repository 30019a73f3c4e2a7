"""A training run's set-up (medusa/training/session.py) on the tiny MEDUSA-1 recipe: the step plan, the
draft vocabulary applied before the optimizer sees the heads, the optimizer holding exactly the trained
parameters, the backbone frozen, and nothing written yet (the loop opens the output)."""

from __future__ import annotations

from pathlib import Path

import pytest

from medusa.config import load_recipe
from medusa.training.method import method_of
from medusa.training.session import build_run

TINY = Path(__file__).resolve().parents[2] / "recipes" / "tiny" / "medusa1.yaml"
pytestmark = pytest.mark.usefixtures("tiny_recipe_env")


def test_build_run_prepares_the_model_data_and_optimizer(tmp_path):
    out = tmp_path / "run"
    recipe = load_recipe(TINY, [f"output_dir={out}", "data.max_length=64", "heads.draft_vocab=64",
                                "train.max_steps=3", "data.eval_split=0.0"])
    run = build_run(recipe, method_of(recipe), progress=False)
    assert run.plan.total_steps == 3 and run.data.eval is None and run.cache is None
    assert (run.out_dir, run.metrics_path) == (out, out / "metrics.jsonl") and not out.exists()
    assert run.model.heads.draft_vocab == 64 and run.model.heads.token_map.shape == (64,)
    in_optimizer = {id(p) for group in run.optimizer.param_groups for p in group["params"]}
    assert in_optimizer == {id(p) for p in run.trainable.parameters() if p.requires_grad} != set()
    assert not any(p.requires_grad for p in run.model.base_model.parameters())
