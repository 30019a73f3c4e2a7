"""A resumable JSONL writer: one row per line, flushed as it completes, keyed by (source id, sample).

Resume rules (documented in the README):

- Rows already in ``out`` are skipped on a re-run. A line cut short by a kill (no trailing newline or not
  valid JSON at the end of the file) is removed before appending, so its row is generated again: no
  duplicates, nothing lost. Only in a file shown to be a self-distillation output: every complete line a
  row of ours (``metadata.source_id`` / ``sample``), at least one of them, and the cut line starting the
  way our rows start (``{"id": `` / ``{"source_id": ``); anything else is refused and left untouched.
- Rows in ``<out>.errors.jsonl`` are also skipped unless ``retry_errors`` is set, in which case their
  error lines are removed (atomically) and they are attempted again.
- Nothing is changed on disk (repair, errors cleared) until the first row is written: a run refused after
  opening the writer leaves both files byte-identical.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from medusa.errors import DataError, path_kind
from medusa.io import atomic_write_text

Key = tuple[str, int]


def errors_path(out: str | Path) -> Path:
    out = Path(out)
    return out.with_name(out.name.removesuffix(".jsonl") + ".errors.jsonl")


def row_key(row: dict[str, Any]) -> Key:
    meta = row.get("metadata") or {}
    if "source_id" in meta and "sample" in meta:
        return str(meta["source_id"]), int(meta["sample"])
    if "source_id" in row and "sample" in row:
        return str(row["source_id"]), int(row["sample"])
    raise KeyError("row has no metadata.source_id / metadata.sample")


_ROW_START = {"output": b'{"id": ', "errors": b'{"source_id": '}


def _repair_tail(path: Path, data: bytes) -> None:
    """Cut a partial last line (a write interrupted by a kill: not JSON) so appends start on a fresh line;
    a complete row that only lacks its newline gets it. Called once every line is known to be ours, and
    only if ``path`` still holds ``data`` (the bytes checked)."""
    cut = data.rfind(b"\n") + 1
    if cut == len(data) or path.read_bytes() != data:
        return
    try:
        json.loads(data[cut:])
    except ValueError:
        with open(path, "rb+") as fh:
            fh.truncate(cut)
        return
    with open(path, "ab") as fh:
        fh.write(b"\n")


def _partial_row(raw: bytes, what: str) -> bool:
    """The last line is a row cut short by a kill: UTF-8 text starting as our rows start, but not JSON."""
    try:
        text = raw.decode("utf-8")
        json.loads(text)
    except UnicodeDecodeError:
        return False
    except ValueError:
        return raw.startswith(_ROW_START[what])
    return False


def read_keys(path: Path, what: str) -> tuple[set[Key], dict[str, Any] | None, bytes | None]:
    """Keys of the complete rows in ``path``, the metadata of its first row, and the bytes checked (for
    :func:`_repair_tail`, applied before the first append; None: nothing to repair). A file that is not ours
    (a line that is not a self-distill row, not UTF-8, or only a cut line) is an error naming it and is left
    untouched."""
    keys: set[Key] = set()
    first_meta = None
    if not path.exists():
        return keys, None, None
    if not path.is_file():
        raise DataError(f"{path}: is {path_kind(path)}; --out must be a JSONL file path")
    data = path.read_bytes()
    lines = data.split(b"\n")
    partial = _partial_row(lines[-1], what)
    if partial:
        lines.pop()  # checked, then cut by _repair_tail
    for lineno, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw.decode("utf-8"))
            keys.add(row_key(row))
        except UnicodeDecodeError:
            raise DataError(f"{path}:{lineno}: not UTF-8 text; use a different --out or remove the "
                            "file") from None
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise DataError(f"{path}:{lineno}: not a self-distill {what} row ({exc}); "
                            "use a different --out or remove the file") from None
        if first_meta is None:
            first_meta = row.get("metadata")
    if partial and not keys:
        raise DataError(f"{path}:{len(lines) + 1}: not JSON, and no complete self-distill {what} row before "
                        "it: not a self-distillation file; use a different --out or remove the file")
    return keys, first_meta, data


class ResumableWriter:
    """Appends rows to ``out`` and error rows to ``<out>.errors.jsonl``; knows which keys are done."""

    def __init__(self, out: str | Path, retry_errors: bool = False, fsync_every_s: float = 2.0) -> None:
        self.out = Path(out)
        self.errors = errors_path(self.out)
        self.done, self.first_meta, self._out_data = read_keys(self.out, "output")
        error_keys, _, self._err_data = read_keys(self.errors, "errors")
        self._clear_errors = bool(retry_errors and error_keys)
        if self._clear_errors:
            error_keys = set()  # every failed row is tried again (re-logged if it fails)
        elif error_keys:
            # an errors row whose key was written later (an earlier retry succeeded) is not an error any more
            error_keys -= self.done
        self.failed_before = error_keys
        self._fh = None  # opened at the first row: a run that fails before it leaves no file behind
        self._err = None
        self._last_sync = time.monotonic()
        self._fsync_every_s = fsync_every_s
        self.written = 0
        self.failed = 0

    def skip(self, key: Key) -> bool:
        return key in self.done or key in self.failed_before

    def _append(self, fh: Any, row: dict[str, Any]) -> None:
        fh.write(json.dumps(row, ensure_ascii=False) + "\n")  # one write per row: a kill leaves <= 1 partial
        fh.flush()
        now = time.monotonic()
        if now - self._last_sync > self._fsync_every_s:
            os.fsync(fh.fileno())
            self._last_sync = now

    def write(self, row: dict[str, Any]) -> None:
        key = row_key(row)
        if key in self.done:
            raise RuntimeError(f"row {key} written twice")  # a bug in the runner, never a user error
        self._append(self._open_out(), row)
        self.done.add(key)
        self.written += 1

    def _open_out(self) -> Any:
        """The output, opened (created) once generation has a first outcome, a row or an error row."""
        if self._fh is None:
            self.out.parent.mkdir(parents=True, exist_ok=True)
            if self._out_data is not None:
                _repair_tail(self.out, self._out_data)
            if self._clear_errors:
                atomic_write_text(self.errors, "")
            elif self._err_data is not None:
                _repair_tail(self.errors, self._err_data)
            self._fh = open(self.out, "a", encoding="utf-8")
        return self._fh

    def write_error(self, source_id: str, sample: int, reason: str, **extra: Any) -> None:
        self._open_out()
        if self._err is None:
            self._err = open(self.errors, "a", encoding="utf-8")
        row = {"source_id": source_id, "sample": sample, "reason": reason,
               "time": time.strftime("%Y-%m-%dT%H:%M:%S"), **extra}
        self._append(self._err, row)
        self.failed += 1

    def close(self) -> None:
        for fh in (self._fh, self._err):
            if fh is not None and not fh.closed:
                fh.flush()
                os.fsync(fh.fileno())
                fh.close()

    def __enter__(self) -> ResumableWriter:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:  # a finished run with no row: its (empty) output exists
            self._open_out()
        self.close()
