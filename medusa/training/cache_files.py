"""The hidden-state cache's files, checked before any array is built from them: the index's values, each
shard's offsets, the hidden rows' file size and the token arrays' dtype and shape (``tokens.npy`` holding
objects is refused, never unpickled). Every failure is one :class:`MedusaError` naming the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from medusa.errors import MedusaError
from medusa.io import read_json

MAX_HIDDEN = 1 << 20  # hidden size (times the fused layers) a cache may declare


def _int(value: Any, lo: int, hi: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi


def check_index_values(index: Any, path: Path, dtypes: Any) -> None:
    """The index's own values: a dtype this reader knows, a sane hidden size, shards as ``[start, end)``
    example ranges covering ``num_examples`` in order."""
    if not isinstance(index, dict):
        raise MedusaError(f"train.hidden_cache: {path}: not a JSON object")
    if index.get("dtype") not in dtypes:
        raise MedusaError(f"train.hidden_cache: {path}: dtype {index.get('dtype')!r:.40} is not one of "
                          f"{', '.join(dtypes)}")
    if not _int(index.get("hidden_size"), 1, MAX_HIDDEN):
        size = index.get("hidden_size")
        raise MedusaError(f"train.hidden_cache: {path}: hidden_size {size!r:.40} is not a size in "
                          f"[1, {MAX_HIDDEN}]")
    shards, n = index.get("shards"), index.get("num_examples")
    if not _int(n, 0, 1 << 40) or not isinstance(shards, list):
        raise MedusaError(f"train.hidden_cache: {path}: num_examples / shards are not a cache's")
    at = 0
    for i, shard in enumerate(shards):
        if not (isinstance(shard, list) and len(shard) == 2 and shard[0] == at and _int(shard[1], at, n)):
            raise MedusaError(f"train.hidden_cache: {path}: shard {i} {shard!r:.40} does not continue at "
                              f"example {at}")
        at = shard[1]
    if at != n:
        raise MedusaError(f"train.hidden_cache: {path}: the shards cover {at} of {n} examples")


def existing_dtype(index_path: Path, dtype: str | None, dtypes: Any) -> str:
    """The storage dtype: an existing cache's (a different explicit ``dtype`` is refused, never ignored),
    else ``dtype`` (default bfloat16)."""
    if not index_path.is_file():
        return dtype or "bfloat16"
    index = read_json(index_path, MedusaError)
    check_index_values(index, index_path, dtypes)
    if dtype is not None and index["dtype"] != dtype:
        raise MedusaError(f"--dtype {dtype}: {index_path.parent} already holds a {index['dtype']} cache; use "
                          "another train.hidden_cache, or leave --dtype out to finish this one")
    return index["dtype"]


def read_shard(directory: Path, i: int, names: dict[str, str], shard: tuple[int, int], width: int,
               np_dtype: Any) -> tuple[list[int], np.ndarray, np.ndarray]:
    """Shard ``i``'s offsets ``[n + 1]``, hidden rows ``[T, width]`` (memory-mapped) and tokens ``[2, T]``
    (ids, labels), each checked against the others. ``names``: suffix -> file name."""
    meta_path = directory / names["json"]
    try:
        offsets = json.loads(meta_path.read_text(encoding="utf-8"))["offsets"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise MedusaError(f"train.hidden_cache: {meta_path}: not a shard's metadata ({exc})") from None
    n = shard[1] - shard[0]
    if not (isinstance(offsets, list) and len(offsets) == n + 1 and offsets[:1] == [0]
            and all(_int(b, a, 1 << 40) for a, b in zip(offsets, offsets[1:]))):
        raise MedusaError(f"train.hidden_cache: {meta_path}: offsets are not {n + 1} increasing positions "
                          "from 0")
    rows = offsets[-1]
    hidden_path = directory / names["hidden"]
    expected = rows * width * np.dtype(np_dtype).itemsize
    if not hidden_path.is_file() or hidden_path.stat().st_size != expected:
        have = hidden_path.stat().st_size if hidden_path.is_file() else "no"
        raise MedusaError(f"train.hidden_cache: {hidden_path}: {have} bytes, expected {expected} (truncated "
                          "or another cache's); rebuild the cache in a new directory")
    hidden = np.memmap(hidden_path, dtype=np_dtype, mode="r", shape=(rows, width))
    tokens_path = directory / names["tokens.npy"]
    try:
        tokens = np.load(tokens_path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise MedusaError(f"train.hidden_cache: {tokens_path}: not a token array ({exc})") from None
    if tokens.dtype.kind not in "iu" or tokens.shape != (2, rows):
        raise MedusaError(f"train.hidden_cache: {tokens_path}: {tokens.dtype} {tuple(tokens.shape)}, "
                          f"expected integer ids and labels of shape (2, {rows})")
    return offsets, hidden, tokens
