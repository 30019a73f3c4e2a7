"""How faithful greedy decoding is, per prompt, beside the bench's timings.

In float32 MEDUSA's greedy output equals HF ``generate``'s token for token (tested). In bfloat16 a matmul
over 16 rows rounds differently from one over 1 row, so where the base's top two logits are within bf16
rounding of each other the argmax can flip -- HF's own cached and uncached bf16 greedy runs disagree for the
same reason. The claim the bench checks: each divergence sits at such a near-tie. For a pair of greedy
outputs it records where they first differ and the base's top-2 logit margin there (from one forward of the
reference's own prefix in the model's dtype), so a report shows identity with HF greedy and with our own
plain decode (no drafts) in the same dtype, and what each divergence looked like.
"""

from __future__ import annotations

import statistics
from typing import Any

import torch


def first_divergence(a: torch.Tensor, b: torch.Tensor) -> int | None:
    """The first index where the 1-D sequences ``a`` and ``b`` differ (over their common length; a length
    difference counts at the shorter one's end), or None where they are equal."""
    n = min(a.numel(), b.numel())
    diff = (a[:n] != b[:n]).nonzero()
    if diff.numel():
        return int(diff[0, 0])
    return None if a.numel() == b.numel() else n


@torch.no_grad()
def top2_margin(base: Any, sequence: torch.Tensor, position: int) -> float:
    """The base's top-1 minus top-2 logit for the token at ``position`` of ``sequence [T]`` (one forward of
    ``sequence[:position]``, no cache, in the model's dtype), as a float."""
    prefix = sequence[:position].view(1, -1).to(base.device)  # [1, position]
    logits = base(input_ids=prefix, use_cache=False).logits[0, -1].float()  # [V]
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


def divergence(base: Any, ours: torch.Tensor, reference: torch.Tensor, prompt_len: int) -> dict[str, Any]:
    """``{"identical", "at", "margin"}`` of ``ours`` against ``reference`` (both ``[P + new]``): ``at`` the
    first differing new token (None: identical), ``margin`` the base's top-2 margin there on the reference's
    prefix (None: identical, or the difference is only in length)."""
    at = first_divergence(ours[prompt_len:], reference[prompt_len:])
    if at is None:
        return {"identical": True, "at": None, "margin": None}
    position = prompt_len + at
    margin = top2_margin(base, reference, position) if position < reference.numel() else None
    return {"identical": False, "at": at, "margin": margin}


def fidelity_fields(base: Any, sequences: dict[str, torch.Tensor], prompt_len: int) -> dict[str, Any]:
    """A bench row's fidelity fields from the greedy outputs ``sequences`` (method -> ``[P + new]``): MEDUSA
    against our own plain decode (``vs_own_plain``) and against HF (``vs_hf``), our plain decode against HF
    (``own_plain_vs_hf``)."""
    pairs = {"vs_own_plain": ("medusa", "own_plain"), "vs_hf": ("medusa", "baseline"),
             "own_plain_vs_hf": ("own_plain", "baseline")}
    return {f"fidelity_{name}": divergence(base, sequences[a], sequences[b], prompt_len)
            for name, (a, b) in pairs.items() if a in sequences and b in sequences}


def fidelity_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Over the rows: per pair, the share identical and the largest and median top-2 margin at the first
    divergences (a margin within bf16 rounding of the logits -- a few hundredths -- is a near-tie)."""
    summary: dict[str, Any] = {}
    for key in (k for k in rows[0] if k.startswith("fidelity_")):
        records = [r[key] for r in rows]
        margins = [rec["margin"] for rec in records if rec["margin"] is not None]
        summary[key.removeprefix("fidelity_")] = {
            "identical": sum(rec["identical"] for rec in records) / len(records),
            "divergences": len(records) - sum(rec["identical"] for rec in records),
            "max_margin": max(margins) if margins else None,
            "median_margin": statistics.median(margins) if margins else None,
        }
    return summary


__all__ = ["divergence", "fidelity_fields", "fidelity_summary", "first_divergence", "top2_margin"]
