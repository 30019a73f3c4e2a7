"""Resumable training checkpoints: ``<output_dir>/checkpoint-<step>/``.

Each holds the trained module and its optimizer gathered to full per-parameter tensors, the same whatever
engine wrote them (:mod:`medusa.training.engine_state`: ``model.safetensors``, ``optimizer.safetensors`` +
``optimizer.json``), and as plain data: the learning-rate scheduler (``scheduler.json``), every process's RNG
(``rng_state_<i>.json`` + ``.safetensors``) and ``trainer_state.json`` (global step, the data position, the
world size and global batch, the recipe). So a checkpoint of a 2-process DDP or DeepSpeed ZeRO-2/3 run
resumes in 1 process, and the other way round, provided processes x batch_size x grad_accum stays the same
(:func:`check_global_batch`). Nothing in a checkpoint is unpickled: a checkpoint holding a pickle
(``*.pkl``, ``.bin``, ``.pt``, DeepSpeed / FSDP shards) is refused before anything loads
(:func:`check_no_pickles`).
Written to a temp directory and renamed into place, so an interrupted save never leaves a checkpoint that
looks complete; files get the umask's mode.

The output directory's policy (:func:`check_output_dir`): a run starts fresh only in an empty (or new)
``output_dir``; one that holds an earlier run (``final/``, checkpoints, ``metrics.jsonl``) or other files is
refused unless the run resumes from a checkpoint inside it (``train.resume``) or ``overwrite`` is given,
which removes only the earlier run's own files. A resume from a checkpoint elsewhere gets the fresh run's
guard. A resumed run keeps ``recipe.json`` and cuts ``metrics.jsonl`` back to the checkpoint's step before
appending. A resume whose recipe (beyond logging / saving keys) or data files changed since the checkpoint
is refused (:func:`resume_changes`) unless allowed; then the changes are recorded in ``metrics.jsonl``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from medusa.config import Recipe
from medusa.errors import CheckpointError, ConfigError
from medusa.io import OVERWRITE_HINT, atomic_write_text, give_umask_mode, save_safetensors
from medusa.training.engine_state import GROUP_BOUNDS, check_supported, load_engine_state, save_engine_state

STATE_NAME = "trainer_state.json"
METRICS_NAME = "metrics.jsonl"
SCHEDULER_NAME = "scheduler.json"
_PICKLE_SUFFIXES = (".pkl", ".pickle", ".bin", ".pt", ".pth", ".ckpt", ".distcp", ".metadata")
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
        path = found[-1] if found else None
    else:
        path = Path(resume)
        if not (path / STATE_NAME).is_file():
            raise ConfigError(f"train.resume: {path} is not a training checkpoint (no {STATE_NAME})")
    if path is not None:
        check_no_pickles(path)  # before anything loads
    return path


# recipe keys a resumed run may change freely (where it writes and how often it logs, saves, evaluates)
RESUME_FREE_KEYS = frozenset({"output_dir", "train.resume", "train.logging_steps", "train.save_steps",
                              "train.eval_steps", "report_to"})
# the per-process batch layout: free when the global batch stays (another number of processes)
BATCH_KEYS = ("train.batch_size", "train.grad_accum")


def flat_keys(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts -> ``{"train.lr": ..., ...}``."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flat_keys(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def data_fingerprint(paths: list[str | None]) -> str | None:
    """sha256 over the bytes of the local data files ``paths`` (a directory: its files, by relative path);
    None when none is local (hub datasets: the recipe's name is what is compared)."""
    digest, seen = hashlib.sha256(), False
    for item in paths:
        path = Path(item).expanduser() if item else None
        if path is None or not path.exists():
            continue
        files = sorted(f for f in path.rglob("*") if f.is_file()) if path.is_dir() else [path]
        for f in files:
            seen = True
            digest.update(str(f.relative_to(path) if path.is_dir() else f.name).encode() + b"\0")
            with open(f, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(chunk)
    return digest.hexdigest() if seen else None


def resume_changes(recipe: dict[str, Any], path: Path, fingerprint: str | None,
                   allow: bool) -> dict[str, list[Any]]:
    """What changed since checkpoint ``path``: recipe keys (``[old, new]``, the free keys aside) and the data
    files' contents. Refused (naming them) unless ``allow``; returns the changes to record. ``batch_size`` and
    ``grad_accum`` are left to :func:`check_global_batch` when the checkpoint records its global batch."""
    try:
        state = json.loads((path / STATE_NAME).read_text(encoding="utf-8"))
        old = flat_keys(state["recipe"]) if isinstance(state.get("recipe"), dict) else {}
        step = state["global_step"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise CheckpointError(f"train.resume: {path / STATE_NAME}: not a trainer state ({exc})") from None
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise CheckpointError(f"train.resume: {path / STATE_NAME}: global_step {step!r} is not a step")
    max_steps = (recipe.get("train") or {}).get("max_steps")
    if isinstance(max_steps, int) and 0 < max_steps < step:
        raise CheckpointError(f"train.resume: {path / STATE_NAME}: global_step {step} is past this run's "
                              f"train.max_steps {max_steps}")
    new = flat_keys(recipe)
    defaults = flat_keys(Recipe().to_dict())  # a key added since the checkpoint was made had its default
    old = {**{k: v for k, v in defaults.items() if k in new}, **old} if old else old
    free = RESUME_FREE_KEYS | (set(BATCH_KEYS) if isinstance(state.get("global_batch"), int) else set())
    changes = {k: [old.get(k), new.get(k)] for k in sorted(set(old) | set(new))
               if k not in free and old.get(k) != new.get(k)}
    if not old:  # an older or foreign checkpoint: nothing to compare with
        changes = {"recipe (not recorded in the checkpoint)": [None, "this run's"]}
    before = state.get("data_fingerprint")
    if before and fingerprint and before != fingerprint:
        changes["data (file contents)"] = [before, fingerprint]
    if changes and not allow:
        named = "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changes.items())
        raise ConfigError(f"train.resume: {path} was made with another recipe or data ({named[:400]}); "
                          "pass --resume-changed to resume anyway (the changes are recorded in "
                          "metrics.jsonl), or start a new run")
    return changes


def check_global_batch(state: dict[str, Any], path: Path, world: int, batch_size: int,
                       grad_accum: int) -> None:
    """The resumed run's global batch (processes x batch_size x grad_accum) is the checkpoint's: its step
    count then names the same examples and the same updates, at any number of processes."""
    before, now = state.get("global_batch"), world * batch_size * grad_accum
    if isinstance(before, int) and before != now:
        raise ConfigError(f"train.resume: {path} was trained with a global batch of {before} "
                          f"({state.get('world_size')} process(es) x batch_size x grad_accum); this run's "
                          f"is {now} ({world} x {batch_size} x {grad_accum}): set train.batch_size / "
                          f"train.grad_accum so that processes x batch_size x grad_accum = {before}")


def check_no_pickles(path: Path) -> None:
    """Refuse a checkpoint holding a file a load would unpickle: one :class:`CheckpointError` naming the file.
    Called before anything loads."""
    for item in sorted(path.rglob("*")):
        name = item.name
        if name.lower().endswith(_PICKLE_SUFFIXES) or name.startswith("custom_checkpoint_"):
            raise CheckpointError(f"train.resume: {item}: a pickle (code could run when it loads); medusa "
                                  "resumes only from safetensors and plain JSON state (checkpoints it wrote "
                                  "itself); remove the file or resume from another checkpoint")


def _within(path: Path, folder: Path) -> bool:
    path, folder = path.resolve(), folder.resolve()
    return path == folder or folder in path.parents


def resumes_in_place(resume_from: Path | None, output_dir: str | Path) -> bool:
    """The run resumes from a checkpoint inside its own ``output_dir`` (the only resume that may find the
    directory holding a run: a checkpoint from elsewhere gets the fresh run's guard)."""
    return resume_from is not None and _within(resume_from, Path(output_dir))


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


# ----------------------------------------------------------------------------------------- RNG as plain data
def _save_rng(folder: Path, index: int) -> None:
    """This process's RNG states: Python's and numpy's as JSON, torch's (CPU, CUDA) as safetensors."""
    import numpy as np

    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    plain = {"python": [version, list(internal), gauss],
             "numpy": [kind, [int(k) for k in keys], int(pos), int(has_gauss), float(cached)]}
    (folder / f"rng_state_{index}.json").write_text(json.dumps(plain) + "\n")
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        tensors.update({f"cuda_{i}": s for i, s in enumerate(torch.cuda.get_rng_state_all())})
    save_safetensors(tensors, folder / f"rng_state_{index}.safetensors")


def _load_rng(folder: Path, index: int) -> None:
    """Restore :func:`_save_rng`'s states (absent, as after a change of world size: kept as they are)."""
    import numpy as np
    from safetensors.torch import load_file

    plain_path, tensor_path = folder / f"rng_state_{index}.json", folder / f"rng_state_{index}.safetensors"
    if not (plain_path.is_file() and tensor_path.is_file()):
        return
    try:
        plain, tensors = json.loads(plain_path.read_text()), load_file(str(tensor_path))
        version, internal, gauss = plain["python"]
        random.setstate((int(version), tuple(int(x) for x in internal), gauss))
        kind, keys, pos, has_gauss, cached = plain["numpy"]
        np.random.set_state((str(kind), np.asarray(keys, dtype=np.uint32), int(pos), int(has_gauss),
                             float(cached)))
        torch.set_rng_state(tensors["torch"])
        cuda = [tensors[f"cuda_{i}"] for i in range(torch.cuda.device_count()) if f"cuda_{i}" in tensors]
        if cuda and len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
    except Exception as exc:  # noqa: BLE001 - any malformed state is the checkpoint's fault
        raise CheckpointError(f"train.resume: {plain_path}: not a valid RNG state ({exc})") from None


# ----------------------------------------------------------------------------------------- the scheduler
def _fits(want: Any, got: Any) -> bool:
    """``got`` (from JSON) has the kind of ``want`` (the running scheduler's value)."""
    if isinstance(want, bool) or isinstance(got, bool):
        return isinstance(want, bool) and isinstance(got, bool)
    if isinstance(want, int):
        return isinstance(got, int)
    if isinstance(want, float):
        return isinstance(got, (int, float)) and math.isfinite(got)
    if isinstance(want, list):
        return isinstance(got, list) and len(got) == len(want) and all(_fits(w, g) for w, g in zip(want, got))
    if isinstance(want, dict):
        return isinstance(got, dict) and set(got) == set(want) and all(_fits(want[k], got[k]) for k in want)
    return want is None and got is None


def _in_bounds(key: str, got: Any) -> bool:
    """A scheduler counter in [-1, 10**9]; a scheduler's learning rates within the optimizer's lr bounds."""
    if key in ("last_epoch", "_step_count"):
        return -1 <= got <= 10**9
    if key in ("base_lrs", "_last_lr"):
        low, high = GROUP_BOUNDS["lr"]
        return all(low <= x <= high for x in got)
    return True


def _scheduler_state(path: Path, scheduler: Any) -> dict[str, Any]:
    """``scheduler.json``, checked against the running scheduler's own state: same keys, same kinds."""
    file = path / SCHEDULER_NAME
    try:
        state = json.loads(file.read_text())
    except (OSError, ValueError, RecursionError) as exc:
        raise CheckpointError(f"train.resume: {file}: unreadable scheduler state ({exc})") from None
    expected = scheduler.state_dict()
    if not isinstance(state, dict) or set(state) != set(expected):
        have = sorted(state) if isinstance(state, dict) else state
        raise CheckpointError(f"train.resume: {file}: keys {have!r}, expected {sorted(expected)}")
    for key, want in expected.items():
        got = state[key]
        if not _fits(want, got) or not _in_bounds(key, got):
            raise CheckpointError(f"train.resume: {file}: {key} = {got!r:.60} does not fit this run's "
                                  "scheduler")
    return state


def save_checkpoint(accelerator: Any, output_dir: str | Path, step: int, state: dict[str, Any],
                    scheduler: Any, module: Any, optimizer: Any) -> Path:
    """Every process calls this; the main process writes the trained state (gathered), the scheduler's and
    the trainer's state as JSON, gives the files the umask's mode and renames. No pickle is written."""
    final = Path(output_dir) / f"checkpoint-{step}"
    tmp = Path(output_dir) / f".checkpoint-{step}.tmp"
    try:
        _save_into(accelerator, tmp, final, step, state, (scheduler, module, optimizer))
    except BaseException:  # a full disk, a kill: no half-written temp directory is left in the way
        if accelerator.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _save_into(accelerator: Any, tmp: Path, final: Path, step: int, state: dict[str, Any],
               trained: tuple[Any, Any, Any]) -> None:
    scheduler, module, optimizer = trained
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    save_engine_state(accelerator, module, optimizer, tmp)
    _save_rng(tmp, accelerator.process_index)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        (tmp / SCHEDULER_NAME).write_text(json.dumps(scheduler.state_dict(), indent=2) + "\n")
        (tmp / STATE_NAME).write_text(json.dumps({"global_step": step, **state}, indent=2) + "\n")
        give_umask_mode(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    accelerator.wait_for_everyone()


def load_checkpoint(accelerator: Any, path: Path, scheduler: Any, module: Any, optimizer: Any,
                    layout: tuple[int, int, int]) -> dict[str, Any]:
    """Restore the trained module and optimizer into whatever engine runs (:mod:`engine_state`), the
    scheduler and the RNG (plain data) from ``path``; returns its ``trainer_state.json``. ``layout``: this
    run's (processes, batch_size, grad_accum), whose product must be the checkpoint's global batch."""
    check_no_pickles(path)
    check_supported(accelerator)
    check_global_batch(json.loads((path / STATE_NAME).read_text()), path, *layout)
    sched = _scheduler_state(path, scheduler)
    load_engine_state(accelerator, module, optimizer, path)
    scheduler.load_state_dict(sched)
    _load_rng(path, accelerator.process_index)
    return json.loads((path / STATE_NAME).read_text())
