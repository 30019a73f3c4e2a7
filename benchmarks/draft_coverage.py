"""``python -m benchmarks.draft_coverage``: how many reply tokens a draft vocabulary of N tokens can draft.

The draft vocabulary of size N is the N most frequent reply tokens of the *training* data
(:func:`medusa.modeling.draft_vocab.most_frequent`, as training picks it): the self-distilled replies under
``DIR/train``. Its coverage is measured on the held-out replies (``DIR/heldout``, requests built from texts
never trained on) and on the model's own greedy replies to Spec-Bench public prompts
(``--spec-bench-replies N``: N prompts per category answered into ``DIR/eval/spec_bench.jsonl``;
evaluation only, never read as training data), per category too. Beside coverage: the perfect-chain bound
(:func:`medusa.modeling.draft_vocab.chain_bound`) and the draft LM head's cost per drafting pass
(parameters, multiply-adds per drafted token, and with ``--time`` its measured milliseconds on this core).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks.chat_data import spec_bench
from medusa.data import load_tokenized
from medusa.data.formats import normalize
from medusa.data.tokenize import encode_sample, resolve_chat_template
from medusa.demo.stages import write_jsonl
from medusa.modeling.draft_vocab import chain_bound, coverage, label_counts, most_frequent
from medusa.selfdistill import Sampling, SelfDistillConfig, self_distill

SIZES = (8192, 16384, 32768)
EVAL_DIR = "eval"  # under the data directory: replies for measurement only
Examples = list[dict[str, list[int]]]


def reply_files(directory: Path) -> list[Path]:
    """The self-distillation outputs in ``directory`` (errors and synthesized-request files left out)."""
    return sorted(p for p in directory.glob("*.jsonl")
                  if not p.name.endswith((".errors.jsonl", ".prompts.jsonl")))


def tokenized(paths: Sequence[Path], tokenizer: Any, max_length: int = 2048) -> dict[str, Examples]:
    """Each file's conversations tokenised through the chat template (labels = the reply tokens)."""
    return {p.stem: load_tokenized(str(p), tokenizer, max_length, skip_invalid=True).examples for p in paths}


def _labels(examples: Examples) -> torch.Tensor:
    runs = [torch.as_tensor(ex["labels"], dtype=torch.long) for ex in examples]
    return torch.cat(runs) if runs else torch.zeros(0, dtype=torch.long)


def coverage_rows(train: Examples, evals: dict[str, Examples], vocab_size: int,
                  sizes: Sequence[int] = SIZES, depth: int = 4) -> list[dict[str, Any]]:
    """Per size N: the map from ``train``'s labels, its coverage of ``train`` and of every eval set, and each
    eval set's perfect-chain tokens/step bound at ``depth`` (the full vocabulary's bound as ``full``)."""
    counts = label_counts(train, vocab_size)
    seen = _labels(train)
    held = {name: _labels(ex) for name, ex in evals.items()}
    rows: list[dict[str, Any]] = [{"draft_vocab": "full", **{f"{name}_chain": chain_bound(None, ex, depth)
                                                            for name, ex in evals.items()}}]
    for n in sizes:
        token_map = most_frequent(counts, min(int(n), vocab_size))
        row: dict[str, Any] = {"draft_vocab": int(token_map.shape[0]), "train": coverage(token_map, seen)}
        for name, ex in evals.items():
            row[name] = coverage(token_map, held[name])
            row[f"{name}_chain"] = chain_bound(token_map, ex, depth)
        rows.append(row)
    return rows


def shipped_map_row(path: Path, evals: dict[str, Examples]) -> dict[str, Any]:
    """Coverage of every eval set by the ``token_map`` a shipped head set holds (its own training data's):
    ``path`` a heads folder or its weight file."""
    from medusa.modeling.heads_file import heads_weights_path, read_heads_file

    token_map = read_heads_file(heads_weights_path(path) if path.is_dir() else path)["token_map"]
    return {"draft_vocab": f"shipped {int(token_map.shape[0])}",
            **{name: coverage(token_map, _labels(ex)) for name, ex in evals.items()}}


def head_cost(n: int, hidden: int, rows: int = 8, dtype: torch.dtype | None = None,
              repeats: int = 0) -> dict[str, Any]:
    """The draft LM head ``[n, hidden]``: parameters, mega multiply-adds per drafted token and, with
    ``repeats > 0``, the median milliseconds of one pass over ``rows`` drafted tokens (``dtype``, this
    thread)."""
    out: dict[str, Any] = {"draft_vocab": n, "params_m": round(n * hidden / 1e6, 2),
                           "mmac_per_token": round(n * hidden / 1e6, 2)}
    if repeats:
        from medusa.modeling import bf16_kernel

        dtype = dtype or torch.float32
        w, x = torch.randn(n, hidden, dtype=dtype), torch.randn(rows, hidden, dtype=dtype)
        out[f"ms_{rows}_rows"] = _median_ms(lambda: torch.nn.functional.linear(x, w), repeats)
        if dtype == torch.bfloat16 and bf16_kernel.available() and bf16_kernel.fits(w):
            packed = bf16_kernel.pack(w)  # what a bf16 decode runs: the drafter's head packed like the target
            out[f"ms_{rows}_rows_packed"] = _median_ms(lambda: bf16_kernel.rows_matmul(x, packed), repeats)
    return out


def _median_ms(call: Any, repeats: int) -> float:
    """Median milliseconds of ``repeats`` calls after one warm-up call."""
    times = []
    with torch.inference_mode():
        for _ in range(repeats + 1):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
    return round(sorted(times[1:])[len(times[1:]) // 2] * 1e3, 3)


def spec_bench_prompts(shared: str | Path, per_category: int) -> list[dict[str, Any]]:
    """Spec-Bench public's first ``per_category`` prompts of every category as ``messages`` rows."""
    return [{"id": r["id"], "messages": [{"role": "user", "content": r["prompt"]}]}
            for r in spec_bench(shared, per_category)]


def spec_bench_replies(model: str, shared: str | Path, data: Path, per_category: int, dtype: str,
                       max_new_tokens: int = 256) -> Path:
    """The model's greedy replies to Spec-Bench public prompts, in ``data/eval`` (resumable)."""
    out = data / EVAL_DIR / "spec_bench.jsonl"
    prompts = data / EVAL_DIR / "spec_bench_prompts.jsonl"
    write_jsonl(prompts, spec_bench_prompts(shared, per_category))
    self_distill(SelfDistillConfig(model=model, prompts=str(prompts), out=str(out), mode="replay",
                                   sampling=Sampling(temperature=0.0, max_new_tokens=max_new_tokens),
                                   batch_size=32, dtype=dtype, on_length="keep", progress=False))
    return out


def by_category(path: Path, tokenizer: Any) -> dict[str, Examples]:
    """Spec-Bench replies tokenised (labels = the reply tokens), grouped by category (the id's prefix) as
    ``sb_<category>``, plus all of them as ``spec_bench``."""
    has_template = bool(resolve_chat_template(tokenizer, None))
    groups: dict[str, Examples] = {"spec_bench": []}
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        ids, labels = encode_sample(tokenizer, *normalize(row, "auto"), has_template)
        example = {"input_ids": ids, "labels": labels}
        groups.setdefault(f"sb_{row['id'].split('-')[0]}", []).append(example)
        groups["spec_bench"].append(example)
    return groups


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.draft_coverage",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--data", default="/work/data-run", help="data_mix's output directory")
    parser.add_argument("--shared", default=os.environ.get("MEDUSA_SHARED", "../shared"))
    parser.add_argument("--model", default=str(Path.home() / ".cache/medusa/models/smollm2-135m-instruct"))
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--spec-bench-replies", type=int, default=0, metavar="N",
                        help="answer N Spec-Bench public prompts per category first (evaluation only)")
    parser.add_argument("--time", type=int, default=0, metavar="R", help="time the draft head R times")
    parser.add_argument("--shipped-map", default=None, metavar="HEADS",
                        help="also the coverage of this heads folder's (or weight file's) token_map")
    parser.add_argument("--out", default=None, help="write the report as JSON here")
    args = parser.parse_args(argv)
    from medusa.selfdistill.backends.local import load_tokenizer

    data, tok = Path(args.data), load_tokenizer(args.model)
    if args.spec_bench_replies:
        spec_bench_replies(args.model, args.shared, data, args.spec_bench_replies, args.dtype)
    train = [ex for exs in tokenized(reply_files(data / "train"), tok).values() for ex in exs]
    evals = {"held_out": [ex for exs in tokenized(reply_files(data / "heldout"), tok).values() for ex in exs]}
    sb = data / EVAL_DIR / "spec_bench.jsonl"
    if sb.is_file():
        evals.update(by_category(sb, tok))
    report = {"train_reply_tokens": int(_labels(train).ne(-100).sum()),
              "eval_reply_tokens": {k: int(_labels(v).ne(-100).sum()) for k, v in evals.items()},
              "coverage": coverage_rows(train, evals, len(tok))
              + ([shipped_map_row(Path(args.shipped_map), evals)] if args.shipped_map else []),
              "head_cost": [head_cost(n, 576, repeats=args.time, dtype=getattr(torch, args.dtype))
                            for n in SIZES]}
    text = json.dumps(report, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    from medusa.cli import run_script

    raise SystemExit(run_script(main))
