"""Resumable pipeline stages shared by ``medusa demo`` and the benchmarks: self-distil, train, calibrate,
export, bench. Each stage writes its outputs, then a marker (``<root>/.stages/<name>.json`` with the
stage's summary and timing); a re-run finds the marker and reuses the stage. A stage that raises leaves no
marker and surfaces as a one-line :class:`MedusaError` naming the stage.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from medusa.calibrate.calibrate import calibrate
from medusa.calibrate.full_vocab import draft_vs_full_vocab
from medusa.calibrate.plot import plot_accuracy
from medusa.config import load_recipe
from medusa.data import load_tokenized
from medusa.errors import MedusaError
from medusa.eval.bench import bench
from medusa.eval.report import write_report
from medusa.export import export_checkpoint
from medusa.io import atomic_directory, atomic_write_text
from medusa.modeling.config import TREE_NAME
from medusa.modeling.loading import load_for_generation
from medusa.selfdistill import Sampling, SelfDistillConfig, self_distill
from medusa.training.loop import train
from medusa.tree import MedusaTree


class StageError(MedusaError):
    """A pipeline stage failed; the message names the stage and the cause."""


def chat_model_parser(prog: str, description: str, settings: Any) -> argparse.ArgumentParser:
    """The arguments every real-model pipeline takes (``--out``, ``--shared``, ``--cache``), defaults from
    its ``settings`` dataclass."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--out", default=settings.out)
    parser.add_argument("--shared", default=settings.shared, help="the shared assets directory")
    parser.add_argument("--cache", default=None,
                        help="converted-model cache (default ~/.cache/medusa/models)")
    return parser


def marker_path(root: str | Path, name: str) -> Path:
    return Path(root) / ".stages" / f"{name}.json"


def run_stage(root: str | Path, name: str, fn: Callable[[], dict[str, Any]],
              log: Callable[[str], None] = print, force: bool = False) -> dict[str, Any]:
    """Run ``fn`` unless its marker exists; returns the stage summary (``seconds`` and ``reused`` added)."""
    marker = marker_path(root, name)
    if marker.is_file() and not force:
        summary = json.loads(marker.read_text())
        log(f"[{name}] reusing the finished stage ({marker}; took {summary.get('seconds', 0):.0f}s)")
        return {**summary, "reused": True}
    log(f"[{name}] running")
    t0 = time.perf_counter()
    try:
        summary = dict(fn() or {})
    except StageError:
        raise
    except MedusaError as exc:
        raise StageError(f"stage '{name}' failed: {exc}") from exc
    except Exception as exc:  # a bug or an environment problem: keep the cause on one line, --debug for more
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise StageError(f"stage '{name}' failed: {type(exc).__name__}: {first} (re-run with --debug for the "
                         "traceback; finished stages are reused)") from exc
    summary["seconds"] = round(time.perf_counter() - t0, 2)
    atomic_write_text(marker, json.dumps(summary, indent=2, default=str) + "\n")
    log(f"[{name}] done in {summary['seconds']:.0f}s")
    return {**summary, "reused": False}


@contextlib.contextmanager
def hf_progress_bars(enabled: bool) -> Iterator[None]:
    """Run the body with transformers' own progress bars (``Loading weights``...) off unless ``enabled``;
    the previous setting is restored."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    if not enabled:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was and not enabled:
            hf_logging.enable_progress_bar()


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run the body with ``torch.set_num_threads(n)`` (None: unchanged), restoring the previous count.

    Timing stages of the tiny models here use 1 thread: on a small CPU shared with other work, a second
    intra-op thread spins on a busy core and makes each forward 5-50x slower and erratic."""
    import torch

    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def write_jsonl(path: str | Path, rows: Sequence[dict[str, Any]]) -> Path:
    path = Path(path)
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return path


def concat_jsonl(out: str | Path, sources: Sequence[str | Path]) -> Path:
    text = "".join(Path(s).read_text(encoding="utf-8") for s in sources)
    atomic_write_text(out, text)
    return Path(out)


# ---------------------------------------------------------------------------------------- stages
def distill(model_path: str, prompts: str | Path, out: str | Path, max_new_tokens: int,
            temperature: float = 0.0,
            num_samples: int = 1, batch_size: int = 64, seed: int = 0, progress: bool = True,
            model: Any = None, tokenizer: Any = None) -> dict[str, Any]:
    """Completion-mode self-distillation with the local backend (``{"prompt", "completion"}`` rows)."""

    cfg = SelfDistillConfig(model=model_path, prompts=str(prompts), out=str(out), mode="completion",
                            prompt_format="prompt",
                            sampling=Sampling(temperature=temperature, top_p=1.0,
                                              max_new_tokens=max_new_tokens, seed=seed),
                            num_samples=num_samples, batch_size=batch_size, on_length="keep",
                            progress=progress)
    return _self_distill(cfg, model, tokenizer)


def distill_chat(model_path: str, prompts: str | Path, out: str | Path, max_new_tokens: int,
                 prompt_format: str = "auto", limit: int | None = None, batch_size: int = 32,
                 device: str | None = None, progress: bool = True) -> dict[str, Any]:
    """Replay-mode self-distillation, greedy, through the model's chat template: the model answers each
    conversation's first user turn (``{"messages": [...]}`` rows); a reply cut at the budget is kept."""

    cfg = SelfDistillConfig(model=model_path, prompts=str(prompts), out=str(out), mode="replay",
                            prompt_format=prompt_format, limit=limit, turns=1,
                            sampling=Sampling(temperature=0.0, top_p=1.0,
                                              max_new_tokens=max_new_tokens, seed=0),
                            batch_size=batch_size, device=device, on_length="keep", progress=progress)
    return _self_distill(cfg)


def distill_synthesized(model_path: str, out: str | Path, count: int, max_new_tokens: int,
                        batch_size: int = 32, device: str | None = None,
                        progress: bool = True) -> dict[str, Any]:
    """``medusa self-distill --synthesize-prompts N``: the model writes ``count`` user requests (kept in
    ``<out>.prompts.jsonl``) and answers them greedily; a reply cut at the budget is kept."""

    cfg = SelfDistillConfig(model=model_path, prompts=None, out=str(out), mode="replay", turns=1,
                            synthesize_prompts=count,
                            sampling=Sampling(temperature=0.0, top_p=1.0, max_new_tokens=max_new_tokens,
                                              seed=0),
                            batch_size=batch_size, device=device, on_length="keep", progress=progress)
    return _self_distill(cfg)


def _self_distill(cfg: Any, model: Any = None, tokenizer: Any = None) -> dict[str, Any]:
    """Run a self-distillation config; an output with no row at all is a stage error."""

    s = self_distill(cfg, model=model, tokenizer=tokenizer)
    if s["written"] + s["already_done"] == 0:
        raise MedusaError(f"{cfg.out}: self-distillation wrote no rows (see {s['errors_file']})")
    return {k: s[k] for k in ("out", "prompts", "written", "already_done", "errors", "completion_tokens",
                              "tokens_per_s") if k in s}


def train_recipe(recipe_path: str | Path, overrides: Sequence[str], progress: bool = True) -> dict[str, Any]:
    """``medusa train RECIPE key=value...`` in-process (``progress=False``: no progress bar); returns the
    final directory and last metrics."""

    recipe = load_recipe(recipe_path, list(overrides))
    result = train(recipe, progress=progress, overwrite=True)  # the pipeline's own output_dir
    if result.final_dir is None:
        raise MedusaError(f"{recipe_path}: training stopped before its last step")
    last = {k: v for k, v in (result.eval_metrics or result.last_metrics or {}).items()
            if isinstance(v, (int, float)) and ("top1" in k or "loss" in k or k == "step")}
    return {"final_dir": str(result.final_dir), "steps": result.global_step, "metrics": last,
            "recipe": str(recipe_path), "overrides": list(overrides)}


def calibrate_stage(heads_dir: str | Path, final_dir: str | Path, data: str | Path, nodes: int | str = "auto",
                    max_length: int = 512, progress: bool = True) -> dict[str, Any]:
    """Copy the trained heads to ``final_dir`` with a calibrated ``tree.json`` (+ plots), atomically.

    ``nodes="auto"``: the size (<= 64 nodes) with the most predicted tokens/s, as
    ``medusa calibrate --nodes auto`` chooses it (:func:`medusa.calibrate.auto.choose_size`)."""

    model, tokenizer = load_for_generation(str(heads_dir))
    examples = load_tokenized(str(data), tokenizer, max_length=max_length).examples
    tree = calibrate(model, examples, nodes=nodes if nodes == "auto" else int(nodes), data_name=str(data),
                     progress=progress)
    with atomic_directory(final_dir, overwrite=True) as tmp:  # the stage's own directory
        for item in Path(heads_dir).iterdir():  # everything, MEDUSA-2's merged base_model/ too
            if item.is_dir():
                shutil.copytree(item, tmp / item.name)
            elif item.name != TREE_NAME:
                shutil.copy2(item, tmp / item.name)
        tree.to_json(tmp / TREE_NAME)
        plot_accuracy(tree.calibration["accuracy"], tmp / "calibration_accuracy.png")
    cal = tree.calibration
    return {"final_dir": str(final_dir), "nodes": len(tree), "depth": tree.depth,
            "top1": cal["top1"], "expected_tokens_per_step": cal["expected_tokens_per_step"],
            "position_mean_tokens_per_step": cal.get("position_mean_tokens_per_step"),
            "auto": cal.get("auto"), "num_positions": cal["num_positions"],
            "draft_vocab_loss": cal.get("draft_vocab_loss")}


def full_vocab_twin_stage(calibrated: dict[str, Any], data: str | Path, max_length: int = 512,
                          progress: bool = True) -> dict[str, Any]:
    """Draft-vocabulary shared-LM-head heads against their full-vocabulary twin at the node count the
    ``calibrate`` stage's summary (``calibrated``, on the same ``data``) chose; the twin is calibrated here
    (:func:`medusa.calibrate.full_vocab.draft_vs_full_vocab`)."""
    model, tokenizer = load_for_generation(str(calibrated["final_dir"]))
    examples = load_tokenized(str(data), tokenizer, max_length=max_length).examples
    return draft_vs_full_vocab(model, examples, int(calibrated["nodes"]), progress=progress, draft=calibrated)


def export_stage(heads_dir: str | Path, out: str | Path, format: str = "vllm") -> dict[str, Any]:

    return export_checkpoint(str(heads_dir), str(out), format, overwrite=True)  # the stage's own directory


def compare_lookup_tokens(heads: str | Path, default: int) -> int:
    """L of the lookup-alone and hybrid benchmark rows: the heads' tree.json ``lookup_tokens`` when > 0,
    else ``default``."""
    path = Path(heads) / TREE_NAME
    calibrated = MedusaTree.from_json(path).lookup_tokens if path.is_file() else 0
    return calibrated if calibrated > 0 else default


def bench_stage(heads_dir: str | Path, prompts: Sequence[str], report_path: str | Path, max_new_tokens: int,
                repeats: int = 1, progress: bool = True, **kwargs: Any) -> dict[str, Any]:

    model, tokenizer = load_for_generation(str(heads_dir))
    report = bench(model, tokenizer, list(prompts), max_new_tokens=max_new_tokens, repeats=repeats,
                   progress=progress, **kwargs)
    report["config"]["heads"] = str(Path(heads_dir).resolve())
    files = write_report(report, report_path)
    keys = ("baseline_tokens_per_s", "medusa_tokens_per_s", "speedup", "tokens_per_step", "overhead",
            "greedy_exact_match", "medusa_step_ms", "plain_step_ms", "hf_step_ms", "prompts")
    optional = {k: report[k] for k in ("categories", "prompt_lookup", "assisted", "lookup_alone", "hybrid")
                if k in report}
    return {**{k: report[k] for k in keys}, **optional, "files": [str(f) for f in files]}


# ---------------------------------------------------------------------------------------- head types
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

__all__ = ["StageError", "add_common_arguments", "bench_stage", "calibrate_stage", "chat_model_parser",
           "concat_jsonl",
           "distill", "distill_chat", "distill_synthesized", "export_stage", "format_head_types",
           "head_type_rows", "marker_path",
           "run_main", "run_pipeline", "run_stage", "train_recipe", "write_jsonl"]
