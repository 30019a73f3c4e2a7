"""The stories260K benchmark (``make bench``): ``python -m benchmarks.stories260k [--medusa2]``.

On Karpathy's stories260K (a real pretrained Llama, read from ``../shared/models/stories260K``):

1. ``prompts``: TinyStories from ``../shared/data/tinystories_sample.txt`` split by story: the last 24 are
   held out for the benchmark, the 48 before them for calibration, the rest make training prompts
   (each story's first 1..4 sentences);
2. ``distill``: the model's own completions of those prompts (greedy, plus temperature samples);
3. ``train``: MEDUSA-1 heads with ``benchmarks/recipes/stories260k_medusa1.yaml``;
4. ``calibrate``: the accuracy-ranked tree on the calibration completions, size chosen by predicted
   tokens/s among <= 64 nodes; heads + ``tree.json`` land in ``<out>/final/``;
5. ``bench``: ``medusa bench`` on the held-out prompts (greedy, exactly ``--max-new-tokens`` tokens);
   the report is ``<out>/report.json`` (+ ``report.md`` and PNG plots); when the chosen tree is smaller
   than 64 nodes, the 64-node tree (most tokens per step) is benchmarked too (``report_64nodes.json``);
6. unless ``--no-hydra``: Hydra heads (same recipe, ``heads.head_type=hydra``) calibrated at the node
   count ``calibrate`` chose (``<out>/final_hydra``), and the dynamic tree of that many nodes with either
   head type: ``report_hydra.json``, ``report_dynamic.json``, ``report_hydra_dynamic.json``; the rows side
   by side in ``summary["head_types"]`` (:mod:`benchmarks.head_types`);
7. with ``--medusa2``: MEDUSA-2 (``benchmarks/recipes/stories260k_medusa2.yaml``, LoRA, from the
   MEDUSA-1 heads) on the same data, benchmarked with the same tree; the backbone's held-out loss before and
   after.

Every stage leaves a marker in ``<out>/.stages/``; re-running reuses finished stages. Figures are
measured and written, never asserted; ``<out>/summary.json`` compares them with the targets.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks import stages as S
from benchmarks.head_types import HeadTypePlan, run_head_types
from medusa.data import load_tokenized
from medusa.data.tokenize import IGNORE_INDEX
from medusa.errors import DataError, MedusaError
from medusa.io import atomic_directory
from medusa.modeling.base import load_base_model
from medusa.modeling.config import TREE_NAME
from medusa.modeling.loading import load_for_generation

RECIPES = Path(__file__).resolve().parent / "recipes"  # package data: they travel with the wheel
TARGETS = {"tokens_per_step": 3.0, "speedup": 2.0, "greedy_exact_match": 1.0}
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+")


@dataclass
class Settings:
    out: str = "out/bench/stories260k"
    shared: str = os.environ.get("MEDUSA_SHARED", "../shared")  # the shared assets beside the checkout
    held_out: int = 24  # stories for the benchmark (the last ones of the sample)
    calib_stories: int = 48  # stories for calibration (just before the held-out ones)
    train_stories: int | None = None  # None: all the others
    max_sentences: int = 4  # training prompts: each story's first 1..max_sentences sentences
    distill_tokens: int = 256  # completion length when self-distilling
    samples: int = 6  # extra temperature samples per first-sentence prompt (0: greedy only)
    temperature: float = 0.8
    distill_batch: int = 128
    recipe: str = str(RECIPES / "stories260k_medusa1.yaml")
    recipe_overrides: tuple[str, ...] = ()
    nodes: str = "auto"  # or a number <= 64
    bench_prompts: int | None = None  # None: all held-out stories
    max_new_tokens: int = 128
    repeats: int = 2
    threads: int | None = None  # torch threads for distillation and training (None: torch's default)
    timing_threads: int | None = 1  # torch threads while timing (calibration --nodes auto, bench)
    hydra: bool = True  # Hydra heads and dynamic-tree rows beside MEDUSA-1 (--no-hydra: off)
    medusa2: bool = False
    medusa2_recipe: str = str(RECIPES / "stories260k_medusa2.yaml")
    medusa2_overrides: tuple[str, ...] = ()
    progress: bool = True


def stories(shared: str | Path) -> list[str]:
    path = Path(shared) / "data" / "tinystories_sample.txt"
    if not path.is_file():
        raise DataError(f"{path}: not found (the shared assets live at ../shared beside the project; "
                        "give --shared DIR)")
    text = path.read_text(encoding="utf-8")
    return [s.strip() for s in text.split("\n\n") if len(s.split()) > 12]


def sentence_prefixes(story: str, n: int) -> list[str]:
    """The story's first 1..n sentences (fewer when it is shorter; the whole story is never a prompt)."""
    ends = [m.end() for m in _SENTENCE_END.finditer(story)]
    return [story[:e].rstrip() for e in ends[:n]]


def split_prompts(s: Settings) -> dict[str, list[dict[str, str]]]:
    """Prompt rows per split: ``train`` (1..max_sentences sentences), ``sample`` (first sentence, for the
    temperature samples), ``calib`` and ``bench`` (first sentence of their stories)."""
    all_stories = stories(s.shared)
    if len(all_stories) < s.held_out + s.calib_stories + 8:
        raise DataError(f"{s.shared}: only {len(all_stories)} stories; need more than held_out + "
                        f"calib_stories")
    bench = all_stories[-s.held_out:]
    calib = all_stories[-s.held_out - s.calib_stories:-s.held_out]
    train = all_stories[:-s.held_out - s.calib_stories]
    if s.train_stories is not None:
        train = train[: s.train_stories]
    first = lambda st: sentence_prefixes(st, 1)[0] if sentence_prefixes(st, 1) else " ".join(st.split()[:8])
    rows = {
        "train": [{"id": f"train-{i}-{k}", "prompt": p} for i, st in enumerate(train)
                  for k, p in enumerate(sentence_prefixes(st, s.max_sentences))],
        "sample": [{"id": f"sample-{i}", "prompt": first(st)} for i, st in enumerate(train)],
        "calib": [{"id": f"calib-{i}", "prompt": first(st)} for i, st in enumerate(calib)],
        "bench": [{"id": f"bench-{i}", "prompt": first(st)} for i, st in enumerate(bench)],
    }
    if s.bench_prompts is not None:
        rows["bench"] = rows["bench"][: s.bench_prompts]
    return rows


def run(s: Settings, log: Any = print) -> dict[str, Any]:
    """The whole benchmark; returns ``summary.json``'s content (also written to ``<out>/summary.json``)."""
    import torch

    if s.threads is not None:
        torch.set_num_threads(s.threads)
    out = Path(s.out)
    model_path = str(Path(s.shared) / "models" / "stories260K")
    if not Path(model_path).is_dir():
        raise DataError(f"{model_path}: not found (give --shared DIR)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    data = out / "data"
    rows = split_prompts(s)  # before anything runs: a missing file fails fast
    S.run_stage(out, "prompts", lambda: write_prompts(data, rows), log)
    distilled = S.run_stage(out, "distill", lambda: distill_all(s, model_path, data), log)
    overrides = [f"model={model_path}", f"data.train={data / 'train.jsonl'}", f"output_dir={out / 'medusa1'}",
                 *s.recipe_overrides]
    trained = S.run_stage(out, "train", lambda: S.train_recipe(s.recipe, overrides, progress=s.progress),
                          log)
    prompts = [r["prompt"] for r in rows["bench"]]
    with S.torch_threads(s.timing_threads):
        calibrated = S.run_stage(out, "calibrate", lambda: S.calibrate_stage(
            trained["final_dir"], out / "final", data / "calib.jsonl", nodes=_nodes(s.nodes),
            progress=s.progress), log)
        benched = S.run_stage(out, "bench", lambda: S.bench_stage(
            out / "final", prompts, out / "report.json", s.max_new_tokens, repeats=s.repeats,
            progress=s.progress), log)
    summary: dict[str, Any] = {
        "settings": asdict(s), "distill": _drop(distilled, "parts"), "train": trained,
        "calibrate": calibrated, "bench": benched,
    }
    deepest = benched
    if s.nodes == "auto" and calibrated["nodes"] < 64:
        deepest = summary["bench_64_nodes"] = _bench_64_nodes(s, out, data, trained, prompts, log)
    summary["targets"] = targets(benched, deepest)
    summary["missed"] = {k: t for k, t in summary["targets"].items() if not t["met"]}
    if s.hydra:
        summary.update(_head_types(s, out, data, model_path, {"calibrate": calibrated, "bench": benched},
                                   prompts, log))
    if s.medusa2:
        summary["medusa2"] = _medusa2(s, out, data, model_path, trained, prompts, log)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return summary


def write_prompts(data: Path, rows: dict[str, list[dict[str, str]]]) -> dict[str, int]:
    """The ``prompts`` stage: ``<data>/prompts_<split>.jsonl`` per split; returns the row counts."""
    for name, r in rows.items():
        S.write_jsonl(data / f"prompts_{name}.jsonl", r)
    return {name: len(r) for name, r in rows.items()}


def distill_all(s: Settings, model_path: str, data: Path) -> dict[str, Any]:
    """The ``distill`` stage: greedy completions of the training prompts (+ temperature samples of the first
    sentences) concatenated into ``train.jsonl``, and greedy completions of the calibration prompts."""
    parts = [S.distill(model_path, data / "prompts_train.jsonl", data / "distill_greedy.jsonl",
                       s.distill_tokens, temperature=0.0, batch_size=s.distill_batch, progress=s.progress)]
    sources = [data / "distill_greedy.jsonl"]
    if s.samples > 0:
        parts.append(S.distill(model_path, data / "prompts_sample.jsonl", data / "distill_sampled.jsonl",
                               s.distill_tokens, temperature=s.temperature, num_samples=s.samples,
                               batch_size=s.distill_batch, progress=s.progress))
        sources.append(data / "distill_sampled.jsonl")
    parts.append(S.distill(model_path, data / "prompts_calib.jsonl", data / "calib.jsonl", s.distill_tokens,
                           temperature=0.0, batch_size=s.distill_batch, progress=s.progress))
    S.concat_jsonl(data / "train.jsonl", sources)
    return {"train_rows": sum(p["written"] + p["already_done"] for p in parts[:-1]),
            "train_completion_tokens": sum(p["completion_tokens"] for p in parts[:-1]),
            "calib_rows": parts[-1]["written"] + parts[-1]["already_done"], "parts": parts}


def _bench_64_nodes(s: Settings, out: Path, data: Path, trained: dict[str, Any], prompts: list[str],
                    log: Any) -> dict[str, Any]:
    """The largest allowed tree (the most tokens per step, maybe not the fastest) calibrated and benchmarked
    beside the chosen one."""
    with S.torch_threads(s.timing_threads):
        S.run_stage(out, "calibrate_64", lambda: S.calibrate_stage(
            trained["final_dir"], out / "final_64nodes", data / "calib.jsonl", nodes=64,
            progress=s.progress), log)
        return S.run_stage(out, "bench_64", lambda: S.bench_stage(
            out / "final_64nodes", prompts, out / "report_64nodes.json", s.max_new_tokens, repeats=s.repeats,
            progress=s.progress), log)


def _head_types(s: Settings, out: Path, data: Path, model_path: str, medusa1: dict[str, Any],
                prompts: list[str], log: Any) -> dict[str, Any]:
    """Hydra heads and the dynamic tree beside MEDUSA-1, at the node count ``calibrate`` chose."""
    plan = HeadTypePlan(
        recipe=s.recipe, overrides=(f"model={model_path}", f"data.train={data / 'train.jsonl'}",
                                    f"output_dir={out / 'hydra'}"),
        user_overrides=tuple(s.recipe_overrides), calib_data=data / "calib.jsonl",
        medusa1_final=out / "final", hydra_final=out / "final_hydra",
        reports={"hydra": out / "report_hydra.json", "dynamic": out / "report_dynamic.json",
                 "hydra_dynamic": out / "report_hydra_dynamic.json"},
        timing_threads=s.timing_threads, progress=s.progress)

    def bench(heads: Path, report: Path, tree: Any) -> dict[str, Any]:
        return S.bench_stage(heads, prompts, report, s.max_new_tokens, repeats=s.repeats, progress=s.progress,
                             tree=tree)

    return run_head_types(out, plan, medusa1, bench, log)


def targets(benched: dict[str, Any], deepest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each of :data:`TARGETS` with the measured figure (tokens/step: the better of the two trees; exactness:
    the worse) and whether it is met."""
    measured = {"tokens_per_step": max(benched["tokens_per_step"], deepest["tokens_per_step"]),
                "speedup": benched["speedup"],
                "greedy_exact_match": min(benched["greedy_exact_match"], deepest["greedy_exact_match"])}
    return {k: {"target": v, "measured": measured[k], "met": measured[k] >= v} for k, v in TARGETS.items()}


def _medusa2(s: Settings, out: Path, data: Path, model_path: str, trained: dict[str, Any], prompts: list[str],
             log: Any) -> dict[str, Any]:
    """MEDUSA-2 from the MEDUSA-1 heads on the same data; tokens/step with the MEDUSA-1 tree."""

    overrides = [f"model={model_path}", f"data.train={data / 'train.jsonl'}", f"output_dir={out / 'medusa2'}",
                 f"heads.init_from={trained['final_dir']}", *s.medusa2_overrides]
    m2 = S.run_stage(out, "medusa2_train", lambda: S.train_recipe(s.medusa2_recipe, overrides,
                                                                        progress=s.progress), log)

    def with_tree() -> dict[str, Any]:
        import shutil

        final2 = out / "final_medusa2"

        with atomic_directory(final2, overwrite=True, kind="heads") as tmp:
            shutil.copytree(m2["final_dir"], tmp, dirs_exist_ok=True)
            shutil.copy2(out / "final" / TREE_NAME, tmp / TREE_NAME)
        return {"final_dir": str(final2)}

    S.run_stage(out, "medusa2_tree", with_tree, log)
    heldout_text = data / "heldout_text.jsonl"  # the held-out benchmark stories, whole: never trained on
    heldout_text.write_text("".join(json.dumps({"id": f"heldout-{i}", "text": st}) + "\n"
                                    for i, st in enumerate(stories(s.shared)[-s.held_out:])))
    losses = S.run_stage(out, "medusa2_loss", lambda: {
        "heldout_text": backbone_losses(model_path, str(out / "final_medusa2"), heldout_text),
        "own_completions": backbone_losses(model_path, str(out / "final_medusa2"), data / "calib.jsonl"),
    }, log)
    with S.torch_threads(s.timing_threads):
        benched = S.run_stage(out, "medusa2_bench", lambda: S.bench_stage(
            out / "final_medusa2", prompts, out / "report_medusa2.json", s.max_new_tokens, repeats=s.repeats,
            progress=s.progress), log)
    return {"train": m2, "bench": benched, "backbone_heldout_loss": losses}


def backbone_losses(model_path: str, medusa2_dir: str, data: str | Path) -> dict[str, Any]:
    """Held-out next-token loss (completion tokens of ``data``) of the original and the MEDUSA-2 backbone."""
    import torch


    m2, tokenizer = load_for_generation(medusa2_dir)
    examples = load_tokenized(str(data), tokenizer, max_length=512).examples
    result = {}
    for name, model in (("before", load_base_model(model_path).eval()), ("after", m2.base_model.eval())):
        total, count = 0.0, 0
        with torch.no_grad():
            for ex in examples:
                ids = torch.tensor([ex["input_ids"]])  # [1, T]
                labels = torch.tensor([ex["labels"]])  # [1, T], unshifted
                logits = model(input_ids=ids).logits[:, :-1]  # [1, T-1, V]
                target = labels[:, 1:]
                loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                                         target.reshape(-1), ignore_index=IGNORE_INDEX,
                                                         reduction="sum")
                total += float(loss)
                count += int((target != IGNORE_INDEX).sum())
        result[name] = total / max(count, 1)
    result["tokens"] = count
    return result


def _drop(d: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k != key}


def _nodes(value: str | int) -> int | str:
    if value == "auto":
        return value
    n = int(value)
    if not 1 <= n <= 64:
        raise MedusaError(f"--nodes must be 'auto' or between 1 and 64, got {value}")
    return n


def format_summary(summary: dict[str, Any]) -> str:
    b, c = summary["bench"], summary["calibrate"]
    lines = [
        f"heads: {summary['calibrate']['final_dir']} ({c['nodes']}-node tree, expected "
        f"{c['expected_tokens_per_step']:.2f} tokens/step; head top-1 "
        + " / ".join(f"{a:.2f}" for a in c["top1"])
        + ")",
        (f"HF generate {b['baseline_tokens_per_s']:.1f} tokens/s, MEDUSA "
         f"{b['medusa_tokens_per_s']:.1f} tokens/s: "
        f"speedup {b['speedup']:.2f}x, {b['tokens_per_step']:.2f} tokens/step, overhead {b['overhead']:.2f}, "
        f"greedy exact match {b['greedy_exact_match']}"),
    ]
    if "bench_64_nodes" in summary:
        d = summary["bench_64_nodes"]
        lines.append(f"64-node tree: {d['tokens_per_step']:.2f} tokens/step, speedup {d['speedup']:.2f}x, "
                     f"overhead {d['overhead']:.2f}, greedy exact match {d['greedy_exact_match']}")
    for key, t in summary["targets"].items():
        lines.append(f"target {key} >= {t['target']}: measured {t['measured']:.2f} "
                     + ("(met)" if t["met"] else f"(missed by {t['target'] - t['measured']:.2f})"))
    if "medusa2" in summary:
        m = summary["medusa2"]
        lines.append(f"MEDUSA-2: {m['bench']['tokens_per_step']:.2f} tokens/step (MEDUSA-1 "
                     f"{b['tokens_per_step']:.2f}), speedup {m['bench']['speedup']:.2f}x, exact match "
                     f"{m['bench']['greedy_exact_match']}; backbone loss on held-out TinyStories text "
                     f"{m['backbone_heldout_loss']['heldout_text']['before']:.4f} -> "
                     f"{m['backbone_heldout_loss']['heldout_text']['after']:.4f}")
    if "head_types" in summary:
        lines += [f"head types at the same node budget ({summary['head_types']['nodes']} nodes):",
                  S.format_head_types(summary["head_types"])]
    return "\n".join(lines)


def parse_settings(argv: Sequence[str] | None = None) -> tuple[Settings, argparse.Namespace]:
    """The command line as :class:`Settings` (and the parsed arguments, for ``--debug``)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.stories260k",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=Settings.out)
    parser.add_argument("--shared", default=Settings.shared, help="the shared assets directory")
    parser.add_argument("--nodes", default="auto", help="tree size (<= 64) or auto")
    parser.add_argument("--max-new-tokens", type=int, default=Settings.max_new_tokens)
    parser.add_argument("--repeats", type=int, default=Settings.repeats)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads for distillation and training (default: torch's)")
    parser.add_argument("--timing-threads", type=int, default=1,
                        help="torch threads while timing (calibration, bench; default 1: "
                             "stories260K is tiny)")
    parser.add_argument("--samples", type=int, default=Settings.samples)
    S.add_common_arguments(parser)
    args = parser.parse_args(argv)
    s = Settings(out=args.out, shared=args.shared, nodes=args.nodes, max_new_tokens=args.max_new_tokens,
                 repeats=args.repeats, threads=args.threads, timing_threads=args.timing_threads,
                 samples=args.samples, medusa2=args.medusa2, hydra=not args.no_hydra,
                 recipe_overrides=tuple(args.set), progress=not args.no_progress)
    return s, args


def main(argv: Sequence[str] | None = None) -> int:
    s, args = parse_settings(argv)
    footer = f"report: {Path(s.out) / 'report.json'}; summary: {Path(s.out) / 'summary.json'}"
    return S.run_main(run, s, format_summary, footer, args.debug)


if __name__ == "__main__":
    from medusa.cli import run_script

    raise SystemExit(run_script(main))
