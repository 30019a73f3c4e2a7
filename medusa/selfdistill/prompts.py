"""Prompt sources for self-distillation: every supported dataset format -> a list of :class:`Prompt`.

Formats (detected per row with ``format="auto"``):

- ``sharegpt``: ``{"conversations": [{"from": "human"|"gpt"|"system", "value": ...}]}``
- ``messages``: ``{"messages": [{"role": "user"|"assistant"|"system", "content": ...}]}`` (OpenAI)
- ``alpaca``: ``{"instruction": ..., "input": ..., "output": ...}``
- ``mtbench``: ``{"turns": ["first user turn", "second user turn", ...]}`` (MT-bench / Vicuna-bench)
- ``prompt``: ``{"prompt": "..."}`` (extra keys such as ``completion`` are ignored)
- ``text``: ``{"text": "..."}`` rows or a ``.txt`` file of blank-line separated documents; the prompt is
  the beginning of each document (first sentence(s), ``prompt_chars`` or ``prompt_tokens``).

Files: ``.json`` (a list of rows), ``.jsonl``, ``.parquet``, ``.txt``; a directory or a hub dataset id is
read through ``datasets.load_dataset``. Only the *user side* of a conversation is kept: the source's
assistant turns are discarded because the model writes its own.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from medusa.errors import DataError, first_line

FORMATS = ("auto", "sharegpt", "messages", "alpaca", "mtbench", "prompt", "text")
_SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                   "chatgpt": "assistant", "bard": "assistant", "bing": "assistant", "model": "assistant",
                   "system": "system"}
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


def detect_format(row: dict[str, Any]) -> str:
    if "conversations" in row:
        return "sharegpt"
    if "messages" in row:
        return "messages"
    if "turns" in row:
        return "mtbench"
    if "instruction" in row:
        return "alpaca"
    if "prompt" in row:
        return "prompt"
    if "text" in row:
        return "text"
    raise ValueError(f"cannot tell the format from keys {sorted(row)[:8]} (expected one of conversations, "
                     "messages, turns, instruction, prompt, text)")


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, got {type(value).__name__}")
    return value


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
    """How a text document becomes a completion prompt (exactly one rule applies; sentences by default)."""

    prompt_sentences: int = 1
    prompt_chars: int | None = None
    prompt_tokens: int | None = None
    tokenizer: Any = None  # needed for prompt_tokens


def text_prompt(doc: str, opts: PromptOptions) -> str:
    if opts.prompt_tokens is not None:
        if opts.tokenizer is None:
            raise DataError("--prompt-tokens needs a tokenizer (give --tokenizer or a local --model)")
        ids = opts.tokenizer(doc.strip(), add_special_tokens=False)["input_ids"][: opts.prompt_tokens]
        return opts.tokenizer.decode(ids, skip_special_tokens=True)
    if opts.prompt_chars is not None:
        return _truncate_chars(doc, opts.prompt_chars)
    return first_sentences(doc, opts.prompt_sentences)


def parse_row(row: dict[str, Any], fmt: str, opts: PromptOptions) -> tuple[list[dict[str, str]], str]:
    """(system + user messages, completion prompt text) of one row; raises ValueError when malformed."""
    if not isinstance(row, dict):
        raise ValueError(f"a row must be a JSON object, got {type(row).__name__}")
    if fmt == "auto":
        fmt = detect_format(row)
    messages: list[dict[str, str]] = []
    if fmt == "sharegpt":
        turns = row.get("conversations")
        if not isinstance(turns, list):
            raise ValueError("'conversations' must be a list")
        for i, turn in enumerate(turns):
            if not isinstance(turn, dict) or "from" not in turn or "value" not in turn:
                raise ValueError(f"conversations[{i}] must have 'from' and 'value'")
            role = _SHAREGPT_ROLES.get(str(turn["from"]).lower())
            if role is None:
                raise ValueError(f"conversations[{i}]: unknown speaker {turn['from']!r}")
            messages.append({"role": role, "content": _text(turn["value"], f"conversations[{i}].value")})
    elif fmt == "messages":
        turns = row.get("messages")
        if not isinstance(turns, list):
            raise ValueError("'messages' must be a list")
        for i, turn in enumerate(turns):
            if not isinstance(turn, dict) or "role" not in turn or "content" not in turn:
                raise ValueError(f"messages[{i}] must have 'role' and 'content'")
            if turn["role"] not in ("system", "user", "assistant"):
                raise ValueError(f"messages[{i}]: unknown role {turn['role']!r}")
            messages.append({"role": turn["role"], "content": _text(turn["content"], f"messages[{i}].content")})
    elif fmt == "mtbench":
        turns = row.get("turns")
        if not isinstance(turns, list):
            raise ValueError("'turns' must be a list of strings")
        messages = [{"role": "user", "content": _text(t, f"turns[{i}]")} for i, t in enumerate(turns)]
    elif fmt == "alpaca":
        instruction = _text(row.get("instruction"), "'instruction'")
        extra = row.get("input") or ""
        content = instruction if not extra else f"{instruction}\n\n{_text(extra, 'input')}"
        messages = [{"role": "user", "content": content}]
    elif fmt == "prompt":
        messages = [{"role": "user", "content": _text(row.get("prompt"), "'prompt'")}]
    elif fmt == "text":
        doc = _text(row.get("text"), "'text'")
        messages = [{"role": "user", "content": text_prompt(doc, opts)}]
    else:
        raise ValueError(f"unknown format {fmt!r}")
    kept = [m for m in messages if m["role"] != "assistant"]
    users = [m for m in kept if m["role"] == "user"]
    if not users or not any(m["content"].strip() for m in users):
        raise ValueError("no non-empty user turn")
    if any(not m["content"].strip() for m in users):
        raise ValueError("an empty user turn")
    return kept, users[0]["content"]


def _read_rows(path: Path, split: str) -> list[tuple[str, Any]]:
    """(location, row) pairs; location names the file line / index for error messages."""
    suffix = path.suffix.lower()
    if path.is_dir():
        return _read_hub(str(path), split)
    if suffix == ".jsonl":
        rows = []
        with open(path, encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    rows.append((f"{path}:{lineno}", json.loads(line)))
                except json.JSONDecodeError as exc:
                    rows.append((f"{path}:{lineno}", _Malformed(f"invalid JSON: {exc.msg}")))
        return rows
    if suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}: invalid JSON at line {exc.lineno}: {exc.msg}") from exc
        if isinstance(data, dict):
            data = data.get("data", data.get("rows", [data]))
        if not isinstance(data, list):
            raise DataError(f"{path}: expected a JSON list of rows")
        return [(f"{path}[{i}]", row) for i, row in enumerate(data)]
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return [(f"{path}[{i}]", row) for i, row in enumerate(pq.read_table(path).to_pylist())]
    if suffix in (".txt", ".md"):
        docs = [d for d in re.split(r"\n\s*\n", path.read_text(encoding="utf-8")) if d.strip()]
        return [(f"{path}[doc {i}]", {"text": d}) for i, d in enumerate(docs)]
    raise DataError(f"{path}: unsupported prompt file type {suffix!r} (use .json, .jsonl, .parquet, .txt)")


class _Malformed:
    def __init__(self, reason: str) -> None:
        self.reason = reason


def _read_hub(name: str, split: str) -> list[tuple[str, Any]]:
    try:
        import datasets

        ds = datasets.load_dataset(name, split=split)
    except Exception as exc:
        first = first_line(exc)
        raise DataError(f"cannot load dataset {name!r} (split {split!r}): {first}") from exc
    return [(f"{name}[{i}]", row) for i, row in enumerate(ds)]


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
    if path.exists():
        rows = _read_rows(path, split)
        stem = path.stem if path.is_file() else path.name
    elif re.fullmatch(r"[\w.-]+/[\w.-]+", str(source)) and not str(source).startswith("."):
        rows = _read_hub(str(source), split)
        stem = str(source).split("/")[-1]
    else:
        raise DataError(f"{source}: prompt file not found")
    prompts: list[Prompt] = []
    seen: dict[str, int] = {}
    for index, (location, row) in enumerate(rows):
        if limit is not None and len(prompts) >= limit:
            break
        rid = _row_id(row, f"{stem}-{index}")
        seen[rid] = seen.get(rid, 0) + 1
        if seen[rid] > 1:
            rid = f"{rid}#{seen[rid]}"
        try:
            if isinstance(row, _Malformed):
                raise ValueError(row.reason)
            row_fmt = detect_format(row) if fmt == "auto" and isinstance(row, dict) else fmt
            messages, text = parse_row(row, row_fmt, opts)
        except ValueError as exc:
            if on_invalid is None:
                raise DataError(f"{location}: {exc}") from exc
            on_invalid(rid, location, str(exc))
            continue
        prompts.append(Prompt(id=rid, messages=messages, text=text, source_format=row_fmt))
    return prompts
