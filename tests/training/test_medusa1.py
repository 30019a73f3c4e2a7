"""MEDUSA-1 (medusa/training/medusa1.py): the heads' loss on the frozen backbone's hidden states (computed,
or read from the hidden-state cache), and MEDUSA-1 as the loop's training method."""

from types import SimpleNamespace

import torch

from medusa.config import Recipe
from medusa.modeling.model import MedusaModel
from medusa.training import medusa1

from tiny_models import tiny_model


def _model_and_batch(head_type: str = "linear") -> tuple[MedusaModel, medusa1.HeadsLoss, dict]:
    base = tiny_model("llama")
    model = MedusaModel.from_base(base, num_heads=2, head_type=head_type, heads_dtype=torch.float32)
    model.freeze_base()
    ids = torch.randint(0, 96, (2, 9), generator=torch.Generator().manual_seed(0))  # [B, T]
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}
    return model, medusa1.HeadsLoss(model.heads, 0.8, 4), batch


def test_cached_hidden_states_give_the_same_loss_as_the_backbone():
    for head_type in ("linear", "hydra"):
        model, trainable, batch = _model_and_batch(head_type)
        loss, stats = medusa1.compute_loss(model, trainable, batch)
        hidden = medusa1.backbone_hidden(model, batch)  # [B, T, d]
        assert hidden.shape == (2, 9, 32) and not hidden.requires_grad
        cached_loss, cached_stats = medusa1.compute_loss(model, trainable, {**batch, "hidden": hidden})
        assert torch.equal(loss, cached_loss) and torch.equal(stats, cached_stats)
        assert stats.shape[1] == 2 and loss.requires_grad


def test_method_trains_the_heads_alone_at_the_recipe_lr():
    model, trainable, batch = _model_and_batch()
    recipe = Recipe(model="m")
    method = medusa1.METHOD
    assert method.name == "medusa1" and method.check_recipe(recipe) is None
    groups = method.param_groups(recipe, trainable)
    head_params = {id(p) for p in model.heads.parameters()}
    assert {id(p) for g in groups for p in g["params"]} == head_params
    assert {g["lr"] for g in groups} == {recipe.train.lr}
    loss, stats, parts = method.compute_loss(recipe, model, trainable, batch, 0, None)
    assert parts == {} and torch.equal(loss, medusa1.compute_loss(model, trainable, batch)[0])  # null: no
    for precision, bf16 in (("bf16", True), ("no", False)):
        recipe.train.mixed_precision = precision
        loss, _, _ = method.compute_loss(recipe, model, trainable, batch, 0, None)
        assert torch.equal(loss, medusa1.compute_loss(model, trainable, batch, bf16_base=bf16)[0]), precision


def test_bf16_base_runs_the_frozen_backbone_under_bf16_autocast():
    model, trainable, batch = _model_and_batch()
    loss32, _ = medusa1.compute_loss(model, trainable, batch)
    loss16, _ = medusa1.compute_loss(model, trainable, batch, bf16_base=True)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        hidden16 = medusa1.backbone_hidden(model, batch).float()  # [B, T, d]: bf16 matmuls, rounded
    hidden32 = medusa1.backbone_hidden(model, batch)
    assert hidden16.dtype == torch.float32 and not torch.equal(hidden16, hidden32)
    assert torch.allclose(loss16, trainable(hidden16, batch["labels"], batch["input_ids"])[0])
    assert not torch.equal(loss16, loss32) and torch.allclose(loss16, loss32, rtol=0.05)
    for p in model.base_model.parameters():  # the backbone's weights stay float32 and frozen
        assert p.dtype == torch.float32 and not p.requires_grad
    with torch.autocast("cpu", dtype=torch.bfloat16):  # an outer autocast (evaluation's) is kept
        outer = medusa1.compute_loss(model, trainable, batch)[0]
        assert torch.equal(outer, trainable(hidden16, batch["labels"], batch["input_ids"])[0])


def test_backbone_bf16_follows_the_recipe_else_accelerate(monkeypatch):
    from medusa.training.setup import backbone_bf16
    recipe = Recipe(model="m")
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    assert backbone_bf16(recipe) is True  # null: accelerate's launch setting
    recipe.train.mixed_precision = "no"
    assert backbone_bf16(recipe) is False
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION")
    recipe.train.mixed_precision = None
    assert backbone_bf16(recipe) is False


def test_trained_model_takes_the_prepared_modules_heads():
    model, trainable, _ = _model_and_batch()
    trained = medusa1.HeadsLoss(_model_and_batch()[0].heads, 0.8, 4)
    accelerator = SimpleNamespace(unwrap_model=lambda module: trained if module is trainable else None)
    out = medusa1.METHOD.trained_model(accelerator, model, trainable)
    assert out is model and model.heads is trained.heads
