"""The real chat model (SmolLM2-135M-Instruct, converted from the pinned PyPI wheel): greedy MEDUSA equals
HF greedy through EOS on chat prompts, batch 1 and 2; the Spec-Bench reader; the pinned-hash check.

The converted model is prepared by ``make test`` (``python -m medusa.pipelines.chat_model``); outside CI
the tests skip when it is absent, in CI (MEDUSA_REQUIRE_SHARED=1) its absence fails.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from decoding_helpers import memorise_heads, real_rows

from medusa import MedusaModel
from medusa.errors import MedusaError
from medusa.pipelines import chat_model
from medusa.pipelines.smollm2 import spec_bench

from tiny_models import SHARED, require_shared

PROMPTS = ["What is the capital of France?", "Write a Python function that reverses a string."]


def smollm2_dir() -> Path:
    path = Path(os.environ.get("MEDUSA_SMOLLM2", chat_model.default_cache() / "smollm2-135m-instruct"))
    if not (path / "model.safetensors").is_file():
        if os.environ.get("MEDUSA_REQUIRE_SHARED") == "1":
            pytest.fail(f"{path}: the converted SmolLM2 is missing (make test prepares it)")
        pytest.skip(f"{path}: run `python -m medusa.pipelines.chat_model` to prepare SmolLM2")
    return path


@pytest.fixture(scope="module")
def chat():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = smollm2_dir()
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    messages = [[{"role": "user", "content": p}] for p in PROMPTS]
    batch = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                          return_dict=True, padding=True)
    with torch.no_grad():
        ref = base.generate(**batch, max_new_tokens=40, do_sample=False)  # [2, P + new], EOS-padded rows
    model = MedusaModel.from_base(base, num_heads=3, num_layers=1, head_type="shared_lm_head")
    eos = base.generation_config.eos_token_id
    memorise_heads(model, real_rows(ref, batch["attention_mask"], eos), steps=60)
    return model, tokenizer, batch, ref


def test_model_is_the_chat_model(chat):
    model, tokenizer, _, _ = chat
    assert tokenizer.chat_template and tokenizer.eos_token == "<|im_end|>"
    assert model.base_model.generation_config.eos_token_id == 2
    assert model.base_model.config.vocab_size == 49152


@pytest.mark.parametrize("row", [0, 1])
def test_greedy_equals_hf_through_eos_batch_1(chat, row):
    model, tokenizer, batch, ref = chat
    mask = batch["attention_mask"][row].bool()
    ids = batch["input_ids"][row][mask].view(1, -1)
    expected = real_rows(ref[row: row + 1], batch["attention_mask"][row: row + 1],
                         model.base_model.generation_config.eos_token_id)[0]
    out = model.generate(ids, max_new_tokens=40, return_dict_in_generate=True)
    assert torch.equal(out.sequences[0], expected)
    assert max(out.accept_lengths[0]) >= 3  # the fitted heads were accepted: tree paths, not only the root


def test_greedy_equals_hf_through_eos_batch_2(chat):
    model, _, batch, ref = chat
    out = model.generate(batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=40,
                         return_dict_in_generate=True)
    assert torch.equal(out.sequences, ref)  # left padding, the row that stops at EOS padded like HF's
    assert all(max(a) >= 3 for a in out.accept_lengths)  # tree paths accepted in both rows


def test_spec_bench_rows_per_category():
    require_shared(SHARED)
    rows = spec_bench(SHARED, per_category=2)
    cats = [r["category"] for r in rows]
    assert sorted(set(cats)) == ["math_reasoning", "mt_bench", "qa", "rag", "summarization", "translation"]
    assert all(cats.count(c) == 2 for c in set(cats)) and all(r["prompt"].strip() for r in rows)


def test_pinned_hash_mismatch_is_an_error(tmp_path, monkeypatch):
    wheel = tmp_path / chat_model.WHEEL_FILE
    wheel.write_bytes(b"not the wheel")
    with pytest.raises(MedusaError, match="sha256"):
        chat_model.download_wheel(tmp_path)


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
