"""``python -m benchmarks.training throughput | cache-speedup`` on the tiny recipe: one command each, a
table plus a JSON line whose figures are positive and consistent (nothing about speed is asserted)."""

import json
import math

import pytest

from benchmarks.training import main

RECIPE = "recipes/tiny/medusa1.yaml"
PARTS = ("backbone_forward", "heads_forward", "heads_backward", "optimizer")


def _run(capsys, argv):
    assert main(argv) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0] == "| quantity | value |"
    return json.loads(out[-1])


def _positive(result, keys):
    for key in keys:
        value = result[key]
        assert isinstance(value, (int, float)) and math.isfinite(value) and value > 0, (key, value)


def _epoch_tokens(recipe_path, overrides, steps):
    """Tokens of the first ``steps`` micro-batches of epoch 0, computed here from the recipe's data."""
    from medusa.config import load_recipe
    from medusa.training import setup as S

    recipe = load_recipe(recipe_path, overrides)
    examples = S.load_data(recipe, S.load_tokenizer(recipe)).train.examples
    order = S.epoch_order(len(examples), recipe.train.seed, 0)
    bs = recipe.train.batch_size
    return sum(len(examples[i]["input_ids"]) for i in order[:steps * bs])


@pytest.mark.usefixtures("tiny_recipe_env")
@pytest.mark.parametrize("draft", [0, 128])
def test_throughput_json(capsys, draft):
    overrides = [f"heads.draft_vocab={draft}"]
    r = _run(capsys, ["throughput", RECIPE, *overrides, "--steps", "3", "--warmup", "1", "--threads", "1"])
    _positive(r, ["tokens", "forward_only_s", "train_s", "forward_only_tokens_per_s", "train_tokens_per_s",
                  "ratio", "ratio_from_parts"] + [f"{p}_s" for p in PARTS])
    assert r["steps"] == 3 and r["threads"] == 1 and r["draft_vocab"] == draft
    assert r["tokens"] == _epoch_tokens(RECIPE, overrides, 4) - _epoch_tokens(RECIPE, overrides, 1)
    assert r["train_s"] == pytest.approx(sum(r[f"{p}_s"] for p in PARTS))
    assert sum(r[f"{p}_share"] for p in PARTS) == pytest.approx(1.0)
    assert r["ratio"] == pytest.approx(r["train_tokens_per_s"] / r["forward_only_tokens_per_s"])
    extra = r["heads_forward_s"] + r["heads_backward_s"] + r["optimizer_s"]
    assert r["ratio_from_parts"] == pytest.approx(r["forward_only_s"] / (r["forward_only_s"] + extra))
    if draft:
        assert 0 < r["draft_vocab_coverage"] <= 1
    else:
        assert r["draft_vocab_coverage"] is None


@pytest.mark.usefixtures("tiny_recipe_env")
def test_cache_speedup_json(capsys, tmp_path):
    overrides = ["heads.draft_vocab=128"]
    r = _run(capsys, ["cache-speedup", RECIPE, *overrides, "--steps", "2", "--threads", "1",
                      "--cache-dir", str(tmp_path)])
    _positive(r, ["tokens", "cache_write_s", "cache_bytes", "online_epoch_s", "cached_epoch_s",
                  "cache_read_s", "speedup", "online_heads_s", "cache_tokens", "steps_per_epoch",
                  "cache_write_over_online_epoch"])
    assert r["steps"] == 2 and r["steps_per_epoch"] > 2
    assert r["tokens"] == _epoch_tokens(RECIPE, overrides, 2)
    assert r["speedup"] == pytest.approx(r["online_epoch_s"] / r["cached_epoch_s"])
    # every cached token: a bf16 row of stories260K's hidden size 64, its id and label (int32 each)
    assert r["cache_tokens"] == r["tokens"] and r["cache_examples"] == 2 * 8
    assert r["cache_bytes"] >= r["cache_tokens"] * (2 * 64 + 2 * 4)
    assert list(tmp_path.iterdir()) == []  # the temporary cache is removed
