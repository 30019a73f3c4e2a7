"""The training loop (medusa/training/loop.py): end-to-end MEDUSA-1 runs of the tiny recipe on stories260K
(CPU), resume (a 2-process launch: tests/integration/test_distributed.py; the draft vocabulary:
test_vocab_setup.py; the method: test_method.py)."""

import json
from pathlib import Path

import pytest
import torch
from frozen import heads_only, record_frozen

from medusa.config import load_recipe
from medusa.modeling.model import MedusaModel
from medusa.training.loop import train

from tiny_models import require_module, stories_model

ROOT = Path(__file__).resolve().parents[2]


TINY = ROOT / "recipes" / "tiny" / "medusa1.yaml"


# stories260K present, run from the repository root (recipe paths), one torch thread (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("tiny_recipe_env")


def _recipe(tmp_path, *overrides):
    base = [f"output_dir={tmp_path / 'run'}", "data.max_length=64", "train.logging_steps=5",
            "data.eval_split=0.02", "train.eval_steps=0"]
    return load_recipe(TINY, base + list(overrides))


def _metrics(run_dir):
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def test_tiny_recipe_learns_and_keeps_backbone_frozen(tmp_path, monkeypatch):
    frozen = record_frozen(monkeypatch, heads_only)
    recipe = _recipe(tmp_path, "train.max_steps=40", "train.lr=5e-3")
    result = train(recipe)
    rows = [r for r in _metrics(result.output_dir) if "loss" in r]
    assert rows[-1]["loss"] < 0.8 * rows[0]["loss"]
    assert rows[-1]["head1_top1"] > rows[0]["head1_top1"] + 0.02
    assert {"head1_top5", "head3_loss", "lr", "tokens_per_s", "grad_norm"} <= set(rows[-1])
    assert result.eval_metrics is not None and "eval_head1_top1" in result.eval_metrics

    frozen.assert_unchanged()  # every backbone tensor, bit for bit
    fresh = stories_model()
    untrained = MedusaModel.from_base(fresh, num_heads=3, num_layers=1, heads_dtype=torch.float32)
    trained = MedusaModel.from_pretrained(result.final_dir, base_model=fresh)
    assert trained.config.recipe["train"]["max_steps"] == 40
    for (name, p), (_, q) in zip(trained.heads.state_dict().items(), untrained.heads.state_dict().items()):
        assert not torch.equal(p, q), f"head tensor {name} did not move"
    for p, q in zip(trained.heads.state_dict().values(), result.model.heads.state_dict().values()):
        torch.testing.assert_close(p, q.float())


def test_resume_equals_straight_run(tmp_path):
    steps = ["train.max_steps=8", "train.batch_size=4", "train.eval_steps=0", "data.eval_split=0.0"]
    straight = train(_recipe(tmp_path / "a", *steps))
    first = train(_recipe(tmp_path / "b", *steps), stop_at_step=4)
    assert first.final_dir is None and (first.output_dir / "checkpoint-4" / "trainer_state.json").is_file()
    second = train(_recipe(tmp_path / "b", *steps, "train.resume=auto"))
    assert second.global_step == 8
    a = MedusaModel.from_pretrained(straight.final_dir, base_model=stories_model()).heads.state_dict()
    b = MedusaModel.from_pretrained(second.final_dir, base_model=stories_model()).heads.state_dict()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6)
    last_a, last_b = _metrics(straight.output_dir)[-1], _metrics(second.output_dir)[-1]
    assert last_a["step"] == last_b["step"] == 8  # both averaged over steps 6-8
    assert last_a["loss"] == pytest.approx(last_b["loss"], rel=1e-5)


def test_4bit_backbone_trains_on_cpu(tmp_path, monkeypatch):
    require_module("bitsandbytes")
    frozen = record_frozen(monkeypatch, heads_only)
    result = train(_recipe(tmp_path, "quantization=4bit", "train.max_steps=3", "data.eval_split=0.0",
                           "train.logging_steps=1"))
    import bitsandbytes as bnb

    base = result.model.base_model
    assert any(isinstance(m, bnb.nn.Linear4bit) for m in base.modules())
    assert all(not p.requires_grad for p in base.parameters())
    assert any(t.dtype == torch.uint8 for t in frozen.before[0].values())  # packed 4-bit weights among them
    frozen.assert_unchanged()  # norms, embeddings, LM head, 4-bit weights and their states
    rows = _metrics(result.output_dir)
    assert len(rows) == 3 and all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)
    untrained = MedusaModel.from_base(stories_model(), num_heads=3, heads_dtype=torch.float32)
    moved = [not torch.equal(p, q) for p, q in zip(result.model.heads.state_dict().values(),
                                                     untrained.heads.state_dict().values())]
    assert all(moved)
