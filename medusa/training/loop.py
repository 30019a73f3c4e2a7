"""The training loop: MEDUSA-1 (:mod:`medusa1`) or MEDUSA-2 (:mod:`medusa2`), each a :class:`TrainingMethod`
chosen once from ``recipe.method``.

``train(recipe)`` runs under any accelerate launch (single process, DDP, DeepSpeed, FSDP): the trained
module goes through ``accelerator.prepare``; the frozen backbone stays a plain module on each device.
Data order is a function of (seed, epoch) and the global step, so a resumed run sees exactly the
batches the uninterrupted one would have.

``metrics.jsonl`` gets one row every ``train.logging_steps`` optimizer steps (averages over the window
and over processes: ``loss``, per-head loss / top-1 / top-5, tokens; MEDUSA-2 adds ``lm_loss`` (the KL
to the teacher when self-distilling, then also under ``distill_kl``), ``heads_loss`` and ``lambda0``, with
``loss = lm_loss + lambda0 * heads_loss`` when the window is one step) and one ``eval_*`` row per evaluation.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from medusa.config import Recipe
from medusa.data import collate
from medusa.errors import ConfigError
from medusa.modeling.draft_vocab import build_token_map, coverage
from medusa.modeling.model import MedusaModel
from medusa.training import medusa1, medusa2
from medusa.training import setup as S
from medusa.training.checkpoint import (
    METRICS_NAME,
    check_output_dir,
    data_fingerprint,
    flat_keys,
    load_checkpoint,
    remove_run_files,
    resolve_resume,
    resume_changes,
    resumes_in_place,
    save_checkpoint,
    truncate_metrics,
)
from medusa.training.engine_state import check_supported
from medusa.training.hidden_cache import HiddenCache
from medusa.training.hidden_cache import prepare as prepare_cache
from medusa.training.losses import STATS_ROWS, summarise_stats


class TrainingMethod(Protocol):
    """What the loop asks of a training method. :data:`medusa1.METHOD` and :data:`medusa2.METHOD` provide it;
    :func:`method_of` picks one from ``recipe.method``."""

    name: str  # the recipe's ``method``

    def check_recipe(self, recipe: Recipe) -> None:
        """Method-specific combinations that cannot work, raised before anything loads."""

    def setup_model(self, recipe: Recipe, device: torch.device,
                    total_steps: int) -> tuple[MedusaModel, nn.Module, Any]:
        """``(model, trained module, loss state)``."""

    def param_groups(self, recipe: Recipe, trainable: nn.Module) -> list[dict[str, Any]]:
        """The optimizer's parameter groups (learning rates and weight decay)."""

    def compute_loss(self, recipe: Recipe, model: MedusaModel, trainable: nn.Module,
                     batch: dict[str, torch.Tensor], step: int,
                     state: Any) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """``(loss, stats [STATS_ROWS, K], metrics)`` of one micro-batch at optimizer step ``step``."""

    def save_final(self, accelerator: Any, model: MedusaModel, trainable: nn.Module, recipe: Recipe,
                   path: Path) -> None:
        """Write ``final/`` (every process calls it)."""

    def trained_model(self, accelerator: Any, model: MedusaModel, trainable: nn.Module) -> MedusaModel:
        """The model holding what was trained, once training ends."""


_METHODS: dict[str, TrainingMethod] = {m.name: m for m in (medusa1.METHOD, medusa2.METHOD)}


def method_of(recipe: Recipe) -> TrainingMethod:
    """The recipe's training method (``recipe.method``, validated against :data:`medusa.config.METHODS`)."""
    return _METHODS[recipe.method]


@dataclass
class TrainResult:
    output_dir: Path
    final_dir: Path | None
    global_step: int
    last_metrics: dict[str, Any]
    eval_metrics: dict[str, Any] | None
    model: MedusaModel | None = None  # the trained model (backbone + heads) of this process


@dataclass
class Run:
    """What one training session holds, built once by :func:`_build`."""

    recipe: Recipe
    method: TrainingMethod
    accelerator: Any
    data: S.RunData
    plan: S.Plan
    model: MedusaModel
    trainable: nn.Module  # prepared by accelerate
    optimizer: Any
    scheduler: Any
    state: Any  # the method's loss state (MEDUSA-2: Medusa2State; MEDUSA-1: None)
    out_dir: Path
    metrics_path: Path
    cache: HiddenCache | None = None  # train.hidden_cache: training batches read hidden states from it


@dataclass
class Window:
    """Sums over this process's micro-batches since the last metrics row."""

    stats: torch.Tensor  # [STATS_ROWS, K]: per-head CE sum, top-1 hits, top-5 hits, count, draft misses
    loss: float = 0.0
    tokens: int = 0
    micro: int = 0
    parts: dict[str, float] = field(default_factory=dict)  # MEDUSA-2's loss terms and lambda0
    t0: float = field(default_factory=time.perf_counter)


# ----------------------------------------------------------------------------------------- per method
def setup_model(recipe: Recipe, device: torch.device, plan: S.Plan) -> tuple[MedusaModel, nn.Module, Any]:
    """The recipe's method's ``(model, trained module, loss state)``."""
    return method_of(recipe).setup_model(recipe, device, plan.total_steps)


def save_final(run: Run, path: Path) -> None:
    run.method.save_final(run.accelerator, run.model, run.trainable, run.recipe, path)


# ----------------------------------------------------------------------------------------- metrics
def _summarise(stats: torch.Tensor, prefix: str) -> dict[str, float]:
    """stats ``[STATS_ROWS, K]`` -> per-head loss / top1 / top5 (/ draft_miss); see ``summarise_stats``."""
    return summarise_stats(stats, prefix)


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
    return {"eval_loss": float(totals[R * K] / totals[R * K + 1].clamp(min=1)), **_summarise(stats, "eval_")}


def _write_metrics(path: Path, row: dict[str, Any]) -> None:
    with path.open("a") as fh:
        fh.write(json.dumps(row) + "\n")


def _log_window(run: Run, window: Window, step: int, grad_norm: Any) -> dict[str, Any]:
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
           **_summarise(totals[: R * K].reshape(R, K), ""),
           "grad_norm": float(grad_norm) if grad_norm is not None else None,
           "tokens": int(totals[R * K + 1]), "tokens_per_s": float(totals[R * K + 1]) / max(elapsed, 1e-9)}
    if run.accelerator.is_main_process:
        _write_metrics(run.metrics_path, row)
    run.accelerator.log({k: v for k, v in row.items() if v is not None}, step=step)
    return row


def _log_eval(run: Run, step: int) -> dict[str, Any]:
    row = {"step": step, **evaluate(run, step)}
    if run.accelerator.is_main_process:
        _write_metrics(run.metrics_path, row)
    run.accelerator.log(row, step=step)
    return row


# ----------------------------------------------------------------------------------------- the loop
def _build(recipe: Recipe, method: TrainingMethod, progress: bool = True) -> Run:
    """Accelerator, data, step plan, model, optimizer and scheduler, prepared by accelerate."""
    from accelerate.utils import set_seed

    accelerator = S.make_accelerator(recipe)
    set_seed(recipe.train.seed)
    data = S.load_data(recipe, S.load_tokenizer(recipe))
    plan = S.make_plan(recipe, len(data.train.examples), accelerator.num_processes)
    model, trainable, state = setup_model(recipe, accelerator.device, plan)
    _draft_vocab(recipe, model, data.train.examples, accelerator)
    cache = None
    if recipe.train.hidden_cache:
        cache = prepare_cache(recipe.train.hidden_cache, model.base_model, data.train.examples,
                              data.pad_token_id, recipe.train.batch_size, accelerator, log=accelerator.print,
                              bf16_compute=accelerator.mixed_precision == "bf16", progress=progress,
                              feature_layers=getattr(model.heads, "feature_layers", None))
    optimizer = torch.optim.AdamW(method.param_groups(recipe, trainable), lr=recipe.train.lr)
    scheduler = S.make_scheduler(optimizer, recipe, plan)
    trainable, optimizer = S.prepare(accelerator, model.config.hidden_size, trainable, optimizer)
    out_dir = Path(recipe.output_dir)
    return Run(recipe, method, accelerator, data, plan, model, trainable, optimizer, scheduler, state,
               out_dir, out_dir / METRICS_NAME, cache)


def _draft_vocab(recipe: Recipe, model: MedusaModel, examples: list[dict[str, list[int]]],
                 accelerator: Any) -> None:
    """``heads.draft_vocab: N``: restrict the heads to the N most frequent training labels (the same map on
    every process: each one holds all of the training data), before the optimizer sees the parameters.
    Heads from ``heads.init_from`` keep their own map, which must have N ids."""
    n, have = recipe.heads.draft_vocab, model.heads.draft_vocab
    if recipe.heads.init_from:
        if have != n:
            raise ConfigError(f"heads.draft_vocab: {n}, but heads.init_from {recipe.heads.init_from} has "
                              f"draft_vocab {have}")
        return
    if not n:
        return
    token_map = build_token_map(examples, model.config.vocab_size, n)
    model.use_draft_vocab(token_map)
    labels = torch.tensor([t for ex in examples for t in ex["labels"]], dtype=torch.long)
    accelerator.print(f"draft vocabulary: {n} of {model.config.vocab_size} tokens cover "
                      f"{coverage(token_map, labels):.2%} of the training labels")


def _open_output(run: Run, step: int, resume_from: Path | None, stale: list[Path],
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
        accelerator.init_trackers("medusa", config=_flat(recipe.to_dict()))
    if accelerator.is_main_process and step == 0:
        run.metrics_path.unlink(missing_ok=True)
    elif accelerator.is_main_process:
        truncate_metrics(run.metrics_path, step)
        if changes:
            _write_metrics(run.metrics_path, {"step": step, "resumed_from": str(resume_from),
                                              "resume_changes": changes})
    if accelerator.is_main_process:
        train, plan = run.data.train, run.plan
        accelerator.print(f"train: {len(train)} examples ({train.num_label_tokens:,} trained tokens)"
                          + (f", skipped {train.skipped}" if train.skipped else "")
                          + f"; {plan.total_steps} steps, {plan.steps_per_epoch} per epoch"
                          + (f"; resuming at step {step} from {resume_from}" if resume_from else ""))


def _optimizer_step(run: Run, window: Window, order: list[int], step: int, params: list[nn.Parameter]) -> Any:
    """The ``grad_accum`` micro-batches of optimizer step ``step`` (0-based); returns the clipped norm."""
    accelerator, plan, data, recipe = run.accelerator, run.plan, run.data, run.recipe
    within = step % plan.steps_per_epoch
    grad_norm = None
    for g in range(plan.grad_accum):
        idx = S.micro_batch_indices(order, within * plan.grad_accum + g, accelerator.process_index, plan)
        batch = collate([data.train.examples[i] for i in idx], data.pad_token_id)
        if run.cache is not None:  # MEDUSA-1 from the hidden-state cache: the backbone does not run
            batch["hidden"] = run.cache.batch(idx, batch["input_ids"].shape[1])  # [B, T, d]
        batch = {k: v.to(accelerator.device) for k, v in batch.items()}
        with accelerator.accumulate(run.trainable):
            loss, stats, parts = run.method.compute_loss(recipe, run.model, run.trainable, batch, step,
                                                         run.state)
            accelerator.backward(loss)
            if accelerator.sync_gradients and recipe.train.max_grad_norm > 0:
                grad_norm = accelerator.clip_grad_norm_(params, recipe.train.max_grad_norm)
            run.optimizer.step()
            run.optimizer.zero_grad(set_to_none=True)
        window.stats += stats.detach().cpu()
        window.loss += float(loss.detach())
        window.tokens += int(batch["attention_mask"].sum())
        window.micro += 1
        for name, value in parts.items():
            window.parts[name] = window.parts.get(name, 0.0) + value
    if not accelerator.optimizer_step_was_skipped:
        run.scheduler.step()
    return grad_norm


def _finish(run: Run, step: int) -> tuple[Path | None, dict[str, Any] | None]:
    """At the last step: a final evaluation and ``final/``. Returns (final_dir, eval row)."""
    if step < run.plan.total_steps:
        return None, None
    eval_row = _log_eval(run, step) if run.data.eval is not None else None
    final_dir = run.out_dir / "final"
    save_final(run, final_dir)
    if run.accelerator.is_main_process:
        skipped = run.data.train.skipped
        run.accelerator.print(f"wrote {final_dir}" + (f"; skipped rows: {skipped}" if skipped else ""))
    return final_dir, eval_row


def _inputs(recipe: Recipe) -> dict[str, str | None]:
    """The recipe's local inputs, by key: an output_dir holding one of them is refused."""
    return {"model": recipe.model, "data.train": recipe.data.train, "data.eval": recipe.data.eval,
            "heads.init_from": recipe.heads.init_from, "data.chat_template": recipe.data.chat_template
            if (recipe.data.chat_template or "").endswith((".jinja", ".j2")) else None}


def train(recipe: Recipe, stop_at_step: int | None = None, progress: bool = True,
          overwrite: bool = False, resume_changed: bool = False) -> TrainResult:
    """Run the recipe. ``stop_at_step`` ends this session after that optimizer step (saving a checkpoint
    there) without writing ``final/``; a later run with ``train.resume: auto`` continues it.
    ``progress=False``: no progress bar (the main process draws it otherwise). An ``output_dir`` holding
    an earlier run or other files is refused unless the run resumes or ``overwrite`` (which removes only
    the earlier run's files: ``final/``, checkpoints, ``metrics.jsonl``, ``recipe.json``). A resume whose
    recipe or data changed since its checkpoint is refused unless ``resume_changed`` (then recorded)."""
    from tqdm.auto import tqdm

    method = method_of(recipe)
    method.check_recipe(recipe)  # before anything loads
    resume_from = resolve_resume(recipe.train.resume, Path(recipe.output_dir))
    stale = check_output_dir(recipe.output_dir, resumes_in_place(resume_from, recipe.output_dir), overwrite,
                             _inputs(recipe), keep=recipe.train.hidden_cache)
    fingerprint = data_fingerprint([recipe.data.train, recipe.data.eval])
    changes = (resume_changes(recipe.to_dict(), resume_from, fingerprint, resume_changed)
               if resume_from is not None else {})
    run = _build(recipe, method, progress)
    plan, t = run.plan, recipe.train
    if t.save_steps or stop_at_step is not None:
        check_supported(run.accelerator)  # before anything is written
    step = (int(load_checkpoint(run.accelerator, resume_from, run.scheduler, run.trainable, run.optimizer,
                                (plan.world, plan.micro_batch, plan.grad_accum))["global_step"])
            if resume_from is not None else 0)  # any engine; any number of processes, the same global batch
    _open_output(run, step, resume_from, stale, changes)
    params = [p for p in run.trainable.parameters() if p.requires_grad]
    end = plan.total_steps if stop_at_step is None else min(plan.total_steps, stop_at_step)
    bar = tqdm(total=plan.total_steps, initial=step, desc="train", dynamic_ncols=True,
               disable=not (progress and run.accelerator.is_local_main_process))
    window = Window(torch.zeros(STATS_ROWS, recipe.heads.num_heads))
    last, eval_metrics, order_epoch, order = {}, None, -1, []
    while step < end:
        if step // plan.steps_per_epoch != order_epoch:
            order_epoch = step // plan.steps_per_epoch
            order = S.training_order(run.data.train.examples, recipe, plan, order_epoch)
        grad_norm = _optimizer_step(run, window, order, step, params)
        step += 1
        bar.update(1)
        if step % t.logging_steps == 0 or step == end:
            last = _log_window(run, window, step, grad_norm)
            bar.set_postfix(loss=f"{last['loss']:.3f}", top1=f"{last['head1_top1']:.2f}")
            window = Window(torch.zeros(STATS_ROWS, recipe.heads.num_heads))
        if (run.data.eval is not None and t.eval_steps and step % t.eval_steps == 0
                and step < plan.total_steps):
            eval_metrics = _log_eval(run, step)
        if (t.save_steps and step % t.save_steps == 0) or step == end < plan.total_steps:
            save_checkpoint(run.accelerator, run.out_dir, step,
                            {"epoch": step // plan.steps_per_epoch,
                             "step_in_epoch": step % plan.steps_per_epoch,
                             "total_steps": plan.total_steps, "world_size": plan.world,
                             "global_batch": plan.world * plan.micro_batch * plan.grad_accum,
                             "recipe": recipe.to_dict(), "data_fingerprint": fingerprint},
                            run.scheduler, run.trainable, run.optimizer)
    bar.close()
    final_dir, final_eval = _finish(run, step)
    run.accelerator.end_training()
    model = run.method.trained_model(run.accelerator, run.model, run.trainable)
    return TrainResult(run.out_dir, final_dir, step, last, final_eval or eval_metrics, model)


def _flat(d: dict[str, Any]) -> dict[str, Any]:
    """Trackers take flat scalar configs: ``{"train.lr": 1e-3, ...}``; lists become strings."""
    return {k: v if isinstance(v, (int, float, str, bool)) or v is None else str(v)
            for k, v in flat_keys(d).items()}
