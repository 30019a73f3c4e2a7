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
