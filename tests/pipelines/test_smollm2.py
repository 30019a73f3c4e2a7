"""``make bench-chat`` (medusa.pipelines.smollm2): the distill stage on the real chat model, the targets, the
printed summary and the command line."""

from __future__ import annotations

from real_models import smollm2_dir

from tiny_models import SHARED, require_shared


def test_distill_stage_writes_chat_replies_and_resumes(tmp_path):
    """The bench-chat distill stage on a few prompts: greedy replay replies through the chat template."""
    import json

    from medusa.pipelines.smollm2 import Settings, distill_stage

    require_shared(SHARED)
    model = str(smollm2_dir())
    s = Settings(out=str(tmp_path), shared=str(SHARED), sharegpt_prompts=2, alpaca_prompts=2, calib_prompts=2,
                 distill_tokens=8, distill_batch=4, progress=False)
    first = distill_stage(s, model, tmp_path / "data")
    assert first["train_rows"] == 4 and first["calib_rows"] == 2
    rows = [json.loads(line) for line in (tmp_path / "data" / "train.jsonl").read_text().splitlines()]
    assert len(rows) == 4
    for row in rows:
        roles = [turn["role"] for turn in row["messages"]]
        assert roles == ["user", "assistant"] and row["messages"][1]["content"].strip()
        assert row["metadata"]["mode"] == "replay" and row["metadata"]["completion_tokens"] <= 8
    again = distill_stage(s, model, tmp_path / "data")
    assert sum(p["written"] for p in again["parts"]) == 0  # resumed: every row was already there
