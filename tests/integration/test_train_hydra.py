"""Training Hydra heads end to end on stories260K (CPU): MEDUSA-1 with Hydra heads (``heads.head_type:
hydra``, ``heads.teacher_loss``), and ``medusa train`` with Hydra heads on the base LM head and a draft
vocabulary: the loss falls, the frozen LM head stays bit-identical, the checkpoint holds no W2 and
round-trips; MEDUSA-2 (LoRA) too."""

import json
from pathlib import Path

import pytest
import torch
from frozen import heads_and_lora, heads_only, record_frozen
from safetensors.torch import load_file

import medusa.training.loop as loop
from medusa.cli import main as cli_main
from medusa.config import load_recipe
from medusa.modeling.base import lm_head_of
from medusa.modeling.hydra import HydraHeads
from medusa.modeling.model import MedusaModel
from medusa.training.loop import train

from tiny_models import stories_model

ROOT = Path(__file__).resolve().parents[2]


TINY = ROOT / "recipes" / "tiny" / "medusa1.yaml"


# stories260K present, run from the repository root (recipe paths), one torch thread (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("tiny_recipe_env")


def _recipe(tmp_path, *overrides):
    base = [f"output_dir={tmp_path / 'run'}", "data.max_length=64", "train.logging_steps=5",
            "data.eval_split=0.02", "train.eval_steps=0", "heads.head_type=hydra"]
    return load_recipe(TINY, base + list(overrides))


@pytest.mark.parametrize("teacher", [0.0, 1.0])
def test_hydra_heads_learn_and_round_trip(tmp_path, monkeypatch, teacher):
    frozen = record_frozen(monkeypatch, heads_only)
    result = train(_recipe(tmp_path, "train.max_steps=30", "train.lr=5e-3", f"heads.teacher_loss={teacher}"))
    rows = [json.loads(line) for line in (Path(result.output_dir) / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "loss" in r]
    assert rows[-1]["loss"] < 0.9 * rows[0]["loss"]
    frozen.assert_unchanged()  # the input embedding the heads read, the LM head, all of it
    fresh = stories_model()
    trained = MedusaModel.from_pretrained(result.final_dir, base_model=fresh)
    assert isinstance(trained.heads, HydraHeads) and trained.config.head_type == "hydra"
    assert trained.config.recipe["heads"]["teacher_loss"] == teacher
    untrained = MedusaModel.from_base(fresh, num_heads=trained.num_heads, head_type="hydra")
    for (name, p), (_, q) in zip(trained.heads.state_dict().items(), untrained.heads.state_dict().items()):
        assert not torch.equal(p, q), f"head tensor {name} did not move"
    for p, q in zip(trained.heads.state_dict().values(), result.model.heads.state_dict().values()):
        assert torch.equal(p, q.cpu())


def test_medusa2_lora_trains_hydra_heads_with_the_teacher_loss(tmp_path, monkeypatch):
    frozen = record_frozen(monkeypatch, heads_and_lora)
    recipe = load_recipe(ROOT / "recipes" / "tiny" / "medusa2_lora.yaml",
                         [f"output_dir={tmp_path / 'run'}", "data.max_length=64", "train.logging_steps=2",
                          "data.eval_split=0.0", "train.eval_steps=0", "train.max_steps=6",
                          "heads.head_type=hydra", "heads.teacher_loss=0.5"])
    result = train(recipe)
    frozen.assert_unchanged()  # everything but the adapters and the heads: embeddings, norms, LM head
    loaded = MedusaModel.from_pretrained(result.final_dir)
    assert isinstance(loaded.heads, HydraHeads) and loaded.config.base_model_subdir == "base_model"
    ids = torch.tensor([[1, 403, 407, 261, 378, 29, 261, 269, 363, 260, 365, 267]])  # [1, T]
    result.model.eval()
    with torch.no_grad():
        trained = result.model.heads
        want = trained(trained.teacher_inputs(result.model(input_ids=ids).hidden_states, ids))
        got = loaded.heads(loaded.heads.teacher_inputs(loaded(input_ids=ids).hidden_states, ids))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


HYDRA = ["heads.head_type=hydra", "heads.hydra_projection=shared_lm_head", "heads.draft_vocab=200"]




def test_medusa_train_hydra_shared_lm_head_with_a_draft_vocab(tmp_path, monkeypatch, capsys):
    frozen = record_frozen(monkeypatch, heads_only)
    results = []
    train = loop.train
    monkeypatch.setattr(loop, "train", lambda recipe, **kw: results.append(train(recipe, **kw))
                        or results[-1])
    out = tmp_path / "run"
    code = cli_main(["train", str(TINY), f"output_dir={out}", "data.max_length=64", "train.logging_steps=5",
                     "data.eval_split=0.02", "train.eval_steps=0", "train.max_steps=30", "train.lr=5e-3",
                     *HYDRA, "heads.teacher_loss=0.5"])  # the KL over the 200 draft tokens
    assert code == 0, capsys.readouterr().err
    assert "draft vocabulary: 200 of 512 tokens" in capsys.readouterr().out
    result = results[0]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "loss" in r]
    assert rows[-1]["loss"] < 0.9 * rows[0]["loss"]
    fresh = stories_model()
    heads = result.model.heads
    assert isinstance(heads, HydraHeads) and heads.lm_heads is None and heads.draft_vocab == 200
    assert heads.shared_lm_head is lm_head_of(result.model.base_model)
    assert torch.equal(lm_head_of(result.model.base_model).weight, lm_head_of(fresh).weight)  # frozen
    frozen.assert_unchanged()  # and so is every other base tensor, the input embedding the heads read too
    state = load_file(Path(result.final_dir) / "medusa_heads.safetensors")
    assert not any(k.startswith("lm_heads") for k in state) and state["token_map"].shape == (200,)
    cfg = json.loads((Path(result.final_dir) / "medusa_config.json").read_text())
    assert (cfg["hydra_projection"], cfg["draft_vocab"]) == ("shared_lm_head", 200)
    assert cfg["recipe"]["heads"]["hydra_projection"] == "shared_lm_head"
    assert cfg["recipe"]["heads"]["teacher_loss"] == 0.5
    trained = MedusaModel.from_pretrained(result.final_dir, base_model=fresh)
    assert trained.heads.projection == "shared_lm_head"
    assert torch.equal(trained.heads.token_map, heads.token_map.cpu())
    for name, p in trained.heads.state_dict().items():
        assert torch.equal(p, heads.state_dict()[name].cpu()), name
    untrained = MedusaModel.from_base(fresh, num_heads=trained.num_heads, head_type="hydra",
                                      hydra_projection="shared_lm_head", token_map=trained.heads.token_map)
    for (name, p), (_, q) in zip(trained.heads.state_dict().items(), untrained.heads.state_dict().items()):
        assert name == "token_map" or not torch.equal(p, q), f"head tensor {name} did not move"


def test_medusa2_lora_trains_hydra_shared_lm_head_with_a_draft_vocab(tmp_path, monkeypatch):
    frozen = record_frozen(monkeypatch, heads_and_lora)
    recipe = load_recipe(ROOT / "recipes" / "tiny" / "medusa2_lora.yaml",
                         [f"output_dir={tmp_path / 'run'}", "data.max_length=64", "train.logging_steps=2",
                          "data.eval_split=0.0", "train.eval_steps=0", "train.max_steps=6", *HYDRA])
    result = loop.train(recipe)
    frozen.assert_unchanged()  # the shared LM head and the input embedding are not adapted
    loaded = MedusaModel.from_pretrained(result.final_dir)
    assert isinstance(loaded.heads, HydraHeads) and loaded.config.base_model_subdir == "base_model"
    assert loaded.heads.projection == "shared_lm_head" and loaded.heads.draft_vocab == 200
    assert loaded.heads.shared_lm_head is lm_head_of(loaded.base_model)
    ids = torch.tensor([[1, 403, 407, 261, 378, 29, 261, 269, 363, 260, 365, 267]])  # [1, T]
    result.model.eval()
    with torch.no_grad():
        trained = result.model.heads
        want = trained(trained.teacher_inputs(result.model(input_ids=ids).hidden_states, ids))
        got = loaded.heads(loaded.heads.teacher_inputs(loaded(input_ids=ids).hidden_states, ids))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
