"""Magpie-style prompt synthesis: the user header, kept requests, the resumable prompts file, and a run that
writes distinct requests and answers them."""

from __future__ import annotations

import functools
import json

from selfdistill_helpers import chat_tokenizer, tiny_chat_model

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
