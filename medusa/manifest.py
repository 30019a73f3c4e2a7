"""The manifest of an output directory (``.medusa-manifest.json``): which command wrote which names there,
so that ``--overwrite`` replaces or removes only those (the policy of :mod:`medusa.io`).

``{"format": "medusa-manifest", "version": 2, "kind": K, "entries": {name: stamp}, "pending": {name: stamp}}``

- ``kind``: what wrote the folder ("heads" for a heads checkpoint, "export", "model" for a converted base
  model, ...). A command's ``--overwrite`` takes as its own only the entries of a manifest of ITS kind: a
  converted model's or a speculators export's files are never a heads checkpoint's to replace. A manifest
  without a kind (written before kinds existed) owns nothing.
- a file's stamp is ``[size, mtime_ns]``; a directory's is ``{relative path: stamp or None (a folder)}``
  over everything inside it, so a folder holding a file the user added since is not ours whole.
- ``pending``: while a merge moves new files in, the stamps of the old files it replaces. A run killed in the
  middle leaves each name either old (a pending stamp) or new (its entry): both still count as ours, so the
  next ``--overwrite`` finishes or cleans it.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Union

MANIFEST_NAME = ".medusa-manifest.json"
Stamp = Union[list, dict, None]


def umask() -> int:
    """The process's umask (read without changing it where /proc allows)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def stamp(path: Path) -> Stamp:
    """A file's ``[size, mtime_ns]``; a directory's stamps of everything inside it (relative paths)."""
    if path.is_dir() and not path.is_symlink():
        out: dict[str, Any] = {}
        for item in sorted(path.rglob("*")):
            rel = str(item.relative_to(path))
            out[rel] = None if item.is_dir() and not item.is_symlink() else _file_stamp(item)
        return out
    return _file_stamp(path)


def _file_stamp(path: Path) -> list[int]:
    st = path.lstat()
    return [st.st_size, st.st_mtime_ns]


def plain_name(name: object) -> bool:
    return isinstance(name, str) and "/" not in name and name not in ("", ".", "..", MANIFEST_NAME)


def _valid_stamp(v: object) -> bool:
    if isinstance(v, list):
        return len(v) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in v)
    return isinstance(v, dict) and all(isinstance(k, str) and (s is None or _valid_stamp(s) and
                                                               isinstance(s, list)) for k, s in v.items())


def _entries(data: dict, key: str) -> dict[str, Stamp]:
    entries = data.get(key)
    if not isinstance(entries, dict):
        return {}
    return {k: v for k, v in entries.items() if plain_name(k) and _valid_stamp(v)}


def read_full(folder: Path) -> tuple[str | None, dict[str, Stamp], dict[str, Stamp]]:
    """``(kind, entries, pending)`` of ``folder``'s manifest; ``(None, {}, {})`` without a valid one."""
    try:
        data = json.loads((folder / MANIFEST_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None, {}, {}
    if not isinstance(data, dict):
        return None, {}, {}
    kind = data.get("kind") if isinstance(data.get("kind"), str) else None
    return kind, _entries(data, "entries"), _entries(data, "pending")


def read_manifest(folder: Path, kind: str | None = None) -> dict[str, Stamp]:
    """The names a command of ``kind`` wrote into ``folder`` (name -> stamp); every name of the manifest
    when ``kind`` is None; empty when there is no manifest, or it is another kind's."""
    found, entries, _ = read_full(folder)
    return entries if kind is None or (found is not None and found == kind) else {}


def ours(folder: Path, name: str, kind: str) -> bool:
    """``folder/name`` was written by a command of ``kind`` and is unchanged since (or is the old file a
    killed merge had still to replace)."""
    found, entries, pending = read_full(folder)
    return found == kind and _matches(folder / name, entries.get(name), pending.get(name))


def _matches(path: Path, *stamps: Stamp) -> bool:
    if not (path.exists() or path.is_symlink()):
        return False
    now = stamp(path)
    return any(s is not None and s == now for s in stamps)


def write_manifest(folder: Path, kind: str, entries: dict[str, Stamp],
                   pending: dict[str, Stamp] | None = None) -> None:
    """Write ``folder``'s manifest atomically (temp file + rename; umask's mode)."""
    data = {"format": "medusa-manifest", "version": 2, "kind": kind, "entries": entries}
    if pending:
        data["pending"] = pending
    fd, tmp = tempfile.mkstemp(prefix=f".{MANIFEST_NAME}.", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(data, indent=1) + "\n")
        os.chmod(tmp, 0o666 & ~umask())
        os.replace(tmp, folder / MANIFEST_NAME)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def record_in_manifest(folder: str | Path, names: list[str], kind: str) -> None:
    """Add ``names`` (just written into ``folder`` by a command of ``kind``) to its manifest. A folder whose
    manifest is another kind's keeps it unchanged: those names stay unowned (never removed later)."""
    folder = Path(folder)
    found, entries, _ = read_full(folder)
    if found is not None and found != kind:
        return
    if found is None and (folder / MANIFEST_NAME).exists():
        return  # a manifest of an older version, or not one: not ours to rewrite
    entries.update({name: stamp(folder / name) for name in names})
    write_manifest(folder, kind, entries)


def owned_now(folder: Path, kind: str) -> dict[str, Stamp]:
    """The names of ``folder``'s manifest of ``kind`` still ours now (-> their current stamps)."""
    found, entries, pending = read_full(folder)
    if found != kind:
        return {}
    return {n: stamp(folder / n) for n in set(entries) | set(pending)
            if _matches(folder / n, entries.get(n), pending.get(n))}


__all__ = ["MANIFEST_NAME", "owned_now", "ours", "read_full", "read_manifest", "record_in_manifest", "stamp",
           "umask", "write_manifest"]
