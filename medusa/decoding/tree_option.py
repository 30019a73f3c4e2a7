"""The user's tree option, resolved once per run: ``tree=None`` (the checkpoint's tree, else the built-in
default), a :class:`medusa.tree.MedusaTree`, ``"dynamic"`` / ``"dynamic:N"`` / a
:class:`DynamicTreeOption`, or ``"lookup"`` (the context-lookup chain alone), plus ``lookup_tokens``
(a lookup chain beside a static tree). :func:`resolve_tree` turns them into one :class:`TreeChoice`;
:func:`tree_option` is the CLI's ``--tree`` / ``--nodes`` / ``--lookup-tokens``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from medusa.decoding.drafter import Drafter
from medusa.errors import MedusaError
from medusa.tree import DraftTreeShape, MedusaTree, is_draft_tree_file

LOOKUP_TREE = "lookup"  # tree="lookup" / --tree lookup: the lookup chain alone, no heads (decoding.lookup)
PLAIN_TREE = "plain"  # tree="plain" / --tree plain: no drafts, the root alone each step (decoding.plain)
DEFAULT_DYNAMIC_NODES = 32


def is_lookup_tree(tree: object) -> bool:
    """Whether ``tree`` asks for the lookup chain alone (``tree="lookup"``)."""
    return isinstance(tree, str) and tree == LOOKUP_TREE


@dataclass(frozen=True)
class DynamicTreeOption:
    """``tree="dynamic"``: every step, each row's tree of the ``num_nodes`` nodes (root included) of highest
    path probability, ``depth`` levels deep (default: one per head). ``branch``: children proposed under
    each expanded node (default ``num_nodes - 1``, which makes the tree exactly the best N nodes).
    ``calibrated``: score paths with the checkpoint's fitted ``path_score`` when it has one (``score``, set
    by :func:`resolve_dynamic`); False: the raw product of head probabilities."""

    num_nodes: int = DEFAULT_DYNAMIC_NODES
    depth: int | None = None
    branch: int | None = None
    calibrated: bool = True
    # medusa.tree.path_score.fit_path_score's record, or None: raw (not part of equality / hash)
    score: dict[str, Any] | None = dataclasses.field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.num_nodes < 2:
            raise MedusaError(f"a dynamic tree needs at least 2 nodes, got {self.num_nodes}")

    def __len__(self) -> int:
        return self.num_nodes


@dataclass(frozen=True)
class TreeChoice:
    """What a run decodes with: the heads' ``static`` tree, a ``dynamic`` one or an autoregressive drafter's
    ``draft`` tree shape (eagle3 heads; none of them: the lookup chain alone), and ``lookup_tokens`` chain
    nodes verified beside it (0: none)."""

    static: MedusaTree | None = None
    dynamic: DynamicTreeOption | None = None
    lookup_tokens: int = 0
    draft: DraftTreeShape | None = None
    plain: bool = False  # tree="plain": no drafts at all

    @property
    def lookup_only(self) -> bool:
        return self.static is None and self.dynamic is None and self.draft is None and not self.plain

    @property
    def depth(self) -> int:
        """The heads' tree depth (0 for the lookup chain alone)."""
        if self.draft is not None:
            return self.draft.depth
        if self.dynamic is not None:
            return int(self.dynamic.depth or 0)
        return self.static.depth if self.static is not None else 0


def tree_option(tree: str | None, nodes: int | None = None, lookup_tokens: int | None = None
                ) -> MedusaTree | DraftTreeShape | DynamicTreeOption | str | None:
    """The CLI's ``--tree`` / ``--nodes`` / ``--lookup-tokens``: None (the checkpoint's tree), ``dynamic`` (a
    :class:`DynamicTreeOption` of ``nodes`` nodes, default 32, calibrated path score when the checkpoint has
    one), ``dynamic-raw`` (raw head probabilities), ``lookup`` (the string: the lookup chain alone, which
    needs ``lookup_tokens >= 1``), ``plain`` (no drafts) or a tree.json path. A lookup chain
    (``lookup_tokens >= 1``) needs a static tree or ``lookup``."""
    if tree in ("dynamic", "dynamic-raw"):
        if lookup_tokens:
            raise MedusaError("--lookup-tokens needs a static tree (a tree.json or the checkpoint's) or "
                              "--tree lookup, not a dynamic one")
        return DynamicTreeOption(nodes if nodes is not None else DEFAULT_DYNAMIC_NODES,
                                 calibrated=tree == "dynamic")
    if nodes is not None:
        raise MedusaError("--nodes applies to --tree dynamic only (a tree.json fixes its own size)")
    if tree == PLAIN_TREE:  # no drafts: our own plain decode
        if lookup_tokens:
            raise MedusaError("--tree plain (no drafts) takes no --lookup-tokens")
        return PLAIN_TREE
    if tree == LOOKUP_TREE:
        if lookup_tokens is None or lookup_tokens < 1:
            raise MedusaError("--tree lookup (the lookup chain alone) needs --lookup-tokens L with L >= 1")
        return LOOKUP_TREE
    if tree is None:
        return None
    if is_draft_tree_file(tree):  # an autoregressive drafter's tree sizes (eagle3 heads)
        return DraftTreeShape.from_json(tree)
    return MedusaTree.from_json(tree)


def resolve_dynamic(tree: object, num_heads: int, checkpoint_tree: MedusaTree | None = None,
                    default_nodes: int = DEFAULT_DYNAMIC_NODES) -> DynamicTreeOption | None:
    """``"dynamic"``, ``"dynamic:N"`` or a :class:`DynamicTreeOption` -> one with its depth resolved (all
    heads) and, when ``calibrated``, the ``path_score`` of ``checkpoint_tree``'s calibration record (the
    model's calibrated ``MedusaTree``); anything else -> None (a static tree)."""
    if isinstance(tree, str):
        size = str(default_nodes) if tree == "dynamic" else ""
        if tree.startswith("dynamic:"):
            size = tree.split(":", 1)[1]
        if not size.isdigit():
            raise MedusaError(f"tree must be a MedusaTree, a DynamicTreeOption, 'dynamic' or 'dynamic:N', "
                              f"got {tree!r}")
        tree = DynamicTreeOption(int(size))
    if not isinstance(tree, DynamicTreeOption):
        return None
    if tree.depth is None:
        tree = dataclasses.replace(tree, depth=num_heads)
    record = getattr(checkpoint_tree, "calibration", None) or {}
    if tree.calibrated and tree.score is None and record.get("path_score"):
        tree = dataclasses.replace(tree, score=record["path_score"])
    return tree


def tree_kind(tree: object, checkpoint_tree: MedusaTree | None = None) -> str:
    """How a benchmark report names ``tree``: ``static``, ``dynamic (calibrated path score)`` or ``dynamic
    (raw head probabilities)`` (``checkpoint_tree``: the model's calibrated tree, whose record holds the
    score)."""
    dynamic = resolve_dynamic(tree, 1, checkpoint_tree)
    if dynamic is None:
        return "static"
    return f"dynamic ({'calibrated path score' if dynamic.score else 'raw head probabilities'})"


def resolve_lookup_tokens(model: Any, tree: object, lookup_tokens: int | None) -> int:
    """The lookup chain's length: ``lookup_tokens``, else the calibrated tree's (``tree.json``'s
    ``lookup_tokens``; 0 when it has none). ``tree="lookup"`` needs one."""
    if lookup_tokens is None:
        source = tree if tree is not None else model.tree
        lookup_tokens = 0 if isinstance(source, str) else getattr(source, "lookup_tokens", 0)
    if not isinstance(lookup_tokens, int) or isinstance(lookup_tokens, bool) or lookup_tokens < 0:
        raise MedusaError(f"lookup_tokens must be an integer >= 0, got {lookup_tokens!r}")
    if is_lookup_tree(tree) and lookup_tokens < 1:
        raise MedusaError("tree='lookup' (the lookup chain alone) needs lookup_tokens >= 1")
    return lookup_tokens


def resolve_tree(model: Any, tree: object, lookup_tokens: int | None = None) -> TreeChoice:
    """The run's :class:`TreeChoice` for the user's ``tree`` / ``lookup_tokens`` on ``model`` (its heads'
    count, its calibrated ``tree``, its ``default_tree()``)."""
    if isinstance(tree, str) and tree == PLAIN_TREE:
        if lookup_tokens:
            raise MedusaError("tree='plain' (no drafts) takes no lookup chain: drop lookup_tokens")
        return TreeChoice(plain=True)
    lookup = resolve_lookup_tokens(model, tree, lookup_tokens)
    if is_lookup_tree(tree):
        return TreeChoice(lookup_tokens=lookup)
    if isinstance(model.heads, Drafter):
        return TreeChoice(lookup_tokens=lookup, draft=dataclasses.replace(draft_shape(model, tree),
                                                                          lookup_tokens=lookup))
    if isinstance(tree, DraftTreeShape):
        raise MedusaError("a DraftTreeShape is the tree of a sequential drafter (eagle3 heads); these "
                          f"heads are {getattr(model.heads, 'head_type', 'linear')}")
    dynamic = resolve_dynamic(tree, model.num_heads, model.tree)
    static = None
    if dynamic is None:
        static = tree if tree is not None else model.tree
        static = static if static is not None else model.default_tree()
        if not isinstance(static, MedusaTree):
            raise MedusaError(f"tree must be a MedusaTree, a DynamicTreeOption, 'dynamic', 'dynamic:N' or "
                              f"'lookup', got {type(static).__name__}")
    choice = TreeChoice(static, dynamic, lookup)
    if choice.depth > model.num_heads:
        raise MedusaError(f"tree depth {choice.depth} exceeds the model's {model.num_heads} heads")
    if lookup and dynamic is not None:
        raise MedusaError("lookup_tokens needs a static tree (a tree.json or the checkpoint's), not a "
                          "dynamic one")
    return choice


def draft_shape(model: Any, tree: object) -> DraftTreeShape:
    """eagle3 heads' tree: ``tree`` (a :class:`DraftTreeShape`), else the checkpoint's calibrated one, else
    the default shape; a MEDUSA tree or a dynamic one is refused (the drafter grows its own each step)."""
    if isinstance(tree, DraftTreeShape):
        return tree
    if tree is not None:
        raise MedusaError(f"eagle3 heads draft their own tree each step: tree must be None, a DraftTreeShape "
                          f"or 'lookup', got {tree!r}")
    return model.tree if isinstance(model.tree, DraftTreeShape) else DraftTreeShape()


__all__ = ["DEFAULT_DYNAMIC_NODES", "LOOKUP_TREE", "PLAIN_TREE", "DynamicTreeOption", "TreeChoice",
           "draft_shape", "is_lookup_tree", "resolve_dynamic", "resolve_lookup_tokens", "resolve_tree",
           "tree_kind",
           "tree_option"]
