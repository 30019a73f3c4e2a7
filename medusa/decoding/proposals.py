"""One step's candidates for every head type and tree kind: ``(tokens [B, N], the step's tree)``.

- MEDUSA heads, static tree: the heads' top-k at the last accepted position, placed by rank.
- Hydra heads, static tree: grown depth by depth (:mod:`medusa.decoding.hydra_candidates`).
- Any heads, dynamic tree: each row's N most probable paths (:mod:`medusa.decoding.dynamic_tree`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from medusa.decoding.candidates import DecodeTree, decode_tree, propose
from medusa.decoding.dynamic_tree import (
    DynamicTree,
    StepTree,
    build_step_tree,
    hydra_children,
    medusa_children,
)
from medusa.decoding.hydra_candidates import hydra_propose
from medusa.decoding.static_cache import stacked_heads
from medusa.modeling.hydra import needs_tokens


def step_candidates(heads: torch.nn.Module, root: torch.Tensor, hidden: torch.Tensor,
                    dt: DecodeTree | DynamicTree) -> tuple[torch.Tensor, DecodeTree | StepTree]:
    """Tree tokens ``[B, N]`` (node 0 = ``root [B]``) from the base hidden state ``hidden [B, d]`` at the last
    accepted position, and the tree they sit in (``dt`` itself when static)."""
    if isinstance(dt, DynamicTree):
        branch = min(dt.branch or dt.num_nodes - 1, heads.vocab_size)
        if needs_tokens(heads):
            children = hydra_children(heads, hidden, branch)
        else:
            logits = stacked_heads(heads, hidden.unsqueeze(1))[:dt.depth, :, 0]  # [D, B, V]
            children = medusa_children(torch.log_softmax(logits.float(), dim=-1), branch)
        step = build_step_tree(root, children, dt.num_nodes, dt.depth, dt.dtype, branch, path_score=dt.score)
        return step.tokens, step
    if needs_tokens(heads):
        return hydra_propose(heads, root, hidden, dt), dt
    return propose(root, heads.topk(hidden, dt.kmax), dt), dt  # top-k [K, B, kmax] target ids


def decoding_tree(tree: Any, device: torch.device, dtype: torch.dtype) -> DecodeTree | DynamicTree:
    """A static tree's buffers on ``device`` (mask in ``dtype``), or the dynamic tree with that mask dtype."""
    if isinstance(tree, DynamicTree):
        return dataclasses.replace(tree, dtype=dtype)
    return decode_tree(tree, device, dtype)
