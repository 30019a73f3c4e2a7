"""``medusa bench``: MEDUSA decoding against plain HF ``generate`` (and optional assisted / prompt-lookup
baselines), measured per prompt in one process, interleaved; JSON report + markdown table + PNG plots.

For every prompt (batch 1) each method runs ``repeats`` times in a rotating order after one warm-up
of each; the fastest run counts. All methods use the same model object (same weights, dtype, device)
and the same token budget. With ``ignore_eos`` (the default) no method stops at EOS, so every one writes
exactly ``max_new_tokens`` tokens and greedy outputs compare token for token; with ``ignore_eos=False``
all methods stop at the model's EOS token(s).

The report's keys and files are described in :mod:`medusa.eval.report`. Figures are measured, never
asserted.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from medusa.config.enums import ACCEPTANCE
from medusa.decoding.generate import sampling_defaults
from medusa.decoding.tree_option import LOOKUP_TREE, PLAIN_TREE, DynamicTreeOption, is_lookup_tree
from medusa.errors import MedusaError
from medusa.eval.bench_compiled import (
    compiled_fields,
    compiled_summary,
    format_compiled,
    static_compiled_config,
)
from medusa.eval.bench_config import bench_config, lookup_config
from medusa.eval.fidelity import fidelity_fields, fidelity_summary
from medusa.eval.report import summarize
from medusa.eval.timing import plain_step_time, timed
from medusa.modeling.cpu_linear import stock_linears
from medusa.modeling.draft_vocab import draft_vocab_summary
from medusa.modeling.loading import encode_prompt

LOOKUP_METHODS = ("lookup_alone", "hybrid")  # compare_lookup: the lookup chain alone, and beside the heads
EXTRA_METHODS = ("own_plain", *LOOKUP_METHODS, "assisted", "prompt_lookup")  # reported beside MEDUSA


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
        eos = getattr(getattr(base, "generation_config", None), "eos_token_id", None)
        pad = eos[0] if isinstance(eos, (list, tuple)) and eos else eos
    return pad if pad is not None else 0


# ---------------------------------------------------------------------------------------- the methods
@dataclass
class BenchSetup:
    """Everything one timed call of a method needs; built once per :func:`bench` call."""

    model: Any  # the MedusaModel; ``model.base_model`` runs the HF baselines
    tokenizer: Any
    max_new_tokens: int
    acceptance: str
    temperature: float | None
    top_k: int | None
    top_p: float | None
    tree: Any
    seed: int
    medusa_eos: list[int] | None  # [] = never stop at EOS; None = the model's EOS
    gen_cfg: Any  # the HF baselines' GenerationConfig
    lookup_cfg: Any  # the same with prompt_lookup_num_tokens
    generator: torch.Generator  # MEDUSA's sampling generator, reseeded per prompt
    assistant_model: Any = None
    assistant_tokenizer: Any = None
    lookup_tokens: int | None = None  # MEDUSA's lookup chain (None: the tree's; 0 with compare_lookup)
    compare_lookup: int = 0  # L of the lookup-alone and hybrid rows (0: not measured)


def make_setup(model: Any, tokenizer: Any, max_new_tokens: int, acceptance: str, temperature: float | None,
               top_k: int | None, top_p: float | None, tree: Any, ignore_eos: bool, seed: int,
               prompt_lookup_num_tokens: int, assistant_model: Any = None,
               assistant_tokenizer: Any = None, lookup_tokens: int | None = None,
               compare_lookup: int = 0) -> BenchSetup:
    """HF generation configs matching MEDUSA's decoding parameters (unset temperature / top_k / top_p
    resolve as ``medusa_generate`` and HF resolve them) and the state the runners share."""

    base = model.base_model
    pad = _pad_id(base, tokenizer)
    hf_sampling: dict[str, Any] = {}
    if acceptance != "greedy":
        temperature, k, p = sampling_defaults(model, temperature, top_k, top_p)  # unset: as HF resolves them
        hf_sampling = {"temperature": temperature, "top_k": k, "top_p": 1.0 if p is None else p}
    return BenchSetup(
        model=model, tokenizer=tokenizer, max_new_tokens=max_new_tokens, acceptance=acceptance,
        temperature=temperature, top_k=top_k, top_p=top_p, tree=tree, seed=seed,
        medusa_eos=[] if ignore_eos else None,
        gen_cfg=_generation_config(base, ignore_eos, pad, max_new_tokens, hf_sampling),
        lookup_cfg=_generation_config(base, ignore_eos, pad, max_new_tokens, hf_sampling,
                                      prompt_lookup_num_tokens=prompt_lookup_num_tokens),
        generator=torch.Generator(device=model.device), assistant_model=assistant_model,
        assistant_tokenizer=assistant_tokenizer, lookup_tokens=0 if compare_lookup else lookup_tokens,
        compare_lookup=compare_lookup)


def run_baseline(s: BenchSetup, ids: torch.Tensor, i: int) -> torch.Tensor:
    """HF ``generate`` as HF runs it (stock linear layers, :func:`stock_linears`); ``ids``: ``[1, P]``;
    returns ``[1, P + new]``."""
    torch.manual_seed(s.seed + i)
    with stock_linears(s.model):
        return s.model.base_model.generate(ids, attention_mask=torch.ones_like(ids),
                                           generation_config=s.gen_cfg)


def _medusa_call(s: BenchSetup, ids: torch.Tensor, i: int, tree: Any, lookup_tokens: int | None,
                 compile: bool = False) -> Any:
    """``model.generate`` with the bench's settings, ``tree`` and ``lookup_tokens``."""
    s.generator.manual_seed(s.seed + i)
    return s.model.generate(ids, max_new_tokens=s.max_new_tokens, acceptance=s.acceptance,
                            temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, tree=tree,
                            eos_token_id=s.medusa_eos, return_dict_in_generate=True, generator=s.generator,
                            compile=compile, lookup_tokens=lookup_tokens)


def run_medusa(s: BenchSetup, ids: torch.Tensor, i: int) -> Any:
    """MEDUSA decoding; returns the :class:`MedusaGenerateOutput` (``sequences [1, P + new]``)."""
    return _medusa_call(s, ids, i, s.tree, s.lookup_tokens)


def run_own_plain(s: BenchSetup, ids: torch.Tensor, i: int) -> Any:
    """Our own decode loop with no drafts (``tree="plain"``): the packed model one token per step."""
    return _medusa_call(s, ids, i, PLAIN_TREE, 0)


def run_lookup_alone(s: BenchSetup, ids: torch.Tensor, i: int) -> Any:
    """MEDUSA's context-lookup chain of ``compare_lookup`` tokens alone (``tree="lookup"``, no heads)."""
    return _medusa_call(s, ids, i, LOOKUP_TREE, s.compare_lookup)


def run_hybrid(s: BenchSetup, ids: torch.Tensor, i: int) -> Any:
    """The heads' tree and a lookup chain of ``compare_lookup`` tokens, verified in one forward."""
    return _medusa_call(s, ids, i, s.tree, s.compare_lookup)


def run_assisted(s: BenchSetup, ids: torch.Tensor, i: int) -> torch.Tensor:
    """HF assisted generation with the draft model (a different tokenizer: universal assisted decoding);
    stock linear layers."""
    torch.manual_seed(s.seed + i)
    extra = {}
    if s.assistant_tokenizer is not None:
        extra = {"tokenizer": s.tokenizer, "assistant_tokenizer": s.assistant_tokenizer}
    with stock_linears(s.model):
        return s.model.base_model.generate(ids, attention_mask=torch.ones_like(ids),
                                           generation_config=s.gen_cfg, assistant_model=s.assistant_model,
                                           **extra)


def run_prompt_lookup(s: BenchSetup, ids: torch.Tensor, i: int) -> torch.Tensor:
    """HF prompt-lookup decoding (stock linear layers)."""
    torch.manual_seed(s.seed + i)
    with stock_linears(s.model):
        return s.model.base_model.generate(ids, attention_mask=torch.ones_like(ids),
                                           generation_config=s.lookup_cfg)


def run_baseline_compiled(s: BenchSetup, ids: torch.Tensor, i: int) -> torch.Tensor:
    """HF ``generate`` with ``cache_implementation="static"`` and a compiled forward."""
    torch.manual_seed(s.seed + i)
    cfg = static_compiled_config(s.gen_cfg, ids.device)
    return s.model.base_model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=cfg)


def run_medusa_compiled(s: BenchSetup, ids: torch.Tensor, i: int) -> Any:
    """MEDUSA with the static cache and the compiled step (``compile=True``)."""
    return _medusa_call(s, ids, i, s.tree, s.lookup_tokens, compile=True)


RUNNERS: dict[str, Callable[[BenchSetup, torch.Tensor, int], Any]] = {"baseline": run_baseline,
    "medusa": run_medusa, "own_plain": run_own_plain, "lookup_alone": run_lookup_alone, "hybrid": run_hybrid,
    "assisted": run_assisted, "prompt_lookup": run_prompt_lookup,
    "baseline_compiled": run_baseline_compiled, "medusa_compiled": run_medusa_compiled}
COMPILED = ("baseline_compiled", "medusa_compiled")


# ---------------------------------------------------------------------------------------- per prompt
def time_methods(s: BenchSetup, names: Sequence[str], ids: torch.Tensor, i: int,
                 repeats: int) -> tuple[dict[str, float], dict[str, Any]]:
    """The fastest of ``repeats`` runs of each method on prompt ``i`` (order rotated per repeat so that no
    method always runs first) and the output of that run."""
    names = list(names)
    best: dict[str, float] = {n: float("inf") for n in names}
    outputs: dict[str, Any] = {}
    for r in range(repeats):
        shift = (i + r) % len(names)
        for name in names[shift:] + names[:shift]:
            out, seconds = timed(lambda fn=RUNNERS[name]: fn(s, ids, i), ids.device)
            if seconds < best[name]:
                best[name], outputs[name] = seconds, out
    return best, outputs


def prompt_row(prompt: str, prompt_len: int, best: dict[str, float], outputs: dict[str, Any], plain_s: float,
               greedy: bool) -> dict[str, Any]:
    """One report row from the fastest run of each method on one prompt (``plain_s``: plain step seconds)."""
    md = outputs["medusa"]
    seqs = {n: getattr(out, "sequences", out) for n, out in outputs.items()}  # each [1, P + new]
    new = {n: seq.shape[1] - prompt_len for n, seq in seqs.items()}
    base_seq = seqs["baseline"][0].cpu()
    row: dict[str, Any] = {
        "prompt": prompt if len(prompt) <= 200 else prompt[:197] + "...",
        "prompt_tokens": int(prompt_len),
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
        "plain_step_ms": 1e3 * plain_s,
        "hf_step_ms": 1e3 * best["baseline"] / max(new["baseline"], 1),
        "exact_match": bool(torch.equal(md.sequences[0].cpu(), base_seq)) if greedy else None,
    }
    for extra in EXTRA_METHODS:
        if extra in outputs:
            row[f"{extra}_s"] = best[extra]
            row[f"{extra}_new_tokens"] = new[extra]
            row[f"{extra}_tokens_per_s"] = new[extra] / best[extra]
            row[f"{extra}_speedup"] = row[f"{extra}_tokens_per_s"] / row["baseline_tokens_per_s"]
            row[f"{extra}_exact_match"] = torch.equal(seqs[extra][0].cpu(), base_seq) if greedy else None
            if extra in (*LOOKUP_METHODS, "own_plain"):
                row[f"{extra}_steps"] = outputs[extra].num_steps
                row[f"{extra}_tokens_per_step"] = outputs[extra].tokens_per_step
    return row


# ---------------------------------------------------------------------------------------- top level
def check_lookup(tree: Any, lookup_tokens: int | None, compare_lookup: int) -> None:
    """``compare_lookup`` (an integer >= 0) sets every row's lookup chain itself, and its hybrid row needs a
    static tree; ``tree="lookup"`` needs ``lookup_tokens >= 1`` (as ``generate``). ``tree``: as ``bench``
    takes it, or as ``--tree`` names it (a tree.json path, ``lookup``, ``dynamic``, ``dynamic-raw``)."""
    if not isinstance(compare_lookup, int) or isinstance(compare_lookup, bool) or compare_lookup < 0:
        raise MedusaError(f"compare_lookup must be an integer >= 0, got {compare_lookup!r}")
    is_lookup = is_lookup_tree(tree)
    dynamic = isinstance(tree, DynamicTreeOption) or (isinstance(tree, str) and tree.startswith("dynamic"))
    if compare_lookup and (is_lookup or dynamic):
        raise MedusaError("--compare-lookup needs a static tree (a tree.json or the checkpoint's): its "
                          "hybrid row merges the lookup chain into it")
    if compare_lookup and lookup_tokens:
        raise MedusaError("--compare-lookup runs MEDUSA with heads only, then the lookup rows with its "
                          "own L; drop --lookup-tokens")
    if is_lookup and (lookup_tokens is None or lookup_tokens < 1):
        raise MedusaError("--tree lookup (the lookup chain alone) needs --lookup-tokens L with L >= 1")


def _check_args(acceptance: str, prompts: Sequence[str], max_new_tokens: int, repeats: int) -> None:
    if acceptance not in ACCEPTANCE:
        raise MedusaError(f"--acceptance must be one of {', '.join(ACCEPTANCE)}, got {acceptance!r}")
    if not prompts:
        raise MedusaError("no prompts to benchmark")
    if max_new_tokens < 1 or repeats < 1:
        raise MedusaError(f"--max-new-tokens and --repeats must be >= 1, got {max_new_tokens} and {repeats}")


@torch.no_grad()
def bench(model: Any, tokenizer: Any, prompts: Sequence[str], max_new_tokens: int = 128,
          acceptance: str = "greedy", temperature: float | None = None, top_k: int | None = None,
          top_p: float | None = None, tree: Any = None, assistant_model: Any = None,
          assistant_tokenizer: Any = None, prompt_lookup: bool = False, prompt_lookup_num_tokens: int = 10,
          repeats: int = 1, ignore_eos: bool = True, seed: int = 0, progress: bool = True,
          plain_step_samples: int = 32, chat: bool = False,
          categories: Sequence[str] | None = None, compile: bool = False, lookup_tokens: int | None = None,
          compare_lookup: int = 0) -> dict[str, Any]:
    """Measure ``model`` (a :class:`MedusaModel`) against its base model on ``prompts``; returns the report.

    ``acceptance="greedy"`` compares with ``generate(do_sample=False)``; ``"sample"`` / ``"typical"`` with
    ``generate(do_sample=True, temperature, top_k, top_p)`` (then ``greedy_exact_match`` is None).
    ``assistant_model``: a draft model for HF assisted generation (classic speculative decoding; a
    different tokenizer needs ``assistant_tokenizer``); ``prompt_lookup``: HF prompt-lookup decoding.
    ``chat``: each prompt is a user turn wrapped in the tokenizer's chat template (as ``medusa generate
    --chat``); ``categories``: one label per prompt, reported per category (``report["categories"]``).
    ``compile``: also compiled MEDUSA vs HF static-cache compiled generate (``report["compiled"]``); the
    warm-up call compiles both, so the timed runs exclude compilation.
    ``lookup_tokens``: MEDUSA's context-lookup chain (as ``generate``; None: the tree's). ``compare_lookup=L``
    (L >= 1): MEDUSA runs heads only (``lookup_tokens=0``) and, in the same loop, the lookup chain of L
    tokens alone (``report["lookup_alone"]``) and beside the heads' tree (``report["hybrid"]``).
    """
    from tqdm.auto import tqdm


    _check_args(acceptance, prompts, max_new_tokens, repeats)
    if categories is not None and len(categories) != len(prompts):
        raise MedusaError(f"{len(categories)} categories for {len(prompts)} prompts")
    tree = tree if tree is not None else model.tree
    check_lookup(tree, lookup_tokens, compare_lookup)
    s = make_setup(model, tokenizer, max_new_tokens, acceptance, temperature, top_k, top_p, tree, ignore_eos,
                   seed, prompt_lookup_num_tokens, assistant_model, assistant_tokenizer, lookup_tokens,
                   compare_lookup)
    names = method_names(assistant_model is not None, prompt_lookup, compile, bool(compare_lookup))
    encoded = [encode_prompt(tokenizer, p, chat).to(model.device) for p in prompts]  # each [1, P]
    for name in names:  # warm-up: allocations, lazy imports, first-call paths
        RUNNERS[name](s, encoded[0], 0)
    plain_step_time(model.base_model, encoded[0], steps=4)

    rows: list[dict[str, Any]] = []
    accept_hist: Counter = Counter()
    generated: list[torch.Tensor] = []  # each prompt's new tokens, for the draft vocabulary's coverage
    bar = tqdm(total=len(prompts), desc="bench", unit="prompt", disable=not progress, dynamic_ncols=True)
    for i, (prompt, ids) in enumerate(zip(prompts, encoded)):
        row, medusa_out = measure_prompt(s, names, prompt, ids, i, repeats, plain_step_samples)
        accept_hist.update(int(a) for a in medusa_out.accept_lengths[0])
        generated.append(medusa_out.sequences[0, ids.shape[1]:].cpu())
        rows.append(row if categories is None else {**row, "category": categories[i]})
        bar.update(1)
        bar.set_postfix(speedup=f"{row['speedup']:.2f}", tps=f"{row['tokens_per_step']:.2f}", refresh=False)
    bar.close()
    config = bench_config(s, assistant_model, prompt_lookup, prompt_lookup_num_tokens, repeats, ignore_eos)
    config.update(lookup_config(s), chat_template=chat, compile=compile)
    return _report(s, rows, accept_hist, config, generated)


def _report(s: BenchSetup, rows: list[dict[str, Any]], accept_hist: Counter, config: dict[str, Any],
            generated: list[torch.Tensor]) -> dict[str, Any]:
    """The report of a run: the summary, greedy fidelity, the draft vocabulary's coverage of what was
    generated, the compiled rows."""
    report = summarize(rows, accept_hist, config)
    if s.acceptance == "greedy":
        report["fidelity"] = fidelity_summary(rows)
    report.update(draft_vocab_summary(s.model.heads, torch.cat(generated)))
    if config["compile"]:
        report["compiled"] = compiled_summary(rows)
    return report


def method_names(assisted: bool, prompt_lookup: bool, compile: bool, compare_lookup: bool = False
                 ) -> list[str]:
    """The methods one bench run times, in order (keys of :data:`RUNNERS`)."""
    return (["baseline", "medusa", "own_plain"] + (list(LOOKUP_METHODS) if compare_lookup else [])
            + (["assisted"] if assisted else [])
            + (["prompt_lookup"] if prompt_lookup else []) + (list(COMPILED) if compile else []))


def measure_prompt(s: BenchSetup, names: Sequence[str], prompt: str, ids: torch.Tensor, i: int, repeats: int,
                   plain_step_samples: int) -> tuple[dict[str, Any], Any]:
    """Time every method on prompt ``i`` (``ids [1, P]``); its report row and MEDUSA's (eager) output."""
    for name in COMPILED if COMPILED[0] in names else ():  # compile this prompt's shapes outside the timing
        RUNNERS[name](s, ids, i)
    best, outputs = time_methods(s, names, ids, i, repeats)
    steps = min(plain_step_samples, s.max_new_tokens)
    plain = min(plain_step_time(s.model.base_model, ids, steps=steps) for _ in range(repeats))
    compiled = {n: outputs.pop(n) for n in COMPILED if n in outputs}
    greedy = s.acceptance == "greedy"
    row = prompt_row(prompt, ids.shape[1], best, outputs, plain, greedy)
    if greedy:  # where greedy outputs differ, how close the base's top two logits were there
        seqs = {n: getattr(out, "sequences", out)[0].cpu() for n, out in outputs.items()}  # each [P + new]
        row.update(fidelity_fields(s.model.base_model, seqs, ids.shape[1]))
    if compiled:
        row.update(compiled_fields(best, compiled, ids.shape[1], greedy))
    return row, outputs["medusa"]


__all__ = ["BenchSetup", "RUNNERS", "bench", "bench_config", "check_lookup", "format_compiled", "make_setup",
           "prompt_row", "time_methods"]
