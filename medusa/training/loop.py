"""The training loop: the optimizer steps of a :class:`~medusa.training.session.Run` (MEDUSA-1 or MEDUSA-2,
:mod:`medusa.training.method`), its metrics rows (:mod:`medusa.training.metrics`), checkpoints and its output
(:mod:`medusa.training.output`).

``train(recipe)`` runs under any accelerate launch (single process, DDP, DeepSpeed, FSDP): the trained
module goes through ``accelerator.prepare``; the frozen backbone stays a plain module on each device.
Data order is a function of (seed, epoch) and the global step, so a resumed run sees exactly the
batches the uninterrupted one would have.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from medusa.config import Recipe
from medusa.data import collate
from medusa.modeling.model import MedusaModel
from medusa.training import setup as S
from medusa.training.checkpoint import (
    check_output_dir,
    data_fingerprint,
    load_checkpoint,
    resolve_resume,
    resume_changes,
    resumes_in_place,
    save_checkpoint,
)
from medusa.training.engine_state import check_supported
from medusa.training.heap import trim_heap
from medusa.training.method import method_of
from medusa.training.metrics import Window, log_eval, log_window, new_window
from medusa.training.output import finish, open_output, run_inputs
from medusa.training.session import Run, build_run


@dataclass
class TrainResult:
    output_dir: Path
    final_dir: Path | None
    global_step: int
    last_metrics: dict[str, Any]
    eval_metrics: dict[str, Any] | None
    model: MedusaModel | None = None  # the trained model (backbone + heads) of this process


def optimizer_step(run: Run, window: Window, order: list[int], step: int, params: list[nn.Parameter]) -> Any:
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
        window.add(loss, stats, int(batch["attention_mask"].sum()), parts)
    if not accelerator.optimizer_step_was_skipped:
        run.scheduler.step()
    trim_heap()  # the step's freed tensors back to the OS (medusa.training.heap)
    return grad_norm


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
                             run_inputs(recipe), keep=recipe.train.hidden_cache)
    fingerprint = data_fingerprint([recipe.data.train, recipe.data.eval])
    changes = (resume_changes(recipe.to_dict(), resume_from, fingerprint, resume_changed)
               if resume_from is not None else {})
    run = build_run(recipe, method, progress)
    plan, t = run.plan, recipe.train
    if t.save_steps or stop_at_step is not None:
        check_supported(run.accelerator)  # before anything is written
    step = (int(load_checkpoint(run.accelerator, resume_from, run.scheduler, run.trainable, run.optimizer,
                                (plan.world, plan.micro_batch, plan.grad_accum))["global_step"])
            if resume_from is not None else 0)  # any engine; any number of processes, the same global batch
    print(S.engine_report(run.accelerator, run.trainable, run.optimizer), flush=True)  # every process
    open_output(run, step, resume_from, stale, changes)
    params = [p for p in run.trainable.parameters() if p.requires_grad]
    end = plan.total_steps if stop_at_step is None else min(plan.total_steps, stop_at_step)
    bar = tqdm(total=plan.total_steps, initial=step, desc="train", dynamic_ncols=True,
               disable=not (progress and run.accelerator.is_local_main_process))
    window = new_window(recipe.heads.num_heads)
    last, eval_metrics, order_epoch, order = {}, None, -1, []
    while step < end:
        if step // plan.steps_per_epoch != order_epoch:
            order_epoch = step // plan.steps_per_epoch
            order = S.training_order(run.data.train.examples, recipe, plan, order_epoch)
        grad_norm = optimizer_step(run, window, order, step, params)
        step += 1
        bar.update(1)
        if step % t.logging_steps == 0 or step == end:
            last = log_window(run, window, step, grad_norm)
            bar.set_postfix(loss=f"{last['loss']:.3f}", top1=f"{last['head1_top1']:.2f}")
            window = new_window(recipe.heads.num_heads)
        if (run.data.eval is not None and t.eval_steps and step % t.eval_steps == 0
                and step < plan.total_steps):
            eval_metrics = log_eval(run, step)
        if (t.save_steps and step % t.save_steps == 0) or step == end < plan.total_steps:
            save_checkpoint(run.accelerator, run.out_dir, step,
                            {"epoch": step // plan.steps_per_epoch,
                             "step_in_epoch": step % plan.steps_per_epoch,
                             "total_steps": plan.total_steps, "world_size": plan.world,
                             "global_batch": plan.world * plan.micro_batch * plan.grad_accum,
                             "recipe": recipe.to_dict(), "data_fingerprint": fingerprint},
                            run.scheduler, run.trainable, run.optimizer)
    bar.close()
    final_dir, final_eval = finish(run, step)
    run.accelerator.end_training()
    model = run.method.trained_model(run.accelerator, run.model, run.trainable)
    return TrainResult(run.out_dir, final_dir, step, last, final_eval or eval_metrics, model)


__all__ = ["TrainResult", "optimizer_step", "train"]
