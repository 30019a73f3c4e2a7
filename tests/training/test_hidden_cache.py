"""The offline hidden-state cache (train.hidden_cache) for MEDUSA-1 on stories260K (CPU)."""

import json
from pathlib import Path

import pytest
import torch

import medusa.training.hidden_cache as HC
import medusa.training.medusa1 as M1
from medusa.config import load_recipe
from medusa.errors import ConfigError, MedusaError
from medusa.training import setup as S
from medusa.training.loop import train

from tiny_models import stories_model, tiny_model

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "recipes" / "tiny" / "medusa1.yaml"


# stories260K present, run from the repository root (recipe paths), one torch thread (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("tiny_recipe_env")


def _recipe(out, *overrides):
    base = [f"output_dir={out}", "data.max_length=64", "train.logging_steps=1", "data.eval_split=0.0",
            "train.eval_steps=0", "train.max_steps=6", "train.lr=5e-3"]
    return load_recipe(TINY, base + list(overrides))


def _losses(result):
    rows = [json.loads(x) for x in (Path(result.output_dir) / "metrics.jsonl").read_text().splitlines()]
    return [(r["loss"], r["head1_top1"]) for r in rows if "loss" in r]


def _no_backbone(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the backbone ran during cached training")
    monkeypatch.setattr(M1, "backbone_hidden", refuse)


def _examples_and_base(recipe):
    data = S.load_data(recipe, S.load_tokenizer(recipe))
    return data, S.load_backbone(recipe, torch.device("cpu"))


def test_cached_training_has_the_online_loss_curve(tmp_path, monkeypatch):
    online = _losses(train(_recipe(tmp_path / "online")))
    # float32 storage: the same curve as online training within float tolerance
    recipe = _recipe(tmp_path / "cached", f"train.hidden_cache={tmp_path / 'cache32'}")
    data, base = _examples_and_base(recipe)
    HC.prepare(tmp_path / "cache32", base, data.train.examples, data.pad_token_id, 4, dtype="float32")
    with monkeypatch.context() as m:
        _no_backbone(m)
        cached = _losses(train(recipe))
    assert len(cached) == len(online) == 6
    for (a, ta), (b, tb) in zip(online, cached):
        assert b == pytest.approx(a, rel=1e-5, abs=1e-6) and tb == pytest.approx(ta, abs=1e-6)
    # bf16 storage (the default, built by the run itself): the curve of online training whose hidden
    # states are rounded to bf16
    real = M1.backbone_hidden
    with monkeypatch.context() as m:
        m.setattr(M1, "backbone_hidden", lambda model, batch: real(model, batch).to(torch.bfloat16))
        rounded = _losses(train(_recipe(tmp_path / "rounded")))
    with monkeypatch.context() as m:  # the run builds its cache (one backbone pass), then trains from it
        _no_backbone(m)
        bf16 = _losses(train(_recipe(tmp_path / "bf16", f"train.hidden_cache={tmp_path / 'cache16'}")))
    index = json.loads((tmp_path / "cache16" / "cache.json").read_text())
    assert index["dtype"] == "bfloat16"
    for (a, _), (b, _) in zip(rounded, bf16):
        assert b == pytest.approx(a, rel=1e-5, abs=1e-6)
    assert any(abs(a - b) > 1e-7 for (a, _), (b, _) in zip(online, bf16))  # bf16 really is stored


def test_build_resumes_after_a_kill_and_equals_a_full_build(tmp_path, monkeypatch):
    recipe = _recipe(tmp_path / "r")
    data, base = _examples_and_base(recipe)
    examples = data.train.examples[:40]
    kw = dict(pad_token_id=data.pad_token_id, batch_size=3, shard_bytes=64 * 200 * 2, log=lambda s: None)
    assert HC.prepare(tmp_path / "c", base, examples, max_shards=2, **kw) is None  # "killed" after 2 shards
    n_shards = len(json.loads((tmp_path / "c" / "cache.json").read_text())["shards"])
    assert n_shards > 3
    (tmp_path / "c" / "shard-00002.hidden.tmp").write_bytes(b"half a shard")  # what a kill mid-write leaves
    written = []
    real = HC.write_shard
    monkeypatch.setattr(HC, "write_shard",
                        lambda plan, i, *a, **k: (written.append(i), real(plan, i, *a, **k)))
    cache = HC.prepare(tmp_path / "c", base, examples, **kw)
    assert written == list(range(2, n_shards))
    monkeypatch.setattr(HC, "write_shard", real)
    fresh = HC.prepare(tmp_path / "fresh", base, examples, **kw)
    assert len(cache) == len(fresh) == 40
    for i in range(40):
        assert torch.equal(cache.example_hidden(i).view(torch.int16),
                           fresh.example_hidden(i).view(torch.int16))
        assert cache.example_tokens(i) == (examples[i]["input_ids"], examples[i]["labels"])
    # the rows are the backbone's own hidden states (bf16)
    hidden = HC.backbone_hidden_fn(base)({"input_ids": torch.tensor([examples[5]["input_ids"]]),
                                          "attention_mask": torch.ones(1, len(examples[5]["input_ids"]))})
    torch.testing.assert_close(cache.example_hidden(5).float(), hidden[0].to(torch.bfloat16).float(),
                               rtol=0, atol=0)


def test_shards_split_over_processes(tmp_path):
    recipe = _recipe(tmp_path / "r")
    data, base = _examples_and_base(recipe)
    examples = data.train.examples[:30]
    fp = HC.base_fingerprint(base)
    plan = HC.open_plan(tmp_path / "c", examples, fp, 64, shard_bytes=64 * 150 * 2)
    fn = HC.backbone_hidden_fn(base)
    from medusa.data import collate
    col = lambda rows: collate(list(rows), data.pad_token_id)  # noqa: E731
    assert HC.build(plan, examples, fn, col, 4, rank=1, world=2, log=lambda s: None) == len(plan.shards) // 2
    assert [plan.done(i) for i in range(len(plan.shards))] == [i % 2 == 1 for i in range(len(plan.shards))]
    with pytest.raises(MedusaError, match="unfinished"):
        HC.HiddenCache(plan)
    HC.build(plan, examples, fn, col, 4, rank=0, world=2, log=lambda s: None)
    assert len(HC.HiddenCache(plan)) == 30


def test_refuses_another_base_other_examples_and_a_full_disk(tmp_path, monkeypatch):
    recipe = _recipe(tmp_path / "r")
    data, base = _examples_and_base(recipe)
    examples = data.train.examples[:12]
    logs = []
    HC.prepare(tmp_path / "c", base, examples, data.pad_token_id, 4, log=logs.append)
    assert logs and "GiB" in logs[0] and f"{sum(len(e['input_ids']) for e in examples):,} tokens" in logs[0]
    other = tiny_model("llama", hidden_size=64)
    with pytest.raises(MedusaError, match="train.hidden_cache: .* was made from another base model"):
        HC.prepare(tmp_path / "c", other, examples, data.pad_token_id, 4)
    tweaked = stories_model()
    with torch.no_grad():
        tweaked.model.layers[0].mlp.down_proj.weight.mul_(1.01)
    with pytest.raises(MedusaError, match="another base model"):
        HC.prepare(tmp_path / "c", tweaked, examples, data.pad_token_id, 4)
    with pytest.raises(MedusaError, match="other training examples"):
        HC.prepare(tmp_path / "c", base, examples[:11], data.pad_token_id, 4)
    monkeypatch.setattr(HC.shutil, "disk_usage", lambda p: type("U", (), {"free": 1000})())
    with pytest.raises(MedusaError, match=r"train.hidden_cache: .* needs .* GiB more but its disk has only"):
        HC.prepare(tmp_path / "new", base, examples, data.pad_token_id, 4)


def test_hidden_cache_is_medusa1_only():
    with pytest.raises(ConfigError, match="train.hidden_cache: only method medusa1"):
        load_recipe(ROOT / "recipes" / "tiny" / "medusa2_lora.yaml", ["output_dir=x", "train.hidden_cache=c"])


def test_cli_cache_hidden_builds_what_train_then_uses(tmp_path, capsys, monkeypatch):
    from medusa.cli import main

    args = ["cache-hidden", str(TINY), f"output_dir={tmp_path / 'run'}", "data.max_length=64",
            "data.eval_split=0.0", f"train.hidden_cache={tmp_path / 'cache'}"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "GiB" in out.splitlines()[0] and "complete: 2137 examples" in out
    assert main(args) == 0  # a finished cache: nothing to write
    assert "0.00 GiB to write" in capsys.readouterr().out
    written = []
    monkeypatch.setattr(HC, "write_shard", lambda *a: written.append(a))
    _no_backbone(monkeypatch)
    train(_recipe(tmp_path / "run", f"train.hidden_cache={tmp_path / 'cache'}", "train.max_steps=2"))
    assert written == []
    capsys.readouterr()
    assert main(["cache-hidden", str(TINY), "output_dir=x"]) == 2
    assert capsys.readouterr().err.strip() == ("error: train.hidden_cache: not set "
                                               "(give train.hidden_cache=DIR)")
