"""Readers: rows from files, ``datasets`` directories and hub datasets; the one format detector; prompt lines.

``read_rows(source)`` yields ``(where, row)``: ``where`` names the file and line (or dataset row) for error
messages; a line that is not valid JSON comes back as a :class:`RowError` row, so the caller decides whether
to stop or skip. ``detect_format(row)`` tells the row format from its keys (one table for every caller):

- ``sharegpt``: ``{"conversations": [{"from": "human"|"gpt"|"system"|..., "value": ...}]}``
- ``messages``: ``{"messages": [{"role": "system"|"user"|"assistant"|"tool", "content": ...}]}`` (OpenAI)
- ``mtbench``: ``{"turns": ["first user turn", "second user turn", ...]}`` (MT-bench, Spec-Bench)
- ``alpaca``: ``{"instruction": ..., "input": ..., "output": ...}``
- ``prompt_completion``: ``{"prompt": ..., "completion": ...}``; ``prompt``: ``{"prompt": ...}``
- ``text``: ``{"text": ...}`` (a ``.txt`` file gives one such row per blank-line separated block)

``conversation(row, fmt)`` turns the conversational formats into ``[{"role", "content"}]`` the same way for
training (:mod:`medusa.data.formats`) and for prompt sources (:mod:`medusa.selfdistill.prompts`): an Alpaca
row is a user turn (``instruction``, then ``input`` after a blank line when it is not blank) followed by an
assistant turn (``output``); an MT-bench row is its ``turns``, all user turns.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from medusa.errors import DataError, first_line, path_kind
from medusa.io import read_text

SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "chatgpt": "assistant", "bard": "assistant", "bing": "assistant", "model": "assistant",
                  "system": "system", "tool": "tool"}
MESSAGE_ROLES = {role: role for role in ("system", "user", "assistant", "tool")}
# format -> (list key, speaker key, text key, what an unknown speaker is called, speaker -> role)
_TURN_LISTS: dict[str, tuple[str, str, str, str, Mapping[str, str]]] = {
    "sharegpt": ("conversations", "from", "value", "speaker", SHAREGPT_ROLES),
    "messages": ("messages", "role", "content", "role", MESSAGE_ROLES),
}
# key that identifies a format, in detection order (prompt rows with a completion are prompt_completion)
_FORMAT_KEYS = (("conversations", "sharegpt"), ("messages", "messages"), ("turns", "mtbench"),
                ("instruction", "alpaca"), ("prompt", "prompt"), ("text", "text"))
DATA_SUFFIXES = (".json", ".jsonl", ".parquet", ".txt")


class RowError(ValueError):
    """A malformed row: ``reason`` is the short category counted by ``skip_invalid``."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


# ------------------------------------------------------------------------------------------ reading
def _utf8_lines(path: Path) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` of each line of ``path``; a line that is not UTF-8 is a :class:`DataError`
    naming the file and line."""
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            try:
                yield lineno, raw.decode("utf-8").replace("\r\n", "\n")
            except UnicodeDecodeError as exc:
                raise DataError(f"{path}:{lineno}: not UTF-8 text ({exc.reason})") from None


def _json_array_rows(path: Path, text: str) -> Iterator[tuple[str, Any]]:
    """Elements of a top-level JSON array, each named by its index and the line it starts on."""
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
    index = 0
    while True:
        line = text.count("\n", 0, i) + 1
        try:
            obj, end = decoder.raw_decode(text, i)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{text.count(chr(10), 0, exc.pos) + 1}: invalid JSON "
                            f"({exc.msg})") from None
        yield f"{path}: row {index} (line {line})", obj
        index += 1
        i = skip_ws(end)
        if i < n and text[i] == ",":
            i = skip_ws(i + 1)
            continue
        if i < n and text[i] == "]":
            return
        raise DataError(f"{path}:{text.count(chr(10), 0, i) + 1}: invalid JSON (expected ',' or ']')")


def _json_object_rows(path: Path, text: str) -> Iterator[tuple[str, Any]]:
    """A top-level JSON object: its ``data`` or ``rows`` list, or the object itself as one row."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}:{exc.lineno}: invalid JSON ({exc.msg})") from None
    except RecursionError:
        raise DataError(f"{path}: JSON nested too deeply to read") from None
    rows = data.get("data", data.get("rows", [data]))
    if not isinstance(rows, list):
        raise DataError(f"{path}: 'data' / 'rows' must be a JSON list of rows")
    for i, row in enumerate(rows):
        yield f"{path}[{i}]", row


def _jsonl_rows(path: Path) -> Iterator[tuple[str, Any]]:
    for lineno, line in _utf8_lines(path):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            yield where, json.loads(line)
        except json.JSONDecodeError as exc:
            yield where, RowError("invalid_json", f"invalid JSON ({exc.msg})")
        except RecursionError:
            yield where, RowError("invalid_json", "JSON nested too deeply to read")


def _json_rows(path: Path) -> Iterator[tuple[str, Any]]:
    """A .json file: an array of rows, JSON lines saved as .json, or an object holding the rows."""
    text = read_text(path, DataError)
    stripped = text.lstrip()
    if stripped.startswith("{") and "\n{" in stripped:
        return _jsonl_rows(path)
    if stripped.startswith("{"):
        return _json_object_rows(path, text)
    return _json_array_rows(path, text)


def _text_rows(path: Path) -> Iterator[tuple[str, Any]]:
    """Blank-line separated blocks of a .txt file, each a ``{"text": ...}`` row."""
    block: list[str] = []
    start = 1
    for lineno, line in _utf8_lines(path):
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

    for i, row in enumerate(pq.read_table(path).to_pylist()):
        yield f"{path}: row {i}", row


def _dataset_rows(source: str, split: str) -> Iterator[tuple[str, Any]]:
    """A ``datasets`` directory or a hub dataset id (``name:split`` picks the split), via ``load_dataset``."""
    import datasets

    name, colon, inline = source.partition(":")
    if not colon or Path(source).exists():
        name, inline = source, ""
    split = inline or split
    try:
        ds = datasets.load_dataset(name, split=split)
    except Exception as exc:  # datasets raises many types; all mean "cannot get this dataset"
        raise DataError(f"{source}: not a local file and cannot be loaded as a dataset "
                        f"({first_line(exc)})") from None
    for i, row in enumerate(ds):
        yield f"{name}[{split}] row {i}", row


def read_rows(source: str | Path, split: str = "train") -> Iterator[tuple[str, Any]]:
    """``(where, row)`` pairs of a .json / .jsonl / .parquet / .txt file, a ``datasets`` directory or a hub
    dataset id; ``where`` names the file and line (or dataset row)."""
    source = str(source)
    path = Path(source).expanduser()
    if path.is_file():
        suffix = path.suffix.lower()
        if suffix == ".jsonl":
            yield from _jsonl_rows(path)
        elif suffix == ".json":
            yield from _json_rows(path)
        elif suffix == ".parquet":
            yield from _parquet_rows(path)
        elif suffix in (".txt", ".md"):
            yield from _text_rows(path)
        else:
            raise DataError(f"{path}: unsupported file type {suffix!r} (use .json, .jsonl, .parquet or .txt)")
    elif path.is_dir() and path.suffix.lower() in DATA_SUFFIXES:
        raise DataError(f"{path}: is a directory, expected a {path.suffix} file")
    elif path.is_dir():
        yield from _dataset_rows(str(path), split)
    elif path.exists():  # /dev/null, a pipe, a socket
        raise DataError(f"{path}: is {path_kind(path)}, expected a data file or a dataset directory")
    elif source.startswith((".", "/", "~")) or path.suffix.lower() in DATA_SUFFIXES:
        raise DataError(f"{source}: file not found")
    else:
        yield from _dataset_rows(source, split)


# ------------------------------------------------------------------------------------------ formats
def detect_format(row: Any) -> str:
    """The format of one row from its keys: sharegpt, messages, mtbench, alpaca, prompt_completion, prompt
    or text; raises :class:`RowError` (``unknown_format``) for anything else."""
    if isinstance(row, dict):
        for key, fmt in _FORMAT_KEYS:
            if key in row:
                return "prompt_completion" if fmt == "prompt" and "completion" in row else fmt
    keys = ", ".join(sorted(map(str, row))[:8]) if isinstance(row, dict) else type(row).__name__
    raise RowError("unknown_format", f"cannot tell the format of this row (keys: {keys}; expected one of "
                                     "conversations, messages, turns, instruction, prompt, text)")


def row_format(row: Any, fmt: str = "auto") -> str:
    """``fmt``, or the detected format when it is ``auto``; a row that is not a JSON object (or an unreadable
    line, which :func:`read_rows` yields as a :class:`RowError`) raises :class:`RowError`."""
    if isinstance(row, RowError):
        raise row
    if not isinstance(row, dict):
        raise RowError("not_an_object", f"expected a JSON object, got {type(row).__name__}")
    return detect_format(row) if fmt == "auto" else fmt


def str_field(row: dict, key: str, allow_empty: bool = False) -> str:
    """``row[key]``, which must be a string (and not blank unless ``allow_empty``)."""
    if key not in row:
        raise RowError("missing_key", f"missing key {key!r}")
    value = row[key]
    if not isinstance(value, str):
        raise RowError("bad_type", f"{key!r} must be a string, got {type(value).__name__}")
    if not allow_empty and not value.strip():
        raise RowError("empty_content", f"{key!r} is empty")
    return value


def _turn_list(row: dict, fmt: str) -> list[dict[str, str]]:
    """ShareGPT ``conversations`` or OpenAI ``messages`` -> messages (roles mapped, texts checked)."""
    key, speaker, text, what, roles = _TURN_LISTS[fmt]
    if key not in row:
        raise RowError("missing_key", f"missing key {key!r}")
    turns = row[key]
    if not isinstance(turns, list) or not turns:
        raise RowError("bad_type", f"{key!r} must be a non-empty list")
    out = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict) or speaker not in turn or text not in turn:
            raise RowError("missing_key", f"{key}[{i}] needs {speaker!r} and {text!r}")
        name = turn[speaker]
        role = roles.get(str(name).lower() if fmt == "sharegpt" else name) if isinstance(name, str) else None
        if role is None:
            raise RowError("bad_role", f"{key}[{i}]: unknown {what} {name!r}")
        if not isinstance(turn[text], str):
            raise RowError("bad_type", f"{key}[{i}].{text} must be a string")
        out.append({"role": role, "content": turn[text]})
    return out


def _alpaca(row: dict) -> list[dict[str, str]]:
    """``instruction`` (+ a blank line + ``input`` when it is not blank) is the user turn; ``output``, when
    the row has one, the assistant turn."""
    instruction = str_field(row, "instruction")
    extra = row.get("input") or ""
    if not isinstance(extra, str):
        raise RowError("bad_type", f"'input' must be a string, got {type(extra).__name__}")
    messages = [{"role": "user", "content": instruction + (f"\n\n{extra}" if extra.strip() else "")}]
    if "output" in row:
        messages.append({"role": "assistant", "content": str_field(row, "output", allow_empty=True)})
    return messages


def _mtbench(row: dict) -> list[dict[str, str]]:
    """The ``turns`` are the user's turns, in order (MT-bench rows carry no replies)."""
    turns = row.get("turns")
    if not isinstance(turns, list):
        raise RowError("bad_type", "'turns' must be a list of strings")
    if not turns:
        raise RowError("empty_content", "'turns' is empty")
    for i, turn in enumerate(turns):
        if not isinstance(turn, str):
            raise RowError("bad_type", f"turns[{i}] must be a string, got {type(turn).__name__}")
    return [{"role": "user", "content": turn} for turn in turns]


def conversation(row: dict, fmt: str) -> list[dict[str, str]]:
    """A sharegpt / messages / alpaca / mtbench row -> ``[{"role", "content"}]``."""
    if fmt in _TURN_LISTS:
        return _turn_list(row, fmt)
    if fmt == "alpaca":
        return _alpaca(row)
    if fmt == "mtbench":
        return _mtbench(row)
    raise ValueError(f"unknown conversation format {fmt!r}")


def user_side(row: Any, fmt: str = "auto") -> list[dict[str, str]]:
    """The system and user turns of a row of any format (a prompt or text row is one user turn); raises
    :class:`RowError` unless every user turn is non-blank and there is at least one."""
    fmt = row_format(row, fmt)
    if fmt in ("prompt", "prompt_completion"):
        messages = [{"role": "user", "content": str_field(row, "prompt", allow_empty=True)}]
    elif fmt == "text":
        messages = [{"role": "user", "content": str_field(row, "text", allow_empty=True)}]
    else:
        messages = conversation(row, fmt)
    return check_user_turns([m for m in messages if m["role"] in ("system", "user")])


def check_user_turns(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    users = [m["content"] for m in messages if m["role"] == "user"]
    if not any(u.strip() for u in users):
        raise RowError("no_user_turn", "no non-empty user turn")
    if not all(u.strip() for u in users):
        raise RowError("empty_content", "an empty user turn")
    return messages


# ------------------------------------------------------------------------------------------ prompt lines
def _first_prompt(where: str, row: Any) -> str:
    if isinstance(row, dict) and not any(key in row for key, _ in _FORMAT_KEYS) \
            and isinstance(row.get("question"), str):
        return row["question"]
    try:
        return next(m["content"] for m in user_side(row) if m["role"] == "user")
    except RowError as exc:
        if exc.reason == "unknown_format":
            raise DataError(f"{where}: no 'prompt', 'text', 'question' or 'turns' "
                            f"string in the row") from None
        raise DataError(f"{where}: {exc}") from None


def read_prompts(path: str | Path) -> list[str]:
    """Prompts from a text file (one per non-empty line) or a JSON / JSONL file of rows: the first user turn
    of a row of any format (``turns[0]`` of MT-bench), or its ``question``."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: is {path_kind(path)}, expected a file" if path.exists()
                        else f"{path}: not found")
    if path.suffix.lower() in (".jsonl", ".json"):
        prompts = [_first_prompt(where, row) for where, row in read_rows(path)]
    else:
        prompts = [line for line in read_text(path, DataError).splitlines() if line.strip()]
    if not prompts:
        raise DataError(f"{path}: no prompts")
    return prompts
