"""Prompt sources for self-distillation: every supported dataset format -> a list of :class:`Prompt`.

Formats (detected per row with ``format="auto"``):

- ``sharegpt``: ``{"conversations": [{"from": "human"|"gpt"|"system", "value": ...}]}``
- ``messages``: ``{"messages": [{"role": "user"|"assistant"|"system"|"tool", "content": ...}]}`` (OpenAI)
- ``alpaca``: ``{"instruction": ..., "input": ..., "output": ...}``: instruction (+ input) is the user turn
- ``mtbench``: ``{"turns": ["first user turn", "second user turn", ...]}`` (MT-bench / Spec-Bench)
- ``prompt``: ``{"prompt": "..."}`` (a ``completion`` beside it is ignored)
- ``text``: ``{"text": "..."}`` rows or a ``.txt`` file of blank-line separated documents; the prompt is
  the beginning of each document (first sentence(s), ``prompt_chars`` or ``prompt_tokens``).

Rows are read and detected by :mod:`medusa.data.readers` (the same reader and format table as training
data): ``.json`` (a list of rows), ``.jsonl``, ``.parquet``, ``.txt``; a ``datasets`` directory or a hub
dataset id. Only the *user side* of a conversation is kept (system and user turns): the source's assistant
(and tool) turns are discarded because the model writes its own (an Alpaca ``output`` too).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from medusa.config.enums import PROMPT_FORMATS as FORMATS
from medusa.data.readers import RowError, check_user_turns, read_rows, row_format, str_field, user_side
from medusa.errors import DataError

_ID_KEYS = ("id", "question_id", "conversation_id", "idx", "uid")
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+")


@dataclass
class Prompt:
    """One source item. ``messages`` holds the system and user turns in order (assistant turns dropped);
    ``text`` is the raw prompt used in completion mode."""

    id: str
    messages: list[dict[str, str]]
    text: str
    source_format: str = "prompt"
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def user_turns(self) -> list[str]:
        return [m["content"] for m in self.messages if m["role"] == "user"]

    @property
    def system(self) -> str | None:
        sys_msgs = [m["content"] for m in self.messages if m["role"] == "system"]
        return sys_msgs[0] if sys_msgs else None


def first_sentences(text: str, n: int = 1) -> str:
    """The first ``n`` sentences of ``text`` (a sentence ends at . ! or ? followed by space)."""
    text = text.strip()
    ends = [m.end() for m in _SENTENCE_END.finditer(text)]
    return text if len(ends) < n else text[: ends[n - 1]].rstrip()


def _truncate_chars(text: str, n: int) -> str:
    text = text.strip()
    if len(text) <= n:
        return text
    cut = text[:n]
    if text[n].isspace():
        return cut.rstrip()
    space = cut.rfind(" ")
    return (cut[:space] if space > n // 2 else cut).rstrip()


@dataclass
class PromptOptions:
    """How a text document becomes a completion prompt (at most one rule given; one sentence by default)."""

    prompt_sentences: int | None = None  # None: one sentence
    prompt_chars: int | None = None
    prompt_tokens: int | None = None
    tokenizer: Any = None  # needed for prompt_tokens

    def given(self) -> list[str]:
        """The options given, as their command-line flags."""
        return [flag for flag, value in (("--prompt-sentences", self.prompt_sentences),
                                         ("--prompt-chars", self.prompt_chars),
                                         ("--prompt-tokens", self.prompt_tokens)) if value is not None]


def text_prompt(doc: str, opts: PromptOptions) -> str:
    if opts.prompt_tokens is not None:
        if opts.tokenizer is None:
            raise DataError("--prompt-tokens needs a tokenizer (give --tokenizer or a local --model)")
        ids = opts.tokenizer(doc.strip(), add_special_tokens=False)["input_ids"][: opts.prompt_tokens]
        return opts.tokenizer.decode(ids, skip_special_tokens=True)
    if opts.prompt_chars is not None:
        return _truncate_chars(doc, opts.prompt_chars)
    return first_sentences(doc, opts.prompt_sentences or 1)


def parse_row(row: Any, fmt: str, opts: PromptOptions) -> tuple[list[dict[str, str]], str]:
    """(system + user messages, completion prompt text) of one row; :class:`RowError` when malformed."""
    fmt = row_format(row, fmt)
    if fmt == "text":
        messages = [{"role": "user", "content": text_prompt(str_field(row, "text", allow_empty=True), opts)}]
        kept = check_user_turns(messages)
    else:
        kept = user_side(row, fmt)
    return kept, next(m["content"] for m in kept if m["role"] == "user")


def _row_id(row: Any, fallback: str) -> str:
    if isinstance(row, dict):
        for key in _ID_KEYS:
            if row.get(key) not in (None, ""):
                return str(row[key])
    return fallback


def load_prompts(
    source: str | Path,
    fmt: str = "auto",
    opts: PromptOptions | None = None,
    split: str = "train",
    limit: int | None = None,
    on_invalid: Callable[[str, str, str], None] | None = None,
) -> list[Prompt]:
    """Read prompts from a local file/directory or a hub dataset id.

    A malformed row is reported through ``on_invalid(source_id, location, reason)`` (the runner writes it
    to the errors file) or, without a callback, raises :class:`DataError` naming the file and line.
    Ids come from the row (``id``, ``question_id``, ...) or are ``<file stem>-<index>``; repeated ids get
    a ``#2``, ``#3``... suffix so that every prompt has a unique, stable key.
    """
    opts = opts or PromptOptions()
    if fmt not in FORMATS:
        raise DataError(f"unknown prompt format {fmt!r}; use one of {', '.join(FORMATS)}")
    path = Path(source)
    stem = path.stem if path.is_file() else path.name
    prompts: list[Prompt] = []
    seen: dict[str, int] = {}
    for index, (location, row) in enumerate(read_rows(source, split)):
        if limit is not None and len(prompts) >= limit:
            break
        rid = _row_id(row, f"{stem}-{index}")
        seen[rid] = seen.get(rid, 0) + 1
        if seen[rid] > 1:
            rid = f"{rid}#{seen[rid]}"
        try:
            row_fmt = row_format(row, fmt)
            messages, text = parse_row(row, row_fmt, opts)
        except RowError as exc:
            if on_invalid is None:
                raise DataError(f"{location}: {exc}") from None
            on_invalid(rid, location, str(exc))
            continue
        if row_fmt != "text" and opts.given():  # the rule would silently not apply: say so
            raise DataError(f"{location}: {opts.given()[0]} cuts text documents ({{\"text\": ...}} rows or a "
                            f".txt file), but this is a {row_fmt!r} row, whose prompt is used whole: drop "
                            f"{opts.given()[0]}")
        source_format = "prompt" if row_fmt == "prompt_completion" else row_fmt
        prompts.append(Prompt(id=rid, messages=messages, text=text, source_format=source_format))
    return prompts
