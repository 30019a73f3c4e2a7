"""vLLM serve check: our exported heads in unmodified vLLM (CPU build, its own pinned venv) on Spec-Bench.

``python -m benchmarks.serve_check [--per-category N] [--max-tokens T] [--out DIR]`` (``make serve-check``):
builds or reuses the vLLM venv (:mod:`benchmarks.vllm_env`), exports the shipped SmolLM2 MEDUSA-1 heads with
``medusa export --format vllm`` (Hydra heads have no vLLM layout: vLLM's Medusa model is ResBlocks + an LM
head per head, with no previous-token input), chat-templates Spec-Bench public prompts here (the project's
tokenizer, so both engines see the same ids) and runs vLLM's offline ``LLM`` in one worker process
(:mod:`benchmarks.vllm_worker`), batch 1 and batched: plain, our heads at every valid
``num_speculative_tokens``, vLLM's n-gram and suffix drafters. float32 throughout (vLLM otherwise runs a
float32 model as bfloat16 on CPU). Our own decoder then runs the same heads as a chain
(``[[0], [0, 0], [0, 0, 0]]``, lookup off) on the same prompts, and the per-position acceptance of the two
engines is compared (target: within 0.03). The report goes to ``OUT/report.json`` and, with ``--doc``, to
docs/results/vllm.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.vllm_env import engine_env, ensure_venv, venv_dir

HEADS = Path("data/heads/smollm2-135m-instruct/medusa1")
EXPORT = Path("out/vllm/smollm2-medusa1")  # where the README's serving commands expect the export
SPEC_BENCH = Path("../shared/data/spec_bench_public.jsonl")
WORKER = Path(__file__).with_name("vllm_worker.py")
CHAIN = [[0], [0, 0], [0, 0, 0]]


def spec_bench_prompts(path: Path, per_category: int) -> list[dict[str, Any]]:
    """The first ``per_category`` rows of each category (file order), first turn only."""
    rows, seen = [], {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        cat = row.get("category", "?")
        if seen.get(cat, 0) < per_category:
            seen[cat] = seen.get(cat, 0) + 1
            rows.append({"category": cat, "prompt": row["turns"][0]})
    return rows


def chat_ids(base: str, prompts: list[str]) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(base)
    return [list(tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                         tokenize=True, return_dict=True)["input_ids"]) for p in prompts]


def medusa_spec(export: Path, k: int) -> dict[str, Any]:
    return {"method": "medusa", "model": str(export), "num_speculative_tokens": k}


def eagle3_spec(export: Path, k: int) -> dict[str, Any]:
    """vLLM's speculative config for a ``--format speculators`` export of eagle3 heads (a chain of k)."""
    return {"method": "eagle3", "model": str(export), "num_speculative_tokens": k}


def configs(export: Path, num_heads: int, modes: list[str], method: str = "medusa") -> list[dict[str, Any]]:
    """plain, ours with every head (``method`` "eagle3": the drafter as a chain of ``num_heads``), n-gram,
    suffix, then ours at every smaller k vLLM accepts (MEDUSA: k <= n_predict; a larger k must be a multiple
    and finds no weights): the worker saves each config as it finishes."""
    spec = eagle3_spec if method == "eagle3" else medusa_spec

    def ours(k: int) -> dict[str, Any]:
        return {"name": f"{method} k={k}", "speculative_config": spec(export, k), "modes": modes}

    out = [{"name": "plain", "speculative_config": None, "modes": modes}, ours(num_heads)]
    out.append({"name": "ngram k=3", "modes": modes, "speculative_config": {
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}})
    out.append({"name": "suffix", "modes": modes, "speculative_config": {"method": "suffix"}})
    return out + [ours(k) for k in range(num_heads - 1, 0, -1)]


def run_vllm(job: dict[str, Any], work: Path, cores: str | None = None) -> dict[str, Any]:
    """One worker process (the vLLM venv's python) for every config of ``job``."""
    python = ensure_venv()
    work.mkdir(parents=True, exist_ok=True)
    (work / "job.json").write_text(json.dumps(job))
    out = work / "vllm_out.json"
    proc = subprocess.run([str(python), str(WORKER), str(work / "job.json"), str(out)],
                          env=engine_env(venv_dir(), cores=cores), capture_output=True, text=True)
    (work / "vllm_stderr.log").write_text(proc.stderr)
    if proc.returncode != 0:
        tail = " | ".join(proc.stderr.strip().splitlines()[-5:])
        raise RuntimeError(f"vLLM worker failed (exit {proc.returncode}; {work / 'vllm_stderr.log'}): {tail}")
    return json.loads(out.read_text())


def vllm_acceptance(spec: dict[str, Any]) -> dict[str, Any] | None:
    """Counters -> mean acceptance length (1 + accepted / drafts) and accepted rate per draft position."""
    drafts = spec["vllm:spec_decode_num_drafts"]
    if drafts == 0:
        return None
    per_pos = [n / drafts for n in spec["vllm:spec_decode_num_accepted_tokens_per_pos"]]
    accepted = spec["vllm:spec_decode_num_accepted_tokens"]
    return {"drafts": drafts, "mean_acceptance_length": 1 + accepted / drafts, "per_position": per_pos}


def our_chain_acceptance(heads: Path, base: str, prompts: list[list[int]], max_tokens: int,
                         depth: int = 3, ignore_eos: bool = True) -> dict[str, Any]:
    """Our decoder with the heads as a chain of ``depth`` (lookup off; eagle3 heads: a drafted chain,
    branch 1), float32, greedy: per-position acceptance over all steps, the tokens per prompt.
    ``ignore_eos`` as vLLM's: every prompt writes ``max_tokens`` (vLLM counts drafts its last step accepts
    past an EOS, which would skew the comparison)."""
    import torch

    from medusa import MedusaModel, MedusaTree
    from medusa.tree import DraftTreeShape

    model = MedusaModel.from_pretrained(str(heads), base_model=base)
    model.base_model.float()
    model.heads.float()
    tree = (DraftTreeShape(depth + 1, depth, 1, 1) if model.config.head_type == "eagle3"
            else MedusaTree.from_choices(CHAIN[:depth], num_heads=model.config.num_heads))
    eos = [] if ignore_eos else model.base_model.generation_config.eos_token_id
    steps, accepted, tokens = 0, [0] * depth, []
    with torch.no_grad():
        for ids in prompts:
            x = torch.tensor([ids])
            out = model.generate(x, max_new_tokens=max_tokens, tree=tree, eos_token_id=eos,
                                 return_dict_in_generate=True)
            tokens.append(out.sequences[0, len(ids):].tolist())
            gains = [int(g) for g in out.accept_lengths[0]]
            steps += len(gains)
            for g in gains:
                for i in range(min(g - 1, depth)):
                    accepted[i] += 1
    return {"steps": steps, "mean_acceptance_length": 1 + sum(accepted) / max(steps, 1),
            "per_position": [a / max(steps, 1) for a in accepted], "tokens": tokens}


def summarise(vllm: dict[str, Any], prompts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (config, mode): tokens/s, acceptance, and how many greedy outputs equal plain's."""
    plain = {run["mode"]: run["tokens"] for cfg in vllm["configs"] if cfg["name"] == "plain"
             for run in cfg["runs"]}
    rows = []
    for cfg in vllm["configs"]:
        if cfg.get("error"):
            rows.append({"config": cfg["name"], "mode": "-", "error": cfg["error"]})
        for run in cfg["runs"]:
            ref = plain.get("batch1") or plain.get(run["mode"])
            same = sum(a == b for a, b in zip(run["tokens"], ref)) if ref else None
            n_tokens = sum(len(t) for t in run["tokens"])
            rows.append({"config": cfg["name"], "mode": run["mode"], "prompts": len(prompts),
                         "tokens": n_tokens, "tokens_per_s": n_tokens / run["seconds"],
                         "identical_to_plain": same, "acceptance": vllm_acceptance(run["spec"]),
                         "engine_start_s": cfg["engine_start_seconds"]})
    return rows


def markdown(rows: list[dict[str, Any]], ours: dict[str, Any] | None) -> str:
    lines = ["| config | mode | tokens/s | mean acceptance length | accepted at pos 1 / 2 / 3 "
             "| greedy = plain |",
             "|---|---|---:|---:|---|---:|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['config']} | failed: {r['error'][:100]} | | | | |")
            continue
        acc = r["acceptance"]
        mal = f"{acc['mean_acceptance_length']:.3f}" if acc else "-"
        pos = " / ".join(f"{p:.3f}" for p in acc["per_position"]) if acc else "-"
        same = f"{r['identical_to_plain']}/{r['prompts']}"
        lines.append(f"| {r['config']} | {r['mode']} | {r['tokens_per_s']:.1f} | {mal} | {pos} | {same} |")
    if ours is not None:
        pos = " / ".join(f"{p:.3f}" for p in ours["per_position"])
        lines.append(f"| ours, chain [[0],[0,0],[0,0,0]] | batch1 | - | "
                     f"{ours['mean_acceptance_length']:.3f} | {pos} | "
                     f"{ours['identical_to_plain']}/{len(ours['tokens'])} |")
    return "\n".join(lines) + "\n"


def agreement(rows: list[dict[str, Any]], ours: dict[str, Any], k: int,
              method: str = "medusa") -> float | None:
    """Largest per-position gap between vLLM's ``{method} k=k`` batch-1 run and our chain of depth k."""
    run = next((r for r in rows if r["config"] == f"{method} k={k}" and r["mode"] == "batch1"), None)
    if run is None or run["acceptance"] is None:
        return None
    return max(abs(a - b) for a, b in zip(run["acceptance"]["per_position"], ours["per_position"]))


def export_heads(heads: Path, out: Path, format: str = "vllm") -> dict[str, Any]:
    """``medusa export --format vllm`` (MEDUSA heads) or ``--format speculators`` (eagle3 heads)."""
    from medusa.export import export_checkpoint

    return export_checkpoint(heads, out, format, overwrite=True)


def write_report(out: Path, summary: dict[str, Any], prompts: list[dict[str, Any]], vllm: dict[str, Any],
                 ours: dict[str, Any] | None, max_tokens: int) -> str:
    """report.json + table.md under ``out`` (from every config the worker finished); returns the table."""
    rows = summarise(vllm, prompts)
    if ours is not None:
        plain = next(r["tokens"] for c in vllm["configs"] if c["name"] == "plain" for r in c["runs"]
                     if r["mode"] == "batch1")
        ours["identical_to_plain"] = sum(a == b for a, b in zip(ours["tokens"], plain))
        method = summary.get("method", "medusa")
        ours["max_gap_vs_vllm_k3"] = agreement(rows, ours, summary["num_heads"], method)
    report = {"commands": summary["commands"], "export": summary["out"], "backbone": summary["backbone"],
              "prompts": len(prompts), "max_tokens": max_tokens, "rows": rows,
              "ours": {k: v for k, v in (ours or {}).items() if k != "tokens"}}
    (out / "report.json").write_text(json.dumps(report, indent=2))
    table = markdown(rows, ours)
    gap = (ours or {}).get("max_gap_vs_vllm_k3")
    if gap is not None:
        k = f"{summary.get('method', 'medusa')} k={summary['num_heads']}"
        table += f"\nlargest per-position gap, vLLM {k} vs our chain: {gap:.4f}\n"
    (out / "table.md").write_text(table)
    return table


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", type=Path, default=HEADS)
    ap.add_argument("--prompts", type=Path, default=SPEC_BENCH)
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--out", type=Path, default=Path("out/serve_check"))
    ap.add_argument("--export", type=Path, default=EXPORT, help="where the vLLM export is written")
    ap.add_argument("--modes", default="batch1,batched")
    ap.add_argument("--only", default=None, help="comma-separated config names to run (default: all)")
    ap.add_argument("--cores", default=None, help="VLLM_CPU_OMP_THREADS_BIND (default: this process's)")
    ap.add_argument("--stop-at-eos", action="store_true",
                    help="stop at EOS (default: ignore it: every run writes --max-tokens, as medusa bench)")
    ap.add_argument("--no-ours", action="store_true", help="skip our decoder's chain-mode acceptance")
    ap.add_argument("--report-only", action="store_true",
                    help="rebuild the report from OUT's files (the configs finished so far); no export")
    ap.add_argument("--eagle3-k", type=int, default=3, help="eagle3 heads: the chain vLLM drafts (default 3)")
    args = ap.parse_args(argv)
    head_type = json.loads((args.heads / "medusa_config.json").read_text())["head_type"]
    method, fmt = ("eagle3", "speculators") if head_type == "eagle3" else ("medusa", "vllm")
    summary_file = args.out / "export.json"
    if args.report_only and summary_file.is_file():
        summary = json.loads(summary_file.read_text())
    elif args.report_only:  # a run from before export.json was written: the summary of a throwaway export
        with tempfile.TemporaryDirectory() as tmp:
            summary = export_heads(args.heads, Path(tmp) / "export")
    else:
        summary = export_heads(args.heads, args.export, fmt)
        if method == "eagle3":  # the drafter is compared as a chain of k, not its unrolled training steps
            summary["num_heads"] = args.eagle3_k
        summary["method"] = method
        args.out.mkdir(parents=True, exist_ok=True)
        summary_file.write_text(json.dumps(summary))
    base = summary["backbone"]
    prompts = spec_bench_prompts(args.prompts, args.per_category)
    ids = chat_ids(base, [p["prompt"] for p in prompts])
    job = {"model": base, "dtype": "float32", "max_tokens": args.max_tokens, "prompts": ids,
           "ignore_eos": not args.stop_at_eos,
           "engine": {"enforce_eager": True, "max_model_len": 2048, "max_num_seqs": len(ids)},
           "configs": [c for c in configs(args.export, summary["num_heads"], args.modes.split(","), method)
                       if args.only is None or c["name"] in args.only.split(",")]}
    args.out.mkdir(parents=True, exist_ok=True)
    ours_file = args.out / "ours.json"
    if args.report_only:
        vllm = json.loads((args.out / "vllm_out.json").read_text())
        ours = json.loads(ours_file.read_text()) if ours_file.is_file() else None
    else:
        ours = None
        if not args.no_ours:  # first: the comparison is the point; the worker saves configs one by one
            ours = our_chain_acceptance(args.heads, base, ids, args.max_tokens, depth=summary["num_heads"],
                                        ignore_eos=not args.stop_at_eos)
            ours_file.write_text(json.dumps(ours))
        vllm = run_vllm(job, args.out, cores=args.cores)
    print(write_report(args.out, summary, prompts, vllm, ours, args.max_tokens))
    return 0


if __name__ == "__main__":
    from medusa.cli import run_script

    sys.exit(run_script(main))
