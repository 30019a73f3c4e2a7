"""The modes as coroutines driven by scripted replies: what each asks for, and the row (or the reason it
failed) it ends with."""

from __future__ import annotations

import pytest

from medusa.selfdistill.backends.base import Result
from medusa.selfdistill.modes import self_talk_job
from medusa.selfdistill.prompts import Prompt


def _drive(job, replies):
    """Run a mode's coroutine on scripted replies (``Result``s, one per request); its Outcome."""
    request = next(job)
    try:
        for reply in replies:
            assert request.messages is not None
            request = job.send(reply)
    except StopIteration as stop:
        return stop.value
    raise AssertionError("the job asked for more replies than scripted")


@pytest.mark.parametrize("on_length", ["keep", "error"])
def test_self_talk_user_turns_follow_on_length(on_length):
    prompt = Prompt(id="p", messages=[{"role": "user", "content": "Hi"}], text="Hi")
    whole, cut = Result("an answer", "stop"), Result("a cut question", "length")
    out = _drive(self_talk_job(prompt, 0, on_length, turns=3), [whole, cut, whole, cut, whole])
    if on_length == "keep":
        assert out.ended == "turns" and out.error is None
        assert [m["content"] for m in out.row["messages"]] == ["Hi", "an answer", "a cut question",
                                                               "an answer", "a cut question", "an answer"]
    else:  # the conversation ends after the last complete assistant reply, saying why
        assert out.error is None and out.ended.startswith("user turn: truncated")
        assert [m["content"] for m in out.row["messages"]] == ["Hi", "an answer"]
    empty = _drive(self_talk_job(prompt, 0, on_length, turns=3), [whole, Result("  ", "stop")])
    assert empty.ended == "user turn: empty reply" and len(empty.row["messages"]) == 2
