"""``medusa demo`` (``make demo``): the whole pipeline on the embedded default model, offline, on a CPU.

1. ``prompts``: code prompts (a few consecutive lines) from the standard-library modules the default model
   never saw in training (``held_out_modules`` of its ``training_summary.json``), split by file into
   distillation, calibration and benchmark prompts;
2. ``distill``: the model's own greedy completions of the distillation and calibration prompts;
3. ``train``: MEDUSA-1 heads with ``medusa/demo/recipes/default_model_medusa1.yaml``;
4. ``calibrate``: the accuracy-ranked tree on the calibration completions (size chosen by predicted
   tokens/s, <= 64 nodes), written with the heads to ``<out>/final/``;
5. ``export``: the heads in vLLM's format (``<out>/export/vllm``);
6. ``bench``: plain HF ``generate`` vs MEDUSA greedy on the benchmark prompts (``<out>/report.json``,
   ``report.md``, PNG plots); then one completion is streamed and the comparison table printed.

Each stage leaves a marker in ``<out>/.stages/``: re-running reuses finished stages (delete ``<out>`` to
start over). ``--model M`` runs the same on any local causal LM.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from medusa.demo import stages as S
from medusa.errors import DataError, MedusaError
from medusa.modeling.loading import load_for_generation

# Package data, so that a wheel install runs `medusa demo` from any directory: the recipe lives here, and
# default_model is a link to the repository's data/default_model that the wheel build copies in.
PACKAGE = Path(__file__).resolve().parent
DEFAULT_MODEL = PACKAGE / "default_model"
RECIPE = PACKAGE / "recipes" / "default_model_medusa1.yaml"
# The modules data/default_model/train.py holds out (used when the model has no training_summary.json).
FALLBACK_HELD_OUT = ("argparse", "csv", "dataclasses", "difflib", "fractions", "heapq", "json", "shlex",
                     "statistics", "textwrap")


@dataclass
class DemoSettings:
    model: str = str(DEFAULT_MODEL)
    out: str = "out/demo"
    recipe: str = str(RECIPE)
    recipe_overrides: tuple[str, ...] = ()
    prompt_lines: int = 6  # lines of code per prompt
    distill_prompts: int = 2400
    calib_prompts: int = 96
    bench_prompts: int = 8
    distill_tokens: int = 96
    distill_batch: int = 64
    max_new_tokens: int = 96  # per benchmark prompt
    repeats: int = 1
    nodes: str = "auto"
    threads: int | None = None  # torch threads for distillation and training (None: torch's default)
    timing_threads: int | None = 1  # torch threads while timing (calibrate --nodes auto, bench, the stream)
    progress: bool = True


def held_out_files(model_dir: str | Path, stdlib: str | Path | None = None) -> list[Path]:
    """Standard-library ``.py`` files of the modules the model was not trained on (sorted)."""
    import json
    import sysconfig

    root = Path(stdlib or sysconfig.get_paths()["stdlib"])
    summary = Path(model_dir) / "training_summary.json"
    modules = FALLBACK_HELD_OUT
    if summary.is_file():
        modules = tuple(json.loads(summary.read_text()).get("held_out_modules") or modules)
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        top = rel.parts[0].removesuffix(".py")
        if top in ("site-packages", "dist-packages"):
            continue
        name = rel.parts[1].removesuffix(".py") if top == "test" and len(rel.parts) > 1 else None
        if top in modules or (name and any(name == f"test_{m}" or name.startswith(f"test_{m}_")
                                           for m in modules)):
            files.append(path)
    if not files:
        raise DataError(f"{root}: none of the held-out modules {', '.join(modules)} found in the "
                        f"standard library")
    return files


def code_prompts(path: Path, lines: int) -> list[str]:
    """Non-overlapping windows of ``lines`` lines that start a statement (no leading blank or comment)."""
    text = path.read_text(encoding="utf-8", errors="replace").splitlines()
    out = []
    for start in range(0, max(len(text) - 2 * lines, 0), lines):
        chunk = text[start:start + lines]
        first = chunk[0].strip()
        if not first or first.startswith("#") or sum(len(c) for c in chunk) > 400 or len(
                "".join(chunk).strip()) < 40:
            continue
        out.append("\n".join(chunk) + "\n")
    return out


def _spread(items: list[Any], n: int) -> list[Any]:
    """``n`` items evenly spaced over ``items`` (all of them when there are fewer)."""
    if len(items) <= n:
        return items
    step = len(items) / n
    return [items[int(i * step)] for i in range(n)]


def split_prompts(s: DemoSettings) -> dict[str, list[dict[str, str]]]:
    """By file: every 8th held-out file gives bench prompts, the next calibration, the rest distillation."""
    from transformers import AutoConfig, AutoTokenizer

    files = held_out_files(s.model)
    tokenizer = AutoTokenizer.from_pretrained(s.model)
    positions = getattr(AutoConfig.from_pretrained(s.model).get_text_config(),
                        "max_position_embeddings", None)
    # prompt + reply (+ a MEDUSA tree's depth, for the benchmark) must fit the model's positions
    budget = positions - max(s.distill_tokens, s.max_new_tokens) - 8 if positions else None
    buckets: dict[str, list[str]] = {"distill": [], "calib": [], "bench": []}
    for i, path in enumerate(files):
        name = "bench" if i % 8 == 0 else "calib" if i % 8 == 1 else "distill"
        prompts = code_prompts(path, s.prompt_lines)
        if budget is not None and prompts:
            lengths = tokenizer(prompts)["input_ids"]
            prompts = [p for p, ids in zip(prompts, lengths) if len(ids) <= budget]
        buckets[name] += prompts
    sizes = {"distill": s.distill_prompts, "calib": s.calib_prompts, "bench": s.bench_prompts}
    rows = {}
    for name, prompts in buckets.items():
        if not prompts:
            raise DataError(f"no {name} prompts from the held-out files {[str(f) for f in files[:3]]}...")
        rows[name] = [{"id": f"{name}-{i}", "prompt": p} for i, p in enumerate(_spread(prompts, sizes[name]))]
    return rows


def run(s: DemoSettings, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run (or reuse) every stage; returns the summary (also ``<out>/summary.json``). ``s.progress=False``:
    no progress bar at all (ours, and transformers' while it loads a model)."""
    with S.hf_progress_bars(s.progress):
        return _run_stages(s, log)


def check_settings(s: DemoSettings) -> None:
    """The model, and the training recipe with the ``--set`` overrides, checked before the first stage runs
    (an unknown key or a bad value fails at once, not after the distillation). The training data does not
    exist yet: the recipe file stands in for it (an override of ``data.train`` is checked as given)."""
    from medusa.config import load_recipe

    if not (Path(s.model) / "config.json").is_file():
        raise MedusaError(f"{s.model}: no model there (config.json missing); give --model DIR")
    load_recipe(s.recipe, [f"model={Path(s.model).resolve()}", f"data.train={s.recipe}",
                           f"output_dir={Path(s.out) / 'medusa1'}", *s.recipe_overrides])


def _run_stages(s: DemoSettings, log: Callable[[str], None]) -> dict[str, Any]:
    import json

    import torch

    if s.threads is not None:
        torch.set_num_threads(s.threads)
    check_settings(s)
    out = Path(s.out)
    data = out / "data"
    model = str(Path(s.model).resolve())
    rows = split_prompts(s)
    done: dict[str, Any] = {}
    done["prompts"] = S.run_stage(out, "prompts", lambda: {
        name: len(S.write_jsonl(data / f"prompts_{name}.jsonl", r).read_text().splitlines())
        for name, r in rows.items()}, log)

    def distill() -> dict[str, Any]:
        train = S.distill(model, data / "prompts_distill.jsonl", data / "train.jsonl", s.distill_tokens,
                          batch_size=s.distill_batch, progress=s.progress)
        calib = S.distill(model, data / "prompts_calib.jsonl", data / "calib.jsonl", s.distill_tokens,
                          batch_size=s.distill_batch, progress=s.progress)
        return {"train": train, "calib": calib}

    done["distill"] = S.run_stage(out, "distill", distill, log)
    overrides = [f"model={model}", f"data.train={data / 'train.jsonl'}", f"output_dir={out / 'medusa1'}",
                 *s.recipe_overrides]
    done["train"] = S.run_stage(out, "train", lambda: S.train_recipe(
        s.recipe, overrides, progress=s.progress), log)
    with S.torch_threads(s.timing_threads):
        done["calibrate"] = S.run_stage(out, "calibrate", lambda: S.calibrate_stage(
            done["train"]["final_dir"], out / "final", data / "calib.jsonl", nodes=s.nodes,
            progress=s.progress), log)
    done["export"] = S.run_stage(out, "export",
                                 lambda: S.export_stage(out / "final", out / "export" / "vllm"), log)
    prompts = [r["prompt"] for r in rows["bench"]]
    with S.torch_threads(s.timing_threads):
        done["bench"] = S.run_stage(out, "bench", lambda: S.bench_stage(
            out / "final", prompts, out / "report.json", s.max_new_tokens, repeats=s.repeats,
            progress=s.progress), log)
    summary = {"settings": asdict(s), "stages": done}
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return summary


def stream_one(heads_dir: str | Path, prompt: str, max_new_tokens: int) -> Any:
    """Decode ``prompt`` with MEDUSA (greedy, stopping at EOS), printing the text as tokens are accepted;
    returns the :class:`MedusaGenerateOutput` with ``new_tokens`` set."""
    from transformers import TextStreamer


    model, tokenizer = load_for_generation(str(heads_dir))
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    streamer = TextStreamer(tokenizer, skip_prompt=False, skip_special_tokens=True)
    out = model.generate(ids, max_new_tokens=max_new_tokens, streamer=streamer, return_dict_in_generate=True)
    out.new_tokens = out.sequences.shape[1] - ids.shape[1]
    return out


def comparison_table(report: dict[str, Any]) -> str:
    c = report["config"]
    n = report["prompts"]
    same = round((report["greedy_exact_match"] or 0) * n)
    return "\n".join([
        (f"plain HF generate vs MEDUSA, greedy, {n} held-out prompts x {c['max_new_tokens']} tokens "
        f"({c['tree_nodes']}-node tree, {c['dtype']}, {c['torch_threads']} threads)"),
        f"{'':14}{'tokens/s':>10}{'tokens/step':>13}{'speedup':>10}   identical output",
        f"{'HF generate':14}{report['baseline_tokens_per_s']:10.1f}{1.0:13.2f}{1.0:9.2f}x",
        f"{'MEDUSA':14}{report['medusa_tokens_per_s']:10.1f}{report['tokens_per_step']:13.2f}"
        f"{report['speedup']:9.2f}x   {same}/{n} prompts" + ("" if same == n else "  <-- MISMATCH"),
    ])


def main(s: DemoSettings) -> int:
    import json
    import time

    t0 = time.perf_counter()
    check_settings(s)  # before the first line: a bad --set is the one error line
    print(f"medusa demo: {s.model} -> {s.out}")
    summary = run(s)
    out = Path(s.out)
    report = json.loads((out / "report.json").read_text())
    bench_prompts = [json.loads(line)["prompt"] for line in (out / "data" / "prompts_bench.jsonl").read_text()
                     .splitlines()]
    order = sorted(range(len(report["rows"])), key=lambda i: report["rows"][i]["tokens_per_step"])
    prompt = bench_prompts[order[(len(order) - 1) // 2]]  # the (lower) median tokens/step: a typical prompt
    print("\n--- one completion, streamed as MEDUSA accepts tokens (prompt first) ---")
    with S.torch_threads(s.timing_threads), S.hf_progress_bars(s.progress):
        res = stream_one(out / "final", prompt, s.max_new_tokens)
    sys.stdout.flush()
    print(f"--- {res.new_tokens} tokens in {res.num_steps} verification steps after the prefill: "
          f"{res.tokens_per_step:.2f} tokens/step ---\n")
    print(comparison_table(report))
    stages = summary["stages"]
    print("\nstages: " + ", ".join(f"{k} {v.get('seconds', 0):.0f}s" + (" (reused)"
                                                                        if v.get("reused") else "")
                                   for k, v in stages.items()))
    print(f"artefacts: heads + tree {out / 'final'}, vLLM export {out / 'export' / 'vllm'}, "
          f"report {out / 'report.json'} (+ .md, PNGs); this run took {time.perf_counter() - t0:.0f}s")
    return 0


__all__ = ["DemoSettings", "check_settings", "code_prompts", "comparison_table", "held_out_files", "main",
           "run", "split_prompts", "stream_one"]
