"""Files in and out, safely: the output-path policy, atomic writes, and readers whose failures are one-line
user errors.

The output-path policy (every command that writes goes through it): a command never deletes or replaces what
it did not create. An existing non-empty output directory (or an existing output file) is refused unless
``overwrite``, and then only the names the command writes are replaced; an output that is, or holds, one
of the command's inputs is refused always. New files and directories get the mode the umask gives
(``0644`` / ``0755`` under umask 022), not the private mode of the temporary directory they are built in.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Iterator

from medusa.errors import MedusaError

OVERWRITE_HINT = "pass --overwrite to replace the files this command writes (other files are kept)"


# ------------------------------------------------------------------------------------------ modes
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


def give_umask_mode(path: str | Path) -> None:
    """``path`` (a file, or a directory and everything in it) gets the mode a plain create would give:
    0666 / 0777 less the umask."""
    mask = umask()
    path = Path(path)
    items = [path] + (sorted(path.rglob("*")) if path.is_dir() and not path.is_symlink() else [])
    for item in items:
        if item.is_symlink():
            continue
        os.chmod(item, (0o777 if item.is_dir() else 0o666) & ~mask)


# ------------------------------------------------------------------------------------------ the policy
def _within(path: Path, folder: Path) -> bool:
    """``path`` is ``folder`` or lies inside it (both resolved)."""
    path, folder = path.resolve(), folder.resolve()
    return path == folder or folder in path.parents


def _check_parent(path: Path) -> None:
    """The nearest existing ancestor of ``path`` must be a directory (else mkdir would fail)."""
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise MedusaError(f"{path}: {parent} is a file, not a directory")
            return


def _check_inputs(target: Path, inputs: Iterable[str | Path | None]) -> None:
    for item in inputs:
        if item is not None and str(item) and Path(item).exists() and _within(Path(item), target):
            raise MedusaError(f"{target}: holds the input {item}; write the output to another directory")


def check_output_dir(target: str | Path, overwrite: bool = False,
                     inputs: Iterable[str | Path | None] = ()) -> None:
    """Refuse an output directory that is a file, holds one of ``inputs`` (even with ``overwrite``), or is
    not empty (unless ``overwrite``). Raises :class:`MedusaError` naming it."""
    target = Path(target)
    _check_parent(target)
    if target.exists() or target.is_symlink():
        if not target.is_dir():
            raise MedusaError(f"{target}: exists and is not a directory")
        _check_inputs(target, inputs)
        if not overwrite and any(target.iterdir()):
            raise MedusaError(f"{target}: exists and is not empty; {OVERWRITE_HINT}")


def check_output_file(path: str | Path, overwrite: bool = False,
                      inputs: Iterable[str | Path | None] = ()) -> None:
    """Refuse an output file path that is a directory, is one of ``inputs`` or a file inside one (even with
    ``overwrite``), or exists (unless ``overwrite``). Raises :class:`MedusaError` naming it."""
    path = Path(path)
    _check_parent(path)
    if path.is_dir():
        raise MedusaError(f"{path}: is a directory; give a file path")
    for item in inputs:  # the input itself, or a file already inside an input directory
        if item is not None and str(item) and Path(item).exists() and _within(path, Path(item)) \
                and (path.exists() or path.resolve() == Path(item).resolve()):
            raise MedusaError(f"{path}: is the input {item}" if path.resolve() == Path(item).resolve()
                              else f"{path}: is part of the input {item}; write the output to another file")
    if path.exists() and not overwrite:
        raise MedusaError(f"{path}: exists; {OVERWRITE_HINT}")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _merge_into(tmp: Path, target: Path, owns: Iterable[str]) -> None:
    """Move every entry of ``tmp`` into ``target``, replacing same-named entries; entries named in ``owns``
    that ``tmp`` lacks are removed (a stale ``tree.json`` must not survive); anything else is kept."""
    written = {p.name for p in tmp.iterdir()}
    for name in sorted(written):
        dest = target / name
        if (dest.is_dir() and not dest.is_symlink()) or (dest.exists() and (tmp / name).is_dir()):
            old = tmp.parent / f".{target.name}.{name}.old-{os.getpid()}"
            os.replace(dest, old)
            os.replace(tmp / name, dest)
            _remove(old)
        else:
            os.replace(tmp / name, dest)
    for name in set(owns) - written:
        _remove(target / name)
    tmp.rmdir()


@contextlib.contextmanager
def atomic_directory(target: str | Path, overwrite: bool = False, inputs: Iterable[str | Path | None] = (),
                     owns: Iterable[str] = ()) -> Iterator[Path]:
    """Yield a temp directory next to ``target``; on success its files land in ``target``.

    ``target`` absent or empty: one rename puts the whole directory in place. ``target`` not empty: refused
    unless ``overwrite``, which replaces only the names written (and removes the names in ``owns`` that were
    not written), keeping every other file. A ``target`` holding one of ``inputs`` is always refused. If the
    body raises, the temp directory is removed and ``target`` is left exactly as it was.
    """
    target = Path(target)
    inputs = list(inputs)
    check_output_dir(target, overwrite, inputs)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        yield tmp
        give_umask_mode(tmp)
        if target.is_dir() and any(target.iterdir()):
            check_output_dir(target, overwrite, inputs)  # again: it may have changed meanwhile
            _merge_into(tmp, target, owns)
        else:
            os.replace(tmp, target)  # over an empty directory too
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write a file through a temp file + rename so a reader never sees half of it (umask's mode)."""
    path = Path(path)
    _check_parent(path)
    if path.is_dir():
        raise MedusaError(f"{path}: is a directory; give a file path")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o666 & ~umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# ------------------------------------------------------------------------------------------ readers
def read_text(path: str | Path, error_cls: type[MedusaError] = MedusaError) -> str:
    """The UTF-8 text of ``path``; missing, a directory, unreadable or not UTF-8: ``error_cls`` naming the
    file (and the line of the first bad byte)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise error_cls(f"{path}: not found") from None
    except IsADirectoryError:
        raise error_cls(f"{path}: is a directory, expected a file") from None
    except PermissionError:
        raise error_cls(f"{path}: permission denied") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise error_cls(f"{path}:{line}: not UTF-8 text (byte {exc.start})") from None


def read_json(path: str | Path, error_cls: type[MedusaError] = MedusaError) -> Any:
    """The JSON value in ``path``; a missing file or corrupt JSON raises ``error_cls`` naming the file."""
    path = Path(path)
    text = read_text(path, error_cls)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error_cls(f"{path}: corrupt JSON ({exc})") from None


def read_yaml(path: str | Path, error_cls: type[MedusaError] = MedusaError,
              loader: type | None = None) -> Any:
    """The YAML value in ``path`` (safe loader, or ``loader``: a ``yaml.SafeLoader`` subclass); invalid YAML
    or a key given twice in one mapping raises ``error_cls`` naming the file and line."""
    import yaml

    class _Loader(loader or yaml.SafeLoader):
        pass

    def mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise error_cls(f"{path}:{line}: duplicate key {key!r} (first given on line {seen[key]})")
            seen[key] = line
        return loader.construct_mapping(node, deep=deep)

    _Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    text = read_text(path, error_cls)
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise error_cls(f"{path}{where}: invalid YAML ({getattr(exc, 'problem', exc)})") from None
