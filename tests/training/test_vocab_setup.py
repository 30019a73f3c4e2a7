"""The draft vocabulary at the start of a run (medusa/training/vocab_setup.py), end to end on the tiny
recipes: the saved map is the most frequent training labels' and decodes greedily equal through draft ids;
heads.init_from with a smaller map is widened (trained rows kept, the new ids from the base LM head), with a
larger one refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from medusa.config import load_recipe
from medusa.errors import ConfigError
from medusa.modeling.draft_vocab import build_token_map, label_counts, widen_map
from medusa.modeling.model import MedusaModel
from medusa.training import setup as S
from medusa.training.loop import train

from fit_heads import fit_heads
from tiny_models import stories_model

ROOT = Path(__file__).resolve().parents[2]
# stories260K present, run from the repository root (recipe paths), one torch thread (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("tiny_recipe_env")

TINY_DIR = ROOT / "recipes" / "tiny"


def _draft_recipe(name, tmp_path, *overrides):
    base = [f"output_dir={tmp_path / 'run'}", "data.max_length=64", "train.logging_steps=2",
            "data.eval_split=0.0", "train.eval_steps=0"]
    return load_recipe(TINY_DIR / f"{name}.yaml", base + list(overrides))


@pytest.mark.parametrize("name,head_type", [("medusa1", "linear"), ("medusa1", "shared_lm_head"),
                                            ("medusa2_lora", "linear")])
def test_draft_vocab_run_saves_the_map_of_the_most_frequent_labels(tmp_path, name, head_type, capsys):
    recipe = _draft_recipe(name, tmp_path, "heads.draft_vocab=64", f"heads.head_type={head_type}",
                     "train.max_steps=4")
    result = train(recipe)
    assert "draft vocabulary: 64 of 512 tokens cover" in capsys.readouterr().out
    rows = [json.loads(x) for x in (Path(result.output_dir) / "metrics.jsonl").read_text().splitlines()]
    miss = [r["head1_draft_miss"] for r in rows if "loss" in r]
    assert miss and all(0.0 < m < 1.0 for m in miss)
    data = S.load_data(recipe, S.load_tokenizer(recipe))
    expected = build_token_map(data.train.examples, 512, 64)
    base = stories_model() if name == "medusa1" else None
    loaded = MedusaModel.from_pretrained(result.final_dir, base_model=base)
    assert loaded.config.draft_vocab == 64 and torch.equal(loaded.heads.token_map, expected)
    if head_type == "linear":
        assert loaded.heads.lm_heads[0].weight.shape == (64, loaded.config.hidden_size)
    ids = torch.tensor([[1, 403, 407, 261, 378, 29]])
    ref = loaded.base_model.generate(ids, do_sample=False, max_new_tokens=12)
    fit_heads(loaded, ref, steps=150)  # the 4 steps left them near the LM head: fit them to the reference
    out = loaded.generate(ids, max_new_tokens=12, return_dict_in_generate=True)
    assert torch.equal(out.sequences, ref)
    assert max(out.accept_lengths[0]) >= 3  # tree paths through the draft ids accepted, not only the root


def test_init_from_with_a_larger_draft_vocab_is_refused(tmp_path):
    first = train(_draft_recipe("medusa1", tmp_path / "a", "heads.draft_vocab=64", "train.max_steps=2"))
    recipe = _draft_recipe("medusa1", tmp_path / "b", "heads.draft_vocab=32", "train.max_steps=2",
                     f"heads.init_from={first.final_dir}")
    with pytest.raises(ConfigError, match="heads.draft_vocab: 32, but heads.init_from .* has draft_vocab 64: "
                                          "a trained draft vocabulary can only be widened"):
        train(recipe)


def test_init_from_with_a_smaller_draft_vocab_is_widened(tmp_path):
    """32 -> 96 ids: the first 32 draft ids are the trained map's, each keeps its trained row; the 64 added
    are the most frequent labels outside it, starting as the base LM head's rows."""
    first = train(_draft_recipe("medusa1", tmp_path / "a", "heads.draft_vocab=32", "train.max_steps=3"))
    trained = MedusaModel.from_pretrained(first.final_dir, base_model=stories_model())
    recipe = _draft_recipe("medusa1", tmp_path / "b", "heads.draft_vocab=96", "train.max_steps=1",
                           "train.lr=1e-12", f"heads.init_from={first.final_dir}")
    second = train(recipe)
    widened = MedusaModel.from_pretrained(second.final_dir, base_model=stories_model())
    data = S.load_data(recipe, S.load_tokenizer(recipe))
    expected = widen_map(trained.heads.token_map, label_counts(data.train.examples, 512), 96)
    assert widened.config.draft_vocab == 96 and torch.equal(widened.heads.token_map, expected)
    assert torch.equal(widened.heads.token_map[:32], trained.heads.token_map)
    old, new = trained.heads.lm_heads[0].weight, widened.heads.lm_heads[0].weight  # [32, d], [96, d]
    assert torch.allclose(new[:32], old, atol=1e-6)  # lr 1e-12: one step leaves the rows where they were
    base_rows = widened.base_model.get_output_embeddings().weight[expected[32:]]
    assert torch.allclose(new[32:], base_rows.to(new.dtype), atol=1e-6)
    assert not torch.allclose(old, base_rows[:32].to(old.dtype), atol=1e-3)  # trained rows moved off the base
