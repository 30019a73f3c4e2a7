"""Training-speed measurements of MEDUSA-1 (``python -m benchmarks.training throughput | cache-speedup``).

Nothing here asserts a speed: each command prints a table and a JSON line. Both run the recipe's own
MEDUSA-1 step (frozen backbone forward, chunked head loss forward + backward, gradient clipping, AdamW),
with ``heads.draft_vocab`` applied as ``medusa train`` applies it, on the micro-batches of the recipe's
first epoch (its shuffled order). The variants being compared alternate step by step in one process, so
a load change on a shared machine hits both alike; the ratios are the figures to quote.

``throughput``: per micro-batch, the backbone forward alone, then one full training step split into
backbone forward / heads forward / heads backward / optimizer (clip + AdamW + zero_grad), each timed
between synchronisations. ``ratio`` = training tokens/s over forward-only tokens/s; ``ratio_from_parts``
= forward-only time over (forward-only time + heads forward + backward + optimizer): the same ratio with
the training step's backbone forward (the very same computation) replaced by the forward-only timing,
so that load noise on a shared machine between the two backbone runs does not enter it.

``cache-speedup``: writes the hidden-state cache of the measured steps' examples (``medusa cache-hidden``'s
code, timed apart), then per micro-batch one online training step (backbone + heads) and one step from
the cache (reading the rows from the memory-mapped shards + heads). ``speedup`` = online epoch time over
cached epoch time (``--steps`` limits both, and the cache, to the epoch's first N steps).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from medusa.config import load_recipe
from medusa.data import collate
from medusa.errors import ConfigError
from medusa.modeling.draft_vocab import build_token_map, coverage
from medusa.training import medusa1
from medusa.training import setup as S
from medusa.training.hidden_cache import prepare

PARTS = ("backbone_forward", "heads_forward", "heads_backward", "optimizer")


@dataclass
class Bench:
    """One MEDUSA-1 training setup, as ``medusa train`` builds it (without accelerate)."""

    recipe: Any
    device: torch.device
    data: Any
    model: Any
    trainable: torch.nn.Module
    optimizer: torch.optim.Optimizer
    params: list[torch.nn.Parameter]
    coverage: float | None  # share of the training labels inside the draft vocabulary (None: full)


def build_bench(recipe_path: str, overrides: list[str]) -> Bench:

    recipe = load_recipe(recipe_path, overrides)
    if recipe.method != "medusa1":
        raise ConfigError(f"{recipe_path}: method is {recipe.method}; these measurements are of MEDUSA-1")
    torch.manual_seed(recipe.train.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data = S.load_data(recipe, S.load_tokenizer(recipe))
    model, trainable = medusa1.setup_model(recipe, device)
    cov = None
    if recipe.heads.draft_vocab and not recipe.heads.init_from:  # as loop._draft_vocab does
        token_map = build_token_map(data.train.examples, model.config.vocab_size, recipe.heads.draft_vocab)
        model.use_draft_vocab(token_map)
        labels = torch.tensor([t for ex in data.train.examples for t in ex["labels"]], dtype=torch.long)
        cov = coverage(token_map, labels)
    t = recipe.train
    optimizer = torch.optim.AdamW(S.param_groups(trainable, t.lr, t.weight_decay, 1.0), lr=t.lr)
    params = [p for p in trainable.parameters() if p.requires_grad]
    return Bench(recipe, device, data, model, trainable, optimizer, params, cov)


def epoch_batches(bench: Bench, steps: int) -> list[tuple[list[int], dict[str, torch.Tensor]]]:
    """``(example indices, collated batch)`` of the first ``steps`` micro-batches of epoch 0 (all of the
    epoch when ``steps`` <= 0)."""

    bs, examples = bench.recipe.train.batch_size, bench.data.train.examples
    order = S.epoch_order(len(examples), bench.recipe.train.seed, 0)
    per_epoch = len(examples) // bs
    n = per_epoch if steps <= 0 else min(steps, per_epoch)
    out = []
    for i in range(n):
        idx = order[i * bs:(i + 1) * bs]
        out.append((idx, collate([examples[j] for j in idx], bench.data.pad_token_id)))
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _clock(device: torch.device) -> float:
    _sync(device)
    return time.perf_counter()


def train_step(bench: Bench, batch: dict[str, torch.Tensor], timings: dict[str, float] | None = None) -> None:
    """One MEDUSA-1 optimizer step (``loop._optimizer_step`` without accelerate): hidden states from
    ``batch["hidden"]`` (the cache) or the backbone; adds each part's seconds into ``timings``."""

    dev = bench.device
    batch = {k: v.to(dev) for k, v in batch.items()}
    t0 = _clock(dev)
    if "hidden" in batch:
        hidden = batch["hidden"]  # [B, T, d] read from the cache
    else:
        hidden = medusa1.backbone_hidden(bench.model, batch)  # [B, T, d]
    t1 = _clock(dev)
    loss, _ = bench.trainable(hidden, batch["labels"], batch["input_ids"])
    t2 = _clock(dev)
    loss.backward()
    t3 = _clock(dev)
    if bench.recipe.train.max_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_(bench.params, bench.recipe.train.max_grad_norm)
    bench.optimizer.step()
    bench.optimizer.zero_grad(set_to_none=True)
    t4 = _clock(dev)
    if timings is not None:
        for name, seconds in zip(PARTS, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            timings[name] = timings.get(name, 0.0) + seconds


def _timed(fn: Callable[[], Any], device: torch.device) -> float:
    t0 = _clock(device)
    fn()
    return _clock(device) - t0


def _describe(bench: Bench, batches: list) -> dict[str, Any]:
    r = bench.recipe
    return {"model": str(r.model), "device": str(bench.device), "threads": torch.get_num_threads(),
            "batch_size": r.train.batch_size, "max_length": r.data.max_length, "num_heads": r.heads.num_heads,
            "num_layers": r.heads.num_layers, "head_type": r.heads.head_type,
            "vocab_size": int(bench.model.config.vocab_size), "draft_vocab": int(r.heads.draft_vocab or 0),
            "draft_vocab_coverage": bench.coverage, "steps": len(batches),
            "tokens": sum(int(b["attention_mask"].sum()) for _, b in batches)}


def measure_throughput(args: argparse.Namespace) -> dict[str, Any]:
    """Forward-only vs training tokens/s on the same micro-batches, alternating batch by batch."""

    bench = build_bench(args.recipe, args.overrides)
    batches = epoch_batches(bench, args.steps + args.warmup)
    warm, timed = batches[:args.warmup], batches[args.warmup:]
    dev = bench.device
    for _, b in warm:
        medusa1.backbone_hidden(bench.model, {k: v.to(dev) for k, v in b.items()})
        train_step(bench, b)
    forward, parts = 0.0, {}
    for _, b in timed:
        moved = {k: v.to(dev) for k, v in b.items()}
        forward += _timed(lambda: medusa1.backbone_hidden(bench.model, moved), dev)
        train_step(bench, b, parts)
    train = sum(parts.values())
    result = _describe(bench, timed)
    tokens = result["tokens"]
    extra = train - parts["backbone_forward"]  # heads forward + backward + optimizer
    result.update({"forward_only_s": forward, "train_s": train, "forward_only_tokens_per_s": tokens / forward,
                   "train_tokens_per_s": tokens / train, "ratio": forward / train,
                   "ratio_from_parts": forward / (forward + extra),
                   **{f"{k}_s": v for k, v in parts.items()},
                   **{f"{k}_share": v / train for k, v in parts.items()}})
    return result


def measure_cache_speedup(args: argparse.Namespace) -> dict[str, Any]:
    """Cache writing time, then one epoch online vs one epoch from the cache (alternating step by step).
    The cache holds exactly the measured steps' examples, in step order (the whole epoch by default)."""

    bench = build_bench(args.recipe, args.overrides)
    batches = epoch_batches(bench, args.steps)
    examples = [bench.data.train.examples[i] for idx, _ in batches for i in idx]
    bs = bench.recipe.train.batch_size
    with tempfile.TemporaryDirectory(dir=args.cache_dir) as tmp:
        t0 = time.perf_counter()
        cache = prepare(Path(tmp) / "hidden_cache", bench.model.base_model, examples, bench.data.pad_token_id,
                        bs, dtype=args.cache_dtype, log=lambda _: None)
        write = time.perf_counter() - t0
        assert cache is not None
        size = sum(f.stat().st_size for f in Path(tmp).rglob("*") if f.is_file())
        online, cached, read = {}, {}, 0.0
        b0 = batches[0][1]
        train_step(bench, b0)  # warm-up of both paths (allocator, kernels)
        train_step(bench, {**b0, "hidden": cache.batch(range(bs), b0["input_ids"].shape[1])})
        for k, (_, b) in enumerate(batches):
            train_step(bench, b, online)
            t0 = time.perf_counter()
            hidden = cache.batch(range(k * bs, (k + 1) * bs), b["input_ids"].shape[1])  # [B, T, d]
            read += time.perf_counter() - t0
            train_step(bench, {**b, "hidden": hidden}, cached)
        cache_tokens = int(cache.plan.index["num_tokens"])
    result = _describe(bench, batches)
    on, off = sum(online.values()), sum(cached.values()) + read
    result.update({"steps_per_epoch": len(bench.data.train.examples) // bs, "cache_examples": len(examples),
                   "cache_tokens": cache_tokens, "cache_dtype": args.cache_dtype, "cache_bytes": size,
                   "cache_write_s": write, "online_epoch_s": on, "cached_epoch_s": off, "cache_read_s": read,
                   "speedup": on / off, "online_heads_s": on - online["backbone_forward"],
                   "cache_write_over_online_epoch": write / on})
    return result
