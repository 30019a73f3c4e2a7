"""Measure MEDUSA decoding against plain decoding in the same process (used by ``medusa generate --profile``).

Reports, over a list of prompts (batch 1, greedy): the mean time of one MEDUSA step (propose + verify +
accept + compact) and of one plain decode step of the base model with a ``DynamicCache`` (their ratio is
the "overhead"; the MEDUSA paper reports 1.22 on a 7B model), tokens gained per step, and tokens/s of
MEDUSA vs HF ``generate(do_sample=False)``; then what bounds the overhead (:mod:`medusa.eval.step_cost`):
the verification forward alone over the tree against a 1-token forward (the overhead's floor with this
model's forward on this device) and the compute ops a step adds to HF's per-token ones. Figures are
returned, never asserted.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

import torch

from medusa.data.readers import read_prompts
from medusa.decoding.step import PhaseClock
from medusa.decoding.tree_option import resolve_dynamic
from medusa.errors import MedusaError
from medusa.eval.step_cost import step_op_counts, verify_floor
from medusa.eval.timing import plain_step_time, timed
from medusa.modeling.cpu_linear import stock_linears
from medusa.modeling.loading import encode_prompt, load_for_generation
from medusa.tree import DraftTreeShape, default_tree


@torch.no_grad()
def _hf_generate(base: Any, ids: torch.Tensor, max_new_tokens: int, device: Any) -> tuple[Any, float]:
    """HF greedy ``generate`` as HF runs it (stock linears, as ``medusa bench`` times it) and its seconds."""
    with stock_linears(base):
        return timed(lambda: base.generate(ids, max_new_tokens=max_new_tokens, do_sample=False), device)


def profile_decoding(model: Any, tokenizer: Any, prompts: Sequence[str], max_new_tokens: int = 128,
                     tree: Any = None, repeats: int = 2, step_cost: bool = True,
                     chat: bool = False) -> dict[str, Any]:
    """MEDUSA vs plain decoding on ``prompts`` (greedy, batch 1); the best of ``repeats`` runs per prompt.
    ``step_cost``: also the overhead's floor and the op counts, on the first prompt. ``chat``: each prompt
    is a user turn in the tokenizer's chat template (``medusa generate --chat``)."""
    from tqdm.auto import tqdm

    base = model.base_model
    device = model.device
    rows = []
    encode = lambda prompt: encode_prompt(tokenizer, prompt, chat).to(device)  # [1, T]
    warm = encode(prompts[0])
    model.generate(warm, max_new_tokens=8, tree=tree, lookup_tokens=0)  # warm-up (allocations, lazy imports)
    base.generate(warm, max_new_tokens=8, do_sample=False)
    for prompt in tqdm(prompts, desc="profile", leave=False):
        ids = encode(prompt)
        best_hf, best_md, best_plain, md_out = float("inf"), float("inf"), float("inf"), None
        for _ in range(repeats):
            ref, seconds = _hf_generate(base, ids, max_new_tokens, device)
            best_hf = min(best_hf, seconds)
            out, seconds = timed(lambda: model.generate(ids, max_new_tokens=max_new_tokens, tree=tree,
                                                        lookup_tokens=0, return_dict_in_generate=True),
                                 device)
            if seconds < best_md:
                best_md, md_out = seconds, out
            best_plain = min(best_plain, plain_step_time(base, ids, steps=min(32, max_new_tokens)))
        new = md_out.sequences.shape[1] - ids.shape[1]
        rows.append({
            "new_tokens": new,
            "identical_to_hf": bool(torch.equal(md_out.sequences, ref)),
            "hf_tokens_per_s": (ref.shape[1] - ids.shape[1]) / best_hf,
            "medusa_tokens_per_s": new / best_md,
            "tokens_per_step": md_out.tokens_per_step,
            "steps": md_out.num_steps,
            "medusa_step_s": md_out.decode_time_s / max(md_out.num_steps, 1),
            "plain_step_s": best_plain,
        })
    if not any(r["steps"] for r in rows):  # EOS (or the budget) at the first token: only the prefill ran
        raise MedusaError("--profile: no decoding step ran (every reply ended at its first token"
                          + (")" if chat else "; a chat model needs --chat)"))
    mean = lambda key: sum(r[key] for r in rows) / len(rows)
    summary = {
        "prompts": len(rows),
        "max_new_tokens": max_new_tokens,
        "tree_nodes": len(tree) if tree is not None else len(model.tree) if model.tree is not None else None,
        "tokens_per_step": mean("tokens_per_step"),
        "medusa_step_ms": 1e3 * mean("medusa_step_s"),
        "plain_step_ms": 1e3 * mean("plain_step_s"),
        "overhead": mean("medusa_step_s") / mean("plain_step_s"),
        "medusa_tokens_per_s": mean("medusa_tokens_per_s"),
        "hf_tokens_per_s": mean("hf_tokens_per_s"),
        "all_identical_to_hf": all(r["identical_to_hf"] for r in rows),
    }
    summary["speedup_vs_hf_generate"] = summary["medusa_tokens_per_s"] / summary["hf_tokens_per_s"]
    summary["phases_ms_per_step"] = step_phases(model, encode(prompts[0]), max_new_tokens, tree)
    if step_cost:
        summary.update(_step_cost(model, encode(prompts[0]), max_new_tokens, tree))
    return summary


def step_phases(model: Any, ids: torch.Tensor, max_new_tokens: int, tree: Any) -> dict[str, float]:
    """Milliseconds per step in each phase of one decode of ``ids [1, P]`` (drafting, target forward,
    acceptance, host copy, cache), and ``loop`` for the rest of the decode time (emitting tokens, stop
    checks): where a step's time goes."""
    clock = PhaseClock()
    out = model.generate(ids, max_new_tokens=max_new_tokens, tree=tree, lookup_tokens=0,
                         return_dict_in_generate=True, step_clock=clock)
    steps = max(clock.steps, 1)
    phases = {name: 1e3 * seconds / steps for name, seconds in clock.seconds.items()}
    phases["loop"] = max(0.0, 1e3 * out.decode_time_s / steps - sum(phases.values()))
    return phases


def _step_cost(model: Any, ids: torch.Tensor, max_new_tokens: int, tree: Any) -> dict[str, Any]:
    """The overhead's floor (the verify forward over a tree of the run's size against a 1-token forward)
    and the op counts. A drafter's per-step tree and a dynamic tree are timed as a static tree of as many
    nodes: the forward's cost depends on the node count and the mask's shape only."""
    used = tree if tree is not None else model.tree if model.tree is not None else model.default_tree()
    if isinstance(used, DraftTreeShape):
        used = default_tree(model.num_heads, used.num_nodes)
    dynamic = resolve_dynamic(used, model.num_heads, model.tree)
    if dynamic is not None:
        used = default_tree(model.num_heads, dynamic.num_nodes)
    floor = verify_floor(model, ids, used)
    return {"verify_forward_ms": floor["verify_forward_ms"], "plain_forward_ms": floor["plain_forward_ms"],
            "overhead_floor": floor["floor"], **step_op_counts(model, ids, max_new_tokens, tree)}


def format_profile(s: dict[str, Any]) -> str:
    return (f"tree {s['tree_nodes'] or 'default'} nodes, {s['prompts']} prompts x "
            f"{s['max_new_tokens']} tokens\ntokens/step          {s['tokens_per_step']:.2f}\n"
            f"MEDUSA step          {s['medusa_step_ms']:.2f} ms\n"
            f"plain decode step    {s['plain_step_ms']:.2f} ms\n"
            f"overhead             {s['overhead']:.2f}\n"
            f"MEDUSA tokens/s      {s['medusa_tokens_per_s']:.0f}\n"
            f"HF generate tokens/s {s['hf_tokens_per_s']:.0f}\n"
            f"speedup              {s['speedup_vs_hf_generate']:.2f}x\n"
            f"identical to HF      {s['all_identical_to_hf']}" + _format_phases(s) + _format_step_cost(s))


def _format_phases(s: dict[str, Any]) -> str:
    phases = s.get("phases_ms_per_step")
    if not phases:
        return ""
    return "\nstep phases (ms)     " + ", ".join(f"{k.replace('_', ' ')} {v:.2f}" for k, v in phases.items())


def _format_step_cost(s: dict[str, Any]) -> str:
    if "overhead_floor" not in s:
        return ""
    added = ", ".join(f"{k.removeprefix('aten::')} {v:+g}" for k, v in list(s["added_ops"].items())[:8])
    return (f"\nverify forward alone {s['verify_forward_ms']:.2f} ms vs 1-token forward "
            f"{s['plain_forward_ms']:.2f} ms: overhead floor {s['overhead_floor']:.2f}\n"
            f"compute ops          {s['medusa_ops_per_step']:.0f} per MEDUSA step vs "
            f"{s['hf_ops_per_token']:.0f} per HF token (added: {added})")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", required=True, help="a MEDUSA heads checkpoint directory")
    parser.add_argument("--base", default=None, help="base model (default: the checkpoint's)")
    parser.add_argument("--prompts", default=None, help="prompts file (.txt lines or .jsonl)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--nodes", type=int, default=None, help="use the default tree with this many nodes")
    parser.add_argument("--chat", action="store_true", help="wrap each prompt in the chat template")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    model, tokenizer = load_for_generation(args.heads, args.base)
    prompts = read_prompts(args.prompts) if args.prompts else ["Once upon a time"]
    tree = None
    if args.nodes:

        tree = default_tree(model.num_heads, args.nodes)
    summary = profile_decoding(model, tokenizer, prompts, args.max_new_tokens, tree=tree, chat=args.chat)
    print(json.dumps(summary, indent=2) if args.json else format_profile(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
