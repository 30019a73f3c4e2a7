"""Greedy fidelity in low precision: the share of prompts whose MEDUSA output stays identical to HF's.

In float32 greedy MEDUSA equals HF greedy ``generate`` exactly (tested). In bfloat16 / float16 the tree
forward computes the same logits through differently shaped matmuls and attention (N query rows instead
of one), which round differently; where the model's top two logits are nearly tied, the argmax can flip
and the two outputs part ways from there (each is a valid greedy decode of its own arithmetic).
:func:`greedy_identity` measures the share that stays identical and, for each prompt that does not, where
it diverges and the base model's top-2 logit margin there (``margin`` in logits, and whether it is within
``tie`` of a near-tie), so a report can say why. As a control it also counts how often HF's own greedy
``generate`` without a KV cache (every step a full forward: other matmul shapes, same model) stays
identical to HF with its cache: the same rounding effect, with no MEDUSA involved.

``python -m benchmarks.low_precision --heads DIR [--prompts FILE] [--dtypes float32 bfloat16]`` prints it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from medusa.data.readers import read_prompts
from medusa.modeling.loading import load_for_generation

STORY_PROMPTS = ["Once upon a time", "Lily saw a big dog", "Tom had a red ball", "The sun was hot and the",
                 "One day, a little bird", "Sara and her mom went to", "There was a small cat who",
                 "Ben wanted to fly a kite"]

@torch.no_grad()
def divergence(base: Any, prompt: torch.Tensor, ours: torch.Tensor, theirs: torch.Tensor) -> dict[str, Any]:
    """Where two greedy continuations of ``prompt [1, P]`` first differ (``ours`` / ``theirs``: ``[1, P+T]``)
    and the base model's top-2 logit margin there, computed on HF's side (``theirs``) by a plain forward."""
    n = min(ours.shape[1], theirs.shape[1])
    diff = (ours[0, :n] != theirs[0, :n]).nonzero()
    if diff.numel() == 0:
        return {"identical": ours.shape == theirs.shape}
    i = int(diff[0])
    logits = base(input_ids=theirs[:, :i]).logits[0, -1].float()  # [V]: the logits that chose token i
    top = logits.topk(2).values
    return {"identical": False, "first_difference": i - prompt.shape[1], "margin": float(top[0] - top[1]),
            "ours": int(ours[0, i]), "theirs": int(theirs[0, i])}


@torch.no_grad()
def greedy_identity(model: Any, tokenizer: Any, prompts: Sequence[str], max_new_tokens: int,
                    tie: float = 0.25) -> dict[str, Any]:
    """MEDUSA greedy vs HF greedy ``generate`` on ``prompts`` in the model's own dtype: the share of prompts
    identical (the whole continuation), per divergent prompt :func:`divergence` (``near_tie``: the margin is
    below ``tie`` logits), and the control share (HF without vs with its KV cache)."""
    rows = []
    device = next(model.base_model.parameters()).device
    for text in prompts:
        ids = tokenizer(text, return_tensors="pt").input_ids.to(device)  # [1, P]
        theirs = model.base_model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
        ours = model.generate(ids, max_new_tokens=max_new_tokens)
        no_cache = model.base_model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False,
                                             use_cache=False)
        row = {"prompt": text, **divergence(model.base_model, ids, ours, theirs),
               "hf_no_cache_identical": torch.equal(no_cache, theirs)}
        if not row["identical"] and "margin" in row:
            row["near_tie"] = row["margin"] < tie
        rows.append(row)
    same = sum(r["identical"] for r in rows)
    return {"dtype": str(next(model.base_model.parameters()).dtype).removeprefix("torch."),
            "prompts": len(rows), "identical": same, "identical_share": same / max(len(rows), 1),
            "near_tie_divergences": sum(bool(r.get("near_tie")) for r in rows), "tie": tie,
            "hf_no_cache_identical_share": sum(r["hf_no_cache_identical"] for r in rows) / max(len(rows), 1),
            "rows": rows}


def main(argv: Sequence[str] | None = None) -> int:
    import argparse
    import json


    p = argparse.ArgumentParser(prog="python -m benchmarks.low_precision",
                                description=__doc__.splitlines()[0])
    p.add_argument("--heads", required=True, help="heads checkpoint (its base model and tree are used)")
    p.add_argument("--prompts", default=None, help="prompts file (default: eight story openings)")
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default=None, help="JSON report")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    prompts = read_prompts(args.prompts) if args.prompts else STORY_PROMPTS
    results = []
    for dtype in args.dtypes:
        model, tokenizer = load_for_generation(args.heads, dtype=dtype)
        r = greedy_identity(model, tokenizer, prompts, args.max_new_tokens)
        results.append(r)
        margins = ", ".join(f"{row['margin']:.3f}" for row in r["rows"] if "margin" in row)
        print(f"{r['dtype']}: MEDUSA identical to HF on {r['identical']}/{r['prompts']} prompts; "
              f"divergences at top-2 margins [{margins}] logits; control (HF without vs with its KV cache): "
              f"{r['hf_no_cache_identical_share']:.2f} identical")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(results, fh, indent=2)
    return 0


__all__ = ["STORY_PROMPTS", "divergence", "greedy_identity", "main"]

if __name__ == "__main__":
    from medusa.cli import run_script

    raise SystemExit(run_script(main))
