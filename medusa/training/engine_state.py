"""The trained module and its optimizer in a training checkpoint, the same whatever engine ran them.

One process, DDP and DeepSpeed ZeRO-1/2/3 write the same files, and each of them reads what any other wrote,
at any number of processes (the optimizer state is gathered to one full tensor per parameter):

- ``model.safetensors``: the trained module's state (``module.state_dict()`` names), trained parameters as
  their float32 master values (ZeRO: gathered from the partitions);
- ``optimizer.safetensors``: ``exp_avg/<name>`` and ``exp_avg_sq/<name>`` (AdamW's moments) per trained
  parameter, full shape, float32;
- ``optimizer.json``: the format, the engine and world size that wrote it, each parameter group's scalar
  settings (``lr``, ``initial_lr``, ``betas``, ...: the learning rate the scheduler set last), and AdamW's
  step count per parameter; ``scaler.json``: the fp16 gradient scaler's state, when there is one.

Nothing here is a pickle. Loading checks the names and shapes against the running module (one
:class:`~medusa.errors.CheckpointError` naming the first difference) and writes the values into whatever
holds them: the parameters themselves (one process, DDP), or the ZeRO partitions through DeepSpeed's
``safe_set_full_fp32_param`` / ``safe_set_full_optimizer_state`` (the bit16 copies too). Frozen parameters
and buffers are written for readers of the file (e.g. a drafter read back as heads) but not loaded: the run
rebuilt them from the base model and the recipe. FSDP is not supported (accelerate runs it on GPU-class
devices only, and this format has not been written for its DTensor shards there): :func:`check_supported`
refuses it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from medusa.errors import CheckpointError, ConfigError

WEIGHTS_NAME = "model.safetensors"
OPTIMIZER_TENSORS = "optimizer.safetensors"
OPTIMIZER_JSON = "optimizer.json"
SCALER_JSON = "scaler.json"
FORMAT = "medusa-optimizer"
MOMENTS = ("exp_avg", "exp_avg_sq")  # AdamW's per-parameter state besides its step count
_GROUP_KEYS_SKIPPED = ("params",)
Tensors = dict[str, torch.Tensor]
Named = list[tuple[str, nn.Parameter]]


def _cpu(t: torch.Tensor) -> torch.Tensor:
    """A detached CPU copy (floating point as float32)."""
    t = t.detach()
    return (t.float() if t.is_floating_point() else t).cpu().clone()


def engine_name(accelerator: Any) -> str:
    """``NO`` / ``MULTI_CPU`` / ``MULTI_GPU`` / ``DEEPSPEED ZeRO-<stage>`` / ``FSDP`` ..."""
    kind = str(accelerator.distributed_type).split(".")[-1]
    ds = accelerator.state.deepspeed_plugin
    return f"{kind} ZeRO-{ds.zero_stage}" if ds is not None else kind


def check_supported(accelerator: Any) -> None:
    """Refuse engines whose state this format cannot carry (FSDP), before training starts."""
    if engine_name(accelerator) == "FSDP":
        raise ConfigError("train.save_steps / train.resume: medusa's resumable checkpoints do not support "
                          "FSDP yet (untested on GPU-class devices); set train.save_steps=0, or train with "
                          "configs/accelerate/deepspeed_zero3.yaml (sharded; it resumes anywhere)")


# ----------------------------------------------------------------------------------------- engine access
def _chain(optimizer: Any) -> Iterator[Any]:
    """accelerate's wrapper, then DeepSpeed's optimizer (ZeRO), then the torch optimizer (innermost)."""
    while True:
        yield optimizer
        if not hasattr(optimizer, "optimizer"):
            return
        optimizer = optimizer.optimizer


def _torch_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    return list(_chain(optimizer))[-1]


def _zero_optimizer(optimizer: Any) -> Any | None:
    """DeepSpeed's ZeRO optimizer (the one holding fp32 partitions), or None."""
    for item in _chain(optimizer):
        if hasattr(item, "single_partition_of_fp32_groups") or hasattr(item, "fp32_partitioned_groups_flat"):
            return item
    return None


def _trained(accelerator: Any, module: nn.Module) -> Named:
    """The unwrapped module's trained parameters, by ``state_dict`` name (every process, the same order)."""
    return [(n, p) for n, p in accelerator.unwrap_model(module).named_parameters() if p.requires_grad]


def _steps(torch_opt: torch.optim.Optimizer, trained: Named, zero: bool) -> dict[str, int]:
    """AdamW's step count per trained parameter (ZeRO: its partitions' common count)."""
    if zero:
        counts = {int(s["step"]) for s in torch_opt.state.values() if "step" in s}
        if len(counts) > 1:
            raise CheckpointError(f"optimizer step counts differ between ZeRO partitions ({sorted(counts)})")
        return {name: count for count in counts for name, _ in trained}  # no state yet: {}
    return {name: int(torch_opt.state[p]["step"]) for name, p in trained
            if "step" in torch_opt.state.get(p, {})}


def _link_states(zero: Any) -> None:
    """ZeRO-1/2: point every parameter's optimizer-state views at the partitions' current AdamW state.
    DeepSpeed links them once, after its first group's first step, when the other groups have no state yet
    (their parameters' views stay empty: ``safe_get_full_optimizer_state`` would fail)."""
    if hasattr(zero, "_lazy_init_hp_params_optimizer_state"):
        zero._hp_optimizer_states_linked = False
        zero._lazy_init_hp_params_optimizer_state()


def _same_kind(want: Any, got: Any) -> bool:
    """``got`` (from JSON) can stand for the optimizer's ``want``: a finite number for a number, a bool for a
    bool, a list as long for a tuple / list, the same for a string or None."""
    if isinstance(want, bool) or isinstance(got, bool):
        return isinstance(want, bool) and isinstance(got, bool)
    if isinstance(want, (int, float)):
        return isinstance(got, (int, float)) and math.isfinite(got)
    if isinstance(want, (list, tuple)):
        return isinstance(got, list) and len(got) == len(want) and all(map(_same_kind, want, got))
    return type(want) is type(got)


# a resumed optimizer group's values: (low, high) inclusive for numbers; a bool must equal this run's own
GROUP_BOUNDS = {"lr": (0.0, 10.0), "initial_lr": (0.0, 10.0), "weight_decay": (0.0, 10.0),
                "eps": (1e-30, 1.0), "betas": (0.0, 0.999999), "momentum": (0.0, 1.0),
                "dampening": (0.0, 1.0)}


def group_value_error(key: str, want: Any, got: Any) -> str | None:
    """Why ``got`` (a saved group's ``key``) cannot replace this run's ``want``; None when it can."""
    if not _same_kind(want, got):
        return f"does not fit this run's optimizer ({want!r:.60})"
    if isinstance(want, bool) and got != want:  # amsgrad, nesterov, ...: state this run does not build
        return f"differs from this run's optimizer ({want!r})"
    bounds = GROUP_BOUNDS.get(key)
    values = got if isinstance(got, list) else [got]
    if bounds and not all(bounds[0] <= v <= bounds[1] for v in values):
        return f"lies outside [{bounds[0]}, {bounds[1]}]"
    return None


def _plain(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    return value is None or isinstance(value, (bool, int, float, str))


# ----------------------------------------------------------------------------------------- save
def _gathered_state(accelerator: Any, module: nn.Module, optimizer: Any,
                    zero: bool) -> tuple[Tensors, Tensors]:
    """(module state, optimizer moments), full tensors on the CPU; every process must call this (ZeRO
    gathers collectively); the tensors are meaningful on the main process."""
    from medusa.training.medusa2 import gathered

    unwrapped = accelerator.unwrap_model(module)
    trained = dict(_trained(accelerator, module))
    torch_opt = _torch_optimizer(optimizer)
    weights: Tensors = {}
    moments: Tensors = {}
    if zero:
        from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

        _link_states(_zero_optimizer(optimizer))
    for name, p in unwrapped.named_parameters(remove_duplicate=False):
        if name in trained and zero:
            weights[name] = _cpu(safe_get_full_fp32_param(p))
            for key in MOMENTS:
                moments[f"{key}/{name}"] = _cpu(safe_get_full_optimizer_state(p, key))
            continue
        with gathered([p]):  # frozen ZeRO-3 parameters: gathered one at a time
            weights[name] = _cpu(p)
        state = torch_opt.state.get(p, {}) if name in trained else {}
        moments.update({f"{key}/{name}": _cpu(state[key]) for key in MOMENTS if key in state})
    for name, t in unwrapped.state_dict().items():  # buffers (not partitioned)
        weights.setdefault(name, t.detach().cpu().clone())
    return weights, moments


def save_engine_state(accelerator: Any, module: nn.Module, optimizer: Any, folder: Path) -> None:
    """Write the module, optimizer and fp16 scaler state into ``folder`` (every process calls this; the main
    process writes)."""
    from medusa.io import save_safetensors

    zero = _zero_optimizer(optimizer) is not None
    weights, moments = _gathered_state(accelerator, module, optimizer, zero)
    torch_opt = _torch_optimizer(optimizer)
    steps = _steps(torch_opt, _trained(accelerator, module), zero)
    if not accelerator.is_main_process:
        return
    groups = [{k: v for k, v in g.items() if k not in _GROUP_KEYS_SKIPPED and _plain(v)}
              for g in torch_opt.param_groups]
    save_safetensors(weights, folder / WEIGHTS_NAME, metadata={"format": "pt"})
    save_safetensors(moments, folder / OPTIMIZER_TENSORS, metadata={"format": "pt"})
    meta = {"format": FORMAT, "version": 1, "engine": engine_name(accelerator),
            "world_size": accelerator.num_processes, "param_groups": groups, "step": steps}
    (folder / OPTIMIZER_JSON).write_text(json.dumps(meta, indent=2) + "\n")
    if getattr(accelerator, "scaler", None) is not None:
        (folder / SCALER_JSON).write_text(json.dumps(accelerator.scaler.state_dict()) + "\n")


# ----------------------------------------------------------------------------------------- load
def _read(folder: Path) -> tuple[Tensors, Tensors, dict[str, Any]]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        meta = json.loads((folder / OPTIMIZER_JSON).read_text())
        weights = load_file(str(folder / WEIGHTS_NAME))
        moments = load_file(str(folder / OPTIMIZER_TENSORS))
    except (OSError, ValueError, RecursionError, SafetensorError) as exc:  # missing, bad / deep JSON, not
        # safetensors (a pickle under the name is never unpickled: safetensors reads its header only)
        raise CheckpointError(f"train.resume: {folder}: unreadable trained state ({exc}); medusa resumes "
                              f"from the {WEIGHTS_NAME} + {OPTIMIZER_TENSORS} + {OPTIMIZER_JSON} it "
                              "writes") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("version") != 1:
        raise CheckpointError(f"train.resume: {folder / OPTIMIZER_JSON}: not a {FORMAT} version 1 file")
    return weights, moments, meta


def _check_names(folder: Path, weights: Tensors, moments: Tensors,
                 meta: dict[str, Any], expected: dict[str, torch.Size], trained: list[str]) -> None:
    """Every trained parameter present with its shape; its moments and step too, unless it has neither (the
    optimizer never updated it: no gradient yet)."""
    missing = sorted(set(expected) - set(weights))
    extra = sorted(set(weights) - set(expected))
    if missing or extra:
        raise CheckpointError(f"train.resume: {folder / WEIGHTS_NAME}: tensors missing {missing[:3]} / "
                              f"unexpected {extra[:3]} for this run's model")
    steps = meta.get("step") if isinstance(meta.get("step"), dict) else {}
    for name in trained:
        stateless = name not in steps and not any(f"{m}/{name}" in moments for m in MOMENTS)
        for key in (name,) if stateless else (name, *(f"{m}/{name}" for m in MOMENTS)):
            have = (weights if key == name else moments).get(key)
            if have is None or have.shape != expected[name]:
                shape = None if have is None else tuple(have.shape)
                raise CheckpointError(f"train.resume: {folder}: {key} has shape {shape}, this run's "
                                      f"{name} {tuple(expected[name])}")
        step = steps.get(name)
        if not stateless and (not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= 10**9):
            raise CheckpointError(f"train.resume: {folder / OPTIMIZER_JSON}: step of {name} is {step!r:.60}")


def _load_groups(folder: Path, torch_opt: torch.optim.Optimizer, saved: Any) -> None:
    """The groups' scalar settings (the scheduler's last learning rate among them)."""
    groups = torch_opt.param_groups
    if not isinstance(saved, list) or len(saved) != len(groups):
        have = len(saved) if isinstance(saved, list) else saved
        raise CheckpointError(f"train.resume: {folder / OPTIMIZER_JSON}: {have!r} parameter groups, this "
                              f"run's optimizer has {len(groups)}")
    for group, old in zip(groups, saved):
        if not isinstance(old, dict) or old.get("name") != group.get("name"):
            raise CheckpointError(f"train.resume: {folder / OPTIMIZER_JSON}: parameter group {old!r:.80} is "
                                  f"not this run's {group.get('name')!r}")
        for key, value in old.items():
            if key not in group or not _plain(group[key]):
                continue
            why = group_value_error(key, group[key], value)
            if why is not None:
                raise CheckpointError(f"train.resume: {folder / OPTIMIZER_JSON}: {key} = {value!r:.60} {why}")
            group[key] = tuple(value) if isinstance(group[key], tuple) else value


def _load_plain(torch_opt: torch.optim.Optimizer, trained: Named, weights: Tensors, moments: Tensors,
                steps: dict[str, int]) -> None:
    with torch.no_grad():
        for name, p in trained:
            p.copy_(weights[name].to(p.dtype))
            torch_opt.state.pop(p, None)
            if name in steps:  # else: never updated, no state yet
                torch_opt.state[p] = {"step": torch.tensor(float(steps[name])),
                                      **{m: moments[f"{m}/{name}"].to(p.device, torch.float32).clone()
                                         for m in MOMENTS}}


def _load_zero(zero: Any, torch_opt: torch.optim.Optimizer, trained: Named, weights: Tensors,
               moments: Tensors, steps: dict[str, int]) -> None:
    """Into ZeRO partitions: AdamW's state made where the optimizer has not stepped yet, the step count set,
    then the full tensors written through DeepSpeed (each process keeps its own slice)."""
    from deepspeed.utils import safe_set_full_fp32_param, safe_set_full_optimizer_state

    from medusa.training.medusa2 import gathered

    counts = set(steps.values())
    if len(counts) > 1:
        raise CheckpointError(f"train.resume: parameters at different optimizer step counts "
                              f"{sorted(counts)[:4]} cannot be loaded into DeepSpeed ZeRO (one count per "
                              "partition); resume without DeepSpeed")
    step = torch.tensor(float(counts.pop() if counts else 0))
    flats = getattr(zero, "single_partition_of_fp32_groups", None) or zero.fp32_partitioned_groups_flat
    for flat in flats:  # [partition] fp32: ZeRO-1/2 one per group, ZeRO-3 one per sub-group
        state = torch_opt.state[flat]
        for m in MOMENTS:
            state.setdefault(m, torch.zeros_like(flat))
        state["step"] = step.clone()
    _link_states(zero)
    with torch.no_grad():
        for name, p in trained:
            with gathered([p], modifier_rank=0):  # the bit16 copy (ZeRO-3: gathered, then re-partitioned)
                p.copy_(weights[name].to(p.dtype))
            safe_set_full_fp32_param(p, weights[name].to(torch.float32))
            for m in MOMENTS:  # never updated: zero moments, as DeepSpeed keeps them for a gradient-less one
                value = moments.get(f"{m}/{name}", torch.zeros(weights[name].shape))
                safe_set_full_optimizer_state(p, value.to(torch.float32), m)


def load_engine_state(accelerator: Any, module: nn.Module, optimizer: Any, folder: Path) -> dict[str, Any]:
    """Load :func:`save_engine_state`'s files into the running engine (every process calls this); returns
    ``optimizer.json`` (the engine and world size that wrote it)."""
    weights, moments, meta = _read(folder)
    unwrapped = accelerator.unwrap_model(module)
    trained = _trained(accelerator, module)
    expected = {n: torch.Size(getattr(p, "ds_shape", p.shape)) for n, p in unwrapped.named_parameters(
        remove_duplicate=False)}
    expected.update({n: t.shape for n, t in unwrapped.state_dict().items() if n not in expected})
    _check_names(folder, weights, moments, meta, expected, [n for n, _ in trained])
    torch_opt = _torch_optimizer(optimizer)
    _load_groups(folder, torch_opt, meta.get("param_groups"))
    zero = _zero_optimizer(optimizer)
    saved = meta["step"] if isinstance(meta.get("step"), dict) else {}
    steps = {n: saved[n] for n, _ in trained if n in saved}
    if zero is None:
        _load_plain(torch_opt, trained, weights, moments, steps)
    else:
        _load_zero(zero, torch_opt, trained, weights, moments, steps)
    scaler = getattr(accelerator, "scaler", None)
    if scaler is not None and (folder / SCALER_JSON).is_file():
        scaler.load_state_dict(json.loads((folder / SCALER_JSON).read_text()))
    return meta
