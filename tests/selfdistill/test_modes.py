"""The modes (medusa.selfdistill.modes) as coroutines driven by scripted replies: what each asks for, and the
row (or the reason it failed) it ends with."""

from __future__ import annotations

import pytest

from medusa.selfdistill.backends.base import Result
from medusa.selfdistill.modes import completion_job, make_job, replay_job, row_seed, self_talk_job
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


def _run(job, replies):
    """The requests a mode's coroutine makes on scripted replies, and its Outcome."""
    requests = [next(job)]
    try:
        for reply in replies:
            requests.append(job.send(reply))
    except StopIteration as stop:
        return requests, stop.value
    raise AssertionError("the job asked for more replies than scripted")


def test_completion_job_keeps_or_refuses_a_cut_reply():
    prompt = Prompt(id="p", messages=[{"role": "user", "content": "Once upon"}], text="Once upon")
    (request,), out = _run(completion_job(prompt, 7, "keep"), [Result(" a time", "length", 3, 2)])
    assert (request.prompt, request.messages, request.seed) == ("Once upon", None, 7)
    assert out.row == {"prompt": "Once upon", "completion": " a time"} and out.error is None
    assert (out.finish_reasons, out.prompt_tokens, out.completion_tokens) == (["length"], 3, 2)
    _, out = _run(completion_job(prompt, 7, "error"), [Result(" a time", "length")])
    assert out.row is None and out.error.startswith("completion: truncated at max_new_tokens")
    _, out = _run(completion_job(prompt, 7, "keep"), [Result("", "error", error="HTTP 500")])
    assert out.row is None and out.error == "completion: HTTP 500"


def test_replay_job_answers_each_user_turn_with_its_own_seed():
    prompt = Prompt(id="p", text="q1", messages=[{"role": "system", "content": "S"},
                                                 {"role": "user", "content": "q1"},
                                                 {"role": "user", "content": "q2"}])
    replies = [Result("a1", "stop", 4, 1), Result("a2", "stop", 9, 1)]
    requests, out = _run(replay_job(prompt, 10, "error"), replies)
    assert [r.seed for r in requests] == [10, 11]
    assert requests[1].messages == [{"role": "system", "content": "S"}, {"role": "user", "content": "q1"},
                                    {"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"}]
    assert out.row == {"messages": requests[1].messages + [{"role": "assistant", "content": "a2"}]}
    assert (out.prompt_tokens, out.completion_tokens, out.finish_reasons) == (13, 2, ["stop", "stop"])
    requests, out = _run(replay_job(prompt, 10, "error", max_turns=1), [Result("a1", "stop")])
    assert len(requests) == 1 and [m["content"] for m in out.row["messages"]] == ["S", "q1", "a1"]
    _, out = _run(replay_job(prompt, 10, "error"), [Result("a1", "stop"), Result(" \n", "stop")])
    assert out.row is None and out.error == "reply to user turn 2: empty reply"


def test_row_seed_is_stable_per_source_and_sample():
    seeds = {row_seed(0, sid, s) for sid in ("a", "b") for s in (0, 1)}
    assert len(seeds) == 4 and all(0 <= s < 2**31 for s in seeds)
    assert row_seed(0, "a", 1) == row_seed(0, "a", 1) != row_seed(1, "a", 1)


def test_make_job_picks_the_mode():
    prompt = Prompt(id="p", messages=[{"role": "user", "content": "Hi"}], text="Hi")
    reply = Result("fine", "stop")
    requests, out = _run(make_job("self-talk", prompt, 0, "keep", turns=None), [reply] * 5)
    assert len(requests) == 5 and len(out.row["messages"]) == 6  # three assistant turns by default
    job = make_job("self-talk", prompt, 0, "keep", turns=2, user_prompt="Play the user.")
    requests, _ = _run(job, [reply] * 3)
    assert requests[1].messages[0] == {"role": "user", "content": "Play the user."}  # the flipped dialogue
    assert _run(make_job("completion", prompt, 0, "keep", None), [reply])[1].row == {"prompt": "Hi",
                                                                                      "completion": "fine"}
    assert "messages" in _run(make_job("replay", prompt, 0, "keep", None), [reply])[1].row
    with pytest.raises(ValueError, match="dialogue"):
        make_job("dialogue", prompt, 0, "keep", None)
