"""``DraftTreeShape``: the sizes of the tree an autoregressive drafter (eagle3 heads) grows each step, and
its ``tree.json`` form.

Unlike a :class:`~medusa.tree.tree.MedusaTree` (fixed paths of ranks), the drafter's tree is grown anew every
step the EAGLE-2 way: ``depth`` draft levels, ``branch`` children under each expanded node, the ``expand``
most probable frontier nodes (by cumulative draft log-probability) expanded per level, and the
``num_nodes - 1`` most probable drafted nodes verified under the root. ``lookup_tokens``: a context-lookup
chain of that many tokens verified beside it (0: none). ``min_prob`` (0: off) prunes each step's tree to what
the drafter is sure enough of: a node whose path probability (the product of its draft probabilities) is
below it is neither expanded nor verified, so a level where no node reaches it is not drafted and a step
the drafter doubts verifies fewer nodes (:func:`medusa.decoding.draft_growth.grow`; deterministic drafts
only: a sampled node's place must not depend on its own token).

```
{"format": "medusa-draft-tree", "version": 1, "num_nodes": 16, "depth": 5, "branch": 4, "expand": 4,
 "lookup_tokens": 0, "min_prob": 0.0, "calibration": {...}}
```
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from medusa.io import atomic_write_text, read_json
from medusa.tree.tree import TreeError

DRAFT_TREE_FORMAT = "medusa-draft-tree"
DRAFT_TREE_VERSION = 1
MAX_NODES = 1024  # the CLI's --nodes bound
MAX_DEPTH = 64
MAX_LOOKUP = 64


@dataclass(frozen=True)
class DraftTreeShape:
    """Per-step tree sizes of an autoregressive drafter (see the module docstring)."""

    num_nodes: int = 16
    depth: int = 5
    branch: int = 4
    expand: int = 4
    lookup_tokens: int = 0
    min_prob: float = 0.0  # nodes of lower path probability are not drafted further nor verified (0: off)
    calibration: dict[str, Any] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        for name, lo, hi in (("num_nodes", 2, MAX_NODES), ("depth", 1, MAX_DEPTH), ("branch", 1, MAX_NODES),
                             ("expand", 1, MAX_NODES), ("lookup_tokens", 0, MAX_LOOKUP)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
                raise TreeError(f"draft tree: {name} must be an integer in [{lo}, {hi}], got {value!r}")
        p = self.min_prob
        if isinstance(p, bool) or not isinstance(p, int | float) or not 0.0 <= p < 1.0:
            raise TreeError(f"draft tree: min_prob must be a number in [0, 1), got {p!r}")
        pool = self.pool_size
        if pool < self.num_nodes - 1:
            raise TreeError(f"draft tree: {self.num_nodes} nodes need {self.num_nodes - 1} drafted "
                            f"candidates; depth {self.depth}, branch {self.branch}, expand {self.expand} "
                            f"give {pool}")

    @property
    def pool_size(self) -> int:
        """The candidates drafted per step: ``branch`` under the root, then ``branch`` under each of the
        ``expand`` best frontier nodes per further level (fewer where the frontier is smaller: level 2's is
        ``branch``)."""
        frontier = pool = self.branch
        for _ in range(self.depth - 1):
            frontier = min(self.expand, frontier) * self.branch
            pool += frontier
        return pool

    def __len__(self) -> int:
        """The drafted nodes verified per step, root included (a lookup chain's come on top)."""
        return self.num_nodes

    @property
    def drafter_forwards(self) -> int:
        """Draft-layer passes per step: the catch-up over the kept path, then one per level below the
        first."""
        return self.depth

    def to_dict(self) -> dict[str, Any]:
        data = {k: v for k, v in asdict(self).items() if k != "calibration"}
        return {"format": DRAFT_TREE_FORMAT, "version": DRAFT_TREE_VERSION, **data,
                "calibration": self.calibration}

    def to_json(self, path: str | Path) -> None:
        atomic_write_text(path, json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def from_dict(cls, data: Any, source: str = "tree.json") -> "DraftTreeShape":
        if not isinstance(data, dict) or data.get("format") != DRAFT_TREE_FORMAT:
            raise TreeError(f"{source}: not a draft tree (expected \"format\": \"{DRAFT_TREE_FORMAT}\")")
        if data.get("version") != DRAFT_TREE_VERSION:
            raise TreeError(f"{source}: draft tree version {data.get('version')!r} is not supported")
        known = {"num_nodes", "depth", "branch", "expand", "lookup_tokens", "min_prob"}
        unknown = sorted(set(data) - known - {"format", "version", "calibration"})
        if unknown:
            raise TreeError(f"{source}: unknown key(s) {', '.join(unknown)}")
        calibration = data.get("calibration")
        if calibration is not None and not isinstance(calibration, dict):
            raise TreeError(f"{source}: calibration must be an object")
        try:
            return cls(**{k: data[k] for k in known if k in data}, calibration=calibration)
        except TreeError as exc:
            raise TreeError(f"{source}: {exc}") from None

    @classmethod
    def from_json(cls, path: str | Path) -> "DraftTreeShape":
        return cls.from_dict(read_json(path, TreeError), source=str(path))


def is_draft_tree_file(path: str | Path) -> bool:
    """True when ``path`` holds a draft tree (its ``format`` key), not a MEDUSA tree."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(data, dict) and data.get("format") == DRAFT_TREE_FORMAT


__all__ = ["DRAFT_TREE_FORMAT", "DraftTreeShape", "is_draft_tree_file"]
