"""llama.cpp serve check: our EAGLE-3 drafter (``medusa export --format gguf``) in the pinned prebuilt
``llama-server`` (:mod:`benchmarks.llama_cpp_env`) beside plain decoding and llama.cpp's n-gram modes.

``python -m benchmarks.llama_cpp_check [--per-category N] [--max-tokens T] [--precisions f32,bf16,q4_1]
[--k K] [--cpu CORE] [--out DIR]`` (``make serve-check``; ``make llama-cpp-rows``: the table of
docs/results/llama-cpp.md): exports the shipped SmolLM2 drafter, converts the base at each target precision
(f32 / bf16: llama.cpp's converter; q4_1: ``medusa export --with-base``, see :func:`target_gguf`), the
drafter at f32 beside the f32 target and at bf16 beside bf16 / q4_1 (:func:`draft_precision_for`),
chat-templates Spec-Bench public prompts here (the project's tokenizer, so every engine sees the same ids) and
serves them one at a time, greedy, one thread: plain, ``ngram-mod``, ``ngram-simple`` and our drafter as a
chain of k drafts (default: the depth of the
tree our calibration chose, and 3). Each config gets a server of its own, started and stopped. Rows:
tokens/s (median over prompts of the server's ``predicted_per_second``, total tokens / total decode
time, and total tokens / total prefill and decode time), the share of drafted tokens accepted, acceptance
per draft position (from the server's log), greedy
text equal to plain. Our decoder then runs the same drafter as a chain of k (float32, branch 1, lookup off)
on the same prompts, and the per-position acceptance is compared with llama.cpp's at f32.
Writes ``OUT/report.json`` and ``OUT/table.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from benchmarks.llama_cpp_env import convert_target, ensure_venv
from benchmarks.llama_cpp_server import LlamaServer, ServerConfig, per_position
from benchmarks.serve_check import SPEC_BENCH, chat_ids, our_chain_acceptance, spec_bench_prompts

HEADS = Path("data/heads/smollm2-135m-instruct/eagle3")
NGRAM_MODES = ("ngram-mod", "ngram-simple")


def calibrated_depth(heads: Path) -> int | None:
    """The depth of the draft tree our calibration chose (tree.json), i.e. the drafts on its longest path."""
    tree = heads / "tree.json"
    return int(json.loads(tree.read_text())["depth"]) if tree.is_file() else None


def server_configs(draft: Path, ks: list[int], p_mins: list[float] | None = None) -> list[ServerConfig]:
    """plain, the n-gram modes, our drafter as a chain of k for each k and each p-min (0: every step drafts
    k; above 0 llama.cpp ends the chain at the first draft the drafter gives less than p-min)."""
    out = [ServerConfig("plain")]
    out += [ServerConfig(mode, mode, draft_n_max=None) for mode in NGRAM_MODES]
    return out + [ServerConfig(config_name(k, p), "draft-eagle3", draft, k, p_min=p)
                  for k in ks for p in (p_mins or [0.0])]


def p_min_list(text: str) -> list[float]:
    """``--p-min 0,0.5``: probabilities in [0, 1]."""
    try:
        values = [float(p) for p in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated probabilities, e.g. 0,0.5") from None
    if not all(0.0 <= v <= 1.0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: each p-min must lie in [0, 1]")
    return values


def config_name(k: int, p_min: float) -> str:
    return f"eagle3 k={k}" + (f" p={p_min:g}" if p_min > 0 else "")


def draft_precision_for(target: str) -> str:
    """Our drafter's GGUF precision beside a target at ``target``: f32 beside f32 (the acceptance check
    against our float32 chain), bf16 beside bf16 / q4_1 (half the bytes of an f32 drafter per pass)."""
    return "f32" if target == "f32" else "bf16"


def target_gguf(heads: Path, base: str, precision: str, out: Path) -> Path:
    """The target at ``precision``: f32 / bf16 (any of the converter's outtypes) from llama.cpp's own
    converter; q4_1 from ``medusa export --format gguf --with-base --base-precision q4_1`` (llama-quantize's
    Q4_1 mix; for SmolLM2, tensor for tensor the GGUF it was published as)."""
    if precision == "q4_1":
        from medusa.export import export_checkpoint

        folder = out / "export-q4_1"
        if not (folder / "base-q4_1.gguf").is_file():
            export_checkpoint(heads, folder, "gguf", base=base, overwrite=True, base_precision="q4_1")
        return folder / "base-q4_1.gguf"
    return convert_target(base, precision, out / f"target-{precision}.gguf")


def run_config(model: Path, cfg: ServerConfig, ids: list[list[int]], max_tokens: int, log: Path,
               cpu: str | None) -> dict[str, Any]:
    """One server for ``cfg``: every prompt in turn; per-prompt results and the drafter's totals."""
    with LlamaServer(model, cfg, log, cpu=cpu) as server:
        runs = [server.complete(p, max_tokens) for p in ids]
    return {"name": cfg.name, "runs": runs, "totals": per_position(log.read_text(errors="replace"))}


def summarise(result: dict[str, Any], plain: list[list[int]] | None) -> dict[str, Any]:
    runs = result["runs"]
    tokens = sum(len(r["tokens"]) for r in runs)
    seconds = sum(r["seconds"] for r in runs)
    with_prefill = seconds + sum(r.get("prompt_seconds", 0.0) for r in runs)
    drafted = sum(r["draft_n"] for r in runs)
    accepted = sum(r["draft_n_accepted"] for r in runs)
    totals = result.get("totals")
    return {"config": result["name"], "prompts": len(runs), "tokens": tokens,
            "tokens_per_s_median": statistics.median(r["predicted_per_second"] for r in runs),
            "tokens_per_s_total": tokens / seconds if seconds else None,
            "tokens_per_s_end_to_end": tokens / with_prefill if with_prefill else None,
            "drafted": drafted, "accepted": accepted, "accept_share": accepted / drafted if drafted else None,
            "steps": totals["steps"] if totals else None,
            "per_position": totals["per_position"] if totals else None,
            "identical_to_plain": (sum(r["tokens"] == p for r, p in zip(runs, plain)) if plain is not None
                                   else None)}


def run_precision(target: Path, draft: Path, ks: list[int], ids: list[list[int]], max_tokens: int,
                  work: Path, cpu: str | None, only: list[str] | None,
                  p_mins: list[float] | None = None) -> list[dict[str, Any]]:
    rows, plain = [], None
    for cfg in server_configs(draft, ks, p_mins):
        if only and cfg.name not in only and cfg.name != "plain":
            continue
        result = run_config(target, cfg, ids, max_tokens, work / f"{cfg.name.replace(' ', '_')}.log", cpu)
        if cfg.name == "plain":
            plain = [r["tokens"] for r in result["runs"]]
            (work / "plain_tokens.json").write_text(json.dumps(plain))
        rows.append(summarise(result, plain))
        (work / "rows.json").write_text(json.dumps(rows, indent=2))
        print(json.dumps(rows[-1]), flush=True)
    return rows


def agreement(rows: list[dict[str, Any]], ours: dict[str, Any], k: int) -> float | None:
    """Largest per-position gap between llama.cpp's ``eagle3 k=k`` row and our chain of k."""
    row = next((r for r in rows if r["config"] == f"eagle3 k={k}"), None)
    if row is None or not row["per_position"]:
        return None
    theirs = row["per_position"] + [0.0] * (k - len(row["per_position"]))
    return max(abs(a - b) for a, b in zip(theirs, ours["per_position"]))


def markdown(table: dict[str, list[dict[str, Any]]], ours: dict[int, dict[str, Any]]) -> str:
    lines = ["| target | config | tokens/s (median) | vs plain | tokens/s (total) | drafts accepted "
             "| accepted per position | greedy = plain |", "|---|---|---:|---:|---:|---:|---|---:|"]
    for precision, rows in table.items():
        plain = next((r["tokens_per_s_median"] for r in rows if r["config"] == "plain"), None)
        for r in rows:
            ratio = f"{r['tokens_per_s_median'] / plain:.2f}x" if plain else "-"
            share = f"{r['accept_share']:.3f}" if r["accept_share"] is not None else "-"
            chain = r["config"].startswith("eagle3") and r["per_position"]  # n-gram drafts vary in length
            pos = " / ".join(f"{p:.3f}" for p in r["per_position"]) if chain else "-"
            same = f"{r['identical_to_plain']}/{r['prompts']}"
            lines.append(f"| {precision} | {r['config']} | {r['tokens_per_s_median']:.1f} | {ratio} | "
                         f"{r['tokens_per_s_total']:.1f} | {share} | {pos} | {same} |")
    for k, o in ours.items():
        pos = " / ".join(f"{p:.3f}" for p in o["per_position"])
        gap = o.get("max_gap_vs_llama_cpp_f32")
        gap_text = f" (largest gap to llama.cpp f32: {gap:.4f})" if gap is not None else ""
        lines.append(f"| f32 (ours) | our chain of {k} | - | - | - | {o['accept_share']:.3f} | "
                     f"{pos}{gap_text} | {o['identical_to_plain']}/{len(o['tokens'])} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", type=Path, default=HEADS)
    ap.add_argument("--prompts", type=Path, default=SPEC_BENCH)
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--precisions", default="f32,bf16,q4_1")
    ap.add_argument("--k", type=int, action="append", default=None,
                    help="drafts per step for our drafter (repeatable; default: the calibrated depth, and 3)")
    ap.add_argument("--p-min", type=p_min_list, default=[0.0],
                    help="comma-separated --spec-draft-p-min values for our drafter's rows "
                         "(default 0: fixed k)")
    ap.add_argument("--cpu", default=None, help="taskset core list for the server (default: none)")
    ap.add_argument("--only", default=None, help="comma-separated config names besides plain")
    ap.add_argument("--no-ours", action="store_true", help="skip our decoder's chain acceptance")
    ap.add_argument("--out", type=Path, default=Path("out/llama_cpp"))
    args = ap.parse_args(argv)
    from medusa.export import export_checkpoint

    ensure_venv()
    drafts, summary = {}, None
    for precision in args.precisions.split(","):  # beside each target, the drafter at draft_precision_for it
        dp = draft_precision_for(precision)
        if dp not in drafts:
            summary = export_checkpoint(args.heads, args.out / f"export-{dp}", "gguf", overwrite=True,
                                        draft_precision=dp)
            drafts[dp] = Path(summary["out"]) / "draft.gguf"
    base = summary["backbone"]
    depth = calibrated_depth(args.heads)
    ks = args.k or sorted({k for k in (depth, 3) if k})
    prompts = spec_bench_prompts(args.prompts, args.per_category)
    ids = chat_ids(base, [p["prompt"] for p in prompts])
    only = args.only.split(",") if args.only else None
    p_mins = args.p_min
    table = {}
    for precision in args.precisions.split(","):
        target = target_gguf(args.heads, base, precision, args.out)
        work = args.out / precision
        work.mkdir(parents=True, exist_ok=True)
        table[precision] = run_precision(target, drafts[draft_precision_for(precision)], ks, ids,
                                         args.max_tokens, work, args.cpu, only, p_mins)
    ours: dict[int, dict[str, Any]] = {}
    if not args.no_ours:
        plain_f32 = json.loads((args.out / "f32" / "plain_tokens.json").read_text()) \
            if (args.out / "f32" / "plain_tokens.json").is_file() else None
        for k in ks:
            o = our_chain_acceptance(args.heads, base, ids, args.max_tokens, depth=k)
            o["accept_share"] = sum(o["per_position"]) / k
            o["identical_to_plain"] = sum(a == b for a, b in zip(o["tokens"], plain_f32 or []))
            o["max_gap_vs_llama_cpp_f32"] = agreement(table.get("f32", []), o, k)
            ours[k] = o
    report = {"commands": [" ".join(["python -m benchmarks.llama_cpp_check", *(argv or sys.argv[1:])])],
              "exports": {dp: str(d.parent) for dp, d in drafts.items()},
              "draft_precision": {p: draft_precision_for(p) for p in table},
              "backbone": base, "prompts": len(prompts),
              "max_tokens": args.max_tokens,
              "ks": ks, "calibrated_depth": depth, "rows": table,
              "ours": {k: {n: v for n, v in o.items() if n != "tokens"} for k, o in ours.items()}}
    (args.out / "report.json").write_text(json.dumps(report, indent=2))
    text = markdown(table, ours) + "\nOur drafter's GGUF: " + ", ".join(
        f"{draft_precision_for(p)} beside the {p} target" for p in table) + ".\n"
    (args.out / "table.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    from medusa.cli import run_script

    raise SystemExit(run_script(main))
