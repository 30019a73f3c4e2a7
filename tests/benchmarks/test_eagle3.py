"""The eagle3 pipeline's pieces that run without the real model: settings, targets, the summary text, the
training-rows cut, and a training checkpoint's drafter turned into a loadable heads checkpoint."""

import json

import torch
from safetensors.torch import save_file

from benchmarks import eagle3
from medusa import MedusaModel

from tiny_models import tiny_model


def test_settings_and_targets():
    s, _ = eagle3.parse_settings(["--out", "o", "--train-rows", "100", "--ship", "d", "--threads", "1"])
    assert (s.out, s.train_rows, s.ship, s.threads) == ("o", 100, "d", 1)
    assert (s.doc_tasks, s.skip_rows, s.init_from) == (0, 0, None)
    s, _ = eagle3.parse_settings(["--doc-tasks", "50", "--skip-rows", "3200", "--init-from", "heads"])
    assert (s.doc_tasks, s.skip_rows, s.init_from, s.train_rows) == (50, 3200, "heads", None)
    bench = {"tokens_per_step": 2.4, "speedup": 1.1, "greedy_exact_match": 1.0, "hybrid": {"speedup": 1.7}}
    t = eagle3.targets(bench)
    assert t["tokens_per_step_alone"]["met"] and not t["speedup_alone"]["met"]
    assert t["speedup_with_lookup"]["met"] and t["greedy_exact_match"]["met"]
    text = eagle3.format_summary({"bench": {"table": "TABLE"}, "targets": t})
    assert "TABLE" in text and "missed by 0.20" in text


def test_checkpoint_heads(tmp_path):
    base = tiny_model("llama", layers=4)
    model = MedusaModel.from_base(base, num_heads=2, head_type="eagle3")
    model.save_pretrained(tmp_path / "final")
    state = model.heads.state_dict()
    trained = {f"heads.{k}": v + 1.0 if v.is_floating_point() else v for k, v in state.items()}
    (tmp_path / "checkpoint-4").mkdir()
    save_file(trained, str(tmp_path / "checkpoint-4" / "model.safetensors"))
    out = eagle3.checkpoint_heads(tmp_path / "checkpoint-4", tmp_path / "final", tmp_path / "step-4", base)
    back = MedusaModel.from_pretrained(out, base_model=base)
    for k, v in back.heads.state_dict().items():
        assert torch.equal(v, trained[f"heads.{k}"]), k
    assert json.loads((out / "medusa_config.json").read_text())["head_type"] == "eagle3"


def test_answered_only_trains_on_the_rows_answered_so_far(tmp_path):
    import pytest

    from medusa.errors import DataError

    def row(n):
        return {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
                "metadata": {"completion_tokens": n, "finish_reasons": ["stop"]}}
    data = tmp_path / "data"
    data.mkdir()
    parts = (("distill_alpaca", [row(3), row(4)]), ("distill_synth", [row(5)]), ("calib", [row(1)]))
    for name, rows in parts:
        (data / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = eagle3.Settings(out=str(tmp_path), synthesize=6000, doc_tasks=3057, calib_prompts=1,
                        answered_only=True)
    with pytest.raises(DataError, match="missing distill_docs.jsonl"):
        eagle3.distill_stage(s, "no-model-is-loaded", data)
    (data / "distill_docs.jsonl").write_text(json.dumps(row(7)) + "\n" + '{"messages": [{"ro')  # killed
    result = eagle3.distill_stage(s, "no-model-is-loaded", data)
    assert result["train_replies"] == {"rows": 4, "reply_tokens": 19, "truncated_share": 0.0}
    assert [p["rows"] for p in result["parts"]] == [2, 1, 1] and result["calib_rows"] == 1
    assert len((data / "train.jsonl").read_text().splitlines()) == 4
    s.skip_rows, s.train_rows = 1, 3  # as after a full distillation: rows 1-2 of the four
    assert eagle3.distill_stage(s, "no-model-is-loaded", data)["train_replies"]["reply_tokens"] == 9
    s.calib_prompts = 2
    with pytest.raises(DataError, match="1 held-out replies, need 2"):
        eagle3.distill_stage(s, "no-model-is-loaded", data)
    (data / "distill_synth.jsonl").write_text("{broken\n" + json.dumps(row(5)) + "\n")
    s.calib_prompts = 1
    with pytest.raises(DataError, match=r"distill_synth.jsonl: row 0 is not JSON"):
        eagle3.distill_stage(s, "no-model-is-loaded", data)
