"""``python -m benchmarks.drafter_eval DRAFTER [DRAFTER ...]``: drafters side by side in tokens per step, the
measure of the ship decision (a drafter ships only when it beats the shipped one on both prompt sets).

Greedy decoding through one tree shape (the shipped EAGLE-3 tree: 8 nodes, depth 4, branch 2; no lookup chain
unless ``--lookup``), or with ``--tree own`` through each drafter's calibrated tree (its ``tree.json``: the
way MEDUSA-1 / Hydra heads, whose trees are static, are compared with EAGLE-3), of two prompt sets, per part
and overall:

- ``held_out``: the first ``--per-part`` requests of each part of data_mix's held-out replies
  (``DATA/heldout/*.jsonl``: Alpaca, translation, math, summaries, RAG, multi-turn; never trained on);
- ``spec_bench``: the first ``--per-category`` Spec-Bench public prompts of each category (evaluation only).

Tokens per step does not depend on the core's load, so this may run beside other work; the decode
tokens/s beside it does (pin it to a quiet core, one thread, to pick a draft vocabulary by speed).
Each drafter loads in ``--dtype`` (bf16: the decode step the README leads with).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.chat_data import spec_bench
from medusa.errors import DataError

DEFAULT_SHAPE = (8, 4, 2, 2)  # nodes, depth, branch, expand: the shipped EAGLE-3 tree


def held_out_requests(data: Path, per_part: int) -> list[dict[str, Any]]:
    """``{"category", "messages"}``: the conversation up to (not including) the last assistant turn, of the
    first ``per_part`` rows of each held-out part."""
    files = sorted((data / "heldout").glob("*.jsonl"))
    if not files:
        raise DataError(f"{data / 'heldout'}: no held-out replies (*.jsonl) found")
    rows = []
    for path in files:
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines()[:per_part], start=1):
            try:
                messages = json.loads(line)["messages"]
                last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
            except (json.JSONDecodeError, KeyError, ValueError, TypeError) as exc:
                raise DataError(f"{path}:{lineno}: not a conversation row ({type(exc).__name__})") from None
            rows.append({"id": f"{path.stem}-{lineno}", "category": path.stem, "messages": messages[:last]})
    return rows


def prompt_sets(data: Path, shared: Path, per_part: int,
                per_category: int) -> dict[str, list[dict[str, Any]]]:
    spec = [{"id": r["id"], "category": r["category"], "messages": [{"role": "user", "content": r["prompt"]}]}
            for r in spec_bench(shared, per_category)]
    return {"held_out": held_out_requests(data, per_part), "spec_bench": spec}


def decode_set(model: Any, tokenizer: Any, rows: Sequence[dict[str, Any]], shape: Any,
               max_new_tokens: int, lookup: int = 0) -> dict[str, Any]:
    """Greedy decoding of every row: tokens per step per category and over all (accepted tokens / steps),
    each row's ``[tokens, steps]`` (``per_row``, by id), and decode tokens per second (prefill excluded).
    ``shape`` None: the drafter's own tree with a lookup
    chain of ``lookup`` tokens (a DraftTreeShape carries its own)."""
    from medusa.decoding.generate import medusa_generate

    per: dict[str, list[int]] = {}
    per_row: dict[str, list[int]] = {}
    seconds = 0.0
    for row in rows:
        ids = tokenizer.apply_chat_template(row["messages"], add_generation_prompt=True, return_tensors="pt",
                                            return_dict=True)["input_ids"]
        own = {"lookup_tokens": lookup} if shape is None else {}
        out = medusa_generate(model, ids, max_new_tokens=max_new_tokens, tree=shape,
                              return_dict_in_generate=True, **own)
        tokens = int(sum(int(a) for r in out.accept_lengths for a in r))
        acc = per.setdefault(row["category"], [0, 0])
        acc[0] += tokens
        acc[1] += int(out.num_steps)
        per_row[str(row.get("id", len(per_row)))] = [tokens, int(out.num_steps)]
        seconds += float(out.decode_time_s)
    total = [sum(v[0] for v in per.values()), sum(v[1] for v in per.values())]
    return {"tokens_per_step": round(total[0] / max(total[1], 1), 3), "tokens": total[0], "steps": total[1],
            "tokens_per_s": round(total[0] / max(seconds, 1e-9), 2),  # decode only: time it on a quiet core
            "per_category": {k: round(v[0] / max(v[1], 1), 3) for k, v in sorted(per.items())},
            "per_row": per_row}


def check_own_tree(drafter: Path, model: Any) -> None:
    """``--tree own`` needs the drafter's calibrated tree: a clear error naming the folder without one."""
    if model.tree is None:
        raise DataError(f"{drafter}: --tree own, but it has no tree.json (run medusa calibrate on it)")


def evaluate(drafter: Path, sets: dict[str, list[dict[str, Any]]], shape: Any, dtype: str,
             max_new_tokens: int, lookup: int = 0) -> dict[str, Any]:
    from medusa.modeling.loading import load_for_generation

    model, tokenizer = load_for_generation(str(drafter), dtype=dtype)
    if shape is None:
        check_own_tree(drafter, model)
    row: dict[str, Any] = {"drafter": str(drafter), "draft_vocab": int(model.config.draft_vocab or 0),
                           "head_type": model.config.head_type}
    for name, rows in sets.items():
        start = time.perf_counter()
        row[name] = decode_set(model, tokenizer, rows, shape, max_new_tokens, lookup)
        print(f"{drafter}: {name} {row[name]['tokens_per_step']} tokens/step "
              f"({time.perf_counter() - start:.0f} s)", file=sys.stderr)
    return row


def table(rows: Sequence[dict[str, Any]]) -> str:
    """A markdown table: one row per drafter, tokens/step of each set, then Spec-Bench per category."""
    cats = sorted({c for r in rows for c in r["spec_bench"]["per_category"]})
    head = ["drafter", "draft vocab", "held-out", "Spec-Bench", "Spec-Bench tok/s", *cats]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [Path(r["drafter"]).name, str(r["draft_vocab"]), f"{r['held_out']['tokens_per_step']:.3f}",
                 f"{r['spec_bench']['tokens_per_step']:.3f}", f"{r['spec_bench']['tokens_per_s']:.1f}",
                 *(f"{r['spec_bench']['per_category'].get(c, float('nan')):.2f}" for c in cats)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_shape(text: str, lookup: int) -> Any:
    """``nodes,depth,branch,expand`` -> a DraftTreeShape with a lookup chain of ``lookup`` tokens."""
    from medusa.tree import DraftTreeShape

    try:
        nodes, depth, branch, expand = (int(x) for x in text.split(","))
    except ValueError:
        raise DataError(f"--tree: expected nodes,depth,branch,expand (four integers) or 'own', "
                        f"got {text!r}") from None
    return DraftTreeShape(nodes, depth, branch, expand, lookup)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.drafter_eval", description=__doc__.split("\n")[0])
    p.add_argument("drafters", nargs="+", type=Path, help="heads checkpoint directories")
    p.add_argument("--data", type=Path, default=Path("/work/data-run"), help="data_mix's output directory")
    p.add_argument("--shared", type=Path, default=Path("../shared"))
    p.add_argument("--per-part", type=int, default=4, help="held-out requests per part")
    p.add_argument("--per-category", type=int, default=5, help="Spec-Bench public prompts per category")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--tree", default=",".join(map(str, DEFAULT_SHAPE)),
                   help="nodes,depth,branch,expand, or 'own': each drafter's tree.json")
    p.add_argument("--lookup", type=int, default=0, help="lookup-chain tokens (0: the drafter alone)")
    p.add_argument("--out", type=Path, help="write the rows as JSON here")
    args = p.parse_args(argv)
    shape = None if args.tree == "own" else parse_shape(args.tree, args.lookup)
    sets = prompt_sets(args.data, args.shared, args.per_part, args.per_category)
    rows = [evaluate(d, sets, shape, args.dtype, args.max_new_tokens, args.lookup) for d in args.drafters]
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    print(table(rows))
    return 0


if __name__ == "__main__":
    from medusa.cli import run_script

    raise SystemExit(run_script(main))
