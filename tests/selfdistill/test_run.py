"""self_distill (medusa.selfdistill.run) with the local backend: completion mode on stories260K, replay /
self-talk on a tiny chat model, truncated replies to the errors file, resume after an interruption."""

from __future__ import annotations

import json

import pytest
import torch
from selfdistill_helpers import CHAT_TEMPLATE, chat_tokenizer, tiny_chat_model
from selfdistill_helpers import local_config as _cfg
from selfdistill_helpers import read_rows as _rows
from selfdistill_helpers import write_prompts as _write_prompts

from medusa.errors import MedusaError
from medusa.selfdistill import Sampling, SelfDistillConfig, self_distill
from medusa.selfdistill.modes import DEFAULT_USER_PROMPT, _flip
from medusa.selfdistill.prompts import load_prompts

from tiny_models import SHARED, STORIES, require_shared, stories_model, stories_tokenizer

TINYSTORIES = SHARED / "data" / "tinystories_sample.txt"


def test_completion_mode_on_stories260k_batched_equals_unbatched(tmp_path):
    require_shared(TINYSTORIES)
    common = dict(model=str(STORIES), prompts=str(TINYSTORIES), mode="completion", limit=6, dtype="float32",
                  sampling=Sampling(temperature=0.0, max_new_tokens=8), progress=False)
    s4 = self_distill(SelfDistillConfig(out=str(tmp_path / "b4.jsonl"), batch_size=4, **common))
    s1 = self_distill(SelfDistillConfig(out=str(tmp_path / "b1.jsonl"), batch_size=1, **common))
    assert s4["written"] == s1["written"] == 6 and s4["completion_tokens"] == 48 and s4["tokens_per_s"] > 0
    b4 = {r["id"]: r for r in _rows(tmp_path / "b4.jsonl")}
    b1 = {r["id"]: r for r in _rows(tmp_path / "b1.jsonl")}
    assert b4.keys() == b1.keys()
    docs = load_prompts(TINYSTORIES, limit=6)
    tok, model = stories_tokenizer(), stories_model()
    for doc in docs:
        row = b4[f"{doc.id}:0"]
        assert row["completion"] == b1[row["id"]]["completion"]  # left padding changes nothing
        assert row["prompt"] == doc.text and doc.text.endswith(".") and "\n" not in doc.text
        meta = row["metadata"]
        assert (meta["mode"], meta["source_id"], meta["sample"], meta["finish_reasons"]) == \
            ("completion", doc.id, 0, ["length"])
        ids = tok(doc.text, return_tensors="pt").input_ids
        with torch.no_grad():
            ref = model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0)
        full = tok.decode(ref[0], skip_special_tokens=True)
        assert row["prompt"] + row["completion"] == full  # spaces between prompt and completion kept


def test_replay_answers_each_user_turn_in_order(tmp_path):
    rows = [{"question_id": 1, "turns": ["First question?", "Second question?"]},
            {"id": "sg", "conversations": [{"from": "system", "value": "Be kind."},
                                           {"from": "human", "value": "Hello"},
                                           {"from": "gpt", "value": "ORIGINAL REPLY"},
                                           {"from": "human", "value": "Bye"},
                                           {"from": "gpt", "value": "ORIGINAL 2"}]}]
    _write_prompts(tmp_path, rows)
    s = self_distill(_cfg(tmp_path, mode="replay", num_samples=2), model=tiny_chat_model(),
                     tokenizer=chat_tokenizer())
    assert s["written"] == 4 and s["errors"] == 0
    out = {r["id"]: r for r in _rows(tmp_path / "out.jsonl")}
    assert sorted(out) == ["1:0", "1:1", "sg:0", "sg:1"]
    for sample in (0, 1):
        mt = out[f"1:{sample}"]["messages"]
        assert [m["role"] for m in mt] == ["user", "assistant", "user", "assistant"]
        assert [mt[0]["content"], mt[2]["content"]] == rows[0]["turns"]
        sg = out[f"sg:{sample}"]["messages"]
        assert [m["role"] for m in sg] == ["system", "user", "assistant", "user", "assistant"]
        assert [sg[0]["content"], sg[1]["content"], sg[3]["content"]] == ["Be kind.", "Hello", "Bye"]
        assert "ORIGINAL" not in sg[2]["content"] + sg[4]["content"]
        assert out[f"sg:{sample}"]["metadata"]["finish_reasons"] == ["length", "length"]
    assert out["1:0"]["messages"] != out["1:1"]["messages"]  # two samples, two different seeds
    # --turns limits replay to the first N user turns
    s = self_distill(_cfg(tmp_path, mode="replay", turns=1, out=str(tmp_path / "t1.jsonl")),
                     model=tiny_chat_model(), tokenizer=chat_tokenizer())
    assert all(len(r["messages"]) in (2, 3) for r in _rows(tmp_path / "t1.jsonl"))


def test_self_talk_alternates_roles_for_n_turns(tmp_path):
    _write_prompts(tmp_path, [{"id": "a", "messages": [{"role": "system", "content": "Sys."},
                                                        {"role": "user", "content": "Let us talk."},
                                                        {"role": "assistant", "content": "dropped"},
                                                        {"role": "user", "content": "dropped too"}]},
                              {"id": "b", "prompt": "Tell me a story."}])
    # Every reply is cut at max_new_tokens=6; --on-length keep keeps the simulated user turns too.
    s = self_distill(_cfg(tmp_path, mode="self-talk", turns=3), model=tiny_chat_model(),
                     tokenizer=chat_tokenizer())
    assert s["written"] == 2
    for row in _rows(tmp_path / "out.jsonl"):
        msgs = [m for m in row["messages"] if m["role"] != "system"]
        assert msgs[0]["content"] in ("Let us talk.", "Tell me a story.")
        assert [m["role"] for m in msgs] == ["user", "assistant"] * 3  # three turns each
        assert row["metadata"]["ended"] == "turns"
        assert "length" in row["metadata"]["finish_reasons"]
        assert "dropped" not in json.dumps(row["messages"])
    hist = [{"role": "system", "content": "S"}, {"role": "user", "content": "u1"},
            {"role": "assistant", "content": "a1"}]
    assert _flip(hist, DEFAULT_USER_PROMPT) == [{"role": "user", "content": DEFAULT_USER_PROMPT},
                                                {"role": "assistant", "content": "u1"},
                                                {"role": "user", "content": "a1"}]


def test_length_truncated_chat_replies_go_to_the_errors_file(tmp_path):
    _write_prompts(tmp_path, [{"prompt": f"q{i}"} for i in range(3)])
    with pytest.raises(MedusaError, match="first 3 rows all failed"):
        self_distill(_cfg(tmp_path, mode="replay", on_length=None), model=tiny_chat_model(),
                     tokenizer=chat_tokenizer())
    errors = _rows(tmp_path / "out.errors.jsonl")
    assert len(errors) == 3 and all("finish_reason=length" in e["reason"] for e in errors)
    assert (tmp_path / "out.jsonl").read_text() == ""
    # a re-run does not retry them unless asked, then does (and keeps them when --on-length keep)
    assert self_distill(_cfg(tmp_path, mode="replay"), model=tiny_chat_model(),
                        tokenizer=chat_tokenizer())["skipped_failed_before"] == 3
    s = self_distill(_cfg(tmp_path, mode="replay", retry_errors=True), model=tiny_chat_model(),
                     tokenizer=chat_tokenizer())
    assert s["written"] == 3 and (tmp_path / "out.errors.jsonl").read_text() == ""


def test_interrupted_run_resumes_without_duplicates(tmp_path, monkeypatch):
    _write_prompts(tmp_path, [{"prompt": f"question {i}"} for i in range(10)])
    import medusa.selfdistill.backends.local as local

    real = local.generate_refill

    def dies_after_six_replies(*args, **kwargs):  # a Ctrl-C while the 7th reply is being generated
        for n, item in enumerate(real(*args, **kwargs)):
            if n == 6:
                raise KeyboardInterrupt
            yield item

    monkeypatch.setattr(local, "generate_refill", dies_after_six_replies)
    with pytest.raises(KeyboardInterrupt):
        self_distill(_cfg(tmp_path, mode="replay", batch_size=3), model=tiny_chat_model(),
                     tokenizer=chat_tokenizer())
    first = _rows(tmp_path / "out.jsonl")
    assert len(first) == 6
    with open(tmp_path / "out.jsonl", "a") as fh:
        fh.write('{"id": "question 9:0", "messa')  # and a kill mid-write
    monkeypatch.setattr(local, "generate_refill", real)
    s = self_distill(_cfg(tmp_path, mode="replay", batch_size=3), model=tiny_chat_model(),
                     tokenizer=chat_tokenizer())
    assert s["already_done"] == 6 and s["written"] == 4
    ids = [r["metadata"]["source_id"] for r in _rows(tmp_path / "out.jsonl")]
    assert sorted(ids) == sorted(f"prompts-{i}" for i in range(10))
    assert [r["messages"] for r in _rows(tmp_path / "out.jsonl")[:6]] == [r["messages"] for r in first]


def test_chat_template_option_on_a_completion_model(tmp_path):
    require_shared(STORIES)
    _write_prompts(tmp_path, [{"prompt": "Tell me a story."}])
    s = self_distill(SelfDistillConfig(model=str(STORIES), prompts=str(tmp_path / "prompts.jsonl"),
                                       out=str(tmp_path / "out.jsonl"), chat_template=CHAT_TEMPLATE,
                                       sampling=Sampling(max_new_tokens=4), on_length="keep", progress=False))
    assert s["written"] == 1
    (row,) = _rows(tmp_path / "out.jsonl")
    assert [m["role"] for m in row["messages"]] == ["user", "assistant"]


def test_rows_made_with_other_sampling_settings_are_not_appended(tmp_path):
    _write_prompts(tmp_path, [{"prompt": f"question {i}"} for i in range(3)])
    self_distill(_cfg(tmp_path, mode="replay", limit=2), model=tiny_chat_model(), tokenizer=chat_tokenizer())
    before = (tmp_path / "out.jsonl").read_bytes()
    other = _cfg(tmp_path, mode="replay")
    other.sampling = Sampling(temperature=0.3, max_new_tokens=other.sampling.max_new_tokens)
    differing = r"sampling \{'seed': 1, 'temperature': 0\.8\}, not \{'seed': 0, 'temperature': 0\.3\}: "
    with pytest.raises(MedusaError, match=f"already holds rows with {differing}rows made with other"):
        self_distill(other, model=tiny_chat_model(), tokenizer=chat_tokenizer())  # the differing ones only
    assert (tmp_path / "out.jsonl").read_bytes() == before
    s = self_distill(_cfg(tmp_path, mode="replay"), model=tiny_chat_model(), tokenizer=chat_tokenizer())
    assert s["written"] == 1  # the same settings resume


def test_a_second_run_on_the_same_output_is_refused_while_the_first_runs(tmp_path):
    from medusa.io import output_lock

    _write_prompts(tmp_path, [{"prompt": "question"}])
    with output_lock(tmp_path / "out.jsonl"):  # the first run holds the output
        with pytest.raises(MedusaError, match="another run .* is writing this output"):
            self_distill(_cfg(tmp_path, mode="replay"), model=tiny_chat_model(), tokenizer=chat_tokenizer())
    assert not (tmp_path / "out.jsonl").exists()
    (tmp_path / ".out.jsonl.lock").write_text("999999999\n")  # left by a killed run: taken over
    s = self_distill(_cfg(tmp_path, mode="replay"), model=tiny_chat_model(), tokenizer=chat_tokenizer())
    assert s["written"] == 1 and not (tmp_path / ".out.jsonl.lock").exists()
