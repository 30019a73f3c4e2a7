"""The bench report: aggregate per-prompt rows (``summarize``), the markdown table, the PNG plots, the
files (``write_report``) and the terminal summary (``format_summary``).

Report keys: ``baseline_tokens_per_s``, ``medusa_tokens_per_s`` (total new tokens / total time),
``speedup`` (median of per-prompt ratios), ``tokens_per_step``, ``overhead`` (MEDUSA verification step
time / a plain single-token forward with a KV cache), ``greedy_exact_match`` (fraction of prompts whose
greedy MEDUSA output equals the baseline's; None when sampling), ``rows`` (per prompt), and more.
Optional methods, each a dict of ``tokens_per_s`` / ``speedup`` / ``greedy_exact_match`` when measured:
``assisted`` and ``prompt_lookup`` (HF), ``lookup_alone`` and ``hybrid`` (MEDUSA's context-lookup chain
alone and beside the heads, ``bench(compare_lookup=L)``; also ``tokens_per_step``), and always
``own_plain`` (our own decode loop with no drafts, the same packed model: MEDUSA's tokens/s over its
tokens/s is the gain of the drafts themselves). Greedy runs add ``fidelity``
(:func:`medusa.eval.fidelity.fidelity_summary`: identity of MEDUSA with our plain decode and with HF, and the
base's top-2 logit margin where they first differ).
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

from medusa.calibrate.plot import pyplot

LOOKUP_LABELS = {"lookup_alone": "lookup alone", "hybrid": "hybrid"}  # bench(compare_lookup=L)'s methods


def aggregate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures of a set of per-prompt rows: totals, medians, tokens per verification step."""
    total = lambda key: sum(r[key] for r in rows)
    steps = total("steps")
    gained = sum(r["tokens_per_step"] * r["steps"] for r in rows)  # tokens gained over all verification steps
    report: dict[str, Any] = {
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
    }
    report["overhead"] = report["medusa_step_ms"] / report["plain_step_ms"]
    for extra in ("own_plain", *LOOKUP_LABELS, "assisted", "prompt_lookup"):
        if f"{extra}_s" in rows[0]:
            report[extra] = {
                "tokens_per_s": total(f"{extra}_new_tokens") / total(f"{extra}_s"),
                "speedup": statistics.median(r[f"{extra}_speedup"] for r in rows),
                "greedy_exact_match": (sum(r[f"{extra}_exact_match"] for r in rows) / len(rows)
                                       if rows[0][f"{extra}_exact_match"] is not None else None),
            }
        if f"{extra}_steps" in rows[0]:  # MEDUSA's lookup methods: tokens gained per verification step
            e_steps = total(f"{extra}_steps")
            gained_e = sum(r[f"{extra}_tokens_per_step"] * r[f"{extra}_steps"] for r in rows)
            report[extra]["tokens_per_step"] = gained_e / e_steps if e_steps else 0.0
    return report


def summarize(rows: list[dict[str, Any]], accept_hist: Counter, config: dict[str, Any]) -> dict[str, Any]:
    """The report: ``config``, the figures over all rows, the accepted-length histogram, the figures per
    category when rows carry a ``category`` (Spec-Bench style), and the rows."""
    report: dict[str, Any] = {"config": config, **aggregate(rows),
                              "accept_length_histogram": {str(k): accept_hist[k]
                                                          for k in sorted(accept_hist)}}
    if "category" in rows[0]:
        names = list(dict.fromkeys(r["category"] for r in rows))  # first-seen order
        report["categories"] = {c: aggregate([r for r in rows if r["category"] == c]) for c in names}
    report["rows"] = rows
    return report


def category_table(report: dict[str, Any]) -> str:
    """Spec-Bench-style markdown: a row per category and overall — tokens/step, speedup over HF generate
    (median of per-prompt ratios), greedy exact match; then, when measured, MEDUSA's lookup chain alone and
    the hybrid (tokens/step, speedup, exact match) and HF prompt lookup (speedup, exact match)."""
    ours = [m for m in LOOKUP_LABELS if m in report]
    lookup = "prompt_lookup" in report
    head = "| category | prompts | tokens/step | speedup | exact match |"
    head += "".join(f" {LOOKUP_LABELS[m]} {c} |" for m in ours
                    for c in ("tokens/step", "speedup", "exact match"))
    lines = [head + (" prompt lookup speedup | lookup exact match |" if lookup else ""),
             "|---" * (5 + 3 * len(ours) + (2 if lookup else 0)) + "|"]
    groups = {**report.get("categories", {}), "overall": report}
    for name, g in groups.items():
        cells = [name, str(g["prompts"]), f"{g['tokens_per_step']:.2f}", f"{g['speedup']:.2f}x",
                 _frac(g["greedy_exact_match"])]
        for m in ours:
            cells += _lookup_cells(g[m])
        if lookup:
            cells += [f"{g['prompt_lookup']['speedup']:.2f}x",
                      _frac(g["prompt_lookup"]["greedy_exact_match"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------- output
def markdown_table(report: dict[str, Any]) -> str:
    """The summary (one row per method) and the per-prompt rows as markdown."""
    c = report["config"]
    lines = [
        (f"MEDUSA vs HF `generate` — {c['base_model'] or 'base'}, {c['num_heads']} heads, tree "
        f"{c['tree_nodes'] or 'default'} nodes, {report['prompts']} prompts x {c['max_new_tokens']} "
        f"new tokens, {c['acceptance']}, {c['dtype']} on {c['hardware']} ({c['torch_threads']} threads), "
        f"{c['date']}"), "",
        "| method | tokens/s | speedup (median) | tokens/step | step ms | identical output |",
        "|---|---:|---:|---:|---:|---:|",
        f"| HF generate | {report['baseline_tokens_per_s']:.1f} | 1.00x | 1.00 | "
        f"{report['hf_step_ms']:.2f} | — |",
        (f"| MEDUSA{' heads only' if any(m in report for m in LOOKUP_LABELS) else ''} | "
        f"{report['medusa_tokens_per_s']:.1f} | {report['speedup']:.2f}x | "
        f"{report['tokens_per_step']:.2f} | {report['medusa_step_ms']:.2f} | "
        f"{_frac(report['greedy_exact_match'])} |"),
    ]
    for m in (m for m in LOOKUP_LABELS if report.get(m)):
        e, n = report[m], c.get("compare_lookup")
        tps, speedup, exact = _lookup_cells(e)
        lines.append(f"| MEDUSA {LOOKUP_LABELS[m]}{f' (L={n})' if n else ''} | {e['tokens_per_s']:.1f} | "
                     f"{speedup} | {tps} | — | {exact} |")
    for extra, label in (("own_plain", "our plain decode (no drafts)"),
                         ("assisted", "HF assisted (draft model)"), ("prompt_lookup", "HF prompt lookup")):
        if report.get(extra):
            e = report[extra]
            lines.append(f"| {label} | {e['tokens_per_s']:.1f} | {e['speedup']:.2f}x | — | — | "
                         f"{_frac(e['greedy_exact_match'])} |")
    lines += [line for line in (_gain_line(report), _fidelity_line(report)) if line]
    lines += ["", (f"overhead (MEDUSA step / plain 1-token forward {report['plain_step_ms']:.2f} ms): "
              f"{report['overhead']:.2f}"), "",
              ("| # | prompt tokens | new | baseline tok/s | MEDUSA tok/s | speedup | tokens/step | "
               "identical |"),
              "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for i, r in enumerate(report["rows"]):
        lines.append(f"| {i} | {r['prompt_tokens']} | {r['new_tokens']} | {r['baseline_tokens_per_s']:.1f} | "
                     f"{r['medusa_tokens_per_s']:.1f} | {r['speedup']:.2f}x | {r['tokens_per_step']:.2f} | "
                     f"{'—' if r['exact_match'] is None else ('yes' if r['exact_match'] else 'NO')} |")
    return "\n".join(lines) + "\n"


def _gain_line(report: dict[str, Any]) -> str:
    """The drafts' own gain: each MEDUSA method's tokens/s over our plain decode's (same loop, no drafts)."""
    plain = report.get("own_plain")
    if not plain:
        return ""
    gains = [f"heads {report['medusa_tokens_per_s'] / plain['tokens_per_s']:.2f}x"]
    gains += [f"{LOOKUP_LABELS[m]} {report[m]['tokens_per_s'] / plain['tokens_per_s']:.2f}x"
              for m in LOOKUP_LABELS if report.get(m)]
    return (f"drafts over our plain decode ({plain['tokens_per_s']:.1f} tokens/s): " + ", ".join(gains))


def _fidelity_line(report: dict[str, Any]) -> str:
    """Identity with our plain decode and with HF greedy, and the largest top-2 margin at a divergence."""
    f = report.get("fidelity")
    if not f:
        return ""
    parts = []
    for key, label in (("vs_own_plain", "MEDUSA = our plain"), ("vs_hf", "MEDUSA = HF"),
                       ("own_plain_vs_hf", "our plain = HF")):
        if key in f:
            m = f[key]["max_margin"]
            margin = "" if m is None else f" (max margin {m:.3f})"
            parts.append(f"{label} {f[key]['identical']:.2f}{margin}")
    return "greedy identity per prompt: " + "; ".join(parts)


def _frac(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}"


def _lookup_cells(e: dict[str, Any]) -> list[str]:
    """A lookup method's tokens/step, speedup and greedy exact match, as table cells."""
    return [f"{e['tokens_per_step']:.2f}", f"{e['speedup']:.2f}x", _frac(e["greedy_exact_match"])]


def plot_report(report: dict[str, Any], stem: str | Path) -> list[Path]:
    """``<stem>_accept_lengths.png`` (histogram of tokens gained per step) and ``<stem>_speedup.png``."""

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


def report_paths(out: str | Path, plots: bool = True) -> list[Path]:
    """The files :func:`write_report` writes for ``out``: the JSON, the markdown table, the PNGs."""
    out = Path(out)
    stem = out.with_suffix("")
    pngs = [stem.with_name(stem.name + s) for s in ("_accept_lengths.png", "_speedup.png")] if plots else []
    return [out, out.with_suffix(".md"), *pngs]


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
    medusa = "MEDUSA heads only" if any(report.get(m) for m in LOOKUP_LABELS) else "MEDUSA"
    lines = [f"HF generate          {report['baseline_tokens_per_s']:8.1f} tokens/s",
             f"{medusa:<20} {report['medusa_tokens_per_s']:8.1f} tokens/s",
             (f"speedup (median)     {report['speedup']:8.2f}x   (range {report['speedup_min']:.2f}-"
             f"{report['speedup_max']:.2f})"),
             f"tokens/step          {report['tokens_per_step']:8.2f}",
             (f"overhead             {report['overhead']:8.2f}   (MEDUSA step "
              f"{report['medusa_step_ms']:.2f} ms / "
             f"plain forward {report['plain_step_ms']:.2f} ms)")]
    if report["greedy_exact_match"] is not None:
        lines.append(f"greedy exact match   {report['greedy_exact_match']:8.2f}")
    if report.get("draft_vocab_coverage") is not None:
        lines.append(f"draft vocabulary     {report['draft_vocab_coverage']:8.2%}   of the generated tokens "
                     f"({report['draft_vocab']} draft tokens)")
    for m in (m for m in LOOKUP_LABELS if report.get(m)):
        e = report[m]
        tps, speedup, exact = _lookup_cells(e)
        lines.append(f"{'MEDUSA ' + LOOKUP_LABELS[m]:<20} {e['tokens_per_s']:8.1f} tokens/s, {speedup}, "
                     f"{tps} tokens/step, exact match {exact}")
    for extra, label in (("own_plain", "our plain decode"), ("assisted", "HF assisted"),
                         ("prompt_lookup", "HF prompt lookup")):
        if report.get(extra):
            lines.append(f"{label:<20} {report[extra]['tokens_per_s']:8.1f} tokens/s, "
                         f"{report[extra]['speedup']:.2f}x")
    lines += [line for line in (_gain_line(report), _fidelity_line(report)) if line]
    return "\n".join(lines)


__all__ = ["format_summary", "markdown_table", "plot_report", "summarize", "write_report"]
