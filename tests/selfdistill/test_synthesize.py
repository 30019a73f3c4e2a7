"""Magpie-style prompt synthesis: the user header, kept requests, the resumable prompts file, and a run that
writes distinct requests and answers them."""

from __future__ import annotations

import functools
import json

import pytest
from selfdistill_helpers import chat_tokenizer, tiny_chat_model

from medusa.errors import ConfigError, DataError
from medusa.selfdistill import SelfDistillConfig, self_distill
from medusa.selfdistill import synthesize as syn
from medusa.selfdistill.backends.base import Sampling

from tiny_models import STORIES, require_shared


def test_synthesized_prompts_are_distinct_nonempty_user_turns(tmp_path, monkeypatch):
    require_shared(STORIES)
    tok = chat_tokenizer()
    header = syn.user_header(tok)
    assert tok.decode(header) == "<s>user: "
    # a random model rarely ends its turn early: allow long requests so that some end by themselves
    monkeypatch.setattr(syn, "SynthesisOptions", functools.partial(syn.SynthesisOptions, max_tokens=150,
                                                                   min_chars=4))
    out = tmp_path / "d.jsonl"
    cfg = SelfDistillConfig(model="tiny-chat", prompts=None, out=str(out), synthesize_prompts=4, batch_size=4,
                            on_length="keep", sampling=Sampling(temperature=0.0, max_new_tokens=4),
                            progress=False)
    s = self_distill(cfg, model=tiny_chat_model(), tokenizer=tok)
    made = syn.read_synthesized(tmp_path / "d.prompts.jsonl")
    assert s["synthesized"] == len(made) == 4
    assert len({syn.normalise(p) for p in made}) == 4 and all(p.strip() for p in made)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert s["written"] == 4, s
    assert sorted(r["messages"][0]["content"] for r in rows) == sorted(made)
    again = self_distill(SelfDistillConfig(model="tiny-chat", prompts=None, out=str(out),
                                           synthesize_prompts=4, on_length="keep", progress=False,
                                           sampling=Sampling(temperature=0.0, max_new_tokens=4)),
                         model=tiny_chat_model(), tokenizer=tok)
    assert again["synthesized"] == 0 and again["already_done"] == 4  # resumed, nothing redone


def test_user_header_needs_a_template_that_places_the_text():
    tok = chat_tokenizer(template=None)
    with pytest.raises(ConfigError, match="needs a chat model"):
        syn.user_header(tok)
    tok.chat_template = "{% for m in messages %}{{ m['role'] }}: (hidden){% endfor %}"
    with pytest.raises(ConfigError, match="does not place the user's text verbatim"):
        syn.user_header(tok)


def test_keep_request_and_normalise():
    opts = syn.SynthesisOptions(min_chars=5)
    assert syn.keep_request("  Tell me a story. ", "stop", opts, ["</s>"])
    assert not syn.keep_request("Tell me a story.", "length", opts, ["</s>"])  # cut at the token limit
    assert not syn.keep_request(" Hi! ", "stop", opts, ["</s>"])  # too short once stripped
    assert not syn.keep_request("Tell me</s> more", "stop", opts, ["</s>"])  # a template token inside
    assert syn.normalise("  Tell\n me   A story. ") == "tell me a story."


def test_synthesize_keeps_distinct_ended_requests_over_rounds():
    require_shared(STORIES)
    tok = chat_tokenizer()
    script = [[("Tell me a story.", "stop"), ("tell  me a STORY.", "stop"), ("Cut off req", "length"),
               ("Old one here", "stop"), ("Hi", "stop")],
              [("What is a cat?", "stop"), ("Name a red fruit.", "stop")]]
    calls = []

    def generate(prompts, seed):
        calls.append((len(prompts), seed, prompts[0]))
        return [(tok(text, add_special_tokens=False)["input_ids"], reason)
                for text, reason in script[len(calls) - 1]]

    rounds = []
    made = syn.synthesize(generate, tok, 2, syn.SynthesisOptions(min_chars=4, seed=5), seen={"old one here"},
                          on_round=lambda r, n: rounds.append((r, n)))
    assert made == ["Tell me a story.", "What is a cat?"]  # duplicates, cut, seen and short ones dropped
    header = syn.user_header(tok)
    assert [c[2] for c in calls] == [header, header] and calls[0][0] >= 8  # oversampled, at least 8
    assert calls[0][1] != calls[1][1] and rounds == [(0, 1), (1, 2)]


def test_synthesized_prompts_file_round_trip(tmp_path):
    path = tmp_path / "sub" / "d.prompts.jsonl"
    assert syn.read_synthesized(path) == []
    syn.append_synthesized(path, ["Tell me a story.", "Qu'est-ce qu'un chat ?"], start=0)
    syn.append_synthesized(path, ["Name a fruit."], start=2)
    assert syn.read_synthesized(path) == ["Tell me a story.", "Qu'est-ce qu'un chat ?", "Name a fruit."]
    ids = [json.loads(line)["id"] for line in path.read_text().splitlines()]
    assert ids == ["synth-0", "synth-1", "synth-2"]
    path.write_text(path.read_text() + '{"id": "synth-3"}\n')
    with pytest.raises(DataError, match=r"d\.prompts\.jsonl:4: not a synthesized prompt row"):
        syn.read_synthesized(path)


def test_synthesis_appends_chunk_by_chunk(tmp_path, monkeypatch):
    """A long synthesis writes each chunk of requests before sampling the next: a kill keeps what is done."""
    import medusa.selfdistill.run as run

    require_shared(STORIES)
    tok = chat_tokenizer()
    monkeypatch.setattr(syn, "SynthesisOptions", functools.partial(syn.SynthesisOptions, max_tokens=150,
                                                                   min_chars=4))
    monkeypatch.setattr(run, "SYNTHESIS_CHUNK", 2)
    written_before = []
    real = run._synthesize_chunk

    def watched(backend, have, want, opts):
        written_before.append(len(syn.read_synthesized(tmp_path / "d.prompts.jsonl")))
        return real(backend, have, want, opts)

    monkeypatch.setattr(run, "_synthesize_chunk", watched)
    cfg = SelfDistillConfig(model="tiny-chat", prompts=None, out=str(tmp_path / "d.jsonl"),
                            synthesize_prompts=5, batch_size=4, on_length="keep",
                            sampling=Sampling(temperature=0.0, max_new_tokens=2), progress=False)
    s = self_distill(cfg, model=tiny_chat_model(), tokenizer=tok)
    assert s["synthesized"] == 5 and written_before == [0, 2, 4]
