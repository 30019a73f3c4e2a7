"""Resumable training checkpoints: ``<output_dir>/checkpoint-<step>/``.

Each holds accelerate's state (the trained module, optimizer, scheduler, every process's RNG) and
``trainer_state.json`` (global step, the data position, the recipe). Written to a temp directory and
renamed into place, so an interrupted save never leaves a checkpoint that looks complete.

The output directory's policy (:func:`check_output_dir`): a run starts fresh only in an empty (or new)
``output_dir``; one that holds an earlier run (``final/``, checkpoints, ``metrics.jsonl``) or other files is
refused unless the run resumes (``train.resume``) or ``overwrite`` is given, which removes only the earlier
run's own files. A resumed run cuts ``metrics.jsonl`` back to the checkpoint's step before appending.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from medusa.errors import ConfigError
from medusa.io import OVERWRITE_HINT, atomic_write_text

STATE_NAME = "trainer_state.json"
METRICS_NAME = "metrics.jsonl"
_CKPT_RE = re.compile(r"^checkpoint-(\d+)$")
_RUN_FILE_RE = re.compile(r"^(final|recipe\.json|metrics\.jsonl|checkpoint-\d+|\.checkpoint-\d+\.tmp)$")


def checkpoint_dirs(output_dir: str | Path) -> list[Path]:
    """Complete checkpoints under ``output_dir``, oldest first."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir()
             if (m := _CKPT_RE.match(p.name)) and (p / STATE_NAME).is_file()]
    return [p for _, p in sorted(found)]


def resolve_resume(resume: str | None, output_dir: str | Path) -> Path | None:
    """``auto`` -> the newest checkpoint (or None: start fresh); a path -> that checkpoint."""
    if resume is None:
        return None
    if resume == "auto":
        found = checkpoint_dirs(output_dir)
        return found[-1] if found else None
    path = Path(resume)
    if not (path / STATE_NAME).is_file():
        raise ConfigError(f"train.resume: {path} is not a training checkpoint (no {STATE_NAME})")
    return path


def _within(path: Path, folder: Path) -> bool:
    path, folder = path.resolve(), folder.resolve()
    return path == folder or folder in path.parents


def check_output_dir(output_dir: str | Path, resuming: bool, overwrite: bool,
                     inputs: dict[str, str | None], keep: str | None = None) -> list[Path]:
    """Check ``output_dir`` before anything loads; returns the earlier run's files that ``overwrite`` lets
    this fresh run remove (empty when resuming). ``inputs``: recipe key -> path (a folder holding one is
    refused); ``keep``: a directory inside ``output_dir`` that is not in the way (the hidden-state cache)."""
    out = Path(output_dir)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"output_dir: {out} exists and is not a directory")
    if not out.is_dir():
        return []
    for key, item in inputs.items():
        if item and Path(item).expanduser().exists() and _within(Path(item).expanduser(), out):
            raise ConfigError(f"output_dir: {out} holds the input {item} ({key}); use another output_dir")
    if resuming:
        return []
    entries = [p for p in out.iterdir() if keep is None or not _within(Path(keep), p)]
    ours = [p for p in entries if _RUN_FILE_RE.match(p.name)]
    if overwrite or not entries:
        return ours
    if (out / "final").exists():
        raise ConfigError(f"output_dir: {out} holds a finished run (final/); use another output_dir, or "
                          "pass --overwrite to train again from scratch there")
    if checkpoint_dirs(out):
        raise ConfigError(f"output_dir: {out} holds checkpoints of an unfinished run; set train.resume=auto "
                          "to continue it, or pass --overwrite to start again from scratch")
    raise ConfigError(f"output_dir: {out} exists and is not empty; {OVERWRITE_HINT}")


def remove_run_files(paths: list[Path]) -> None:
    """Remove an earlier run's files (``check_output_dir``'s list; ``--overwrite``)."""
    for path in paths:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


def truncate_metrics(path: Path, step: int) -> None:
    """Keep only the rows of ``metrics.jsonl`` logged at or before ``step`` (and no line cut short by a
    kill): a resumed run appends the steps after its checkpoint exactly once."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] <= step:
            kept.append(line + "\n")
    atomic_write_text(path, "".join(kept))


def save_checkpoint(accelerator: Any, output_dir: str | Path, step: int, state: dict[str, Any]) -> Path:
    """Every process calls this; the main process writes ``trainer_state.json`` and renames."""
    final = Path(output_dir) / f"checkpoint-{step}"
    tmp = Path(output_dir) / f".checkpoint-{step}.tmp"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp), safe_serialization=True)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        (tmp / STATE_NAME).write_text(json.dumps({"global_step": step, **state}, indent=2) + "\n")
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    accelerator.wait_for_everyone()
    return final


def load_checkpoint(accelerator: Any, path: Path) -> dict[str, Any]:
    """Restore accelerate's state from ``path``; returns its ``trainer_state.json``."""
    accelerator.load_state(str(path))
    return json.loads((path / STATE_NAME).read_text())
