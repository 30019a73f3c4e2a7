"""A resumable JSONL writer: one row per line, flushed as it completes, keyed by (source id, sample).

Resume rules (documented in the README):

- Rows already in ``out`` are skipped on a re-run. A line cut short by a kill (no trailing newline or not
  valid JSON at the end of the file) is removed before appending, so its row is generated again: no
  duplicates, nothing lost.
- Rows in ``<out>.errors.jsonl`` are also skipped unless ``retry_errors`` is set, in which case their
  error lines are removed (atomically) and they are attempted again.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from medusa.errors import DataError
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


def _repair_tail(path: Path) -> None:
    """Cut a partial last line (a write interrupted by a kill) so appends start on a fresh line."""
    with open(path, "rb+") as fh:
        data = fh.read()
        if not data or data.endswith(b"\n"):
            return
        cut = data.rfind(b"\n") + 1
        fh.truncate(cut)


def read_keys(path: Path, what: str) -> tuple[set[Key], dict[str, Any] | None]:
    """Keys of the complete rows in ``path`` and the metadata of its first row."""
    keys: set[Key] = set()
    first_meta = None
    if not path.exists():
        return keys, None
    _repair_tail(path)
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                keys.add(row_key(row))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                raise DataError(f"{path}:{lineno}: not a self-distill {what} row ({exc}); "
                                "use a different --out or remove the file") from exc
            if first_meta is None:
                first_meta = row.get("metadata")
    return keys, first_meta


class ResumableWriter:
    """Appends rows to ``out`` and error rows to ``<out>.errors.jsonl``; knows which keys are done."""

    def __init__(self, out: str | Path, retry_errors: bool = False, fsync_every_s: float = 2.0) -> None:
        self.out = Path(out)
        self.errors = errors_path(self.out)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.done, self.first_meta = read_keys(self.out, "output")
        error_keys, _ = read_keys(self.errors, "errors")
        if retry_errors and error_keys:
            atomic_write_text(self.errors, "")  # every failed row is tried again (re-logged if it fails)
            error_keys = set()
        elif error_keys:
            # an errors row whose key was written later (an earlier retry succeeded) is not an error any more
            error_keys -= self.done
        self.failed_before = error_keys
        self._fh = open(self.out, "a", encoding="utf-8")
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
        self._append(self._fh, row)
        self.done.add(key)
        self.written += 1

    def write_error(self, source_id: str, sample: int, reason: str, **extra: Any) -> None:
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

    def __exit__(self, *exc: object) -> None:
        self.close()
