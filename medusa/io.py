"""Files in and out, safely: the output-path policy, atomic writes, and readers whose failures are one-line
user errors.

The output-path policy (every command that writes goes through it): a command never deletes or replaces what
it did not create. An existing non-empty output directory (or an existing output file) is refused unless
``overwrite``; then only what a medusa command wrote there before is replaced or removed: each output
directory holds a manifest (``.medusa-manifest.json``: the names written, with each file's size and
modification time), and a name the manifest does not list, or a file changed since, is the user's — never
removed, and a collision with it is refused. An output that is, or holds, one of the command's inputs is
refused always. One run per output at a time (:func:`output_lock`: a ``.<name>.lock`` beside it, held with
``flock``, so a killed run's lock is simply taken over). New files and directories get the mode the umask
gives (``0644`` / ``0755`` under umask 022), not the private mode of the temporary directory they are built
in.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Iterator

from medusa.errors import MedusaError, path_kind
from medusa.manifest import (  # noqa: F401  (re-exported)
    MANIFEST_NAME,
    owned_now,
    read_full,
    read_manifest,
    record_in_manifest,
    stamp,
    umask,
)
from medusa.manifest import write_manifest as _write_manifest

OVERWRITE_HINT = "pass --overwrite to replace the files this command wrote there (other files are kept)"


# ------------------------------------------------------------------------------------------ modes
def cache_root() -> Path:
    """Where medusa keeps what it builds once per machine: ``$MEDUSA_CACHE``, else ``~/.cache/medusa``
    (converted models under ``models/``, the native library under ``kernels/``)."""
    return Path(os.environ.get("MEDUSA_CACHE", Path.home() / ".cache" / "medusa"))


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
                raise MedusaError(f"{path}: {parent} is {path_kind(parent)}, not a directory")
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
    """Refuse an output file path that is a directory, is one of ``inputs`` or lies inside an input
    directory (even new, even with ``overwrite``), or exists (unless ``overwrite``). Raises
    :class:`MedusaError` naming it."""
    path = Path(path)
    _check_parent(path)
    if path.exists() and not path.is_file():  # a directory, or /dev/null: never written through or replaced
        raise MedusaError(f"{path}: is {path_kind(path)}; give a file path")
    for item in inputs:  # the input itself, or a file inside an input directory (a checkpoint read)
        if item is not None and str(item) and Path(item).exists() and _within(path, Path(item)) \
                and (path.exists() or Path(item).is_dir() or path.resolve() == Path(item).resolve()):
            raise MedusaError(f"{path}: is the input {item}" if path.resolve() == Path(item).resolve()
                              else f"{path}: is part of the input {item}; write the output to another file")
    if path.exists() and not overwrite:
        raise MedusaError(f"{path}: exists; {OVERWRITE_HINT}")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


# ------------------------------------------------------------------------------------------ the manifest
def _merge_into(tmp: Path, target: Path, kind: str) -> None:
    """Move every entry of ``tmp`` into ``target``. A same-named entry is replaced, and an entry the manifest
    lists that ``tmp`` lacks is removed (a stale ``tree.json`` must not survive), only when a command of the
    same ``kind`` wrote it (:mod:`medusa.manifest`, unchanged since); a collision with anything else is
    refused before anything moves; every other entry is kept. The manifest is written first with the new
    stamps and the old ones pending, so a run killed at any point leaves names the next run owns; replaced
    folders are parked inside ``tmp``, which stays marked partial until the end (cleaned if killed)."""
    owned = owned_now(target, kind)  # name -> current stamp
    written = {p.name for p in tmp.iterdir()} - {MANIFEST_NAME, PARTIAL_MARK}
    for name in sorted(written):
        dest = target / name
        if (dest.exists() or dest.is_symlink()) and name not in owned:
            raise MedusaError(f"{dest}: exists and was not written by medusa (this command, unchanged "
                              "since); --overwrite replaces only what it wrote there: remove it or choose "
                              "another output")
    new = {name: stamp(tmp / name) for name in written}  # a rename keeps sizes and modification times
    _write_manifest(target, kind, {**owned, **new}, pending=owned)
    for name in sorted(written):
        dest = target / name
        if (dest.is_dir() and not dest.is_symlink()) or (dest.exists() and (tmp / name).is_dir()):
            old = tmp / f".old-{name}"
            os.replace(dest, old)
        os.replace(tmp / name, dest)
    for name in sorted(set(owned) - written):
        _remove(target / name)
    _write_manifest(target, kind, new)
    shutil.rmtree(tmp)


# ------------------------------------------------------------------------------------------ the lock
def _lock_path(path: Path, suffix: str = "lock") -> Path:
    """``.<name>.<suffix>`` beside ``path`` (in its nearest existing ancestor while the parent is missing)."""
    path = Path(os.path.abspath(path))
    parent, parts = path.parent, [path.name]
    while not parent.exists() and parent != parent.parent:
        parts.insert(0, parent.name)
        parent = parent.parent
    return parent / f".{'__'.join(parts)}.{suffix}"


def _open_lock(lock: Path, path: str | Path) -> int | None:
    """The lock file's descriptor; None where the folder refuses it (read-only, not ours). A failure names the
    output ``path`` (the lock file was never made)."""
    try:
        return os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return None
        raise MedusaError(f"{path}: cannot create its lock file {lock.name!r} beside it "
                          f"({(exc.strerror or str(exc)).lower()})") from None


def _acquire(lock: Path, path: str | Path, wait: bool) -> int | None:
    """A descriptor holding ``flock`` on ``lock`` (None: the folder refuses a lock file). ``wait``: block
    until the holder lets go; otherwise a held lock is refused naming the holder's pid. The file the holder
    removes as it lets go is never the one locked: the inode is checked, and a new file locked instead."""
    while True:
        fd = _open_lock(lock, path)
        if fd is None:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "?"
            os.close(fd)
            if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise MedusaError(f"{lock}: cannot lock ({exc.strerror})") from None
            raise MedusaError(f"{path}: another run (pid {holder}) is writing this output; wait for it to "
                              f"finish (lock: {lock})") from None
        try:
            same = os.fstat(fd).st_ino == os.stat(lock).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)  # the holder removed the file as we opened it: lock the new one


@contextlib.contextmanager
def _held(path: str | Path, wait: bool, suffix: str) -> Iterator[None]:
    lock = _lock_path(Path(path), suffix)
    fd = _acquire(lock, path, wait)
    if fd is None:  # nothing can be written beside the output: the run's own write fails, naming it
        yield
        return
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lock)
        os.close(fd)


def output_lock(path: str | Path) -> contextlib.AbstractContextManager[None]:
    """Hold the lock of output ``path`` for the body: a second run on the same output is refused naming
    the holder's pid. The lock is an ``flock`` on ``.<name>.lock`` (removed at the end): a killed run's
    lock file is taken over, never stuck. Where the lock file cannot be made (a read-only or foreign
    folder) the body runs unlocked: its own writes there fail first, with the error naming them."""
    return _held(path, wait=False, suffix="lock")


def build_lock(path: str | Path) -> contextlib.AbstractContextManager[None]:
    """Hold the lock of ``path``, a thing built once per machine and shared (a cached model, an engine's
    venv, a fitted test fixture), for the body, waiting while another process holds it: the caller checks
    whether ``path`` is built inside the body, so the second of two concurrent callers finds the first's
    result instead of building it again or over it. Its lock file is ``.<name>.build-lock``, not
    :func:`output_lock`'s, which the body's own atomic writes of ``path`` take."""
    return _held(path, wait=True, suffix="build-lock")


PARTIAL_MARK = ".medusa-partial"  # in a temp folder while a command fills it: the output's name


def _mark(folder: Path) -> str | None:
    try:
        return (folder / PARTIAL_MARK).read_text(encoding="utf-8") if not folder.is_symlink() else None
    except (OSError, UnicodeDecodeError):
        return None


def remove_stale_temps(target: Path) -> list[Path]:
    """Remove the ``.<name>.tmp-*`` folders that killed runs on ``target`` left beside it: only those marked
    for ``target`` (:data:`PARTIAL_MARK`; the caller holds ``target``'s lock, so no live run fills one)."""
    import glob

    stale = [p for p in sorted(target.parent.glob(f".{glob.escape(target.name)}.tmp-*"))
             if _mark(p) == target.name + "\n" or (p.is_dir() and not p.is_symlink()
                                                    and read_full(p)[0] is not None)]
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale


def _renamed(exc: Exception, tmp: Path, target: Path) -> Exception:
    """``exc`` naming ``target`` where it named the temp folder ``tmp`` (gone once the command fails)."""
    if isinstance(exc, OSError) and isinstance(exc.filename, str) and exc.filename.startswith(str(tmp)):
        return type(exc)(exc.errno, exc.strerror, str(target) + exc.filename[len(str(tmp)):])
    if isinstance(exc, MedusaError) and str(tmp) in str(exc):
        return type(exc)(str(exc).replace(str(tmp), str(target)))
    return exc


@contextlib.contextmanager
def atomic_directory(target: str | Path, overwrite: bool = False, inputs: Iterable[str | Path | None] = (),
                     owns: Iterable[str] = (), kind: str = "output") -> Iterator[Path]:
    """Yield a temp directory next to ``target``; on success its files land in ``target``.

    ``target`` absent or empty: one rename puts the whole directory in place. ``target`` not empty: refused
    unless ``overwrite``, which replaces the names written and removes what an earlier command of the same
    ``kind`` wrote there and this one did not (the manifest, :mod:`medusa.manifest`), keeping every other
    file; a written name colliding with a file it did not write is refused. ``owns``: kept for callers,
    unused (the manifest decides). A ``target`` holding one of ``inputs`` is always refused. If the body
    raises, the temp directory is removed, ``target`` is left exactly as it was, and the error names paths
    in ``target``'s terms (never the temp directory, which no longer exists). The temp folders of earlier
    runs on ``target`` that were killed are removed first (:func:`remove_stale_temps`).
    """
    target = Path(target)
    inputs = list(inputs)
    check_output_dir(target, overwrite, inputs)
    with output_lock(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temps(target)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        (tmp / PARTIAL_MARK).write_text(target.name + "\n", encoding="utf-8")
        try:
            try:
                yield tmp
            except (OSError, MedusaError) as exc:
                if _renamed(exc, tmp, target) is exc:
                    raise
                raise _renamed(exc, tmp, target) from None
            give_umask_mode(tmp)
            if target.is_dir() and any(target.iterdir()):
                check_output_dir(target, overwrite, inputs)  # again: it may have changed meanwhile
                _merge_into(tmp, target, kind)
            else:
                names = [p.name for p in tmp.iterdir() if p.name != PARTIAL_MARK]
                _write_manifest(tmp, kind, {name: stamp(tmp / name) for name in names})
                (tmp / PARTIAL_MARK).unlink()  # a kill from here on: the manifest marks it stale
                os.replace(tmp, target)  # over an empty directory too
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write a file through a temp file + rename so a reader never sees half of it (umask's mode)."""
    path = Path(path)
    _check_parent(path)
    if path.exists() and not path.is_file():
        raise MedusaError(f"{path}: is {path_kind(path)}; give a file path")
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


_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def save_safetensors(tensors: dict[str, Any], path: str | Path,
                     metadata: dict[str, str] | None = None) -> None:
    """``safetensors.torch.save_file``, its I/O failures as the :class:`OSError` they are (a full disk, a
    file-size limit, a read-only folder: errno and ``path`` kept, so the CLI says so in one line) instead of
    safetensors' own error type."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    try:
        save_file(tensors, str(path), metadata=metadata)
    except SafetensorError as exc:
        found = _RUST_OS_ERROR.search(str(exc))
        if found is None:
            raise
        code = int(found.group(1))
        raise OSError(code, os.strerror(code), str(path)) from None


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
    except RecursionError:
        raise error_cls(f"{path}: JSON nested too deeply to read") from None
