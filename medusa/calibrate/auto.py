"""``--nodes auto``: the one tree-size chooser (``medusa calibrate --nodes auto``, the demo and the
benchmark pipelines all use it).

Each candidate size has its tree and its expected tokens per step (greedy tree decoding replayed on the
calibration data); a verification step of the real decode loop is timed for every tree on the current
device, and the size with the most predicted tokens per second (expected tokens per step / step time)
wins. Sizes stop at 64 nodes, the size of the built-in default tree.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from medusa.decoding.generate import medusa_generate
from medusa.errors import MedusaError
from medusa.tree.tree import MedusaTree

AUTO_SIZES = (8, 16, 24, 32, 48, 64)  # tree sizes (root included) tried by --nodes auto
AUTO_PROMPT_TOKENS = 128  # prompt length for the timed decode runs


@torch.no_grad()
def time_tree_steps(model: Any, trees: Mapping[int, Sequence[Sequence[int]] | MedusaTree],
                    prompt: Sequence[int], new_tokens: int = 32, repeats: int = 5) -> dict[int, float]:
    """Seconds per verification step of the real decode loop (greedy ``medusa_generate``) for each tree
    (its choices, or a :class:`MedusaTree`, e.g. one with a lookup chain), on the model's device: decode
    time / steps, the fastest of ``repeats`` runs after one warm-up (the minimum is the estimate least
    disturbed by other work on the machine)."""
    ids = torch.tensor([list(prompt)], dtype=torch.long)  # [1, P]
    built = {n: c if isinstance(c, MedusaTree) else MedusaTree.from_choices(c, num_heads=model.num_heads)
             for n, c in trees.items()}
    samples: dict[int, list[float]] = {n: [] for n in built}
    for round_ in range(repeats + 1):  # sizes interleaved, so a busy moment does not hit one size only
        for n, tree in built.items():
            out = medusa_generate(model, ids, max_new_tokens=new_tokens, tree=tree,
                                  return_dict_in_generate=True)
            if round_ > 0 and out.num_steps:
                samples[n].append(out.decode_time_s / out.num_steps)
    times: dict[int, float] = {}
    for n, values in samples.items():
        if not values:
            raise MedusaError("cannot time the tree: decoding stopped at the first token; use another --data")
        times[n] = min(values)
    return times


def timing_prompt(examples: Sequence[dict]) -> list[int]:
    """The start (``AUTO_PROMPT_TOKENS`` tokens) of the longest example: the prompt the sizes are timed on."""
    longest = max(examples, key=lambda e: len(e["input_ids"]))["input_ids"] if examples else []
    if not longest:
        raise MedusaError("--nodes auto needs the calibration examples to time decoding steps")
    return list(longest[:AUTO_PROMPT_TOKENS])


def choose_size(model: Any, trees: Mapping[int, Sequence[Sequence[int]]], expected: Mapping[int, float],
                prompt: Sequence[int]) -> dict[str, Any]:
    """Time ``trees`` (size -> choices) and pick the size maximising ``expected[size] / step time``.

    Returns the calibration record's ``auto`` entry: ``sizes``, ``step_time_s``, ``expected_tokens_per_step``,
    ``tokens_per_s`` (one per size, in ``trees``' order), ``chosen`` and ``device``."""
    times = time_tree_steps(model, trees, prompt)
    sizes = list(trees)
    score = {n: expected[n] / times[n] for n in sizes}
    return {"sizes": sizes, "step_time_s": [times[n] for n in sizes],
            "expected_tokens_per_step": [expected[n] for n in sizes],
            "tokens_per_s": [score[n] for n in sizes], "chosen": max(sizes, key=score.__getitem__),
            "device": str(model.device)}


__all__ = ["AUTO_PROMPT_TOKENS", "AUTO_SIZES", "choose_size", "time_tree_steps", "timing_prompt"]
