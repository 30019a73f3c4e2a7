"""Our decoder beside llama.cpp on the same prompts, core and weight precision (what a CPU user compares).

``taskset -c CORE python -m benchmarks.cpu_engines [--heads DIR] [--per-category 1] [--max-tokens 128]
[--llama-configs "ngram-mod,ngram-simple,eagle3 k=3 p=0.7"] [--draft-precision q8_0|bf16|f32] [--cpu CORE]
[--out DIR]``: the first
``--per-category`` Spec-Bench public prompts of each category, chat template, greedy, EOS ignored (every
method writes ``--max-tokens`` tokens), bf16 weights, one thread. First ``medusa bench`` in this process (HF
``generate``, our plain decode, the drafter alone, with the lookup chain, the lookup chain alone, HF prompt
lookup), then llama.cpp's pinned ``llama-server`` (:mod:`benchmarks.llama_cpp_check`; plain and the configs
named; our drafter exported at ``--draft-precision``, Q8_0 by default: a 12 MB drafter beside the bf16 target,
the fastest of the three in llama.cpp) on the bf16 GGUF of the same base, one
request at a time, pinned to ``--cpu`` (give the core this
process runs on). Tokens/s is end to end for both (new tokens over prefill and decode time: our bench times
the whole call; llama.cpp's decode-only figure is printed beside it). Writes ``OUT/ours.json``,
``OUT/llama_cpp/bf16/rows.json``, ``OUT/table.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from benchmarks.llama_cpp_check import HEADS, run_precision, server_configs, target_gguf
from benchmarks.llama_cpp_env import ensure_venv
from benchmarks.serve_check import SPEC_BENCH, chat_ids, spec_bench_prompts

OURS = (("HF generate", None), ("our plain decode", "own_plain"), ("our EAGLE-3 drafter", "medusa"),
        ("our EAGLE-3 + lookup chain", "hybrid"), ("our lookup chain alone", "lookup_alone"),
        ("HF prompt lookup", "prompt_lookup"))


def our_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """``medusa bench``'s report -> one row per method: tokens/s (total new tokens / total time)."""
    rows = []
    for label, key in OURS:
        if key is None:
            tps = report["baseline_tokens_per_s"]
        elif key == "medusa":
            tps = report["medusa_tokens_per_s"]
        elif key in report:
            tps = report[key]["tokens_per_s"]
        else:
            continue
        rows.append({"engine": "medusa" if "our" in label else "transformers", "method": label,
                     "tokens_per_s": tps, "decode_tokens_per_s": None})
    return rows


def llama_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """llama_cpp_check rows -> rows of this table (end-to-end tokens/s, decode-only beside it)."""
    return [{"engine": "llama.cpp", "method": r["config"], "tokens_per_s": r["tokens_per_s_end_to_end"],
             "decode_tokens_per_s": r["tokens_per_s_total"], "identical_to_plain": r["identical_to_plain"]}
            for r in rows]


def markdown(rows: list[dict[str, Any]]) -> str:
    hf = next(r["tokens_per_s"] for r in rows if r["method"] == "HF generate")
    lc = next((r["tokens_per_s"] for r in rows if (r["engine"], r["method"]) == ("llama.cpp", "plain")), None)
    lines = ["| engine | method | tokens/s | vs HF generate | vs llama.cpp plain "
             "| llama.cpp decode-only tokens/s |", "|---|---|---:|---:|---:|---:|"]
    for r in sorted(rows, key=lambda r: -r["tokens_per_s"]):
        vs_lc = f"{r['tokens_per_s'] / lc:.2f}x" if lc else "-"
        dec = f"{r['decode_tokens_per_s']:.1f}" if r["decode_tokens_per_s"] else "-"
        lines.append(f"| {r['engine']} | {r['method']} | {r['tokens_per_s']:.1f} | "
                     f"{r['tokens_per_s'] / hf:.2f}x | {vs_lc} | {dec} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", type=Path, default=HEADS)
    ap.add_argument("--prompts", type=Path, default=SPEC_BENCH)
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--lookup", type=int, default=6, help="our lookup chain's length")
    # our drafter's row: up to 3 drafts, the chain cut at the first below p 0.7 (the fastest of k = 1-3 and
    # p-min 0-0.7 with the round-13 drafter, docs/results/cpu-engines.md)
    ap.add_argument("--llama-configs", default="ngram-mod,ngram-simple,eagle3 k=3 p=0.7",
                    help="llama.cpp configs besides plain (names as benchmarks.llama_cpp_check prints them)")
    ap.add_argument("--draft-precision", default="q8_0",
                    help="our drafter's GGUF matrices in llama.cpp: q8_0 (default), bf16 (the target's), f32")
    ap.add_argument("--cpu", default=None, help="the core llama-server is pinned to (this process's)")
    ap.add_argument("--out", type=Path, default=Path("out/cpu_engines"))
    args = ap.parse_args(argv)
    from medusa.errors import MedusaError

    wanted = [c.strip() for c in args.llama_configs.split(",") if c.strip()]
    try:
        p_mins = sorted({float(c.split("p=")[1]) for c in wanted if "p=" in c} | {0.0})
        ks = sorted({int(c.split("k=")[1].split()[0]) for c in wanted if "k=" in c})
    except (ValueError, IndexError):
        raise MedusaError(f"--llama-configs {args.llama_configs!r}: names such as 'plain', 'ngram-mod', "
                          "'eagle3 k=2', 'eagle3 k=2 p=0.5'") from None
    from medusa.export.gguf import check_draft_precision

    check_draft_precision(args.draft_precision)  # before anything runs, as --llama-configs
    known = {c.name for c in server_configs(Path("draft.gguf"), ks, p_mins)}
    unknown = [c for c in wanted if c not in known]
    if unknown:
        raise MedusaError(f"--llama-configs: unknown {', '.join(map(repr, unknown))} (known: "
                          f"{', '.join(sorted(known))})")
    from medusa.cli import main as medusa_main
    from medusa.export import export_checkpoint

    ensure_venv()
    args.out.mkdir(parents=True, exist_ok=True)
    prompts = spec_bench_prompts(args.prompts, args.per_category)
    prompt_file = args.out / "prompts.jsonl"
    prompt_file.write_text("".join(json.dumps(p) + "\n" for p in prompts))
    ours_json = args.out / "ours.json"
    code = medusa_main(["bench", "--heads", str(args.heads), "--prompts", str(prompt_file), "--chat",
                        "--dtype", "bfloat16", "--max-new-tokens", str(args.max_tokens), "--compare-lookup",
                        str(args.lookup), "--prompt-lookup", "--threads", "1", "--out", str(ours_json),
                        "--no-plots", "--overwrite"])
    if code:
        return code
    summary = export_checkpoint(args.heads, args.out / "export", "gguf", overwrite=True,
                                draft_precision=args.draft_precision)
    draft, base = Path(summary["out"]) / "draft.gguf", summary["backbone"]
    ids = chat_ids(base, [p["prompt"] for p in prompts])
    work = args.out / "llama_cpp" / "bf16"
    work.mkdir(parents=True, exist_ok=True)
    target = target_gguf(args.heads, base, "bf16", args.out / "llama_cpp")
    llama = run_precision(target, draft, ks, ids, args.max_tokens, work, args.cpu, wanted, p_mins)
    rows = our_rows(json.loads(ours_json.read_text())) + llama_rows(llama)
    text = markdown(rows)
    (args.out / "table.md").write_text(text)
    (args.out / "report.json").write_text(json.dumps(
        {"command": " ".join(["python -m benchmarks.cpu_engines", *(argv or sys.argv[1:])]),
         "prompts": len(prompts), "max_tokens": args.max_tokens, "draft_precision": args.draft_precision,
         "rows": rows}, indent=2))
    print(text)
    return 0


if __name__ == "__main__":
    from medusa.cli import run_script

    raise SystemExit(run_script(main))
