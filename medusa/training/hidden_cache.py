"""Offline hidden-state cache for MEDUSA-1 (``train.hidden_cache: DIR``): the frozen backbone runs once.

One pass of the backbone over the training examples writes their last hidden states (post final norm)
into memory-mapped shards; training epochs then read the rows of each micro-batch from the shards and
never run the backbone. A directory holds:

- ``cache.json``: format, version, the base model's fingerprint, the examples' fingerprint, dtype,
  hidden size and the shard plan (which examples each shard holds);
- per shard ``i``: ``shard-{i:05d}.hidden`` (raw ``[T_i, d]`` rows, bf16 by default, read with
  ``numpy.memmap``), ``shard-{i:05d}.tokens.npy`` (int32 ``[2, T_i]``: token ids and labels) and, written
  last, ``shard-{i:05d}.json`` (its examples' token offsets) — a shard without its json is unfinished.

Resumable: each shard's files are written under temporary names and renamed into place, so a killed
build leaves whole shards, and the next build computes only the missing ones. Several processes
(``accelerate launch``) build shards ``rank, rank + world, ...`` and each reads its own micro-batches.
A cache made from another base model, or for other examples, is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from medusa.config.enums import DRAFTER_HEAD_TYPES
from medusa.data import collate
from medusa.errors import ConfigError, MedusaError
from medusa.io import read_json
from medusa.modeling.base import decoder_of, text_config
from medusa.modeling.eagle3 import default_feature_layers
from medusa.modeling.packaged import weights_fingerprint
from medusa.training import setup as S
from medusa.training.cache_files import check_index_values, existing_dtype, read_shard

FORMAT = "medusa-hidden-cache"
VERSION = 1
INDEX = "cache.json"
DTYPES = {"bfloat16": (torch.bfloat16, np.uint16), "float32": (torch.float32, np.float32)}
SHARD_BYTES = 1 << 30  # about 1 GiB of hidden states per shard

HiddenFn = Callable[[dict[str, torch.Tensor]], torch.Tensor]  # batch -> last hidden state [B, T, d]


def base_fingerprint(model: torch.nn.Module) -> dict[str, Any]:
    """Identifies a backbone's weights cheaply: config fields plus :func:`weights_fingerprint`."""
    cfg = getattr(model, "config", None)
    return {"name_or_path": str(getattr(model, "name_or_path", "") or getattr(cfg, "_name_or_path", "")),
            "model_type": getattr(cfg, "model_type", None), "hidden_size": getattr(cfg, "hidden_size", None),
            "weights": weights_fingerprint(model)}


def data_fingerprint(examples: Sequence[dict[str, Sequence[int]]]) -> str:
    digest = hashlib.sha256()
    for ex in examples:
        digest.update(np.asarray(ex["input_ids"], dtype=np.int64).tobytes() + b"|")
        digest.update(np.asarray(ex["labels"], dtype=np.int64).tobytes() + b";")
    return digest.hexdigest()[:32]


def plan_shards(lengths: Sequence[int], tokens_per_shard: int) -> list[tuple[int, int]]:
    """Consecutive example ranges ``[start, end)`` holding about ``tokens_per_shard`` tokens each."""
    shards, start, tokens = [], 0, 0
    for i, n in enumerate(lengths):
        if tokens and tokens + n > tokens_per_shard:
            shards.append((start, i))
            start, tokens = i, 0
        tokens += n
    if start < len(lengths):
        shards.append((start, len(lengths)))
    return shards


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor as numpy: bf16 as its raw 16-bit patterns (uint16), float32 as is."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def _name(i: int, suffix: str) -> str:
    return f"shard-{i:05d}.{suffix}"


@dataclass
class CachePlan:
    directory: Path
    index: dict[str, Any]

    @property
    def shards(self) -> list[tuple[int, int]]:
        return [tuple(s) for s in self.index["shards"]]

    def done(self, i: int) -> bool:
        return (self.directory / _name(i, "json")).is_file()


def check_cache_dir(directory: str | Path) -> None:
    """``train.hidden_cache`` must be a new or empty directory, or a cache (its index) to resume."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise MedusaError(f"train.hidden_cache: {directory} exists and is not a directory")
    if directory.is_dir() and not (directory / INDEX).is_file() and any(directory.iterdir()):
        raise MedusaError(f"train.hidden_cache: {directory} is not empty and holds no hidden-state cache "
                          f"({INDEX}); use a new or empty directory")


def open_plan(directory: str | Path, examples: Sequence[dict], base: dict[str, Any], hidden_size: int,
              dtype: str = "bfloat16", shard_bytes: int = SHARD_BYTES) -> CachePlan:
    """The cache's index: read (and checked against this base and these examples) or created."""
    if dtype not in DTYPES:
        raise MedusaError(f"hidden cache dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    directory = Path(directory)
    path = directory / INDEX
    data = data_fingerprint(examples)
    check_cache_dir(directory)
    if path.is_file():
        index = read_json(path, MedusaError)
        check_index_values(index, path, DTYPES)
        check_index(index, path, base, data)
        return CachePlan(directory, index)
    itemsize = np.dtype(DTYPES[dtype][1]).itemsize
    shards = plan_shards([len(e["input_ids"]) for e in examples],
                         max(1, shard_bytes // (hidden_size * itemsize)))
    index = {"format": FORMAT, "version": VERSION, "base": base, "data": data, "dtype": dtype,
             "hidden_size": hidden_size, "num_examples": len(examples),
             "num_tokens": int(sum(len(e["input_ids"]) for e in examples)), "shards": shards}
    directory.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(index, indent=1) + "\n")
    os.replace(tmp, path)
    return CachePlan(directory, index)


def check_index(index: dict[str, Any], path: Path, base: dict[str, Any], data: str) -> None:
    """Refuse a cache of another format, another base model or other examples."""
    if index.get("format") != FORMAT or index.get("version") != VERSION:
        raise MedusaError(f"train.hidden_cache: {path} is not a version-{VERSION} {FORMAT} index")
    if index.get("base") != base:
        theirs = index.get("base", {})
        raise MedusaError(f"train.hidden_cache: {path.parent} was made from another base model "
                          f"({theirs.get('name_or_path')!r}, weights {theirs.get('weights')}) than this one "
                          f"({base.get('name_or_path')!r}, weights {base.get('weights')}); use "
                          f"another directory")
    if index.get("data") != data:
        raise MedusaError(f"train.hidden_cache: {path.parent} holds other training examples (data, "
                          f"max_length or "
                          "eval split changed); use another directory")


def estimate_bytes(plan: CachePlan) -> tuple[int, int]:
    """``(total bytes of the cache, bytes still to write)``."""
    idx = plan.index
    itemsize = np.dtype(DTYPES[idx["dtype"]][1]).itemsize
    row = idx["hidden_size"] * itemsize + 2 * 4  # a hidden row + its token id and label (int32)
    total = idx["num_tokens"] * row
    done = sum((plan.directory / _name(i, "hidden")).stat().st_size // (idx["hidden_size"] * itemsize) * row
               for i in range(len(plan.shards)) if plan.done(i))
    return total, total - done


def check_disk(plan: CachePlan, needed: int) -> None:
    free = shutil.disk_usage(plan.directory).free
    if needed > free:
        raise MedusaError(f"train.hidden_cache: {plan.directory} needs {needed / 2**30:.2f} GiB more "
                          f"but its disk has only {free / 2**30:.2f} GiB free; free space or point "
                          f"train.hidden_cache elsewhere")


TOKENS_PER_FORWARD = 8192  # rows of similar length are batched up to about this many (padded) tokens


def length_batches(lengths: Sequence[int], max_rows: int, max_tokens: int = TOKENS_PER_FORWARD
                   ) -> list[list[int]]:
    """Indices into ``lengths`` grouped longest first into batches of at most ``max_tokens`` padded tokens
    (and ``max_rows`` rows; a row longer than the budget goes alone): little padding, large matmuls."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    for i in order:
        if batches and len(batches[-1]) < max_rows and lengths[batches[-1][0]] * (len(batches[-1]) + 1) <= \
                max_tokens:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def write_shard(plan: CachePlan, i: int, examples: Sequence[dict], hidden_fn: HiddenFn, collate: Callable,
                batch_size: int, on_tokens: Callable[[int], None] | None = None) -> None:
    """Compute and write shard ``i`` (its examples' hidden rows, ids, labels), atomically per file.
    Examples run in length-sorted batches (:func:`length_batches`); ``on_tokens(n)`` reports progress."""
    idx = plan.index
    torch_dtype, np_dtype = DTYPES[idx["dtype"]]
    start, end = plan.shards[i]
    rows = examples[start:end]
    lengths = [len(e["input_ids"]) for e in rows]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64).tolist()
    d = idx["hidden_size"]
    tmp_hidden = plan.directory / (_name(i, "hidden") + ".tmp")
    out = np.memmap(tmp_hidden, dtype=np_dtype, mode="w+", shape=(int(offsets[-1]), d))  # [T_i, d]
    for group in length_batches(lengths, max(batch_size, 1) * 64):
        hidden = hidden_fn(collate([rows[j] for j in group])).to(device="cpu", dtype=torch_dtype)  # [B, T, d]
        for r, j in enumerate(group):
            out[offsets[j]:offsets[j + 1]] = _to_numpy(hidden[r, :lengths[j]].contiguous())  # [n, d]
        if on_tokens is not None:
            on_tokens(sum(lengths[j] for j in group))
    out.flush()
    del out
    tokens = np.stack([np.concatenate([np.asarray(e[key], dtype=np.int32) for e in rows]) if rows else
                       np.zeros(0, np.int32) for key in ("input_ids", "labels")])  # [2, T_i]
    with open(plan.directory / (_name(i, "tokens.npy") + ".tmp"), "wb") as fh:
        np.save(fh, tokens)
    os.replace(tmp_hidden, plan.directory / _name(i, "hidden"))
    os.replace(plan.directory / (_name(i, "tokens.npy") + ".tmp"), plan.directory / _name(i, "tokens.npy"))
    meta = plan.directory / (_name(i, "json") + ".tmp")
    meta.write_text(json.dumps({"examples": [start, end], "offsets": offsets}) + "\n")
    os.replace(meta, plan.directory / _name(i, "json"))  # last: the shard is finished


def build(plan: CachePlan, examples: Sequence[dict], hidden_fn: HiddenFn, collate: Callable, batch_size: int,
          rank: int = 0, world: int = 1, log: Callable[[str], None] = print,
          max_shards: int | None = None, progress: bool = True) -> int:
    """Write this process's missing shards (``rank, rank + world, ...``); returns how many were written.
    ``max_shards`` stops after that many (what a kill does, for tests). ``progress``: a bar of tokens with
    tokens/s and an ETA (the main process)."""
    from tqdm.auto import tqdm

    total, todo = estimate_bytes(plan)
    if rank == 0:
        log(f"hidden cache {plan.directory}: {plan.index['num_tokens']:,} tokens x "
            f"{plan.index['hidden_size']} ({plan.index['dtype']}) = {total / 2**30:.2f} GiB in "
            f"{len(plan.shards)} shard(s); {todo / 2**30:.2f} GiB to write")
    check_disk(plan, todo)
    mine = [i for i in range(rank, len(plan.shards), world) if not plan.done(i)]
    if max_shards is not None:
        mine = mine[:max_shards]
    remaining = sum(len(examples[j]["input_ids"]) for i in mine for j in range(*plan.shards[i]))
    bar = tqdm(total=remaining, unit="tok", unit_scale=True, desc="hidden cache", dynamic_ncols=True,
               disable=not progress or rank != 0 or not mine)
    try:
        for i in mine:
            write_shard(plan, i, examples, hidden_fn, collate, batch_size, on_tokens=bar.update)
    finally:
        bar.close()
    return len(mine)


class HiddenCache:
    """Read side: ``cache.batch(indices, width) -> hidden [B, width, d]`` (zeros past each example's end)
    from the memory-mapped shards, plus each example's cached ids / labels for checking."""

    def __init__(self, plan: CachePlan) -> None:
        missing = [i for i in range(len(plan.shards)) if not plan.done(i)]
        if missing:
            raise MedusaError(f"train.hidden_cache: {plan.directory} is unfinished (shard "
                              f"{missing[0]} missing)")
        self.plan = plan
        self.dtype, np_dtype = DTYPES[plan.index["dtype"]]
        d = plan.index["hidden_size"]
        self.where: list[tuple[int, int, int]] = []  # example -> (shard, start row, length)
        self.hidden, self.tokens = [], []
        for i, shard in enumerate(plan.shards):
            names = {suffix: _name(i, suffix) for suffix in ("json", "hidden", "tokens.npy")}
            offs, hidden, tokens = read_shard(plan.directory, i, names, shard, d, np_dtype)
            self.hidden.append(hidden)
            self.tokens.append(tokens)
            self.where += [(i, offs[j], offs[j + 1] - offs[j]) for j in range(len(offs) - 1)]

    def __len__(self) -> int:
        return len(self.where)

    def example_hidden(self, i: int) -> torch.Tensor:
        """Example ``i``'s hidden rows ``[n, d]`` (a copy, in the cache dtype)."""
        shard, start, n = self.where[i]
        rows = np.array(self.hidden[shard][start:start + n])  # [n, d], copied out of the memory map
        if self.dtype == torch.bfloat16:
            return torch.from_numpy(rows.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(rows)

    def example_tokens(self, i: int) -> tuple[list[int], list[int]]:
        shard, start, n = self.where[i]
        block = self.tokens[shard][:, start:start + n]
        return block[0].tolist(), block[1].tolist()

    def batch(self, indices: Sequence[int], width: int) -> torch.Tensor:
        """``[B, width, d]`` hidden states of these examples, right-padded with zeros like ``collate``."""
        d = self.plan.index["hidden_size"]
        out = torch.zeros(len(indices), width, d, dtype=self.dtype)  # [B, T, d]
        for r, i in enumerate(indices):
            rows = self.example_hidden(i)
            out[r, :rows.shape[0]] = rows
        return out


def backbone_hidden_fn(base: torch.nn.Module, bf16_compute: bool = False) -> HiddenFn:
    """``batch -> [B, T, d]``: the frozen backbone's last hidden state (post final norm), without autograd.

    ``bf16_compute``: the backbone runs under bf16 autocast (the recipe's ``train.mixed_precision: bf16``;
    ~4x faster than float32 on an AVX-512 BF16 / AMX CPU). The hidden states then differ from float32 ones by
    the bf16 rounding of the matmuls, as they do in online bf16 training.
    """

    device = next(base.parameters()).device

    def run(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16_compute):
            out = decoder_of(base)(input_ids=batch["input_ids"].to(device),
                                   attention_mask=batch["attention_mask"].to(device), use_cache=False)
        return out.last_hidden_state

    return run


def features_fn(base: torch.nn.Module, layers: Sequence[int], bf16_compute: bool = False) -> HiddenFn:
    """``batch -> [B, T, len(layers) * d]``: eagle3 heads' input, the base hidden states at ``layers``
    (HF's ``output_hidden_states`` numbering) side by side, without autograd."""

    device = next(base.parameters()).device

    def run(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16_compute):
            out = decoder_of(base)(input_ids=batch["input_ids"].to(device),
                                   attention_mask=batch["attention_mask"].to(device), use_cache=False,
                                   output_hidden_states=True)
        return torch.cat([out.hidden_states[i] for i in layers], dim=-1)

    return run


def prepare(directory: str | Path, base: torch.nn.Module, examples: Sequence[dict], pad_token_id: int,
            batch_size: int, accelerator: Any = None, dtype: str = "bfloat16",
            log: Callable[[str], None] = print, max_shards: int | None = None,
            shard_bytes: int = SHARD_BYTES, progress: bool = True,
            bf16_compute: bool = False, feature_layers: Sequence[int] | None = None) -> HiddenCache | None:
    """Open or create the cache of ``examples`` under ``directory``, write the missing shards (split over
    ``accelerator``'s processes) and return the reader; None when ``max_shards`` stopped the build early.
    ``feature_layers`` (eagle3 heads): the cache holds those layers' hidden states side by side
    (``[T, len * d]`` rows; recorded in the index, so a last-hidden-state cache is never read for them)."""

    rank, world = (accelerator.process_index,
                   accelerator.num_processes) if accelerator is not None else (0, 1)
    fingerprint = base_fingerprint(base)
    hidden_size = int(text_config(base).hidden_size)
    hidden_fn = backbone_hidden_fn(base, bf16_compute)
    if feature_layers is not None:
        fingerprint["feature_layers"] = [int(i) for i in feature_layers]
        hidden_size *= len(feature_layers)
        hidden_fn = features_fn(base, feature_layers, bf16_compute)
    if rank == 0:  # the main process writes the index; the others read it after the barrier
        plan = open_plan(directory, examples, fingerprint, hidden_size, dtype, shard_bytes)
    if accelerator is not None:
        accelerator.wait_for_everyone()
    if rank != 0:
        plan = open_plan(directory, examples, fingerprint, hidden_size, dtype, shard_bytes)
    written = build(plan, examples, hidden_fn,
                    lambda rows: collate(list(rows), pad_token_id), batch_size, rank, world, log, max_shards,
                    progress)
    if accelerator is not None:
        accelerator.wait_for_everyone()
    if max_shards is not None and written >= max_shards and not all(plan.done(i)
                                                                    for i in range(len(plan.shards))):
        return None
    return HiddenCache(plan)


def cache_for_recipe(recipe: Any, dtype: str | None = None,
                     log: Callable[[str], None] = print) -> HiddenCache:
    """Build (or finish) the cache a MEDUSA-1 recipe's ``train.hidden_cache`` names, as ``medusa train``
    would before its first step: same tokenizer, examples (eval split included) and backbone."""

    if not recipe.train.hidden_cache:
        raise ConfigError("train.hidden_cache: not set (give train.hidden_cache=DIR)")
    check_cache_dir(recipe.train.hidden_cache)  # before anything loads
    dtype = existing_dtype(Path(recipe.train.hidden_cache) / INDEX, dtype, DTYPES)
    data = S.load_data(recipe, S.load_tokenizer(recipe))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    base = S.load_backbone(recipe, device)
    base.eval()
    layers = None
    if recipe.heads.head_type in DRAFTER_HEAD_TYPES:
        n_layers = int(text_config(base).num_hidden_layers)
        layers = recipe.heads.feature_layers or default_feature_layers(n_layers)
    cache = prepare(recipe.train.hidden_cache, base, data.train.examples, data.pad_token_id,
                    recipe.train.batch_size, dtype=dtype, log=log,
                    bf16_compute=S.backbone_bf16(recipe), feature_layers=layers)
    assert cache is not None
    return cache


__all__ = ["CachePlan", "HiddenCache", "backbone_hidden_fn", "cache_for_recipe", "base_fingerprint", "build",
           "length_batches", "prepare", "data_fingerprint", "estimate_bytes", "open_plan", "plan_shards"]
