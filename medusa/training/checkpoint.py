"""Resumable training checkpoints: ``<output_dir>/checkpoint-<step>/``.

Each holds accelerate's state (the trained module, optimizer, scheduler, every process's RNG) and
``trainer_state.json`` (global step, the data position, the recipe). Written to a temp directory and
renamed into place, so an interrupted save never leaves a checkpoint that looks complete.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from medusa.errors import ConfigError

STATE_NAME = "trainer_state.json"
_CKPT_RE = re.compile(r"^checkpoint-(\d+)$")


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
