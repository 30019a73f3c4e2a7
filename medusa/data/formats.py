"""Reading rows (with their file and line) and normalising the five formats.

A normalised sample is one of:
  ``("chat", messages)``             messages: ``[{"role": system|user|assistant|tool, "content": str}]``
  ``("prompt_completion", (prompt, completion))``
  ``("text", text)``
Rows may carry extra keys (``id``, ``metadata``), which are ignored.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from medusa.errors import DataError, first_line

SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "chatgpt": "assistant", "bard": "assistant", "bing": "assistant", "model": "assistant",
                  "system": "system", "tool": "tool"}
MESSAGE_ROLES = ("system", "user", "assistant", "tool")


class RowError(Exception):
    """A malformed row: ``reason`` is the short category counted by ``skip_invalid``."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


# ------------------------------------------------------------------------------------------ reading
def _json_array_rows(path: Path, text: str) -> Iterator[tuple[str, Any]]:
    """Elements of a top-level JSON array, each with the line it starts on."""
    decoder = json.JSONDecoder()
    n = len(text)

    def skip_ws(i: int) -> int:
        while i < n and text[i] in " \t\r\n":
            i += 1
        return i

    i = skip_ws(0)
    if i >= n or text[i] != "[":
        raise DataError(f"{path}:1: expected a JSON array of rows (or use .jsonl, one object per line)")
    i = skip_ws(i + 1)
    if i < n and text[i] == "]":
        return
    while True:
        line = text.count("\n", 0, i) + 1
        try:
            obj, end = decoder.raw_decode(text, i)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{text.count(chr(10), 0, exc.pos) + 1}: invalid JSON ({exc.msg})") from None
        yield f"{path}:{line}", obj
        i = skip_ws(end)
        if i < n and text[i] == ",":
            i = skip_ws(i + 1)
            continue
        if i < n and text[i] == "]":
            return
        raise DataError(f"{path}:{text.count(chr(10), 0, i) + 1}: invalid JSON (expected ',' or ']')")


def _jsonl_rows(path: Path) -> Iterator[tuple[str, Any]]:
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                yield where, json.loads(line)
            except json.JSONDecodeError as exc:
                yield where, RowError("invalid_json", f"{where}: invalid JSON ({exc.msg})")


def _text_rows(path: Path) -> Iterator[tuple[str, Any]]:
    """Blank-line separated blocks of a .txt file, each a ``{"text": ...}`` row."""
    block: list[str] = []
    start = 1
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if line.strip():
                if not block:
                    start = lineno
                block.append(line.rstrip("\n"))
            elif block:
                yield f"{path}:{start}", {"text": "\n".join(block)}
                block = []
    if block:
        yield f"{path}:{start}", {"text": "\n".join(block)}


def _parquet_rows(path: Path) -> Iterator[tuple[str, Any]]:
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    for i, row in enumerate(table.to_pylist()):
        yield f"{path}: row {i}", row


def _hub_rows(source: str) -> Iterator[tuple[str, Any]]:
    """A hub dataset id, optionally ``name:split`` (default split: train), through ``datasets``."""
    import datasets

    name, _, split = source.partition(":")
    try:
        ds = datasets.load_dataset(name, split=split or "train")
    except Exception as exc:  # datasets raises many types; all mean "cannot get this dataset"
        first = first_line(exc)
        raise DataError(f"{source}: not a local file and cannot be loaded as a dataset ({first})") from None
    for i, row in enumerate(ds):
        yield f"{source}[{split or 'train'}] row {i}", row


def read_rows(source: str) -> Iterator[tuple[str, Any]]:
    """``(where, row)`` pairs; ``where`` names the file and line (or dataset row)."""
    path = Path(source).expanduser()
    if path.is_file():
        suffix = path.suffix.lower()
        if suffix == ".jsonl":
            yield from _jsonl_rows(path)
        elif suffix == ".json":
            try:
                text = path.read_text(encoding="utf-8")
            except UnicodeDecodeError as exc:
                raise DataError(f"{path}: not UTF-8 text ({exc.reason})") from None
            stripped = text.lstrip()
            if stripped.startswith("{") and "\n{" in stripped:  # JSON lines saved as .json
                yield from _jsonl_rows(path)
            else:
                yield from _json_array_rows(path, text)
        elif suffix == ".parquet":
            yield from _parquet_rows(path)
        elif suffix in (".txt", ".md"):
            yield from _text_rows(path)
        else:
            raise DataError(f"{path}: unsupported file type {suffix!r} (use .json, .jsonl, .parquet or .txt)")
    elif path.exists():
        raise DataError(f"{path}: is a directory, expected a data file")
    elif source.startswith((".", "/", "~")) or path.suffix.lower() in (".json", ".jsonl", ".parquet", ".txt"):
        raise DataError(f"{source}: file not found")
    else:
        yield from _hub_rows(source)


# ------------------------------------------------------------------------------------------ formats
def detect_format(row: Any) -> str:
    if isinstance(row, dict):
        if "conversations" in row:
            return "sharegpt"
        if "messages" in row:
            return "messages"
        if "instruction" in row and "output" in row:
            return "alpaca"
        if "prompt" in row and "completion" in row:
            return "prompt_completion"
        if "text" in row:
            return "text"
    keys = ", ".join(sorted(row)) if isinstance(row, dict) else type(row).__name__
    raise RowError("unknown_format", f"cannot tell the format of this row (keys: {keys}); set data.format")


def _str_field(row: dict, key: str, allow_empty: bool = False) -> str:
    if key not in row:
        raise RowError("missing_key", f"missing key {key!r}")
    value = row[key]
    if not isinstance(value, str):
        raise RowError("bad_type", f"{key!r} must be a string, got {type(value).__name__}")
    if not allow_empty and not value.strip():
        raise RowError("empty_content", f"{key!r} is empty")
    return value


def _check_conversation(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    if not any(m["role"] == "assistant" for m in messages):
        raise RowError("no_assistant_turn", "the conversation has no assistant turn")
    return messages


def _sharegpt(row: dict) -> list[dict[str, str]]:
    turns = row["conversations"]
    if not isinstance(turns, list) or not turns:
        raise RowError("bad_type", "'conversations' must be a non-empty list")
    out = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict) or "from" not in turn or "value" not in turn:
            raise RowError("missing_key", f"conversations[{i}] needs 'from' and 'value'")
        role = SHAREGPT_ROLES.get(str(turn["from"]).lower())
        if role is None:
            raise RowError("bad_role", f"conversations[{i}]: unknown speaker {turn['from']!r}")
        if not isinstance(turn["value"], str):
            raise RowError("bad_type", f"conversations[{i}].value must be a string")
        out.append({"role": role, "content": turn["value"]})
    return _check_conversation(out)


def _messages(row: dict) -> list[dict[str, str]]:
    msgs = row["messages"]
    if not isinstance(msgs, list) or not msgs:
        raise RowError("bad_type", "'messages' must be a non-empty list")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise RowError("missing_key", f"messages[{i}] needs 'role' and 'content'")
        if m["role"] not in MESSAGE_ROLES:
            raise RowError("bad_role", f"messages[{i}]: unknown role {m['role']!r}")
        if not isinstance(m["content"], str):
            raise RowError("bad_type", f"messages[{i}].content must be a string")
        out.append({"role": m["role"], "content": m["content"]})
    return _check_conversation(out)


def _alpaca(row: dict) -> list[dict[str, str]]:
    instruction = _str_field(row, "instruction")
    extra = row.get("input") or ""
    if not isinstance(extra, str):
        raise RowError("bad_type", "'input' must be a string")
    output = _str_field(row, "output")
    user = instruction + (f"\n\n{extra}" if extra.strip() else "")
    return [{"role": "user", "content": user}, {"role": "assistant", "content": output}]


def normalize(row: Any, fmt: str) -> tuple[str, Any]:
    """One row -> a normalised sample; raises :class:`RowError` when the row is malformed."""
    if isinstance(row, RowError):
        raise row
    if not isinstance(row, dict):
        raise RowError("not_an_object", f"expected a JSON object, got {type(row).__name__}")
    if fmt == "auto":
        fmt = detect_format(row)
    if fmt == "sharegpt":
        if "conversations" not in row:
            raise RowError("missing_key", "missing key 'conversations'")
        return "chat", _sharegpt(row)
    if fmt == "messages":
        if "messages" not in row:
            raise RowError("missing_key", "missing key 'messages'")
        return "chat", _messages(row)
    if fmt == "alpaca":
        return "chat", _alpaca(row)
    if fmt == "prompt_completion":
        return "prompt_completion", (_str_field(row, "prompt", allow_empty=True), _str_field(row, "completion"))
    if fmt == "text":
        return "text", _str_field(row, "text")
    raise ValueError(f"unknown format {fmt!r}")
