"""What a training run writes where, and what it refuses: the local inputs an ``output_dir`` may not hold,
``recipe.json`` and the metrics log at the start (a resumed run's cut back to its step), trackers, and at the
last step a final evaluation and ``final/``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from medusa.config import Recipe
from medusa.training.checkpoint import flat_keys, remove_run_files, truncate_metrics
from medusa.training.metrics import log_eval, write_metrics
from medusa.training.session import Run


def run_inputs(recipe: Recipe) -> dict[str, str | None]:
    """The recipe's local inputs, by key: an output_dir holding one of them is refused."""
    return {"model": recipe.model, "data.train": recipe.data.train, "data.eval": recipe.data.eval,
            "heads.init_from": recipe.heads.init_from, "data.chat_template": recipe.data.chat_template
            if (recipe.data.chat_template or "").endswith((".jinja", ".j2")) else None}


def open_output(run: Run, step: int, resume_from: Path | None, stale: list[Path],
                changes: dict[str, Any]) -> None:
    """recipe.json (a resumed run keeps the one there), trackers, a fresh metrics log (a resumed run's is cut
    back to its step, then appended to, first with the recipe / data ``changes`` it was allowed), the run's
    summary line. ``stale``: an earlier run's files that ``--overwrite`` removes."""
    accelerator, recipe = run.accelerator, run.recipe
    accelerator.wait_for_everyone()  # every process has checked output_dir before anything is removed
    if accelerator.is_main_process:
        remove_run_files(stale)
        run.out_dir.mkdir(parents=True, exist_ok=True)
        if step == 0 or not (run.out_dir / "recipe.json").exists():
            (run.out_dir / "recipe.json").write_text(json.dumps(recipe.to_dict(), indent=2) + "\n")
    if recipe.report_to != "none":
        accelerator.init_trackers("medusa", config=tracker_config(recipe.to_dict()))
    if accelerator.is_main_process and step == 0:
        run.metrics_path.unlink(missing_ok=True)
    elif accelerator.is_main_process:
        truncate_metrics(run.metrics_path, step)
        if changes:
            write_metrics(run.metrics_path, {"step": step, "resumed_from": str(resume_from),
                                             "resume_changes": changes})
    if accelerator.is_main_process:
        train, plan = run.data.train, run.plan
        accelerator.print(f"train: {len(train)} examples ({train.num_label_tokens:,} trained tokens)"
                          + (f", skipped {train.skipped}" if train.skipped else "")
                          + f"; {plan.total_steps} steps, {plan.steps_per_epoch} per epoch"
                          + (f"; resuming at step {step} from {resume_from}" if resume_from else ""))


def save_final(run: Run, path: Path) -> None:
    """The method's ``final/`` (every process calls it)."""
    run.method.save_final(run.accelerator, run.model, run.trainable, run.recipe, path)


def finish(run: Run, step: int) -> tuple[Path | None, dict[str, Any] | None]:
    """At the last step: a final evaluation and ``final/``. Returns (final_dir, eval row)."""
    if step < run.plan.total_steps:
        return None, None
    eval_row = log_eval(run, step) if run.data.eval is not None else None
    final_dir = run.out_dir / "final"
    save_final(run, final_dir)
    if run.accelerator.is_main_process:
        skipped = run.data.train.skipped
        run.accelerator.print(f"wrote {final_dir}" + (f"; skipped rows: {skipped}" if skipped else ""))
    return final_dir, eval_row


def tracker_config(d: dict[str, Any]) -> dict[str, Any]:
    """Trackers take flat scalar configs: ``{"train.lr": 1e-3, ...}``; lists become strings."""
    return {k: v if isinstance(v, (int, float, str, bool)) or v is None else str(v)
            for k, v in flat_keys(d).items()}


__all__ = ["finish", "open_output", "run_inputs", "save_final", "tracker_config"]
