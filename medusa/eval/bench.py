"""``medusa bench``: MEDUSA decoding against plain HF ``generate`` (and optional assisted / prompt-lookup
baselines), measured per prompt in one process, interleaved; JSON report + markdown table + PNG plots.

For every prompt (batch 1) each method runs ``repeats`` times in a rotating order after one warm-up
of each; the fastest run counts. All methods use the same model object (same weights, dtype, device)
and the same token budget. With ``ignore_eos`` (the default) no method stops at EOS, so every one writes
exactly ``max_new_tokens`` tokens and greedy outputs compare token for token; with ``ignore_eos=False``
all methods stop at the model's EOS token(s).

Report keys: ``baseline_tokens_per_s``, ``medusa_tokens_per_s`` (total new tokens / total time),
``speedup`` (median of per-prompt ratios), ``tokens_per_step``, ``overhead`` (MEDUSA verification step
time / a plain single-token forward with a KV cache), ``greedy_exact_match`` (fraction of prompts whose
greedy MEDUSA output equals the baseline's; None when sampling), ``rows`` (per prompt), and more.
Figures are measured, never asserted.
"""

from __future__ import annotations

import copy
import datetime as _dt
import json
import platform
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from medusa.errors import MedusaError


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Any, device: torch.device) -> tuple[Any, float]:
    _sync(device)
    t0 = time.perf_counter()
    out = fn()
    _sync(device)
    return out, time.perf_counter() - t0


def _generation_config(base: Any, ignore_eos: bool, pad_token_id: int | None, max_new_tokens: int,
                       sampling: dict[str, Any], **extra: Any) -> Any:
    """A copy of the base model's generation config holding every decoding parameter of one method
    (without EOS when ``ignore_eos``): greedy, or sampling with exactly ``sampling``'s parameters."""
    from transformers import GenerationConfig

    gen = getattr(base, "generation_config", None)
    gen = copy.deepcopy(gen) if gen is not None else GenerationConfig()
    if ignore_eos:
        gen.eos_token_id = None
    if pad_token_id is not None:
        gen.pad_token_id = pad_token_id
    gen.max_new_tokens = max_new_tokens
    gen.do_sample = bool(sampling)
    gen.temperature = sampling.get("temperature", 1.0)
    gen.top_k = sampling.get("top_k")
    gen.top_p = sampling.get("top_p", 1.0)
    for key, value in extra.items():
        setattr(gen, key, value)
    return gen


def _pad_id(base: Any, tokenizer: Any) -> int | None:
    pad = getattr(tokenizer, "pad_token_id", None)
    if pad is None:
        eos = getattr(base.generation_config, "eos_token_id", None) if hasattr(base, "generation_config") else None
        pad = eos[0] if isinstance(eos, (list, tuple)) and eos else eos
    return pad if pad is not None else 0


@torch.no_grad()
def bench(model: Any, tokenizer: Any, prompts: Sequence[str], max_new_tokens: int = 128,
          acceptance: str = "greedy", temperature: float = 1.0, top_k: int | None = None,
          top_p: float | None = None, tree: Any = None, assistant_model: Any = None,
          assistant_tokenizer: Any = None, prompt_lookup: bool = False, prompt_lookup_num_tokens: int = 10,
          repeats: int = 1, ignore_eos: bool = True, seed: int = 0, progress: bool = True,
          plain_step_samples: int = 32) -> dict[str, Any]:
    """Measure ``model`` (a :class:`MedusaModel`) against its own base model on ``prompts``; returns the report.

    ``acceptance="greedy"`` compares with ``generate(do_sample=False)``; ``"sample"`` / ``"typical"`` with
    ``generate(do_sample=True, temperature, top_k, top_p)`` (then ``greedy_exact_match`` is None).
    ``assistant_model``: a draft model for HF assisted generation (classic speculative decoding; a
    different tokenizer needs ``assistant_tokenizer``); ``prompt_lookup``: HF prompt-lookup decoding.
    """
    from tqdm.auto import tqdm

    from medusa.decoding.generate import ACCEPTANCE
    from medusa.eval.profile import plain_step_time

    if acceptance not in ACCEPTANCE:
        raise MedusaError(f"--acceptance must be one of {', '.join(ACCEPTANCE)}, got {acceptance!r}")
    if not prompts:
        raise MedusaError("no prompts to benchmark")
    if max_new_tokens < 1 or repeats < 1:
        raise MedusaError(f"--max-new-tokens and --repeats must be >= 1, got {max_new_tokens} and {repeats}")
    greedy = acceptance == "greedy"
    base = model.base_model
    device = model.device
    tree = tree if tree is not None else model.tree
    pad = _pad_id(base, tokenizer)
    medusa_eos = [] if ignore_eos else None
    hf_sampling: dict[str, Any] = {}
    if not greedy:  # unset top_k / top_p resolve as medusa_generate (and HF) resolve them
        from medusa.decoding.generate import sampling_defaults

        k, p = sampling_defaults(model, top_k, top_p)
        hf_sampling = {"temperature": temperature, "top_k": k, "top_p": 1.0 if p is None else p}
    gen_cfg = _generation_config(base, ignore_eos, pad, max_new_tokens, hf_sampling)
    lookup_cfg = _generation_config(base, ignore_eos, pad, max_new_tokens, hf_sampling,
                                    prompt_lookup_num_tokens=prompt_lookup_num_tokens)
    gen = torch.Generator(device=device)

    def run_baseline(ids: torch.Tensor, i: int) -> torch.Tensor:
        torch.manual_seed(seed + i)
        return base.generate(ids, attention_mask=torch.ones_like(ids), generation_config=gen_cfg)

    def run_medusa(ids: torch.Tensor, i: int) -> Any:
        gen.manual_seed(seed + i)
        return model.generate(ids, max_new_tokens=max_new_tokens, acceptance=acceptance, temperature=temperature,
                              top_k=top_k, top_p=top_p, tree=tree, eos_token_id=medusa_eos,
                              return_dict_in_generate=True, generator=gen)

    def run_assisted(ids: torch.Tensor, i: int) -> torch.Tensor:
        torch.manual_seed(seed + i)
        extra = {}
        if assistant_tokenizer is not None:
            extra = {"tokenizer": tokenizer, "assistant_tokenizer": assistant_tokenizer}
        return base.generate(ids, attention_mask=torch.ones_like(ids), generation_config=gen_cfg,
                             assistant_model=assistant_model, **extra)

    def run_lookup(ids: torch.Tensor, i: int) -> torch.Tensor:
        torch.manual_seed(seed + i)
        return base.generate(ids, attention_mask=torch.ones_like(ids), generation_config=lookup_cfg)

    methods: dict[str, Any] = {"baseline": run_baseline, "medusa": run_medusa}
    if assistant_model is not None:
        methods["assisted"] = run_assisted
    if prompt_lookup:
        methods["prompt_lookup"] = run_lookup

    encoded = [tokenizer(p, return_tensors="pt").input_ids.to(device) for p in prompts]  # each [1, P]
    for name, fn in methods.items():  # warm-up: allocations, lazy imports, first-call paths
        fn(encoded[0], 0)
    plain_step_time(base, encoded[0], steps=4)

    rows: list[dict[str, Any]] = []
    accept_hist: Counter = Counter()
    bar = tqdm(total=len(prompts), desc="bench", unit="prompt", disable=not progress, dynamic_ncols=True)
    names = list(methods)
    for i, (prompt, ids) in enumerate(zip(prompts, encoded)):
        best: dict[str, float] = {n: float("inf") for n in names}
        outputs: dict[str, Any] = {}
        for r in range(repeats):
            shift = (i + r) % len(names)  # rotate the order so no method always runs first
            for name in names[shift:] + names[:shift]:
                out, seconds = _timed(lambda fn=methods[name], x=ids, j=i: fn(x, j), device)
                if seconds < best[name]:
                    best[name], outputs[name] = seconds, out
        plain = min(plain_step_time(base, ids, steps=min(plain_step_samples, max_new_tokens))
                    for _ in range(repeats))
        md = outputs["medusa"]
        p_len = ids.shape[1]
        new = {n: (outputs[n].sequences if n == "medusa" else outputs[n]).shape[1] - p_len for n in names}
        for a in md.accept_lengths[0]:
            accept_hist[int(a)] += 1
        base_seq = outputs["baseline"][0]
        row: dict[str, Any] = {
            "prompt": prompt if len(prompt) <= 200 else prompt[:197] + "...",
            "prompt_tokens": int(p_len),
            "new_tokens": new["medusa"],
            "baseline_new_tokens": new["baseline"],
            "baseline_s": best["baseline"],
            "medusa_s": best["medusa"],
            "baseline_tokens_per_s": new["baseline"] / best["baseline"],
            "medusa_tokens_per_s": new["medusa"] / best["medusa"],
            "speedup": (new["medusa"] / best["medusa"]) / (new["baseline"] / best["baseline"]),
            "steps": md.num_steps,
            "tokens_per_step": md.tokens_per_step,
            "medusa_step_ms": 1e3 * md.decode_time_s / max(md.num_steps, 1),
            "plain_step_ms": 1e3 * plain,
            "hf_step_ms": 1e3 * best["baseline"] / max(new["baseline"], 1),
            "exact_match": bool(torch.equal(md.sequences[0].cpu(), base_seq.cpu())) if greedy else None,
        }
        for extra in ("assisted", "prompt_lookup"):
            if extra in outputs:
                row[f"{extra}_s"] = best[extra]
                row[f"{extra}_new_tokens"] = new[extra]
                row[f"{extra}_tokens_per_s"] = new[extra] / best[extra]
                row[f"{extra}_speedup"] = row[f"{extra}_tokens_per_s"] / row["baseline_tokens_per_s"]
                row[f"{extra}_exact_match"] = (bool(torch.equal(outputs[extra][0].cpu(), base_seq.cpu()))
                                               if greedy else None)
        rows.append(row)
        bar.update(1)
        bar.set_postfix(speedup=f"{row['speedup']:.2f}", tps=f"{row['tokens_per_step']:.2f}", refresh=False)
    bar.close()
    return summarize(rows, accept_hist, _bench_config(model, tokenizer, max_new_tokens, acceptance, temperature,
                                                        top_k, top_p, tree, assistant_model, prompt_lookup,
                                                        prompt_lookup_num_tokens, repeats, ignore_eos, seed))


def _bench_config(model: Any, tokenizer: Any, max_new_tokens: int, acceptance: str, temperature: float,
                  top_k: int | None, top_p: float | None, tree: Any, assistant_model: Any, prompt_lookup: bool,
                  lookup_tokens: int, repeats: int, ignore_eos: bool, seed: int) -> dict[str, Any]:
    import transformers

    base = model.base_model
    params = next(base.parameters())
    return {
        "base_model": model.config.base_model_name_or_path,
        "num_heads": model.num_heads,
        "num_layers": model.config.num_layers,
        "tree_nodes": len(tree) if tree is not None else None,
        "tree_source": "given" if tree is not None else "built-in default",
        "max_new_tokens": max_new_tokens,
        "acceptance": acceptance,
        "temperature": None if acceptance == "greedy" else temperature,
        "top_k": top_k, "top_p": top_p,
        "ignore_eos": ignore_eos,
        "repeats": repeats,
        "seed": seed,
        "dtype": str(params.dtype).removeprefix("torch."),
        "device": str(params.device),
        "torch_threads": torch.get_num_threads(),
        "assistant_model": str(getattr(getattr(assistant_model, "config", None), "name_or_path", "") or "")
        if assistant_model is not None else None,
        "prompt_lookup_num_tokens": lookup_tokens if prompt_lookup else None,
        "hardware": _hardware(params.device),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def _hardware(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import os

    return f"{platform.processor() or platform.machine()} CPU, {os.cpu_count()} cores visible"


def summarize(rows: list[dict[str, Any]], accept_hist: Counter, config: dict[str, Any]) -> dict[str, Any]:
    """Aggregate per-prompt rows into the report (totals, medians, histogram)."""
    total = lambda key: sum(r[key] for r in rows)
    steps = total("steps")
    gained = sum(k * v for k, v in accept_hist.items())
    report: dict[str, Any] = {
        "config": config,
        "prompts": len(rows),
        "new_tokens": total("new_tokens"),
        "baseline_tokens_per_s": total("baseline_new_tokens") / total("baseline_s"),
        "medusa_tokens_per_s": total("new_tokens") / total("medusa_s"),
        "speedup": statistics.median(r["speedup"] for r in rows),
        "speedup_mean": statistics.fmean(r["speedup"] for r in rows),
        "speedup_min": min(r["speedup"] for r in rows),
        "speedup_max": max(r["speedup"] for r in rows),
        "tokens_per_step": gained / steps if steps else 0.0,
        "medusa_step_ms": statistics.fmean(r["medusa_step_ms"] for r in rows),
        "plain_step_ms": statistics.fmean(r["plain_step_ms"] for r in rows),
        "hf_step_ms": statistics.fmean(r["hf_step_ms"] for r in rows),
        "greedy_exact_match": (sum(r["exact_match"] for r in rows) / len(rows)
                               if rows[0]["exact_match"] is not None else None),
        "accept_length_histogram": {str(k): accept_hist[k] for k in sorted(accept_hist)},
    }
    report["overhead"] = report["medusa_step_ms"] / report["plain_step_ms"]
    for extra in ("assisted", "prompt_lookup"):
        if f"{extra}_s" in rows[0]:
            report[extra] = {
                "tokens_per_s": total(f"{extra}_new_tokens") / total(f"{extra}_s"),
                "speedup": statistics.median(r[f"{extra}_speedup"] for r in rows),
                "greedy_exact_match": (sum(r[f"{extra}_exact_match"] for r in rows) / len(rows)
                                       if rows[0][f"{extra}_exact_match"] is not None else None),
            }
    report["rows"] = rows
    return report


# ---------------------------------------------------------------------------------------- output
def markdown_table(report: dict[str, Any]) -> str:
    """The summary (one row per method) and the per-prompt rows as markdown."""
    c = report["config"]
    lines = [
        (f"MEDUSA vs HF `generate` — {c['base_model'] or 'base'}, {c['num_heads']} heads, tree "
        f"{c['tree_nodes'] or 'default'} nodes, {report['prompts']} prompts x {c['max_new_tokens']} new tokens, "
        f"{c['acceptance']}, {c['dtype']} on {c['hardware']} ({c['torch_threads']} threads), {c['date']}"),
        "",
        "| method | tokens/s | speedup (median) | tokens/step | step ms | identical output |",
        "|---|---:|---:|---:|---:|---:|",
        f"| HF generate | {report['baseline_tokens_per_s']:.1f} | 1.00x | 1.00 | {report['hf_step_ms']:.2f} | — |",
        (f"| MEDUSA | {report['medusa_tokens_per_s']:.1f} | {report['speedup']:.2f}x | "
        f"{report['tokens_per_step']:.2f} | {report['medusa_step_ms']:.2f} | {_frac(report['greedy_exact_match'])} |"),
    ]
    for extra, label in (("assisted", "HF assisted (draft model)"), ("prompt_lookup", "HF prompt lookup")):
        if report.get(extra):
            e = report[extra]
            lines.append(f"| {label} | {e['tokens_per_s']:.1f} | {e['speedup']:.2f}x | — | — | "
                         f"{_frac(e['greedy_exact_match'])} |")
    lines += ["", (f"overhead (MEDUSA step / plain 1-token forward {report['plain_step_ms']:.2f} ms): "
              f"{report['overhead']:.2f}"), "",
              "| # | prompt tokens | new | baseline tok/s | MEDUSA tok/s | speedup | tokens/step | identical |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for i, r in enumerate(report["rows"]):
        lines.append(f"| {i} | {r['prompt_tokens']} | {r['new_tokens']} | {r['baseline_tokens_per_s']:.1f} | "
                     f"{r['medusa_tokens_per_s']:.1f} | {r['speedup']:.2f}x | {r['tokens_per_step']:.2f} | "
                     f"{'—' if r['exact_match'] is None else ('yes' if r['exact_match'] else 'NO')} |")
    return "\n".join(lines) + "\n"


def _frac(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}"


def plot_report(report: dict[str, Any], stem: str | Path) -> list[Path]:
    """``<stem>_accept_lengths.png`` (histogram of tokens gained per step) and ``<stem>_speedup.png``."""
    from medusa.tree.plot import pyplot

    plt = pyplot()
    stem = Path(stem)
    paths = []
    hist = {int(k): v for k, v in report["accept_length_histogram"].items()}
    fig, ax = plt.subplots(figsize=(5, 3.2), dpi=120)
    xs = list(range(1, max(hist, default=1) + 1))
    ax.bar(xs, [hist.get(x, 0) for x in xs], color="tab:blue")
    ax.set_xlabel("tokens gained per verification step")
    ax.set_ylabel("steps")
    ax.set_title(f"accept lengths (mean {report['tokens_per_step']:.2f} tokens/step)", fontsize=9)
    fig.tight_layout()
    paths.append(stem.with_name(stem.name + "_accept_lengths.png"))
    fig.savefig(paths[-1])
    plt.close(fig)

    speed = [r["speedup"] for r in report["rows"]]
    fig, ax = plt.subplots(figsize=(max(4, 0.25 * len(speed) + 2), 3.2), dpi=120)
    ax.bar(range(len(speed)), speed, color=["tab:green" if s >= 1 else "tab:red" for s in speed])
    ax.axhline(1.0, color="black", lw=0.8)
    ax.axhline(report["speedup"], color="tab:blue", lw=1, ls="--", label=f"median {report['speedup']:.2f}x")
    ax.set_xlabel("prompt")
    ax.set_ylabel("speedup over HF generate")
    ax.legend(fontsize=8)
    ax.set_title("MEDUSA speedup per prompt", fontsize=9)
    fig.tight_layout()
    paths.append(stem.with_name(stem.name + "_speedup.png"))
    fig.savefig(paths[-1])
    plt.close(fig)
    return paths


def write_report(report: dict[str, Any], out: str | Path, plots: bool = True) -> list[Path]:
    """Write ``out`` (JSON), ``out`` with ``.md`` (the markdown table) and, with ``plots``, two PNGs."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    tmp.replace(out)
    md = out.with_suffix(".md")
    md.write_text(markdown_table(report))
    written = [out, md]
    if plots:
        written += plot_report(report, out.with_suffix(""))
    return written


def format_summary(report: dict[str, Any]) -> str:
    """A short plain-text summary for the terminal."""
    lines = [f"HF generate          {report['baseline_tokens_per_s']:8.1f} tokens/s",
             f"MEDUSA               {report['medusa_tokens_per_s']:8.1f} tokens/s",
             (f"speedup (median)     {report['speedup']:8.2f}x   (range {report['speedup_min']:.2f}-"
             f"{report['speedup_max']:.2f})"),
             f"tokens/step          {report['tokens_per_step']:8.2f}",
             (f"overhead             {report['overhead']:8.2f}   (MEDUSA step {report['medusa_step_ms']:.2f} ms / "
             f"plain forward {report['plain_step_ms']:.2f} ms)")]
    if report["greedy_exact_match"] is not None:
        lines.append(f"greedy exact match   {report['greedy_exact_match']:8.2f}")
    for extra, label in (("assisted", "HF assisted"), ("prompt_lookup", "HF prompt lookup")):
        if report.get(extra):
            lines.append(f"{label:<20} {report[extra]['tokens_per_s']:8.1f} tokens/s, "
                         f"{report[extra]['speedup']:.2f}x")
    return "\n".join(lines)


__all__ = ["bench", "format_summary", "markdown_table", "plot_report", "summarize", "write_report"]
