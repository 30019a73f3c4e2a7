"""``make heads-chat-eagle3`` / ``make bench-chat``: the EAGLE-3 drafter for SmolLM2-135M-Instruct, from data
to shipped heads, and its Spec-Bench rows.

Resumable stages under ``--out`` (a finished stage is reused; delete ``--out`` to start over):

1. ``model``: the converted SmolLM2 (:mod:`benchmarks.chat_model`);
2. ``distill``: the model answers, greedily, through its chat template, ``--alpaca-prompts`` Alpaca prompts,
   ``--synthesize`` requests it writes itself, ``--doc-tasks`` long-context and two-turn requests built on
   its own Alpaca replies (:func:`benchmarks.chat_data.document_tasks`: summarise, answer from the text or
   from two passages, translate, list the points, a follow-up turn) and the last ``--calib-prompts`` Alpaca
   rows (held out for calibration); never a Spec-Bench prompt. Every part is a resumable self-distillation
   file: a killed run, or a later session with larger counts, goes on where it stopped;
3. ``train``: ``benchmarks/recipes/smollm2_eagle3.yaml`` (the frozen base's three fused layers computed
   online, the training-time-test unroll, one epoch); checkpoints along the way. ``--init-from DIR`` goes
   on training the drafter in DIR (its draft vocabulary kept) on the conversations after the first
   ``--skip-rows`` (those it was trained on): data added in a later round;
4. ``curve``: predicted tokens per step of the checkpoints at a quarter, half and all of the training
   data seen (greedy decoding of the held-out prompts at one tree), the acceptance-vs-data curve;
5. ``calibrate``: the draft tree (:mod:`medusa.calibrate.draft_tree`) on the held-out prompts, into tree.json;
6. ``ship`` (``--ship DIR``): the calibrated checkpoint tied to the packaged base, in ``DIR/eagle3``;
7. ``bench``: Spec-Bench public per category through the chat template, to EOS, against HF ``generate``:
   the drafter alone, our lookup chain alone, both, and HF prompt lookup (``--shipped DIR``: bench the
   head set shipped in ``DIR/eagle3`` instead of training).
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
from benchmarks.chat_data import document_tasks, reply_stats, spec_bench
from benchmarks.chat_model import fetch_smollm2
from benchmarks.ship import tie_to_packaged
from medusa.errors import DataError
from medusa.io import atomic_write_text

HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
RECIPE = Path(__file__).resolve().parent / "recipes" / "smollm2_eagle3.yaml"
TARGETS = {"tokens_per_step_alone": 2.3, "speedup_alone": 1.3, "speedup_with_lookup": 1.6,
           "greedy_exact_match": 1.0}


@dataclass
class Settings:
    out: str = "out/heads/eagle3"
    shared: str = os.environ.get("MEDUSA_SHARED", "../shared")
    cache: str | None = None
    alpaca_prompts: int = 4800
    calib_prompts: int = 200
    synthesize: int = 0
    doc_tasks: int = 0  # requests about the model's own replies (long context, two turns)
    train_rows: int | None = None  # train on the first N self-distilled conversations (None: all)
    skip_rows: int = 0  # ... after the first K (those an --init-from drafter was trained on)
    init_from: str | None = None  # go on training this drafter
    distill_tokens: int = 256
    distill_batch: int = 64
    recipe_overrides: tuple[str, ...] = ()
    calib_eval_prompts: int = 12  # held-out prompts decoded per calibration candidate
    per_category: int | None = 10
    max_new_tokens: int = 128
    compare_lookup_tokens: int = 6
    ship: str | None = None
    shipped: str | None = None
    threads: int | None = None
    answered_only: bool = False  # train on the rows answered so far; answer nothing more
    resume_changed: bool = False  # the train stage resumes a killed run under changed --set overrides
    processes: int = 1  # > 1: the train stage as that many data-parallel CPU processes (accelerate launch)
    progress: bool = True


def distill_stage(s: Settings, model_path: str, data: Path) -> dict[str, Any]:
    """Greedy replay-mode self-distillation of the Alpaca train / calibration prompts (+ synthesized ones)."""
    if s.answered_only:
        return answered_stage(s, data)
    alpaca_path = Path(s.shared) / "data" / "alpaca_5000.json"
    alpaca = json.loads(alpaca_path.read_text(encoding="utf-8"))
    if len(alpaca) < s.alpaca_prompts + s.calib_prompts:
        raise DataError(f"{alpaca_path}: {len(alpaca)} rows, need {s.alpaca_prompts + s.calib_prompts}")
    start = len(alpaca) - s.calib_prompts
    S.write_jsonl(data / "prompts_alpaca.jsonl", [{"id": f"alpaca-{i}", **r}
                                                  for i, r in enumerate(alpaca[: s.alpaca_prompts])])
    S.write_jsonl(data / "prompts_calib.jsonl", [{"id": f"alpaca-{start + i}", **r}
                                                 for i, r in enumerate(alpaca[start:])])
    common = dict(max_new_tokens=s.distill_tokens, batch_size=s.distill_batch, progress=s.progress)
    parts = [S.distill_chat(model_path, data / "prompts_alpaca.jsonl", data / "distill_alpaca.jsonl",
                            prompt_format="alpaca", **common)]
    train = [data / "distill_alpaca.jsonl"]
    if s.synthesize:
        parts.append(S.distill_synthesized(model_path, data / "distill_synth.jsonl", s.synthesize, **common))
        train.append(data / "distill_synth.jsonl")
    if s.doc_tasks:
        lines = (data / "distill_alpaca.jsonl").read_text(encoding="utf-8").splitlines()
        replies = [json.loads(line) for line in lines if line.strip()]
        S.write_jsonl(data / "prompts_docs.jsonl", document_tasks(replies)[: s.doc_tasks])
        parts.append(S.distill_chat(model_path, data / "prompts_docs.jsonl", data / "distill_docs.jsonl",
                                    turns=2, **common))
        train.append(data / "distill_docs.jsonl")
    calib = S.distill_chat(model_path, data / "prompts_calib.jsonl", data / "calib.jsonl",
                           prompt_format="alpaca", **common)
    S.concat_jsonl(data / "train.jsonl", train)
    if s.train_rows is not None or s.skip_rows:  # the CPU budget / what an --init-from drafter has seen
        lines = (data / "train.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
        atomic_write_text(data / "train.jsonl", "".join(lines[s.skip_rows: s.train_rows]))
    return {"train_replies": reply_stats([data / "train.jsonl"]),
            "calib_rows": calib["written"] + calib["already_done"],
            "parts": [*parts, calib]}


def answered_rows(path: Path) -> list[str]:
    """The complete rows of a self-distillation file, each a JSON line: a killed writer's partial last line
    is left out; an unreadable row before it is an error naming the file and row."""
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    rows = []
    for i, line in enumerate(lines):
        try:
            json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break
            raise DataError(f"{path}: row {i} is not JSON") from None
        rows.append(line + "\n")
    return rows


def answered_stage(s: Settings, data: Path) -> dict[str, Any]:
    """``--answered-only``: train on the rows the self-distillation parts hold now, answering nothing more
    (a killed run's parts, within a CPU budget; ``--skip-rows`` / ``--train-rows`` apply as they do after a
    full distillation); the held-out calibration replies must be complete."""
    names = ["distill_alpaca.jsonl", *(["distill_synth.jsonl"] if s.synthesize else []),
             *(["distill_docs.jsonl"] if s.doc_tasks else [])]
    missing = [n for n in [*names, "calib.jsonl"] if not (data / n).is_file()]
    if missing:
        raise DataError(f"{data}: --answered-only needs the self-distillation parts, missing "
                        f"{', '.join(missing)}")
    calib_rows = len(answered_rows(data / "calib.jsonl"))
    if calib_rows < s.calib_prompts:
        raise DataError(f"{data / 'calib.jsonl'}: {calib_rows} held-out replies, need {s.calib_prompts}")
    parts = {n: answered_rows(data / n) for n in names}
    rows = [r for n in names for r in parts[n]][s.skip_rows: s.train_rows]
    atomic_write_text(data / "train.jsonl", "".join(rows))
    return {"train_replies": reply_stats([data / "train.jsonl"]), "calib_rows": calib_rows,
            "parts": [{"out": str(data / n), "rows": len(parts[n])} for n in names], "answered_only": True}


def calib_prompts(tokenizer: Any, path: Path, n: int) -> list[Any]:
    """The first user turn of the first ``n`` held-out conversations, as chat-template ids ``[1, P]``."""
    prompts = []
    for line in path.read_text(encoding="utf-8").splitlines()[:n]:
        messages = json.loads(line)["messages"]
        user = next(m["content"] for m in messages if m["role"] == "user")
        prompts.append(tokenizer.apply_chat_template([{"role": "user", "content": user}],
                                                     add_generation_prompt=True, return_tensors="pt",
                                                     return_dict=True)["input_ids"])
    return prompts


def checkpoint_heads(checkpoint: Path, final: Path, dest: Path, base: Any = None) -> Path:
    """A training checkpoint's drafter (its ``model.safetensors``, keys ``heads.*``) as a heads checkpoint in
    ``dest``, with the final checkpoint's config: what the curve decodes with."""
    import torch
    from safetensors.torch import load_file

    from medusa.modeling.model import MedusaModel

    model = MedusaModel.from_pretrained(final, base_model=base)
    state = load_file(checkpoint / "model.safetensors")
    model.heads.load_state_dict({k.removeprefix("heads."): v.to(torch.float32) for k, v in state.items()})
    model.tree = None
    model.save_pretrained(dest, overwrite=True)
    return dest


def curve_stage(s: Settings, run_dir: Path, calib: Path, trained: dict[str, Any]) -> dict[str, Any]:
    """Tokens per step on the held-out prompts (greedy, a 16-node tree, no lookup) of the checkpoints at
    about a quarter, a half and all of the training data seen: the acceptance-vs-data curve (one run read at
    three points: the learning rate had not finished its schedule at the first two)."""
    from medusa.calibrate.draft_tree import measure_shape
    from medusa.modeling.loading import load_for_generation
    from medusa.tree import DraftTreeShape

    final = Path(trained["final_dir"])
    steps = sorted(int(p.name.split("-")[1]) for p in run_dir.glob("checkpoint-*") if p.name[11:].isdigit())
    total = max(int(trained.get("steps") or 0), steps[-1] if steps else 0, 1)
    points = []
    for fraction in (0.25, 0.5):  # the checkpoint nearest to that share of the data
        if steps:
            step = min(steps, key=lambda st: abs(st - fraction * total))
            points.append((step, checkpoint_heads(run_dir / f"checkpoint-{step}", final,
                                                  run_dir.parent / "curve" / f"step-{step}")))
    points.append((total, final))
    rows = []
    for step, directory in points:
        model, tokenizer = load_for_generation(str(directory))
        prompts = calib_prompts(tokenizer, calib, s.calib_eval_prompts)
        figures = measure_shape(model, prompts, DraftTreeShape(16, 5, 4, 4), 96)
        rows.append({"step": step, "fraction_of_data": round(step / total, 3), **figures})
    return {"points": rows, "measured": "greedy decoding, 16 nodes, depth 5, held-out prompts"}


def calibrate_stage(s: Settings, final: Path, calib: Path) -> dict[str, Any]:
    from medusa.calibrate.draft_tree import calibrate_draft_tree
    from medusa.modeling.loading import load_for_generation

    model, tokenizer = load_for_generation(str(final))
    shape = calibrate_draft_tree(model, calib_prompts(tokenizer, calib, s.calib_eval_prompts))
    shape.to_json(final / "tree.json")
    return {"tree": shape.to_dict(),
            "expected_tokens_per_step": shape.calibration["expected_tokens_per_step"]}


def bench_stage(s: Settings, heads: Path, rows: list[dict[str, Any]], report: Path) -> dict[str, Any]:
    """Per category: the drafter alone, our lookup chain alone, both (the tree.json's chain, else
    ``--compare-lookup-tokens``), HF prompt lookup — all against one HF generate run."""
    tree = json.loads((heads / "tree.json").read_text())
    compare = tree.get("lookup_tokens") or s.compare_lookup_tokens
    return S.category_bench(heads, rows, report, s.max_new_tokens, progress=s.progress, chat=True,
                            prompt_lookup=True, compare_lookup=compare)


def run(s: Settings, log: Any = print) -> dict[str, Any]:
    out, data = Path(s.out), Path(s.out) / "data"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    rows = spec_bench(s.shared, s.per_category)
    summary: dict[str, Any] = {"settings": asdict(s)}
    with S.torch_threads(s.threads):
        model = S.run_stage(out, "model", lambda: {"path": str(fetch_smollm2(s.cache))}, log)["path"]
        if s.shipped:
            heads = Path(s.shipped) / "eagle3"
        else:
            summary["distill"] = S.run_stage(out, "distill", lambda: distill_stage(s, model, data), log)
            run_dir = out / "train"
            overrides = [f"model={model}", f"data.train={data / 'train.jsonl'}", f"output_dir={run_dir}",
                         *([f"heads.init_from={s.init_from}"] if s.init_from else []), *s.recipe_overrides]
            trained = S.run_stage(out, "train", lambda: (
                S.launch_recipe(RECIPE, overrides, s.processes, s.progress, s.resume_changed)
                if s.processes > 1
                else S.train_recipe(RECIPE, overrides, s.progress)), log)
            summary["train"] = trained
            summary["curve"] = S.run_stage(out, "curve", lambda: curve_stage(s, run_dir, data / "calib.jsonl",
                                                                             trained), log)
            heads = Path(trained["final_dir"])
            summary["calibrate"] = S.run_stage(out, "calibrate", lambda: calibrate_stage(
                s, heads, data / "calib.jsonl"), log)
            if s.ship:
                summary["ship"] = S.run_stage(out, "ship", lambda: tie_to_packaged(
                    heads, Path(s.ship) / "eagle3", model, hub_id=HUB_ID), log)
                return _write(out, summary)
        summary["bench"] = S.run_stage(out, "bench", lambda: bench_stage(s, heads, rows, out / "report.json"),
                                       log)
    summary["targets"] = targets(summary["bench"])
    return _write(out, summary)


def _write(out: Path, summary: dict[str, Any]) -> dict[str, Any]:
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2, default=str) + "\n")
    return summary


def targets(bench: dict[str, Any]) -> dict[str, Any]:
    measured = {"tokens_per_step_alone": bench["tokens_per_step"], "speedup_alone": bench["speedup"],
                "greedy_exact_match": bench["greedy_exact_match"]}
    if "hybrid" in bench:
        measured["speedup_with_lookup"] = bench["hybrid"]["speedup"]
    return {k: {"target": TARGETS[k], "measured": v, "met": v >= TARGETS[k]} for k, v in measured.items()}


def format_summary(summary: dict[str, Any]) -> str:
    lines = []
    if "curve" in summary:
        lines.append("acceptance vs data: " + ", ".join(
            f"{p['fraction_of_data']:.2f} of the data -> {p['tokens_per_step']:.2f} tokens/step"
            for p in summary["curve"]["points"]))
    if "calibrate" in summary:
        t = summary["calibrate"]["tree"]
        lines.append(f"calibrated tree: {t['num_nodes']} nodes, depth {t['depth']}, branch {t['branch']}, "
                     f"expand {t['expand']}, lookup {t['lookup_tokens']}: "
                     f"{summary['calibrate']['expected_tokens_per_step']:.2f} tokens/step, held-out prompts")
    if "ship" in summary:
        lines.append(f"shipped to {summary['ship']['dir']}")
    if "bench" in summary:
        lines.append(summary["bench"]["table"])
        lines += S.target_lines(summary["targets"])
    return "\n".join(lines)


def parse_settings(argv: Sequence[str] | None = None) -> tuple[Settings, argparse.Namespace]:
    parser = S.chat_model_parser("python -m benchmarks.eagle3", __doc__.splitlines()[0], Settings)
    parser.add_argument("--alpaca-prompts", type=int, default=Settings.alpaca_prompts)
    parser.add_argument("--calib-prompts", type=int, default=Settings.calib_prompts)
    parser.add_argument("--synthesize", type=int, default=Settings.synthesize, metavar="N")
    parser.add_argument("--doc-tasks", type=int, default=Settings.doc_tasks, metavar="N",
                        help="N long-context / two-turn requests about the model's own replies")
    parser.add_argument("--train-rows", type=int, default=None, metavar="N",
                        help="train on the first N self-distilled conversations (default: all)")
    parser.add_argument("--skip-rows", type=int, default=0, metavar="K",
                        help="... after the first K (those the --init-from drafter was trained on)")
    parser.add_argument("--init-from", default=None, metavar="DIR", help="go on training the drafter in DIR")
    parser.add_argument("--per-category", type=int, default=Settings.per_category)
    parser.add_argument("--max-new-tokens", type=int, default=Settings.max_new_tokens)
    parser.add_argument("--compare-lookup-tokens", type=int, default=Settings.compare_lookup_tokens)
    parser.add_argument("--ship", default=None, metavar="DIR",
                        help="copy the calibrated drafter to DIR/eagle3")
    parser.add_argument("--shipped", default=None, metavar="DIR", help="bench DIR/eagle3; no training")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--answered-only", action="store_true",
                        help="train on the rows self-distilled so far (a killed run's); answer no more")
    parser.add_argument("--resume-changed", action="store_true",
                        help="with --processes: resume a killed training run under changed --set overrides")
    parser.add_argument("--processes", type=int, default=1, metavar="N",
                        help="train as N data-parallel CPU processes, one thread each (accelerate launch)")
    parser.add_argument("--set", action="append", default=[], metavar="key=value", help="recipe override")
    parser.add_argument("--debug", action="store_true")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    s = Settings(out=args.out, shared=args.shared, cache=args.cache, alpaca_prompts=args.alpaca_prompts,
                 calib_prompts=args.calib_prompts, synthesize=args.synthesize, doc_tasks=args.doc_tasks,
                 train_rows=args.train_rows, skip_rows=args.skip_rows, init_from=args.init_from,
                 per_category=args.per_category,
                 max_new_tokens=args.max_new_tokens, compare_lookup_tokens=args.compare_lookup_tokens,
                 ship=args.ship, shipped=args.shipped, threads=args.threads, processes=args.processes,
                 answered_only=args.answered_only, resume_changed=args.resume_changed,
                 recipe_overrides=tuple(args.set), progress=not args.no_progress)
    return s, args


def main(argv: Sequence[str] | None = None) -> int:
    return S.run_pipeline(argv, parse_settings, run, format_summary)


if __name__ == "__main__":
    from medusa.cli import run_script

    raise SystemExit(run_script(main))
