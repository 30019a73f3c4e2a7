"""``python -m benchmarks.data_mix``: issue 44's self-distillation data, part by part, resumable, on one core.

The model (SmolLM2-135M-Instruct) answers, greedily through its chat template, requests that widen what the
round-3 data asked for (:mod:`benchmarks.data_tasks`, :mod:`benchmarks.math_problems`): Alpaca, translation
out of and into English, summaries of long passages, answers from passages, word problems, two-turn
conversations, closed-book questions, Vicuna questions and requests it writes itself. Never a Spec-Bench
prompt.

Layout under ``--out`` (default ``/work/data-run``, outside every worktree):

- ``prompts/<part>.jsonl``: the requests (rewritten at each start; row ids are stable, so larger counts
  extend a part);
- ``train/<part>.jsonl``: the replies (``medusa self-distill`` outputs: a killed run resumes them);
- ``heldout/<part>.jsonl``: replies to requests built from held-out texts (the last 200 Alpaca rows and the
  last tenth of the stories): never trained on;
- ``run.log``: one JSON line per part and pass.

The held-out parts come first, then every training part is answered in passes at 1/8, 1/4, 1/2 and all of
its count, so a run stopped anywhere holds a balanced mix. ``--status`` prints rows and reply tokens.

``--plan translate_out:24096:512,math:21536:384`` answers fresh requests instead (a later round's data): each
named part from row id START on, CHUNK rows of each part in turn, until killed or every part has run out of
rows (``prompts/train-<part>-<lo>.jsonl`` per chunk; a restart resumes row by row, whatever the CHUNK; a
failed chunk stops the run with its error). ``--held-out-rows N`` first answers the first N held-out requests
of every part.

Vicuna questions that are MT-bench questions (two of the 80; MT-bench is Spec-Bench's mt_bench category) are
left out of every part: ``mt_bench_questions.jsonl`` and ``spec_bench_public.jsonl`` are read for that
only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import data_tasks as T
from benchmarks.chat_data import reply_stats
from benchmarks.math_problems import math_tasks
from medusa.demo.stages import write_jsonl
from medusa.errors import DataError, MedusaError
from medusa.io import read_text
from medusa.selfdistill import Sampling, SelfDistillConfig, self_distill

HELD_OUT_ALPACA = 200  # the last Alpaca rows (benchmarks.eagle3's calibration prompts)
PASSES = (0.125, 0.25, 0.5, 1.0)
COUNTS = {"alpaca": 4800, "translate_out": 6000, "math": 6000, "summarize": 4000, "rag": 4000,
          "multi_turn": 4000, "qa": 4000, "vicuna": 80,
          "synth": 12000}  # translate_in: what translate_out yields
HELD_OUT_COUNTS = {"alpaca": HELD_OUT_ALPACA, "translate_out": 60, "math": 60, "summarize": 40, "rag": 40,
                   "multi_turn": 40}
# a training part's reply budget below --max-new-tokens: a translation of 1-3 sentences needs < 150
# tokens; longer replies were the model repeating itself (38% of the held-out ones reached 384)
PART_MAX_NEW = {"translate_out": 192, "translate_in": 192}
LONG_PARTS = ("summarize", "rag")  # long prompts: a smaller batch keeps the KV buffers small


@dataclass
class Sources:
    alpaca: list[dict[str, Any]]
    stories: list[str]
    vicuna: list[str]


def load_sources(shared: str | Path, held_out: bool) -> Sources:
    """Alpaca, TinyStories and Vicuna questions from ``shared/data``: the training split, or the held-out
    one (the last 200 Alpaca rows, the last tenth of the stories, no Vicuna)."""
    data = Path(shared) / "data"
    try:
        alpaca = json.loads((data / "alpaca_5000.json").read_text(encoding="utf-8"))
        stories = [s.strip() for s in (data / "tinystories_sample.txt").read_text(encoding="utf-8")
                   .split("\n\n") if len(s.split()) >= 20]
        vicuna = [json.loads(line)["turns"][0] for line in
                  (data / "vicuna_bench_questions.jsonl").read_text(encoding="utf-8").splitlines()
                  if line.strip()]
    except (OSError, json.JSONDecodeError, KeyError) as exc:
        raise DataError(f"{data}: cannot read the data sources ({exc})") from None
    cut = len(stories) - len(stories) // 10
    if held_out:
        return Sources(alpaca[-HELD_OUT_ALPACA:], stories[cut:], [])
    benchmark = spec_bench_requests(data)
    return Sources(alpaca[:-HELD_OUT_ALPACA], stories[:cut],
                   [q for q in vicuna if q.strip() not in benchmark])


def spec_bench_requests(data: Path) -> frozenset[str]:
    """Every user turn of MT-bench and of Spec-Bench public (``data`` holds them; a missing file adds
    nothing): requests no training part may send."""
    turns: set[str] = set()
    for name in ("mt_bench_questions.jsonl", "spec_bench_public.jsonl"):
        path = data / name
        if not path.is_file():
            continue
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                turns.update(str(t).strip() for t in json.loads(line)["turns"])
            except (json.JSONDecodeError, KeyError, TypeError):
                raise DataError(f"{path}:{lineno}: not a row with turns") from None
    return frozenset(turns)


def build_part(part: str, src: Sources, count: int, seed: int) -> list[dict[str, Any]]:
    """The requests of one static part (every part but ``translate_in`` and ``synth``)."""
    texts = T.passages(src.alpaca, src.stories)
    builders: dict[str, Callable[[], list[dict[str, Any]]]] = {
        "alpaca": lambda: [{"id": f"alpaca-{i}", "kind": "alpaca",
                            "messages": [{"role": "user", "content": T.alpaca_request(r)}]}
                           for i, r in enumerate(src.alpaca[:count])],
        "translate_out": lambda: T.translate_out(texts, count, seed),
        "math": lambda: math_tasks(count, seed),
        "summarize": lambda: T.summarize(texts, count, seed),
        "rag": lambda: T.rag(src.alpaca, count, seed),
        "multi_turn": lambda: T.multi_turn([T.alpaca_request(r) for r in src.alpaca] + src.vicuna, count,
                                           seed),
        "qa": lambda: T.qa(T.questions(src.alpaca) + [q for q in src.vicuna if T.QUESTION_START.match(q)],
                           count, seed),
        "vicuna": lambda: [{"id": f"vicuna-{i}", "kind": "vicuna",
                            "messages": [{"role": "user", "content": q}]}
                           for i, q in enumerate(src.vicuna[:count])],
    }
    return builders[part]()


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The complete JSON rows of a self-distillation output (a killed writer's partial last line skipped)."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


@dataclass
class RunOptions:
    model: str
    out: Path
    dtype: str = "bfloat16"
    batch_size: int = 128
    max_new_tokens: int = 384
    scale: float = 1.0
    seed: int = 0
    held_out_counts: dict[str, int] | None = None  # None: HELD_OUT_COUNTS
    skip: dict[str, int] | None = None  # part -> its first rows, answered by an earlier run: start past them


def distill_part(opts: RunOptions, prompts: Path | None, out: Path, limit: int | None,
                 synthesize: int = 0, long_prompts: bool = False,
                 max_new_tokens: int | None = None) -> dict[str, Any]:
    """One resumable ``medusa self-distill`` call (greedy, replay, cut replies kept)."""
    cfg = SelfDistillConfig(model=opts.model, prompts=None if synthesize else str(prompts), out=str(out),
                            mode="replay", limit=limit, synthesize_prompts=synthesize,
                            sampling=Sampling(temperature=0.0, top_p=1.0,
                                              max_new_tokens=max_new_tokens or opts.max_new_tokens,
                                              seed=opts.seed),
                            batch_size=max(opts.batch_size // 4, 1) if long_prompts else opts.batch_size,
                            dtype=opts.dtype, on_length="keep", progress=False)
    return self_distill(cfg)


def log(opts: RunOptions, **fields: Any) -> None:
    with open(opts.out / "run.log", "a", encoding="utf-8") as f:
        f.write(json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S"), **fields}) + "\n")


def _run_one(opts: RunOptions, split: str, part: str, rows: list[dict[str, Any]], limit: int | None,
             frac: float) -> None:
    prompts = opts.out / "prompts" / f"{split}-{part}.jsonl"
    write_jsonl(prompts, rows)
    if not rows:
        return
    try:
        cap = PART_MAX_NEW.get(part, opts.max_new_tokens) if split == "train" else opts.max_new_tokens
        s = distill_part(opts, prompts, opts.out / split / f"{part}.jsonl", limit,
                         long_prompts=part in LONG_PARTS, max_new_tokens=min(cap, opts.max_new_tokens))
    except MedusaError as exc:  # one part's failure (its errors file says why) does not stop the run
        log(opts, split=split, part=part, frac=frac, error=str(exc))
        return
    log(opts, split=split, part=part, frac=frac, written=s["written"], done_before=s["already_done"],
        reply_tokens=s["completion_tokens"], tokens_per_s=s["tokens_per_s"], elapsed_s=s["elapsed_s"])


def run(opts: RunOptions, shared: str | Path) -> None:
    """The held-out parts, then every training part pass by pass (see the module docstring)."""
    for sub in ("prompts", "train", "heldout"):
        (opts.out / sub).mkdir(parents=True, exist_ok=True)
    held = load_sources(shared, held_out=True)
    for part, count in (opts.held_out_counts or HELD_OUT_COUNTS).items():
        _run_one(opts, "heldout", part, build_part(part, held, count, opts.seed + 1), None, 1.0)
    src = load_sources(shared, held_out=False)
    counts = {part: int(n * opts.scale) for part, n in COUNTS.items()}
    skip = opts.skip or {}
    static = {part: build_part(part, src, n, opts.seed)[skip.get(part, 0):]
              for part, n in counts.items() if part != "synth"}
    for frac in PASSES:
        for part, rows in static.items():
            if rows:
                _run_one(opts, "train", part, rows, max(int(len(rows) * frac), 1), frac)
            if part == "translate_out":  # back into English from the model's own translations
                answered = read_rows(opts.out / "train" / "translate_out.jsonl")
                _run_one(opts, "train", "translate_in", T.translate_in(answered, opts.seed), None, frac)
        n = max(int(counts["synth"] * frac), 1)
        s = distill_part(opts, None, opts.out / "train" / "synth.jsonl", n, synthesize=n)
        log(opts, split="train", part="synth", frac=frac, written=s["written"],
            reply_tokens=s["completion_tokens"], tokens_per_s=s["tokens_per_s"], elapsed_s=s["elapsed_s"])
    log(opts, event="finished")


FIXED_PARTS = ("alpaca", "vicuna", "synth")  # fixed (or sampled) requests: no fresh ids to extend


@dataclass(frozen=True)
class PlanItem:
    part: str
    start: int  # the first row id of this part to answer
    chunk: int  # rows answered per turn


def parse_plan(text: str) -> list[PlanItem]:
    """``math:21536:384,rag:30512:128``: parts, the row id each starts at and the rows answered per turn."""
    items: list[PlanItem] = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        fields = item.split(":")
        if len(fields) != 3 or not (fields[1].isdigit() and fields[2].isdigit()) or int(fields[2]) == 0:
            raise DataError(f"--plan: {item!r} is not PART:START:CHUNK (CHUNK > 0)")
        if fields[0] not in COUNTS or fields[0] in FIXED_PARTS:
            raise DataError(f"--plan: {fields[0]!r} is not a part a plan can extend (one of "
                            f"{', '.join(p for p in COUNTS if p not in FIXED_PARTS)})")
        items.append(PlanItem(fields[0], int(fields[1]), int(fields[2])))
    if not items:
        raise DataError("--plan: no part given")
    return items


def run_plan(opts: RunOptions, shared: str | Path, plan: list[PlanItem], held_out_rows: int = 0,
             turns: int | None = None) -> None:
    """Fresh requests, ``chunk`` rows of each plan item in turn from its ``start`` on (``translate_out``'s
    answers are followed by their ``translate_in`` requests); ``turns`` rounds, or until killed."""
    for sub in ("prompts", "train", "heldout"):
        (opts.out / sub).mkdir(parents=True, exist_ok=True)
    if held_out_rows:
        held = load_sources(shared, held_out=True)
        for part in HELD_OUT_COUNTS:
            _run_one(opts, "heldout", part, build_part(part, held, held_out_rows, opts.seed + 1), None, 1.0)
    src = load_sources(shared, held_out=False)
    turn = 0
    while turns is None or turn < turns:
        fresh = 0
        for item in plan:
            lo = item.start + turn * item.chunk
            rows = build_part(item.part, src, lo + item.chunk, opts.seed)[lo:]
            fresh += len(rows)
            _run_chunk(opts, item.part, lo, rows)
            if item.part == "translate_out":
                answered = read_rows(opts.out / "train" / "translate_out.jsonl")
                done = {str(r.get("id", "")).rsplit(":", 1)[0]
                        for r in read_rows(opts.out / "train" / "translate_in.jsonl")}
                _run_chunk(opts, "translate_in", lo,
                           [r for r in T.translate_in(answered, opts.seed) if r["id"] not in done])
        if not fresh:  # every part has run out of requests (the qa part's pool is finite)
            log(opts, event="plan exhausted", turn=turn)
            return
        turn += 1


def _run_chunk(opts: RunOptions, part: str, lo: int, rows: list[dict[str, Any]]) -> None:
    if not rows:  # translate_in when no translation qualified, a part past its last request
        return
    prompts = opts.out / "prompts" / f"train-{part}-{lo}.jsonl"
    write_jsonl(prompts, rows)
    cap = min(PART_MAX_NEW.get(part, opts.max_new_tokens), opts.max_new_tokens)
    s = distill_part(opts, prompts, opts.out / "train" / f"{part}.jsonl", None,
                     long_prompts=part in LONG_PARTS, max_new_tokens=cap)
    log(opts, split="train", part=part, lo=lo, written=s["written"], done_before=s["already_done"],
        reply_tokens=s["completion_tokens"], tokens_per_s=s["tokens_per_s"], elapsed_s=s["elapsed_s"])


def parse_skip(text: str) -> dict[str, int]:
    """``alpaca=2400,math=1656``: how many first rows of each static part to leave out."""
    skip: dict[str, int] = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        part, _, n = item.partition("=")
        if part not in COUNTS or part == "synth":
            raise DataError(f"--skip: {part!r} is not a static part (one of "
                            f"{', '.join(p for p in COUNTS if p != 'synth')})")
        if not n.isdigit():
            raise DataError(f"--skip: {item!r} is not PART=ROWS")
        skip[part] = int(n)
    return skip


def training_rows(out: Path, skip: dict[str, int], exclude: frozenset[str] = frozenset()
                  ) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Every training reply under ``out/train`` past ``skip`` (a row's index is the first number of its id;
    ``translate_in`` rows follow the ``translate_out`` row they translate back) whose id is not in
    ``exclude``, in part order, and the rows kept per part. Held-out replies are never read."""
    rows: list[dict[str, Any]] = []
    kept: dict[str, int] = {}
    for path in sorted((out / "train").glob("*.jsonl")):
        if path.name.endswith((".errors.jsonl", ".prompts.jsonl")):
            continue
        part = path.stem
        first = skip.get("translate_out" if part == "translate_in" else part, 0)
        new = [r for r in read_rows(path) if _row_index(r) >= first and str(r.get("id")) not in exclude]
        rows += new
        kept[part] = len(new)
    return rows, kept


def excluded_ids(paths: str) -> frozenset[str]:
    """The row ids of the JSONL files in ``paths`` (comma-separated: earlier rounds' training files)."""
    ids: set[str] = set()
    for name in filter(None, (t.strip() for t in paths.split(","))):
        path = Path(name)
        for lineno, line in enumerate(read_text(path, DataError).splitlines(), start=1):
            try:
                ids.add(str(json.loads(line)["id"]))
            except (json.JSONDecodeError, KeyError, TypeError):
                raise DataError(f"--exclude: {path}:{lineno}: not a row with an id") from None
    return frozenset(ids)


def _row_index(row: dict[str, Any]) -> int:
    """``alpaca-12:0`` / ``tr-in-40-de:0`` -> 12 / 40 (no number: 0)."""
    found = re.search(r"-(\d+)", str(row.get("id", "")))
    return int(found.group(1)) if found else 0


def status(out: Path) -> dict[str, Any]:
    """Rows and reply tokens per part and split, and the training total."""
    found: dict[str, Any] = {}
    for split in ("train", "heldout"):
        files = sorted(p for p in (out / split).glob("*.jsonl")
                       if not p.name.endswith((".errors.jsonl", ".prompts.jsonl")))
        found[split] = {p.stem: reply_stats([p]) for p in files}
        found[f"{split}_reply_tokens"] = sum(v["reply_tokens"] for v in found[split].values())
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.data_mix", description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="/work/data-run")
    parser.add_argument("--shared", default=os.environ.get("MEDUSA_SHARED", "../shared"))
    parser.add_argument("--model", default=str(Path.home() / ".cache/medusa/models/smollm2-135m-instruct"))
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--batch-size", type=int, default=128, help="slots (a quarter for summaries and RAG)")
    parser.add_argument("--max-new-tokens", type=int, default=384)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every part's count")
    parser.add_argument("--skip", default="", metavar="PART=ROWS,...",
                        help="start each named part past its first ROWS requests (rows an earlier run "
                             "answered and a drafter trained on); ids stay those of the full part")
    parser.add_argument("--plan", default="", metavar="PART:START:CHUNK,...",
                        help="answer fresh requests: each part from row id START, CHUNK rows of each in "
                             "turn, until killed (resumable)")
    parser.add_argument("--held-out-rows", type=int, default=0, metavar="N",
                        help="with --plan: first answer the first N held-out requests of every part")
    parser.add_argument("--status", action="store_true", help="print rows and reply tokens, run nothing")
    parser.add_argument("--training-file", type=Path, metavar="FILE",
                        help="write every training reply past --skip into one new JSONL (a round's training "
                             "data), run nothing")
    parser.add_argument("--exclude", default="", metavar="FILE,...",
                        help="with --training-file: leave out the rows whose id is in these JSONL files "
                             "(earlier rounds' training files)")
    args = parser.parse_args(argv)
    if args.status:
        print(json.dumps(status(Path(args.out)), indent=1))
        return 0
    skip = parse_skip(args.skip)
    plan = parse_plan(args.plan) if args.plan else None
    if plan is not None and (skip or args.scale != 1.0):
        raise DataError("--plan names each part's first row id itself: drop --skip / --scale")
    if args.training_file is not None:
        if args.training_file.exists():
            raise DataError(f"{args.training_file}: exists; give a new file (nothing was written)")
        rows, kept = training_rows(Path(args.out), skip, excluded_ids(args.exclude))
        write_jsonl(args.training_file, rows)
        print(json.dumps({"file": str(args.training_file), "rows": len(rows), "per_part": kept}, indent=1))
        return 0
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    opts = RunOptions(args.model, Path(args.out), args.dtype, args.batch_size, args.max_new_tokens,
                      args.scale, skip=skip)
    if plan is not None:
        run_plan(opts, args.shared, plan, args.held_out_rows)
    else:
        run(opts, args.shared)
    return 0


if __name__ == "__main__":
    from medusa.cli import run_script

    raise SystemExit(run_script(main))
