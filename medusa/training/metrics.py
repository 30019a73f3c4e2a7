"""The training run's ``metrics.jsonl``: one row every ``train.logging_steps`` optimizer steps (averages over
the window and over processes: ``loss``, per-head loss / top-1 / top-5, tokens; MEDUSA-2 adds ``lm_loss``
(the KL to the teacher when self-distilling, then also under ``distill_kl``), ``heads_loss`` and ``lambda0``,
with ``loss = lm_loss + lambda0 * heads_loss`` when the window is one step) and one ``eval_*`` row per
evaluation."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from medusa.data import collate
from medusa.training.losses import STATS_ROWS, summarise_stats
from medusa.training.session import Run


@dataclass
class Window:
    """Sums over this process's micro-batches since the last metrics row."""

    stats: torch.Tensor  # [STATS_ROWS, K]: per-head CE sum, top-1 hits, top-5 hits, count, draft misses
    loss: float = 0.0
    tokens: int = 0
    micro: int = 0
    parts: dict[str, float] = field(default_factory=dict)  # MEDUSA-2's loss terms and lambda0
    t0: float = field(default_factory=time.perf_counter)

    def add(self, loss: torch.Tensor, stats: torch.Tensor, tokens: int, parts: dict[str, float]) -> None:
        """One micro-batch's loss, stats ``[STATS_ROWS, K]``, label tokens and loss terms."""
        self.stats += stats.detach().cpu()
        self.loss += float(loss.detach())
        self.tokens += tokens
        self.micro += 1
        for name, value in parts.items():
            self.parts[name] = self.parts.get(name, 0.0) + value


def new_window(num_heads: int) -> Window:
    return Window(torch.zeros(STATS_ROWS, num_heads))


def evaluate(run: Run, step: int) -> dict[str, float]:
    """Loss and per-head accuracy on the eval set (each process takes every world-th example)."""
    accelerator, recipe, data = run.accelerator, run.recipe, run.data
    module = accelerator.unwrap_model(run.trainable)
    module.eval()
    examples = data.eval.examples[accelerator.process_index::accelerator.num_processes]
    stats = torch.zeros(STATS_ROWS, recipe.heads.num_heads)
    loss_sum = torch.zeros(())
    batches = 0
    with torch.no_grad():
        for i in range(0, len(examples), recipe.train.batch_size):
            batch = collate(examples[i:i + recipe.train.batch_size], data.pad_token_id)
            batch = {k: v.to(accelerator.device) for k, v in batch.items()}
            with accelerator.autocast():
                loss, s, _ = run.method.compute_loss(recipe, run.model, module, batch, step, run.state)
            stats += s.cpu()
            loss_sum += loss.detach().float().cpu()
            batches += 1
    module.train()
    totals = accelerator.reduce(torch.cat([stats.flatten(), loss_sum[None], torch.tensor([float(batches)])])
                                .to(accelerator.device), reduction="sum").cpu()
    K, R = recipe.heads.num_heads, STATS_ROWS
    stats = totals[: R * K].reshape(R, K)
    return {"eval_loss": float(totals[R * K] / totals[R * K + 1].clamp(min=1)),
            **summarise_stats(stats, "eval_")}


def write_metrics(path: Path, row: dict[str, Any]) -> None:
    with path.open("a") as fh:
        fh.write(json.dumps(row) + "\n")


def log_window(run: Run, window: Window, step: int, grad_norm: Any) -> dict[str, Any]:
    """Average the window over its micro-batches and every process; write and log the row."""
    names = sorted(window.parts)  # the same on every process
    packed = torch.cat([window.stats.flatten(), torch.tensor([window.loss, float(window.tokens),
                                                              float(window.micro)]
                                                             + [window.parts[n] for n in names])])
    totals = run.accelerator.reduce(packed.to(run.accelerator.device), reduction="sum").cpu()
    K, R = run.recipe.heads.num_heads, STATS_ROWS
    micro = totals[R * K + 2]
    elapsed = time.perf_counter() - window.t0
    row = {"step": step, "epoch": round(step / run.plan.steps_per_epoch, 4),
           "lr": run.scheduler.get_last_lr()[0], "loss": float(totals[R * K] / micro),
           **{n: float(totals[R * K + 3 + i] / micro) for i, n in enumerate(names)},
           **summarise_stats(totals[: R * K].reshape(R, K), ""),
           "grad_norm": float(grad_norm) if grad_norm is not None else None,
           "tokens": int(totals[R * K + 1]), "tokens_per_s": float(totals[R * K + 1]) / max(elapsed, 1e-9)}
    if run.accelerator.is_main_process:
        write_metrics(run.metrics_path, row)
    run.accelerator.log({k: v for k, v in row.items() if v is not None}, step=step)
    return row


def log_eval(run: Run, step: int) -> dict[str, Any]:
    """Evaluate at ``step``; write and log the ``eval_*`` row."""
    row = {"step": step, **evaluate(run, step)}
    if run.accelerator.is_main_process:
        write_metrics(run.metrics_path, row)
    run.accelerator.log(row, step=step)
    return row


__all__ = ["Window", "evaluate", "log_eval", "log_window", "new_window", "write_metrics"]
