"""Building blocks of a training run shared by MEDUSA-1 and MEDUSA-2: accelerator, data, backbone,
optimizer groups, step plan, schedule and data order. Free functions of the recipe (or of explicit
arguments); what differs between the methods lives in ``medusa1.py`` and ``medusa2.py``.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from medusa.config import DataConfig, Recipe
from medusa.data import TokenizedData, load_tokenized
from medusa.errors import ConfigError
from medusa.modeling.base import fit_max_length, load_base_model, max_positions, native_bf16
from medusa.modeling.base import load_tokenizer as _load_tokenizer
from medusa.modeling.quantization import bnb_config, keep_plain_4bit_layout


# ----------------------------------------------------------------------------------------- accelerator
def backbone_bf16(recipe: Recipe) -> bool:
    """Whether a frozen backbone runs under bf16 autocast: the recipe's resolved ``train.mixed_precision``,
    or where the recipe leaves it to accelerate (null), accelerate's own (its launch config or flag)."""
    value = mixed_precision(recipe) or os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
    return value == "bf16"


def mixed_precision(recipe: Recipe) -> str | None:
    """The recipe's ``train.mixed_precision`` with ``auto`` resolved: ``bf16`` where the training device
    (CUDA when available, else the CPU) computes bfloat16 natively (:func:`native_bf16`: Ampere+, or AVX-512
    BF16 / AMX), else ``no`` (emulated bf16 runs several times slower than float32 on such CPUs)."""
    value = recipe.train.mixed_precision
    if value != "auto":
        return value
    return "bf16" if native_bf16("cuda" if torch.cuda.is_available() else "cpu") else "no"


def _flag(name: str) -> bool:
    return os.environ.get(name, "false").lower() in ("1", "true", "yes")


def _device_backend() -> bool:
    """Whether this machine has an accelerator device (CUDA, XPU, ...) for torch.distributed to use."""
    return torch.cuda.is_available() or (hasattr(torch, "accelerator") and torch.accelerator.is_available())


def check_engine(env: dict[str, str] | None = None, has_device: bool | None = None) -> None:
    """Refuse launches that accelerate would silently run as something else (raised before any process
    group or model exists). accelerate applies FSDP only on a device backend (its ``AcceleratorState`` turns
    FSDP on for MULTI_GPU / XPU / NPU-class runs): without one, an FSDP launch becomes a run of independent,
    never-synchronised copies of the model, and ``--cpu`` makes it plain DDP. accelerate starts several CPU
    processes only through mpirun: ``--cpu`` (or a MULTI_CPU config) with ``--num_processes N`` and no mpirun
    starts one process that believes it is alone (its launcher set ``MASTER_ADDR`` and no rank)."""
    env = os.environ if env is None else env
    has_device = _device_backend() if has_device is None else has_device
    if env.get("ACCELERATE_USE_FSDP", "false").lower() == "true" and not has_device:
        import accelerate

        raise ConfigError(f"FSDP needs a GPU-class device: accelerate {accelerate.__version__} does not "
                          "apply FSDP on a CPU (its processes would train unsynchronised copies); on CPU use "
                          "configs/accelerate/deepspeed_zero3.yaml (sharded) or deepspeed_zero2.yaml")
    ranked = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")
    if (env.get("ACCELERATE_USE_CPU", "false").lower() == "true" and "MASTER_ADDR" in env
            and not any(name in env for name in ranked)):
        raise ConfigError("accelerate launch --cpu (or a MULTI_CPU config) with several processes starts "
                          "only one process here (accelerate starts CPU processes through mpirun only); for "
                          "data parallel on CPU run accelerate launch --config_file configs/accelerate/"
                          "cpu.yaml --num_processes N (or unset MASTER_ADDR for one process)")


def make_accelerator(recipe: Recipe) -> Any:
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs

    check_engine()
    kwargs: dict[str, Any] = {"gradient_accumulation_steps": recipe.train.grad_accum,
                              "project_dir": recipe.output_dir}
    if recipe.train.mixed_precision is not None:
        kwargs["mixed_precision"] = mixed_precision(recipe)
    if recipe.report_to != "none":
        kwargs["log_with"] = recipe.report_to
    if "LOCAL_RANK" in os.environ and not _device_backend() and not _flag("ACCELERATE_USE_CPU"):
        # A torchrun launch (DeepSpeed, or configs/accelerate/cpu.yaml) on a CPU: accelerate leaves the
        # backend unset there and every process then takes itself for the only one (num_processes 1, rank 0).
        if _flag("ACCELERATE_USE_DEEPSPEED"):  # DeepSpeed over gloo
            kwargs["kwargs_handlers"] = [InitProcessGroupKwargs(backend="gloo")]
        else:  # data parallel over gloo (accelerate's MULTI_CPU: the module is wrapped in DDP)
            kwargs["cpu"] = True
    accelerator = Accelerator(**kwargs)
    ds = accelerator.state.deepspeed_plugin
    if ds is not None:  # our data loader is not prepared, so DeepSpeed cannot infer the batch sizes
        t, config = recipe.train, ds.deepspeed_config
        config["train_micro_batch_size_per_gpu"] = t.batch_size
        config["train_batch_size"] = t.batch_size * t.grad_accum * accelerator.num_processes
        if config.get("gradient_clipping") == "auto":
            config["gradient_clipping"] = float(t.max_grad_norm)
    return accelerator


def fill_deepspeed_auto(accelerator: Any, hidden_size: int) -> None:
    """DeepSpeed's ``auto`` bucket sizes, from the base model's hidden size as accelerate computes them for a
    Hugging Face model (our trained module has no ``config`` for accelerate to read them from)."""
    ds = accelerator.state.deepspeed_plugin
    if ds is None:
        return
    zero = ds.deepspeed_config.setdefault("zero_optimization", {})
    for key, value in (("reduce_bucket_size", hidden_size * hidden_size),
                       ("stage3_prefetch_bucket_size", int(0.9 * hidden_size * hidden_size)),
                       ("stage3_param_persistence_threshold", 10 * hidden_size)):
        if zero.get(key) == "auto":
            zero[key] = value


def prepare(accelerator: Any, hidden_size: int, module: nn.Module, optimizer: Any) -> tuple[Any, Any]:
    """``accelerator.prepare(module, optimizer)`` (the training loop prints :func:`engine_report` once a
    resumed state has loaded: a refused checkpoint is the command's one line)."""
    fill_deepspeed_auto(accelerator, hidden_size)
    return accelerator.prepare(module, optimizer)


def _updated_tensors(optimizer: Any) -> list[torch.Tensor]:
    """The fp32 tensors this process's optimizer steps: DeepSpeed ZeRO-2 / ZeRO-3's own partitions, else the
    innermost torch optimizer's parameters (accelerate's wrapper -> DeepSpeed's optimizer -> torch's)."""
    inner = optimizer
    while True:
        for name in ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat"):  # ZeRO-1/2, ZeRO-3
            if isinstance(getattr(inner, name, None), list):
                return list(getattr(inner, name))
        if not hasattr(inner, "optimizer"):
            return [p for group in inner.param_groups for p in group["params"]]
        inner = inner.optimizer


def engine_report(accelerator: Any, module: nn.Module, optimizer: Any) -> str:
    """One line per process: the distributed type (and ZeRO stage), and how many parameter elements this
    process holds and how many its optimizer updates, of the module's total. ZeRO-3 holds a slice of each
    parameter; ZeRO-2 holds every parameter but updates a slice; DDP / one process: everything."""
    kind = str(accelerator.distributed_type).split(".")[-1]
    ds = accelerator.state.deepspeed_plugin
    if ds is not None:
        kind += f" ZeRO-{ds.zero_stage}"
    params = list(module.parameters())
    total = sum(int(getattr(p, "ds_numel", p.numel())) for p in params)
    held = sum(int(p.ds_tensor.numel()) if hasattr(p, "ds_tensor") else p.numel() for p in params)
    updated = sum(p.numel() for p in _updated_tensors(optimizer))
    trainable = sum(int(getattr(p, "ds_numel", p.numel())) for p in params if p.requires_grad)
    return (f"engine: {kind}, {accelerator.num_processes} process(es); rank {accelerator.process_index} "
            f"holds {held:,} of {total:,} parameter elements; its optimizer updates {updated:,} of "
            f"{trainable:,}")


# ----------------------------------------------------------------------------------------- data
@dataclass
class RunData:
    tokenizer: Any
    train: TokenizedData
    eval: TokenizedData | None
    pad_token_id: int


def load_tokenizer(recipe: Recipe) -> Any:
    return _load_tokenizer(recipe.model, error=ConfigError, what="a tokenizer (recipe key model)")


def load_data(recipe: Recipe, tokenizer: Any, log: Callable[[str], None] | None = None) -> RunData:
    """The recipe's tokenized train (and eval) data. ``data.max_length`` past the model's positions is an
    error naming both numbers; the default is cut to them, said by ``log`` (default: print on the launch's
    first process) (:func:`~medusa.modeling.base.fit_max_length`)."""
    d = recipe.data
    max_length, note = fit_max_length("data.max_length", d.max_length, max_positions(recipe.model),
                                      DataConfig.max_length, ConfigError)
    if note and log is not None:
        log(note)
    elif note and os.environ.get("RANK", "0") == "0":
        print(note, flush=True)
    kw = dict(max_length=max_length, format=d.format, chat_template=d.chat_template,
              skip_invalid=d.skip_invalid)
    train = load_tokenized(d.train, tokenizer, **kw)
    evaluation = load_tokenized(d.eval, tokenizer, **kw) if d.eval else None
    if evaluation is None and d.eval_split > 0:
        order = torch.randperm(len(train.examples),
                               generator=torch.Generator().manual_seed(recipe.train.seed))
        n_eval = max(1, int(len(order) * d.eval_split))
        held = set(order[:n_eval].tolist())
        evaluation = TokenizedData([e for i, e in enumerate(train.examples) if i in held], {}, d.train)
        train = TokenizedData([e for i, e in enumerate(train.examples) if i not in held],
                              train.skipped, d.train)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return RunData(tokenizer, train, evaluation, int(pad if pad is not None else 0))


# ----------------------------------------------------------------------------------------- model
@contextlib.contextmanager
def load_whole() -> Iterator[None]:
    """Models built in the body load whole (transformers would otherwise build them under ZeRO-3's
    ``zero.Init``, partitioned)."""
    from transformers.integrations import deepspeed as hf_ds

    ref = hf_ds._hf_deepspeed_config_weak_ref
    hf_ds.unset_hf_deepspeed_config()
    try:
        yield
    finally:
        hf_ds._hf_deepspeed_config_weak_ref = ref


def load_backbone(recipe: Recipe, device: torch.device) -> nn.Module:
    """The base model on ``device``, in ``recipe.dtype`` or quantised with bitsandbytes
    (``recipe.quantization``; 4-bit layers keep the plain NF4 layout on CPU)."""
    if recipe.quantization is None and recipe.method == "medusa1":
        with load_whole():  # MEDUSA-1's frozen backbone stays outside the engine: whole, even under ZeRO-3
            return load_base_model(recipe.model, dtype=recipe.dtype).to(device)
    if recipe.quantization is None:
        return load_base_model(recipe.model, dtype=recipe.dtype).to(device)
    index = device.index if device.type == "cuda" else device.type
    base = load_base_model(recipe.model, dtype=recipe.dtype, device_map={"": index},
                           quantization_config=bnb_config(recipe.quantization, compute_dtype=recipe.dtype))
    keep_plain_4bit_layout(base)
    return base


# ----------------------------------------------------------------------------------------- optimizer
def _norm_param_ids(model: nn.Module) -> set[int]:
    ids = set()
    for module in model.modules():
        name = type(module).__name__.lower()
        if isinstance(module, (nn.LayerNorm, nn.GroupNorm)) or "norm" in name:
            ids.update(id(p) for p in module.parameters(recurse=False))
    return ids


def param_groups(
    model: nn.Module,
    lr: float,
    weight_decay: float = 0.0,
    lr_multiplier: float = 4.0,
    heads: nn.Module | None = None,
) -> list[dict[str, Any]]:
    """AdamW parameter groups of every trainable parameter of ``model``: ``backbone_decay``,
    ``backbone_no_decay`` at ``lr`` and ``heads_decay``, ``heads_no_decay`` at ``lr * lr_multiplier``.

    ``heads`` (default ``model.heads``): every one of its parameters (weights and biases) is in a heads
    group. Biases, norm weights and other 1-D parameters get no weight decay. Empty groups are left out;
    each group carries a ``name``. MEDUSA-1 (heads only) uses ``lr_multiplier=1``.
    """
    norm_ids = _norm_param_ids(model)
    head_ids = {id(p) for p in (model.heads if heads is None else heads).parameters()}
    buckets: dict[str, list[nn.Parameter]] = {"backbone_decay": [], "backbone_no_decay": [],
                                              "heads_decay": [], "heads_no_decay": []}
    seen: set[int] = set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        part = "heads" if id(p) in head_ids else "backbone"
        dims = len(getattr(p, "ds_shape", p.shape))  # a ZeRO-3 partition is 1-D: its full shape counts
        no_decay = dims < 2 or id(p) in norm_ids or name.endswith("bias")
        buckets[f"{part}_{'no_decay' if no_decay else 'decay'}"].append(p)
    return [{"name": name, "params": params, "lr": lr * lr_multiplier if name.startswith("heads") else lr,
             "weight_decay": 0.0 if name.endswith("no_decay") else weight_decay}
            for name, params in buckets.items() if params]


# ----------------------------------------------------------------------------------------- schedule
@dataclass
class Plan:
    """How many steps: optimizer steps per epoch, total, warmup, and the global micro-batch size."""

    steps_per_epoch: int
    total_steps: int
    warmup_steps: int
    world: int
    micro_batch: int
    grad_accum: int


def make_plan(recipe: Recipe, num_examples: int, world: int) -> Plan:
    t = recipe.train
    micro_batches = num_examples // (t.batch_size * world)
    steps_per_epoch = micro_batches // t.grad_accum
    if steps_per_epoch < 1:
        raise ConfigError(f"train.batch_size: {num_examples} examples do not fill one step of batch_size "
                          f"{t.batch_size} x {world} process(es) x grad_accum {t.grad_accum}")
    total = t.max_steps if t.max_steps > 0 else max(1, math.ceil(t.epochs * steps_per_epoch))
    return Plan(steps_per_epoch, total, int(t.warmup_ratio * total), world, t.batch_size, t.grad_accum)


def lr_factor(step: int, *, kind: str, warmup: int, total: int) -> float:
    """The learning-rate multiplier at optimizer step ``step``: a linear warm-up over ``warmup`` steps, then
    ``constant``, ``linear`` decay to 0 at ``total``, or a half ``cosine`` to 0 at ``total`` -- the formulas
    of transformers' ``constant_with_warmup`` / ``linear`` / ``cosine`` schedules (whose module is not
    imported: it imports peft, which imports bitsandbytes, which warns on CPUs without its optional
    kernels)."""
    if step < warmup:
        return step / max(1, warmup)
    if kind == "constant":
        return 1.0
    if kind == "linear":
        return max(0.0, (total - step) / max(1, total - warmup))
    progress = (step - warmup) / max(1, total - warmup)
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))


def make_scheduler(optimizer: torch.optim.Optimizer, recipe: Recipe, plan: Plan) -> Any:
    """A ``LambdaLR`` over :func:`lr_factor` (a ``functools.partial``: its state is plain data, as before)."""
    factor = functools.partial(lr_factor, kind=recipe.train.scheduler, warmup=plan.warmup_steps,
                               total=plan.total_steps)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def training_order(examples: Sequence[dict[str, Sequence[int]]], recipe: Recipe, plan: Plan,
                   epoch: int) -> list[int]:
    """Epoch ``epoch``'s example order (:func:`epoch_order`): with ``data.group_by_length``, grouped by
    each example's token count in blocks of one global batch (processes x micro-batch x grad_accum)."""
    lengths = [len(e["input_ids"]) for e in examples] if recipe.data.group_by_length else None
    return epoch_order(len(examples), recipe.train.seed, epoch, lengths,
                       plan.micro_batch * plan.world * plan.grad_accum)


GROUP_BLOCKS = 64  # data.group_by_length: global micro-batches per length-sorted mega-batch


def epoch_order(num_examples: int, seed: int, epoch: int, lengths: Sequence[int] | None = None,
                block: int = 1) -> list[int]:
    """The shuffled example order of one epoch (the same on every process).

    ``lengths`` (``data.group_by_length``): the shuffled order is cut into mega-batches of ``GROUP_BLOCKS``
    global batches of ``block`` rows (processes x micro-batch x grad_accum: the same blocks whatever the
    process count, so a resume at another count keeps the order), each sorted longest first, so that a
    micro-batch holds rows of like length (less padding); the full blocks are then shuffled, so the length of
    a step's rows does not follow the schedule. A short last block stays last."""
    generator = torch.Generator().manual_seed(seed * 1000 + epoch)
    order = torch.randperm(num_examples, generator=generator).tolist()
    if lengths is None:
        return order
    if len(lengths) != num_examples or block < 1:
        raise ValueError(f"epoch_order: {len(lengths)} lengths for {num_examples} examples, block {block}")
    mega = block * GROUP_BLOCKS
    grouped = [i for at in range(0, num_examples, mega)
               for i in sorted(order[at:at + mega], key=lambda i: -lengths[i])]
    full = num_examples // block
    blocks = [grouped[b * block:(b + 1) * block] for b in torch.randperm(full, generator=generator).tolist()]
    return [i for rows in blocks for i in rows] + grouped[full * block:]


def micro_batch_indices(order: list[int], micro: int, rank: int, plan: Plan) -> list[int]:
    """Example indices of this process's part of global micro-batch ``micro`` of the epoch."""
    start = (micro * plan.world + rank) * plan.micro_batch
    return order[start:start + plan.micro_batch]

