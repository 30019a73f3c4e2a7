"""The three modes as generator coroutines: each yields a :class:`Request`, is sent its :class:`Result`,
and finally returns an :class:`Outcome` (a finished row or a reason it failed). Backends drive them:
the local backend batches the pending requests of many conversations, the server backend runs each
conversation in its own worker thread.

Length-truncated replies (``finish_reason == "length"``) follow ``on_length``: ``"error"`` (default in
chat modes) sends the whole conversation to the errors file; ``"keep"`` (default in completion mode,
where a fixed-length continuation is the point) writes it with the finish reason in its metadata. In
self-talk a simulated *user* turn follows ``on_length`` too: kept (truncated) under ``"keep"``; under
``"error"`` a truncated user turn, like an empty one under either, ends the conversation after the last
complete assistant reply (``metadata.ended`` says why) and never appears in the output.
"""

from __future__ import annotations

import zlib
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

from medusa.selfdistill.backends.base import Request, Result
from medusa.selfdistill.prompts import Prompt

MODES = ("replay", "self-talk", "completion")
DEFAULT_USER_PROMPT = ("You are role-playing the user in a conversation with an AI assistant. Reply with "
                       "the user's next message only: a natural follow-up question or request.")


@dataclass
class Outcome:
    row: dict[str, Any] | None = None  # "messages" or "prompt"/"completion"
    error: str | None = None
    finish_reasons: list[str] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ended: str | None = None


Job = Generator[Request, Result, Outcome]


def row_seed(seed: int, source_id: str, sample: int) -> int:
    return zlib.crc32(f"{seed}\x00{source_id}\x00{sample}".encode()) & 0x7FFFFFFF


def _check(result: Result, what: str, on_length: str) -> str | None:
    """The reason a reply cannot be used, or None."""
    if result.error is not None or result.finish_reason == "error":
        return f"{what}: {result.error or 'generation failed'}"
    if result.finish_reason == "length" and on_length == "error":
        return (f"{what}: truncated at max_new_tokens (finish_reason=length); raise --max-new-tokens "
                "or pass --on-length keep")
    if not result.text.strip():
        return f"{what}: empty reply"
    return None


def completion_job(prompt: Prompt, seed: int, on_length: str) -> Job:
    out = Outcome()
    result = yield Request(prompt=prompt.text, seed=seed)
    out.prompt_tokens, out.completion_tokens = result.prompt_tokens, result.completion_tokens
    out.finish_reasons.append(result.finish_reason)
    out.error = _check(result, "completion", on_length)
    if out.error is None:
        out.row = {"prompt": prompt.text, "completion": result.text}
    return out


def replay_job(prompt: Prompt, seed: int, on_length: str, max_turns: int | None = None) -> Job:
    """Answer each user turn of the source in order; the model's replies replace the original ones."""
    out = Outcome()
    history: list[dict[str, str]] = []
    answered = 0
    for message in prompt.messages:
        history.append(dict(message))
        if message["role"] != "user":
            continue
        result = yield Request(messages=[dict(m) for m in history], seed=seed + answered)
        out.prompt_tokens += result.prompt_tokens
        out.completion_tokens += result.completion_tokens
        out.finish_reasons.append(result.finish_reason)
        answered += 1
        out.error = _check(result, f"reply to user turn {answered}", on_length)
        if out.error is not None:
            return out
        history.append({"role": "assistant", "content": result.text})
        if max_turns is not None and answered >= max_turns:
            break
    out.row = {"messages": history}
    return out


def _flip(history: list[dict[str, str]], user_prompt: str) -> list[dict[str, str]]:
    """The dialogue seen from the user's side: roles swapped, led by the role-play instruction."""
    flipped = [{"role": "user", "content": user_prompt}]
    for m in history:
        if m["role"] == "system":
            continue
        flipped.append({"role": "assistant" if m["role"] == "user" else "user", "content": m["content"]})
    return flipped


def self_talk_job(prompt: Prompt, seed: int, on_length: str, turns: int = 3,
                  user_prompt: str = DEFAULT_USER_PROMPT) -> Job:
    """Start from the source's system prompt and first user turn; the model then writes both sides until
    it has given ``turns`` assistant replies (the MEDUSA paper's Zephyr recipe)."""
    out = Outcome(ended="turns")
    history = [dict(m) for m in prompt.messages if m["role"] == "system"][:1]
    history.append({"role": "user", "content": prompt.user_turns[0]})
    for turn in range(1, turns + 1):
        result = yield Request(messages=[dict(m) for m in history], seed=seed + 2 * turn)
        out.prompt_tokens += result.prompt_tokens
        out.completion_tokens += result.completion_tokens
        out.finish_reasons.append(result.finish_reason)
        out.error = _check(result, f"assistant turn {turn}", on_length)
        if out.error is not None:
            return out
        history.append({"role": "assistant", "content": result.text})
        if turn == turns:
            break
        user = yield Request(messages=_flip(history, user_prompt), seed=seed + 2 * turn + 1)
        out.prompt_tokens += user.prompt_tokens
        out.completion_tokens += user.completion_tokens
        problem = _check(user, "user turn", on_length)
        if problem is not None:
            out.ended = problem
            break
        history.append({"role": "user", "content": user.text.strip()})
    out.row = {"messages": history}
    return out


def make_job(mode: str, prompt: Prompt, seed: int, on_length: str, turns: int | None,
             user_prompt: str = DEFAULT_USER_PROMPT) -> Job:
    if mode == "completion":
        return completion_job(prompt, seed, on_length)
    if mode == "replay":
        return replay_job(prompt, seed, on_length, turns)
    if mode == "self-talk":
        return self_talk_job(prompt, seed, on_length, turns or 3, user_prompt)
    raise ValueError(mode)
