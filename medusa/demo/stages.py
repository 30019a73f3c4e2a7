"""Resumable pipeline stages of ``medusa demo`` (the benchmarks in ``benchmarks/`` reuse them): self-distil,
train, calibrate, export, bench. Each stage writes its outputs, then a marker
(``<root>/.stages/<name>.json`` with the stage's summary and timing); a re-run finds the marker and reuses
the stage. A stage that raises leaves no marker and surfaces as a one-line :class:`MedusaError` naming
the stage.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from medusa.calibrate.calibrate import calibrate
from medusa.calibrate.plot import plot_accuracy
from medusa.config import load_recipe
from medusa.data import load_tokenized
from medusa.errors import MedusaError
from medusa.eval.bench import bench
from medusa.eval.report import write_report
from medusa.export import export_checkpoint
from medusa.io import atomic_directory, atomic_write_text
from medusa.modeling.config import TREE_NAME
from medusa.modeling.loading import load_for_generation
from medusa.selfdistill import Sampling, SelfDistillConfig, self_distill
from medusa.training.loop import train


class StageError(MedusaError):
    """A pipeline stage failed; the message names the stage and the cause."""


def marker_path(root: str | Path, name: str) -> Path:
    return Path(root) / ".stages" / f"{name}.json"


def run_stage(root: str | Path, name: str, fn: Callable[[], dict[str, Any]],
              log: Callable[[str], None] = print, force: bool = False) -> dict[str, Any]:
    """Run ``fn`` unless its marker exists; returns the stage summary (``seconds`` and ``reused`` added)."""
    marker = marker_path(root, name)
    if marker.is_file() and not force:
        summary = json.loads(marker.read_text())
        log(f"[{name}] reusing the finished stage ({marker}; took {summary.get('seconds', 0):.0f}s)")
        return {**summary, "reused": True}
    log(f"[{name}] running")
    t0 = time.perf_counter()
    try:
        summary = dict(fn() or {})
    except StageError:
        raise
    except MedusaError as exc:
        raise StageError(f"stage '{name}' failed: {exc}") from exc
    except Exception as exc:  # a bug or an environment problem: keep the cause on one line, --debug for more
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise StageError(f"stage '{name}' failed: {type(exc).__name__}: {first} (re-run with --debug for the "
                         "traceback; finished stages are reused)") from exc
    summary["seconds"] = round(time.perf_counter() - t0, 2)
    atomic_write_text(marker, json.dumps(summary, indent=2, default=str) + "\n")
    log(f"[{name}] done in {summary['seconds']:.0f}s")
    return {**summary, "reused": False}


@contextlib.contextmanager
def hf_progress_bars(enabled: bool) -> Iterator[None]:
    """Run the body with transformers' own progress bars (``Loading weights``...) off unless ``enabled``;
    the previous setting is restored."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    if not enabled:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was and not enabled:
            hf_logging.enable_progress_bar()


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run the body with ``torch.set_num_threads(n)`` (None: unchanged), restoring the previous count.

    Timing stages of the tiny models here use 1 thread: on a small CPU shared with other work, a second
    intra-op thread spins on a busy core and makes each forward 5-50x slower and erratic."""
    import torch

    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def write_jsonl(path: str | Path, rows: Sequence[dict[str, Any]]) -> Path:
    path = Path(path)
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return path


def distill(model_path: str, prompts: str | Path, out: str | Path, max_new_tokens: int,
            temperature: float = 0.0,
            num_samples: int = 1, batch_size: int = 64, seed: int = 0, progress: bool = True,
            model: Any = None, tokenizer: Any = None) -> dict[str, Any]:
    """Completion-mode self-distillation with the local backend (``{"prompt", "completion"}`` rows)."""

    cfg = SelfDistillConfig(model=model_path, prompts=str(prompts), out=str(out), mode="completion",
                            prompt_format="prompt",
                            sampling=Sampling(temperature=temperature, top_p=1.0,
                                              max_new_tokens=max_new_tokens, seed=seed),
                            num_samples=num_samples, batch_size=batch_size, on_length="keep",
                            progress=progress)
    return run_self_distill(cfg, model, tokenizer)


def run_self_distill(cfg: Any, model: Any = None, tokenizer: Any = None) -> dict[str, Any]:
    """Run a self-distillation config; an output with no row at all is a stage error."""

    s = self_distill(cfg, model=model, tokenizer=tokenizer)
    if s["written"] + s["already_done"] == 0:
        raise MedusaError(f"{cfg.out}: self-distillation wrote no rows (see {s['errors_file']})")
    return {k: s[k] for k in ("out", "prompts", "written", "already_done", "errors", "completion_tokens",
                              "tokens_per_s") if k in s}


def summary_metrics(row: dict[str, Any]) -> dict[str, Any]:
    """A metrics row's losses, top-1 accuracies and step: what a training stage reports."""
    return {k: v for k, v in row.items()
            if isinstance(v, (int, float)) and ("top1" in k or "loss" in k or k == "step")}


def train_recipe(recipe_path: str | Path, overrides: Sequence[str], progress: bool = True) -> dict[str, Any]:
    """``medusa train RECIPE key=value...`` in-process (``progress=False``: no progress bar); returns the
    final directory and last metrics."""

    recipe = load_recipe(recipe_path, list(overrides))
    result = train(recipe, progress=progress, overwrite=True)  # the pipeline's own output_dir
    if result.final_dir is None:
        raise MedusaError(f"{recipe_path}: training stopped before its last step")
    last = summary_metrics(result.eval_metrics or result.last_metrics or {})
    return {"final_dir": str(result.final_dir), "steps": result.global_step, "metrics": last,
            "recipe": str(recipe_path), "overrides": list(overrides)}


def calibrate_stage(heads_dir: str | Path, final_dir: str | Path, data: str | Path, nodes: int | str = "auto",
                    max_length: int = 512, progress: bool = True) -> dict[str, Any]:
    """Copy the trained heads to ``final_dir`` with a calibrated ``tree.json`` (+ plots), atomically.

    ``nodes="auto"``: the size (<= 64 nodes) with the most predicted tokens/s, as
    ``medusa calibrate --nodes auto`` chooses it (:func:`medusa.calibrate.auto.choose_size`)."""

    model, tokenizer = load_for_generation(str(heads_dir))
    examples = load_tokenized(str(data), tokenizer, max_length=max_length).examples
    tree = calibrate(model, examples, nodes=nodes if nodes == "auto" else int(nodes), data_name=str(data),
                     progress=progress)
    with atomic_directory(final_dir, overwrite=True, kind="heads") as tmp:  # the stage's own directory
        for item in Path(heads_dir).iterdir():  # everything, MEDUSA-2's merged base_model/ too
            if item.is_dir():
                shutil.copytree(item, tmp / item.name)
            elif item.name != TREE_NAME:
                shutil.copy2(item, tmp / item.name)
        tree.to_json(tmp / TREE_NAME)
        plot_accuracy(tree.calibration["accuracy"], tmp / "calibration_accuracy.png")
    cal = tree.calibration
    return {"final_dir": str(final_dir), "nodes": len(tree), "depth": tree.depth,
            "top1": cal["top1"], "expected_tokens_per_step": cal["expected_tokens_per_step"],
            "position_mean_tokens_per_step": cal.get("position_mean_tokens_per_step"),
            "auto": cal.get("auto"), "num_positions": cal["num_positions"],
            "draft_vocab_loss": cal.get("draft_vocab_loss")}


def export_stage(heads_dir: str | Path, out: str | Path, format: str = "vllm") -> dict[str, Any]:

    return export_checkpoint(str(heads_dir), str(out), format, overwrite=True)  # the stage's own directory


def bench_stage(heads_dir: str | Path, prompts: Sequence[str], report_path: str | Path, max_new_tokens: int,
                repeats: int = 1, progress: bool = True, **kwargs: Any) -> dict[str, Any]:

    model, tokenizer = load_for_generation(str(heads_dir))
    report = bench(model, tokenizer, list(prompts), max_new_tokens=max_new_tokens, repeats=repeats,
                   progress=progress, **kwargs)
    report["config"]["heads"] = str(Path(heads_dir).resolve())
    files = write_report(report, report_path)
    keys = ("baseline_tokens_per_s", "medusa_tokens_per_s", "speedup", "tokens_per_step", "overhead",
            "greedy_exact_match", "medusa_step_ms", "plain_step_ms", "hf_step_ms", "prompts")
    optional = {k: report[k] for k in ("categories", "prompt_lookup", "assisted", "lookup_alone", "hybrid")
                if k in report}
    return {**{k: report[k] for k in keys}, **optional, "files": [str(f) for f in files]}


__all__ = ["StageError", "bench_stage", "calibrate_stage", "distill", "export_stage", "hf_progress_bars",
           "marker_path", "run_self_distill", "run_stage", "torch_threads", "train_recipe", "write_jsonl"]
