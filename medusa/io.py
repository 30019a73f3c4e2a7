"""Atomic writes (a directory built in a sibling temp dir, then renamed into place; a file through a temp
file) and a JSON reader whose failures are one-line user errors."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

from medusa.errors import MedusaError


@contextlib.contextmanager
def atomic_directory(target: str | Path) -> Iterator[Path]:
    """Yield a temp directory next to ``target``; on success it replaces ``target`` in one rename.

    If the body raises, the temp directory is removed and ``target`` is left exactly as it was.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if target.exists():
        old = target.parent / f".{target.name}.old-{os.getpid()}"
        if old.exists():
            shutil.rmtree(old)
        os.replace(target, old)
    os.replace(tmp, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write a file through a temp file + rename so a reader never sees half of it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def read_json(path: str | Path, error_cls: type[MedusaError] = MedusaError) -> Any:
    """The JSON value in ``path``; a missing file or corrupt JSON raises ``error_cls`` naming the file."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise error_cls(f"{path}: not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise error_cls(f"{path}: corrupt JSON ({exc})") from None
