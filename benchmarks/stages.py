"""The benchmark pipelines' stages and command-line pieces, on top of ``medusa demo``'s resumable stages
(:mod:`medusa.demo.stages`, re-exported here so that a pipeline reads ``S.run_stage``, ``S.distill_chat``...):
chat / synthesized self-distillation, the full-vocabulary twin, the head-type rows, the common flags and a
pipeline's ``main``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from medusa.calibrate.full_vocab import draft_vs_full_vocab
from medusa.data import load_tokenized
from medusa.demo.stages import (  # noqa: F401  (re-exported: the stages every pipeline runs)
    StageError,
    bench_stage,
    calibrate_stage,
    distill,
    export_stage,
    hf_progress_bars,
    marker_path,
    run_self_distill,
    run_stage,
    summary_metrics,
    torch_threads,
    train_recipe,
    write_jsonl,
)
from medusa.errors import MedusaError
from medusa.eval.report import category_table
from medusa.io import atomic_write_text
from medusa.modeling.config import TREE_NAME
from medusa.modeling.loading import load_for_generation
from medusa.selfdistill import Sampling, SelfDistillConfig
from medusa.tree import MedusaTree


def chat_model_parser(prog: str, description: str, settings: Any) -> argparse.ArgumentParser:
    """The arguments every real-model pipeline takes (``--out``, ``--shared``, ``--cache``), defaults from
    its ``settings`` dataclass."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--out", default=settings.out)
    parser.add_argument("--shared", default=settings.shared, help="the shared assets directory")
    parser.add_argument("--cache", default=None,
                        help="converted-model cache (default ~/.cache/medusa/models)")
    return parser


def launch_recipe(recipe_path: str | Path, overrides: Sequence[str], processes: int,
                  progress: bool = True, resume_changed: bool = False) -> dict[str, Any]:
    """``accelerate launch --config_file configs/accelerate/cpu.yaml --num_processes N -m medusa.train RECIPE
    key=value...`` (data parallel over N CPU processes, one thread each): what :func:`train_recipe` returns,
    the last logged metrics read from the run's ``metrics.jsonl``. ``resume_changed``: a killed run resumes
    under a changed recipe (``medusa train --resume-changed``; the changes are recorded in metrics.jsonl)."""
    import json
    import os
    import subprocess
    import sys

    from medusa.config import load_recipe

    if processes < 1:
        raise MedusaError(f"--processes: {processes} is not a number of processes (>= 1)")
    recipe = load_recipe(recipe_path, list(overrides))  # a bad override fails here, before any process
    config = Path(__file__).resolve().parents[1] / "configs" / "accelerate" / "cpu.yaml"
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config),
               "--num_processes", str(processes), "--main_process_port", "0", "-m", "medusa.train",
               str(recipe_path), *overrides,
               "--overwrite", *(["--resume-changed"] if resume_changed else [])]
    env = {**os.environ, "OMP_NUM_THREADS": "1", **({} if progress else {"TQDM_DISABLE": "1"})}
    if subprocess.run(command, env=env).returncode != 0:
        raise MedusaError(f"{recipe_path}: accelerate launch of {processes} training processes failed")
    out = Path(recipe.output_dir)
    if not (out / "final").is_dir() or not (out / "metrics.jsonl").is_file():
        raise MedusaError(f"{out}: the launched training wrote no final/ or metrics.jsonl")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    last = summary_metrics(rows[-1] if rows else {})
    return {"final_dir": str(out / "final"), "steps": int(last.get("step", 0)), "metrics": last,
            "recipe": str(recipe_path), "overrides": list(overrides), "processes": processes}


def concat_jsonl(out: str | Path, sources: Sequence[str | Path]) -> Path:
    text = "".join(Path(s).read_text(encoding="utf-8") for s in sources)
    atomic_write_text(out, text)
    return Path(out)


def distill_chat(model_path: str, prompts: str | Path, out: str | Path, max_new_tokens: int,
                 prompt_format: str = "auto", limit: int | None = None, batch_size: int = 32,
                 device: str | None = None, progress: bool = True, turns: int = 1) -> dict[str, Any]:
    """Replay-mode self-distillation, greedy, through the model's chat template: the model answers each
    conversation's first ``turns`` user turns (``{"messages": [...]}`` rows); a reply cut at the budget is
    kept."""

    cfg = SelfDistillConfig(model=model_path, prompts=str(prompts), out=str(out), mode="replay",
                            prompt_format=prompt_format, limit=limit, turns=turns,
                            sampling=Sampling(temperature=0.0, top_p=1.0,
                                              max_new_tokens=max_new_tokens, seed=0),
                            batch_size=batch_size, device=device, on_length="keep", progress=progress)
    return run_self_distill(cfg)


def distill_synthesized(model_path: str, out: str | Path, count: int, max_new_tokens: int,
                        batch_size: int = 32, device: str | None = None,
                        progress: bool = True) -> dict[str, Any]:
    """``medusa self-distill --synthesize-prompts N``: the model writes ``count`` user requests (kept in
    ``<out>.prompts.jsonl``) and answers the first ``count`` of them greedily (a larger earlier run's extra
    requests wait for a later count); a reply cut at the budget is kept."""

    cfg = SelfDistillConfig(model=model_path, prompts=None, out=str(out), mode="replay", turns=1,
                            synthesize_prompts=count, limit=count,
                            sampling=Sampling(temperature=0.0, top_p=1.0, max_new_tokens=max_new_tokens,
                                              seed=0),
                            batch_size=batch_size, device=device, on_length="keep", progress=progress)
    return run_self_distill(cfg)


def full_vocab_twin_stage(calibrated: dict[str, Any], data: str | Path, max_length: int = 512,
                          progress: bool = True) -> dict[str, Any]:
    """Draft-vocabulary shared-LM-head heads against their full-vocabulary twin at the node count the
    ``calibrate`` stage's summary (``calibrated``, on the same ``data``) chose; the twin is calibrated here
    (:func:`medusa.calibrate.full_vocab.draft_vs_full_vocab`)."""
    model, tokenizer = load_for_generation(str(calibrated["final_dir"]))
    examples = load_tokenized(str(data), tokenizer, max_length=max_length).examples
    return draft_vs_full_vocab(model, examples, int(calibrated["nodes"]), progress=progress, draft=calibrated)


def compare_lookup_tokens(heads: str | Path, default: int) -> int:
    """L of the lookup-alone and hybrid benchmark rows: the heads' tree.json ``lookup_tokens`` when > 0,
    else ``default``."""
    path = Path(heads) / TREE_NAME
    calibrated = MedusaTree.from_json(path).lookup_tokens if path.is_file() else 0
    return calibrated if calibrated > 0 else default


HEAD_TYPE_TARGETS = {"hydra_over_medusa1_tokens_per_step": 1.3, "dynamic_over_static_tokens_per_step": 1.10}
ROW_KEYS = ("tokens_per_step", "speedup", "overhead", "greedy_exact_match")


def head_type_rows(benches: Sequence[tuple[str, str, int, dict[str, Any]]]) -> dict[str, Any]:
    """``summary["head_types"]`` from ``(heads, tree, nodes, bench summary)`` per benchmark, ``heads`` in
    ``medusa1`` / ``hydra`` and ``tree`` in ``static`` / ``dynamic``: one row each, the tokens/step ratios
    Hydra / MEDUSA-1 (per tree) and dynamic / static (per head type) against
    :data:`HEAD_TYPE_TARGETS`, and the (heads, tree) with the best wall-clock speedup."""
    rows = [{"heads": h, "tree": t, "nodes": int(n), **{k: b[k] for k in ROW_KEYS}} for h, t, n, b in benches]
    tps = {(r["heads"], r["tree"]): r["tokens_per_step"] for r in rows}

    def ratio(num: tuple[str, str], den: tuple[str, str], target: float) -> dict[str, Any]:
        value = tps[num] / tps[den]
        return {"measured": value, "target": target, "met": value >= target}

    section: dict[str, Any] = {"rows": rows}
    pairs = {"hydra_over_medusa1_tokens_per_step": {t: (("hydra", t), ("medusa1", t)) for t in
                                                    ("static", "dynamic")},
             "dynamic_over_static_tokens_per_step": {h: ((h, "dynamic"), (h, "static")) for h in
                                                     ("medusa1", "hydra")}}
    for key, by in pairs.items():
        section[key] = {name: ratio(num, den, HEAD_TYPE_TARGETS[key]) for name, (num, den) in by.items()
                        if num in tps and den in tps}
    best = max(rows, key=lambda r: r["speedup"])
    section["best_speedup"] = {"heads": best["heads"], "tree": best["tree"], "speedup": best["speedup"],
                               "line": f"best wall-clock speedup: {best['heads']} heads, {best['tree']} tree "
                                       f"({best['nodes']} nodes), {best['speedup']:.2f}x"}
    return section


def format_head_types(section: dict[str, Any]) -> str:
    """``summary["head_types"]`` as a small table, the ratios against their targets and the best row."""
    lines = [f"{'heads':<8} {'tree':<8} {'nodes':>5} {'tokens/step':>11} {'speedup':>8} {'overhead':>8} "
             f"{'exact':>6}"]
    for r in section["rows"]:
        lines.append(f"{r['heads']:<8} {r['tree']:<8} {r['nodes']:>5} {r['tokens_per_step']:>11.2f} "
                     f"{r['speedup']:>7.2f}x {r['overhead']:>8.2f} {_exact(r['greedy_exact_match']):>6}")
    for key in HEAD_TYPE_TARGETS:
        for name, t in section.get(key, {}).items():
            lines.append(f"{key} ({name}): {t['measured']:.2f} (target >= {t['target']}, "
                         + ("met)" if t["met"] else "missed)"))
    lines.append(section["best_speedup"]["line"])
    return "\n".join(lines)


def target_lines(targets: dict[str, dict[str, Any]]) -> list[str]:
    """One line per target: ``target KEY >= T: measured M (met)`` or ``(missed by D)``."""
    return [f"target {key} >= {t['target']}: measured {t['measured']:.2f} "
            + ("(met)" if t["met"] else f"(missed by {t['target'] - t['measured']:.2f})")
            for key, t in targets.items()]


def _exact(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def add_common_arguments(parser: Any) -> None:
    """The flags every benchmark pipeline takes: --medusa2, --no-hydra, --set, --debug, --no-progress."""
    parser.add_argument("--medusa2", action="store_true", help="also train and benchmark MEDUSA-2")
    parser.add_argument("--no-hydra", action="store_true",
                        help="skip the Hydra heads and the dynamic-tree rows (on by default)")
    parser.add_argument("--set", action="append", default=[], metavar="key=value",
                        help="MEDUSA-1 recipe override (repeatable), e.g. --set train.epochs=1")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def run_main(run: Callable[[Any], dict[str, Any]], settings: Any, describe: Callable[[dict[str, Any]], str],
             footer: str, debug: bool) -> int:
    """A benchmark's ``main``: run it, print its summary and ``footer``; a user error is one ``error:`` line
    and exit status 2 (the traceback with ``--debug`` or MEDUSA_DEBUG=1)."""
    import os
    import sys

    try:
        summary = run(settings)
    except MedusaError as exc:
        if debug or os.environ.get("MEDUSA_DEBUG") == "1":
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(describe(summary))
    print(footer)
    return 0



def run_pipeline(argv: Sequence[str] | None, parse: Callable[[Sequence[str] | None], tuple[Any, Any]],
                 run: Callable[[Any], dict[str, Any]], describe: Callable[[dict[str, Any]], str]) -> int:
    """A real-model pipeline's ``main``: parse ``argv`` into (settings, arguments), then :func:`run_main`
    with the summary file as footer."""
    settings, args = parse(argv)
    return run_main(run, settings, describe, f"summary: {Path(settings.out) / 'summary.json'}", args.debug)


def category_bench(heads: Path, rows: list[dict[str, Any]], report: Path, max_new_tokens: int,
                   **bench: Any) -> dict[str, Any]:
    """``bench_stage`` on ``rows`` (``{"prompt", "category"}``) stopping at EOS as HF does, with the report's
    per-category table under ``"table"`` (what every chat / text pipeline prints); ``bench``: the rest of
    ``bench_stage``'s options (chat, tree, compare_lookup, prompt_lookup, repeats, ...)."""
    result = bench_stage(heads, [r["prompt"] for r in rows], report, max_new_tokens, ignore_eos=False,
                         categories=[r["category"] for r in rows], **bench)
    result["table"] = category_table(json.loads(Path(report).read_text()))
    return result
