"""The training loop (MEDUSA-1; MEDUSA-2 plugs in its own model setup, loss and optimizer groups).

``train(recipe)`` runs under any accelerate launch (single process, DDP, DeepSpeed, FSDP): the trained
module goes through ``accelerator.prepare``; the frozen backbone stays a plain module on each device.
Data order is a function of (seed, epoch) and the global step, so a resumed run sees exactly the
batches the uninterrupted one would have.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from medusa.config import Recipe
from medusa.data import collate
from medusa.modeling.heads import MedusaHeads
from medusa.modeling.model import MedusaModel
from medusa.training import setup as S
from medusa.training.checkpoint import load_checkpoint, resolve_resume, save_checkpoint


@dataclass
class Method:
    """What differs between MEDUSA-1 and MEDUSA-2."""

    setup_model: Callable[[Recipe, torch.device], tuple[MedusaModel, nn.Module]]
    compute_loss: Callable[..., tuple[torch.Tensor, torch.Tensor]]  # (model, trainable, batch, recipe, step)
    optimizer_groups: Callable[[nn.Module, Recipe], list[dict[str, Any]]]
    save_final: Callable[..., None] | None = None  # (accelerator, model, trainable, recipe, path)
    set_plan: Callable[[Any], None] | None = None  # told the step plan (Plan) before the model is built


def method_for(recipe: Recipe) -> Method:
    if recipe.method == "medusa1":
        return Method(S.setup_model_medusa1, S.compute_loss_medusa1, S.optimizer_groups)
    from medusa.training import medusa2

    return medusa2.method()


@dataclass
class TrainResult:
    output_dir: Path
    final_dir: Path | None
    global_step: int
    last_metrics: dict[str, Any]
    eval_metrics: dict[str, Any] | None
    model: MedusaModel | None = None  # the trained model (backbone + heads) of this process


def _summarise(stats: torch.Tensor, prefix: str) -> dict[str, float]:
    """stats ``[4, K]`` (CE sum, top-1 hits, top-5 hits, count) -> per-head loss / top1 / top5."""
    out: dict[str, float] = {}
    n = stats[3].clamp(min=1)
    for k in range(stats.shape[1]):
        out[f"{prefix}head{k + 1}_loss"] = float(stats[0, k] / n[k])
        out[f"{prefix}head{k + 1}_top1"] = float(stats[1, k] / n[k])
        out[f"{prefix}head{k + 1}_top5"] = float(stats[2, k] / n[k])
    return out


def evaluate(accelerator: Any, model: MedusaModel, trainable: nn.Module, method: Method, data: Any,
             recipe: Recipe, step: int) -> dict[str, float]:
    """Loss and per-head accuracy on the eval set (each process takes every world-th example)."""
    module = accelerator.unwrap_model(trainable)
    module.eval()
    examples = data.eval.examples[accelerator.process_index::accelerator.num_processes]
    stats = torch.zeros(4, recipe.heads.num_heads)
    loss_sum = torch.zeros(())
    batches = 0
    with torch.no_grad():
        for i in range(0, len(examples), recipe.train.batch_size):
            batch = collate(examples[i:i + recipe.train.batch_size], data.pad_token_id)
            batch = {k: v.to(accelerator.device) for k, v in batch.items()}
            with accelerator.autocast():
                loss, s = method.compute_loss(model, module, batch, recipe, step)
            stats += s.cpu()
            loss_sum += loss.detach().float().cpu()
            batches += 1
    module.train()
    totals = accelerator.reduce(torch.cat([stats.flatten(), loss_sum[None], torch.tensor([float(batches)])])
                                .to(accelerator.device), reduction="sum").cpu()
    K = recipe.heads.num_heads
    stats = totals[: 4 * K].reshape(4, K)
    return {"eval_loss": float(totals[4 * K] / totals[4 * K + 1].clamp(min=1)), **_summarise(stats, "eval_")}


def _write_metrics(path: Path, row: dict[str, Any]) -> None:
    with path.open("a") as fh:
        fh.write(json.dumps(row) + "\n")


def _save_final(accelerator: Any, model: MedusaModel, trainable: nn.Module, recipe: Recipe, path: Path) -> None:
    """Gather the heads (also from ZeRO-3 shards) and write our checkpoint format, with the recipe."""
    state = accelerator.get_state_dict(trainable)  # every process must call this
    if accelerator.is_main_process:
        cfg = model.config
        heads = MedusaHeads(cfg.hidden_size, cfg.vocab_size, cfg.num_heads, cfg.num_layers, cfg.head_type,
                            shared_lm_head=model.heads.shared_lm_head)
        heads.load_state_dict({k.removeprefix("heads."): v.detach().float().cpu() for k, v in state.items()})
        final = MedusaModel(model.base_model, heads, cfg, tree=None)
        final.config.recipe = recipe.to_dict()
        final.save_pretrained(path)
    accelerator.wait_for_everyone()


def train(recipe: Recipe, stop_at_step: int | None = None) -> TrainResult:
    """Run the recipe. ``stop_at_step`` ends this session after that optimizer step (saving a checkpoint
    there) without writing ``final/``; a later run with ``train.resume: auto`` continues it."""
    from accelerate.utils import set_seed
    from tqdm.auto import tqdm

    method = method_for(recipe)  # before anything loads: an unsupported method is a config error
    accelerator = S.make_accelerator(recipe)
    set_seed(recipe.train.seed)
    out_dir = Path(recipe.output_dir)
    resume_from = resolve_resume(recipe.train.resume, out_dir)

    tokenizer = S.load_tokenizer(recipe)
    data = S.load_data(recipe, tokenizer)
    plan = S.make_plan(recipe, len(data.train.examples), accelerator.num_processes)
    if method.set_plan is not None:
        method.set_plan(plan)  # MEDUSA-2's lambda_0 schedule runs over plan.total_steps

    model, trainable = method.setup_model(recipe, accelerator.device)
    optimizer = torch.optim.AdamW(method.optimizer_groups(trainable, recipe), lr=recipe.train.lr)
    scheduler = S.make_scheduler(optimizer, recipe, plan)
    trainable, optimizer = accelerator.prepare(trainable, optimizer)
    accelerator.register_for_checkpointing(scheduler)

    step = 0
    if resume_from is not None:
        step = int(load_checkpoint(accelerator, resume_from)["global_step"])
    if accelerator.is_main_process:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "recipe.json").write_text(json.dumps(recipe.to_dict(), indent=2) + "\n")
    if recipe.report_to != "none":
        accelerator.init_trackers("medusa", config=_flat(recipe.to_dict()))
    metrics_path = out_dir / "metrics.jsonl"
    if accelerator.is_main_process and step == 0 and metrics_path.exists():
        metrics_path.unlink()  # a fresh run starts a fresh log; a resumed one appends
    if accelerator.is_main_process:
        skipped = data.train.skipped
        accelerator.print(f"train: {len(data.train)} examples ({data.train.num_label_tokens:,} trained tokens)"
                          + (f", skipped {skipped}" if skipped else "")
                          + f"; {plan.total_steps} steps, {plan.steps_per_epoch} per epoch"
                          + (f"; resuming at step {step} from {resume_from}" if resume_from else ""))

    params = [p for p in trainable.parameters() if p.requires_grad]
    end = plan.total_steps if stop_at_step is None else min(plan.total_steps, stop_at_step)
    bar = tqdm(total=plan.total_steps, initial=step, disable=not accelerator.is_local_main_process,
               desc="train", dynamic_ncols=True)
    window = torch.zeros(4, recipe.heads.num_heads)
    window_loss, window_tokens, window_micro, t0 = 0.0, 0, 0, time.perf_counter()
    last: dict[str, Any] = {}
    eval_metrics = None
    order_epoch, order = -1, []
    grad_norm = None
    while step < end:
        epoch, within = divmod(step, plan.steps_per_epoch)
        if epoch != order_epoch:
            order, order_epoch = S.epoch_order(len(data.train.examples), recipe.train.seed, epoch), epoch
        for g in range(plan.grad_accum):
            idx = S.micro_batch_indices(order, within * plan.grad_accum + g, accelerator.process_index, plan)
            batch = collate([data.train.examples[i] for i in idx], data.pad_token_id)
            batch = {k: v.to(accelerator.device) for k, v in batch.items()}
            with accelerator.accumulate(trainable):
                loss, stats = method.compute_loss(model, trainable, batch, recipe, step)
                accelerator.backward(loss)
                if accelerator.sync_gradients and recipe.train.max_grad_norm > 0:
                    grad_norm = accelerator.clip_grad_norm_(params, recipe.train.max_grad_norm)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            window += stats.detach().cpu()
            window_loss += float(loss.detach())
            window_tokens += int(batch["attention_mask"].sum())
            window_micro += 1
        if not accelerator.optimizer_step_was_skipped:
            scheduler.step()
        step += 1
        bar.update(1)

        if step % recipe.train.logging_steps == 0 or step == end:
            packed = torch.cat([window.flatten(), torch.tensor([window_loss, float(window_tokens),
                                                                 float(window_micro)])])
            totals = accelerator.reduce(packed.to(accelerator.device), reduction="sum").cpu()
            K = recipe.heads.num_heads
            elapsed = time.perf_counter() - t0
            last = {"step": step, "epoch": round(step / plan.steps_per_epoch, 4),
                    "lr": scheduler.get_last_lr()[0],
                    "loss": float(totals[4 * K] / totals[4 * K + 2]),
                    **_summarise(totals[: 4 * K].reshape(4, K), ""),
                    "grad_norm": float(grad_norm) if grad_norm is not None else None,
                    "tokens": int(totals[4 * K + 1]), "tokens_per_s": float(totals[4 * K + 1]) / max(elapsed, 1e-9)}
            if accelerator.is_main_process:
                _write_metrics(metrics_path, last)
            accelerator.log({k: v for k, v in last.items() if v is not None}, step=step)
            bar.set_postfix(loss=f"{last['loss']:.3f}", top1=f"{last['head1_top1']:.2f}")
            window.zero_()
            window_loss, window_tokens, window_micro, t0 = 0.0, 0, 0, time.perf_counter()

        if data.eval is not None and recipe.train.eval_steps and step % recipe.train.eval_steps == 0 \
                and step < plan.total_steps:
            eval_metrics = {"step": step, **evaluate(accelerator, model, trainable, method, data, recipe, step)}
            if accelerator.is_main_process:
                _write_metrics(metrics_path, eval_metrics)
            accelerator.log(eval_metrics, step=step)
        if (recipe.train.save_steps and step % recipe.train.save_steps == 0) or step == end < plan.total_steps:
            save_checkpoint(accelerator, out_dir, step,
                            {"epoch": step // plan.steps_per_epoch, "step_in_epoch": step % plan.steps_per_epoch,
                             "total_steps": plan.total_steps, "recipe": recipe.to_dict()})
    bar.close()

    final_dir = None
    if step >= plan.total_steps:
        if data.eval is not None:
            eval_metrics = {"step": step, **evaluate(accelerator, model, trainable, method, data, recipe, step)}
            if accelerator.is_main_process:
                _write_metrics(metrics_path, eval_metrics)
            accelerator.log(eval_metrics, step=step)
        final_dir = out_dir / "final"
        (method.save_final or _save_final)(accelerator, model, trainable, recipe, final_dir)
        if accelerator.is_main_process:
            accelerator.print(f"wrote {final_dir}" + (f"; skipped rows: {data.train.skipped}"
                                                      if data.train.skipped else ""))
    accelerator.end_training()
    model.heads = accelerator.unwrap_model(trainable).heads if recipe.method == "medusa1" else model.heads
    return TrainResult(out_dir, final_dir, step, last, eval_metrics, model)


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Trackers take flat scalar configs: ``{"train.lr": 1e-3, ...}``; lists become strings."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v if isinstance(v, (int, float, str, bool)) or v is None else str(v)
    return out
