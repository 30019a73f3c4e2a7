"""``MedusaTree``: the candidate tree as paths of top-k ranks, and the buffers decoding needs.

A choice is a path of ranks, one per depth: ``(0, 1)`` = head 1's best token followed by head 2's
second best. Node 0 is the root (the base model's own next token). Nodes are ordered by depth, then
lexicographically, so every node comes after its parent.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch

from medusa.errors import MedusaError
from medusa.io import atomic_write_text, read_json
from medusa.tree.path_score import check_path_score

TREE_FORMAT = "medusa-tree"
TREE_VERSION = 1
# what a tree.json may ask for: the command line's own bounds (medusa.cli: MAX_NODES, --topk, --lookup-tokens)
MAX_FILE_NODES = 1024  # nodes, the root included
MAX_FILE_RANK = 999  # ranks are 0-based; --topk is at most 1000
MAX_FILE_LOOKUP_TOKENS = 1024
MAX_FILE_HEADS = 64


class TreeError(MedusaError):
    """An invalid tree: a bad rank, a path deeper than the heads, a missing prefix, a duplicate."""


def validate_choices(choices: Iterable[Sequence[int]], num_heads: int | None = None,
                     source: str = "tree") -> list[tuple[int, ...]]:
    """Check and canonicalise choices; the root ``()`` is implicit and must not be listed."""
    seen: set[tuple[int, ...]] = set()
    paths: list[tuple[int, ...]] = []
    for i, choice in enumerate(choices):
        if not isinstance(choice, (list, tuple)) or not all(isinstance(r, int) and not isinstance(r, bool)
                                                            for r in choice):
            raise TreeError(f"{source}: choice {i} ({choice!r}) is not a list of integer ranks")
        path = tuple(choice)
        if not path:
            raise TreeError(f"{source}: choice {i} is empty (the root is implicit)")
        if any(r < 0 for r in path):
            raise TreeError(f"{source}: choice {i} {list(path)} has a negative rank")
        if num_heads is not None and len(path) > num_heads:
            raise TreeError(f"{source}: choice {i} {list(path)} has depth {len(path)} "
                            f"but there are only {num_heads} heads")
        if path in seen:
            raise TreeError(f"{source}: choice {list(path)} appears twice")
        seen.add(path)
        paths.append(path)
    for path in paths:
        if len(path) > 1 and path[:-1] not in seen:
            raise TreeError(f"{source}: choice {list(path)} has no parent {list(path[:-1])} in the tree")
    return sorted(paths, key=lambda p: (len(p), p))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_file_values(data: dict[str, Any], source: str) -> None:
    """A tree.json's values within the command line's bounds, before any tensor is built from them."""
    choices = data["choices"]
    if not isinstance(choices, list):
        raise TreeError(f"{source}: choices must be a list of paths, got {type(choices).__name__}")
    if len(choices) + 1 > MAX_FILE_NODES:
        raise TreeError(f"{source}: {len(choices) + 1} nodes; at most {MAX_FILE_NODES} (the root included)")
    for i, choice in enumerate(choices):
        if isinstance(choice, list) and any(_is_int(r) and r > MAX_FILE_RANK for r in choice):
            raise TreeError(f"{source}: choice {i} asks for a rank past {MAX_FILE_RANK} (--topk is at most "
                            f"{MAX_FILE_RANK + 1})")
    heads = data.get("num_heads")
    if heads is not None and not (_is_int(heads) and 0 <= heads <= MAX_FILE_HEADS):
        raise TreeError(f"{source}: num_heads must be an integer in [0, {MAX_FILE_HEADS}], got {heads!r:.40}")
    lookup = data.get("lookup_tokens", 0)
    if not (_is_int(lookup) and 0 <= lookup <= MAX_FILE_LOOKUP_TOKENS):
        raise TreeError(f"{source}: lookup_tokens must be an integer in [0, {MAX_FILE_LOOKUP_TOKENS}], got "
                        f"{lookup!r:.40}")
    calibration = data.get("calibration")
    if calibration is not None and not isinstance(calibration, dict):
        raise TreeError(f"{source}: calibration must be an object, got {type(calibration).__name__}")
    if calibration and calibration.get("path_score") is not None:
        problem = check_path_score(calibration["path_score"], source)
        if problem:
            raise TreeError(problem)


class MedusaTree:
    """A validated candidate tree. ``paths[0] == ()`` is the root; ``len(tree)`` counts it."""

    def __init__(self, choices: Iterable[Sequence[int]], num_heads: int | None = None,
                 calibration: dict[str, Any] | None = None, source: str = "tree",
                 lookup_tokens: int = 0) -> None:
        if not isinstance(lookup_tokens, int) or isinstance(lookup_tokens, bool) or lookup_tokens < 0:
            raise TreeError(f"{source}: lookup_tokens must be an integer >= 0, got {lookup_tokens!r}")
        # the context-lookup chain decoding verifies beside the tree by default (medusa.decoding.lookup)
        self.lookup_tokens = lookup_tokens
        self.choices: list[tuple[int, ...]] = validate_choices(choices, num_heads, source)
        self.paths: list[tuple[int, ...]] = [()] + self.choices
        self.num_heads = num_heads
        self.calibration = calibration
        index = {p: i for i, p in enumerate(self.paths)}
        n = len(self.paths)
        self.parents: list[int] = [-1] + [index[p[:-1]] for p in self.choices]
        has_child = [False] * n
        for parent in self.parents[1:]:
            has_child[parent] = True
        self.depths = torch.tensor([len(p) for p in self.paths], dtype=torch.long)  # [N]
        mask = torch.zeros(n, n, dtype=torch.bool)  # [N, N]: [i, j] iff j is i or an ancestor of i
        for i, p in enumerate(self.paths):
            for d in range(len(p) + 1):
                mask[i, index[p[:d]]] = True
        self.attention_mask = mask
        leaves = [i for i in range(n) if not has_child[i]]
        depth = self.depth
        retrieve = torch.full((len(leaves), depth + 1), -1, dtype=torch.long)  # [L, D+1], -1 padded
        for row, leaf in enumerate(leaves):
            p = self.paths[leaf]
            for d in range(len(p) + 1):
                retrieve[row, d] = index[p[:d]]
        self.retrieve_indices = retrieve
        # How many ranks each head must propose: topk[d-1] = 1 + max rank used at depth d.
        self.topk_per_depth = [1 + max(p[d - 1] for p in self.choices if len(p) == d)
                               for d in range(1, depth + 1)]
        self._device_cache: dict[str, dict[str, torch.Tensor]] = {}

    # ------------------------------------------------------------------ constructors / io
    @classmethod
    def from_choices(cls, choices: Iterable[Sequence[int]], num_heads: int | None = None,
                     calibration: dict[str, Any] | None = None, lookup_tokens: int = 0) -> "MedusaTree":
        return cls(choices, num_heads=num_heads, calibration=calibration, lookup_tokens=lookup_tokens)

    @classmethod
    def from_json(cls, path: str | Path) -> "MedusaTree":
        path = Path(path)
        data = read_json(path, TreeError)
        if isinstance(data, list):  # a bare list of choices, as the official repo writes them
            _check_file_values({"choices": data}, str(path))
            return cls(data, source=str(path))
        if not isinstance(data, dict) or data.get("format") != TREE_FORMAT:
            raise TreeError(f"{path}: not a tree.json (expected \"format\": \"{TREE_FORMAT}\")")
        if data.get("version") != TREE_VERSION:
            raise TreeError(f"{path}: tree version {data.get('version')!r} is not supported")
        if "choices" not in data:
            raise TreeError(f"{path}: missing key 'choices'")
        _check_file_values(data, str(path))
        return cls(data["choices"], num_heads=data.get("num_heads"), calibration=data.get("calibration"),
                   source=str(path), lookup_tokens=data.get("lookup_tokens", 0))

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": TREE_FORMAT,
            "version": TREE_VERSION,
            "num_heads": self.num_heads if self.num_heads is not None else self.depth,
            "choices": [list(p) for p in self.choices],
            "lookup_tokens": self.lookup_tokens,
            "calibration": self.calibration,
        }

    def to_json(self, path: str | Path) -> None:
        atomic_write_text(path, json.dumps(self.to_dict(), indent=1) + "\n")

    # ------------------------------------------------------------------ properties
    def __len__(self) -> int:
        return len(self.paths)

    def __repr__(self) -> str:
        return f"MedusaTree(nodes={len(self)}, depth={self.depth})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MedusaTree) and self.paths == other.paths

    @property
    def depth(self) -> int:
        return max((len(p) for p in self.paths), default=0)

    def buffers(self, device: torch.device | str) -> dict[str, torch.Tensor]:
        """The tree's tensors on ``device``, built once per device:

        ``attention_mask [N, N]`` bool, ``depths [N]``, ``parents [N]`` (-1 for the root),
        ``retrieve_indices [L, D+1]`` (-1 padded), ``ranks [N]`` (rank of each node at its depth, 0 for root).
        """
        key = str(torch.device(device))
        if key not in self._device_cache:
            ranks = torch.tensor([p[-1] if p else 0 for p in self.paths], dtype=torch.long)
            self._device_cache[key] = {
                "attention_mask": self.attention_mask.to(device),
                "depths": self.depths.to(device),
                "parents": torch.tensor(self.parents, dtype=torch.long, device=device),
                "retrieve_indices": self.retrieve_indices.to(device),
                "ranks": ranks.to(device),
            }
        return self._device_cache[key]
