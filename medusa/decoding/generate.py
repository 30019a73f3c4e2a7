"""The MEDUSA decode loop: prefill, propose (tree candidates), verify (one forward over the tree with a
4-D mask), accept (greedy / sample / typical), compact the KV cache. Statistics are returned, not printed.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from medusa.config.enums import ACCEPTANCE
from medusa.decoding.acceptance import greedy_accept, sample_accept, typical_accept
from medusa.decoding.candidates import DecodeTree
from medusa.decoding.compiled import compact_function, step_functions
from medusa.decoding.dynamic_tree import DynamicTree, is_lookup_tree, resolve_dynamic
from medusa.decoding.kv_cache import TreeCache, check_supported, dynamic_prefill
from medusa.decoding.lookup import HybridTree, new_context, root_only_tree
from medusa.decoding.processors import (
    Generation,
    apply_processors,
    merged_config,
    process_nodes,
    resolve_generation,
    warp_scores,
)
from medusa.decoding.proposals import choose_proposer, decoding_tree
from medusa.decoding.static_cache import static_capacity, static_prefill
from medusa.decoding.step import DecodeState, StepFns, StepResult, step
from medusa.errors import MedusaError
from medusa.modeling.base import unwrap


@dataclass
class MedusaGenerateOutput:
    sequences: torch.Tensor  # [B, prompt + new], rows that stopped early padded as HF pads them
    accept_lengths: list[list[int]] = field(default_factory=list)  # per row: tokens gained at each step
    num_steps: int = 0  # verification passes (the prefill is not counted)
    prefill_time_s: float = 0.0
    decode_time_s: float = 0.0  # compilation excluded
    compile_time_s: float = 0.0  # compile=True: warm-up compilation of the step (0 when already compiled)

    @property
    def tokens_per_step(self) -> float:
        """Mean tokens gained per verification step over all rows."""
        steps = sum(len(a) for a in self.accept_lengths)
        return sum(sum(a) for a in self.accept_lengths) / steps if steps else 0.0


def sampling_defaults(model: Any, temperature: float | None, top_k: int | None, top_p: float | None
                      ) -> tuple[float, int | None, float | None]:
    """Unset temperature / top_k / top_p resolve as HF ``generate`` resolves them: the model's
    generation_config, then HF's global defaults (1.0, 50, 1.0). Pass ``top_k=0`` to turn top-k off."""
    cfg = merged_config(model.base_model, None, {"temperature": temperature, "top_k": top_k, "top_p": top_p})
    return cfg.temperature, cfg.top_k, cfg.top_p


@dataclass
class _Run:
    """One ``medusa_generate`` call's settings and per-row progress (host lists, one entry per row)."""

    dt: DecodeTree | DynamicTree | HybridTree  # the tree's buffers (static, with a lookup chain) or settings
    # (dynamic): its fixed sizes
    gen: Generation
    acceptance: str
    max_new_tokens: int
    typical: tuple[float, float]  # posterior_threshold, posterior_alpha
    generator: torch.Generator | None
    history: torch.Tensor | None  # [B, P + max_new_tokens]: padded prompt + emitted tokens (processors only)
    prompt_len: int
    generated: list[list[int]] = field(default_factory=list)
    accept_lengths: list[list[int]] = field(default_factory=list)
    done: list[bool] = field(default_factory=list)


def _check_arguments(model: Any, input_ids: torch.Tensor, mask: torch.Tensor | None, acceptance: str,
                     max_new_tokens: int, tree: Any, streamer: Any, lookup_tokens: int | None = None
                     ) -> tuple[Any, int, torch.Tensor, torch.Tensor]:
    """Validate the call; returns the tree, the lookup chain's length, the prompt ``[B, P]`` and its mask
    ``[B, P]`` on model.device."""
    if acceptance not in ACCEPTANCE:
        raise MedusaError(f"acceptance must be one of {ACCEPTANCE}, got {acceptance!r}")
    if input_ids.dim() != 2 or input_ids.shape[1] == 0:
        raise MedusaError(f"input_ids must be [batch, length>0], got shape {tuple(input_ids.shape)}")
    if max_new_tokens < 1:
        raise MedusaError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    lookup = resolve_lookup_tokens(model, tree, lookup_tokens)
    if not is_lookup_tree(tree):
        tree = resolve_dynamic(tree, model.num_heads, model.tree) or tree  # "dynamic[:N]" -> DynamicTree
        tree = tree if tree is not None else (model.tree if model.tree is not None else model.default_tree())
        if tree.depth > model.num_heads:
            raise MedusaError(f"tree depth {tree.depth} exceeds the model's {model.num_heads} heads")
        if lookup and isinstance(tree, DynamicTree):
            raise MedusaError("lookup_tokens needs a static tree (a tree.json or the checkpoint's), not a "
                              "dynamic one")
    if streamer is not None and input_ids.shape[0] != 1:
        raise MedusaError(f"streamers need batch size 1, got {input_ids.shape[0]}")
    input_ids = input_ids.to(model.device)
    mask2d = (torch.ones_like(input_ids) if mask is None
              else mask.to(model.device)).long()
    if input_ids.shape[0] > 1 and bool((mask2d[:, -1] == 0).any()):
        raise MedusaError("attention_mask is right-padded; tokenize batches with padding_side='left'")
    return tree, lookup, input_ids, mask2d


def resolve_lookup_tokens(model: Any, tree: Any, lookup_tokens: int | None) -> int:
    """The lookup chain's length: ``lookup_tokens``, else the calibrated tree's (``tree.json``'s
    ``lookup_tokens``; 0 when it has none). ``tree="lookup"`` needs one."""
    if lookup_tokens is None:
        source = tree if tree is not None else model.tree
        lookup_tokens = 0 if isinstance(source, str) else getattr(source, "lookup_tokens", 0)
    if not isinstance(lookup_tokens, int) or isinstance(lookup_tokens, bool) or lookup_tokens < 0:
        raise MedusaError(f"lookup_tokens must be an integer >= 0, got {lookup_tokens!r}")
    if is_lookup_tree(tree) and lookup_tokens < 1:
        raise MedusaError("tree='lookup' (the lookup chain alone) needs lookup_tokens >= 1")
    return lookup_tokens


def _start(model: Any, input_ids: torch.Tensor, mask2d: torch.Tensor, tree: Any, lookup: int, acceptance: str,
           max_new_tokens: int, settings: dict[str, Any]) -> _Run:
    """Resolve the generation settings and the tree buffers (``lookup``: the lookup chain's length, 0 for
    none); an empty run (no token emitted yet)."""
    b, p = input_ids.shape
    gen = resolve_generation(model.base_model, acceptance != "greedy", input_ids, mask2d,
                             settings.pop("eos_token_id"), settings.pop("generation_config"),
                             **settings.pop("hf"))
    dtype = getattr(unwrap(model.base_model), "dtype", None)  # compute dtype (first floating parameter)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        dtype = torch.float32
    history = None
    if gen.needs_ids:
        # history: [B, P + new]
        history = torch.zeros(b, p + max_new_tokens, dtype=torch.long, device=input_ids.device)
        history[:, :p] = input_ids
    lookup_only = is_lookup_tree(tree)
    device = input_ids.device
    dt = root_only_tree(device, dtype) if lookup_only else decoding_tree(tree, device, dtype)
    if lookup:  # room: how far a row's context grows (the run's tokens, then one step's overshoot)
        dt = HybridTree(dt, lookup, max_new_tokens + dt.depth + lookup + 1, lookup_only=lookup_only)
    check_supported(model.base_model, p + max_new_tokens + dt.depth + 1)
    return _Run(dt, gen, acceptance, max_new_tokens,
                (settings.pop("posterior_threshold"), settings.pop("posterior_alpha")),
                settings.pop("generator"),
                history, p, [[] for _ in range(b)], [[] for _ in range(b)], [False] * b)


def _choose_root(run: _Run, input_ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """The first new token from the prompt's last logits ``[B, V]``, as HF's first generate step."""
    scores = logits.float()
    if run.gen.needs_ids:
        scores = apply_processors(run.gen, input_ids, scores,
                                  torch.arange(logits.shape[0], device=logits.device))
    if run.acceptance == "greedy":
        return scores.argmax(dim=-1)
    probs = torch.softmax(warp_scores(run.gen, scores), dim=-1)
    return torch.multinomial(probs, 1, generator=run.generator).view(-1)


def _accept(run: _Run, logits: torch.Tensor, tokens: torch.Tensor, dt: DecodeTree | Any
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Process every tree node's logits with its own prefix, then apply the acceptance rule (``dt``: this
    step's tree, static or per row)."""
    gen = run.gen
    scores = logits
    if gen.needs_ids:
        lengths = [run.prompt_len + len(g) for g in run.generated]
        active = [not d for d in run.done]
        scores = process_nodes(gen, run.history, lengths, active, tokens, logits, dt)
    if run.acceptance == "greedy":
        return greedy_accept(scores, tokens, dt)
    warp = functools.partial(warp_scores, gen)
    if run.acceptance == "sample":
        return sample_accept(scores.float(), tokens, dt, warp, generator=run.generator)
    threshold, alpha = run.typical
    return typical_accept(scores.float(), tokens, dt, warp, gen.temperature, threshold, alpha,
                          generator=run.generator)


def _record(run: _Run, row: int, new: list[int], eos: list[int]) -> int:
    """Emit ``new`` tokens for ``row`` (up to max_new_tokens / EOS); returns how many were kept."""
    out = run.generated[row]
    before = len(out)
    run.done[row] = _emit(out, new, eos, run.max_new_tokens)
    if run.history is not None and not run.done[row]:
        start = run.prompt_len + before
        run.history[row, start:start + len(out) - before] = torch.tensor(out[before:], dtype=torch.long)
    return len(out) - before


@torch.no_grad()
def medusa_generate(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    max_new_tokens: int = 64,
    acceptance: str = "greedy",
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    posterior_threshold: float = 0.09,
    posterior_alpha: float = 0.3,
    tree: Any = None,
    eos_token_id: int | Sequence[int] | None = None,
    return_dict_in_generate: bool = False,
    streamer: Any = None,
    generator: torch.Generator | None = None,
    generation_config: Any = None,
    compile: bool = False,
    cache_implementation: str | None = None,
    lookup_tokens: int | None = None,
    **generation_kwargs: Any,
) -> torch.Tensor | MedusaGenerateOutput:
    """Decode with MEDUSA heads: several tokens per forward pass of the base model.

    ``acceptance="greedy"`` returns exactly ``base_model.generate(do_sample=False)``'s tokens;
    ``"sample"`` is lossless: tokens are distributed exactly as ``generate(do_sample=True)``'s;
    ``"typical"`` is MEDUSA's typical acceptance (``posterior_threshold`` epsilon, ``posterior_alpha``
    delta): faster at high temperature but lossy, its samples are NOT distributed as the base model's.

    Settings resolve as in HF: arguments (``temperature`` / ``top_k`` / ``top_p``, other GenerationConfig
    fields as ``generation_kwargs``, e.g. ``repetition_penalty=1.1``; None means unset), then
    ``generation_config`` or the base model's, then HF's defaults. Every logits processor (repetition
    penalty, no_repeat_ngram_size, min_new_tokens, suppress / bad words...) sees each tree node's own prefix;
    a setting MEDUSA does not reproduce raises :class:`MedusaError` naming it.

    ``input_ids [B, P]``, optional left-padding ``attention_mask [B, P]``; rows stop independently (at
    ``max_new_tokens`` or an EOS of ``eos_token_id`` / the generation_config's), padded like HF. ``streamer``
    for batch 1. Returns ``[B, P + new]``, or a :class:`MedusaGenerateOutput` (return_dict_in_generate).

    ``cache_implementation="static"``: preallocated cache and buffers, fixed step shapes
    (:mod:`medusa.decoding.static_cache`); ``compile=True`` (implies static): the step is ``torch.compile``d
    once per (batch, tree size, cache bucket); compile time is reported apart (``compile_time_s``).

    ``lookup_tokens=L``: a chain of L context-lookup tokens (the tokens that followed the most recent earlier
    occurrence of the context's last n-gram, :mod:`medusa.decoding.lookup`) is verified in the same forward
    as the heads' tree, merged where it follows one of its paths; None: the calibrated tree's
    ``lookup_tokens`` (0 when it has none), 0: off. ``tree="lookup"``: the lookup chain alone. Acceptance
    stays exact (greedy == HF greedy; "sample" lossless).
    """
    tree, lookup, input_ids, mask2d = _check_arguments(model, input_ids, attention_mask, acceptance,
                                                       max_new_tokens, tree, streamer, lookup_tokens)
    hf = dict(generation_kwargs, temperature=temperature, top_k=top_k, top_p=top_p)
    run = _start(model, input_ids, mask2d, tree, lookup, acceptance, max_new_tokens, dict(
        eos_token_id=eos_token_id, generation_config=generation_config, hf=hf, generator=generator,
        posterior_threshold=posterior_threshold, posterior_alpha=posterior_alpha))
    _trim_lookup(run, compile, cache_implementation, input_ids.device)
    out = _timed_decode(model, run, input_ids, mask2d, streamer,
                        _path(model, run, input_ids.shape, compile, cache_implementation))
    return out if return_dict_in_generate else out.sequences


def _trim_lookup(run: _Run, compile: bool, cache_implementation: str | None, device: torch.device) -> None:
    """A lookup chain on the eager CPU path verifies, each step, only the nodes some row can accept (a host
    read, free on a CPU); the static / compiled paths keep its fixed length."""
    if isinstance(run.dt, HybridTree):
        eager_cpu = not compile and cache_implementation in (None, "dynamic") and device.type == "cpu"
        run.dt = dataclasses.replace(run.dt, trim=eager_cpu)


def _timed_decode(model: Any, run: _Run, input_ids: torch.Tensor, mask2d: torch.Tensor, streamer: Any,
                  path: tuple[Callable[..., TreeCache], StepFns]) -> MedusaGenerateOutput:
    """Prefill, then the decode loop, timed apart (compilation, if any, reported apart from decoding)."""
    new_cache, fns = path
    device = model.device
    t0 = time.perf_counter()
    if streamer is not None:
        streamer.put(input_ids.cpu())
    choose_root = functools.partial(_choose_root, run, input_ids)
    state = prefill(model, input_ids, mask2d, run.dt, choose_root, new_cache)
    first = state.root.cpu().tolist()
    _sync(device)
    prefill_time = time.perf_counter() - t0
    t1 = time.perf_counter()
    steps = _decode_loop(model, state, run, first, streamer, fns)
    _sync(device)
    decode_time = time.perf_counter() - t1 - state.compile_time_s
    if streamer is not None:
        streamer.end()
    sequences = _assemble(input_ids, run.generated, run.gen.pad_id)
    return MedusaGenerateOutput(sequences, run.accept_lengths, steps, prefill_time, decode_time,
                                state.compile_time_s)


def _path(model: Any, run: _Run, shape: torch.Size, compile: bool, cache_implementation: str | None
          ) -> tuple[Callable[..., tuple[TreeCache, torch.Tensor, torch.Tensor]], StepFns]:
    """(the cache's prefill, the step's functions) of the eager path (default: ``DynamicCache``) or the
    static / compiled one (``StaticCache``, fixed shapes)."""
    b, p = shape
    if cache_implementation not in (None, "dynamic", "static"):
        raise MedusaError(f"cache_implementation must be 'dynamic' or 'static', got {cache_implementation!r}")
    dt = run.dt
    if not compile and cache_implementation != "static":
        capacity = p + 2 * run.max_new_tokens + dt.num_nodes
        eager = functools.partial(dynamic_prefill, num_nodes=dt.num_nodes, capacity=capacity, dtype=dt.dtype)
        return eager, StepFns()
    capacity = static_capacity(p, run.max_new_tokens, b, dt)
    new_cache = functools.partial(static_prefill, num_nodes=dt.num_nodes, capacity=capacity, dtype=dt.dtype,
                                  compact_fn=compact_function(model, compile))
    greedy = run.acceptance == "greedy" and not run.gen.needs_ids
    return new_cache, step_functions(model, compile, greedy=greedy)


def prefill(model: Any, input_ids: torch.Tensor, mask2d: torch.Tensor,
            dt: DecodeTree | DynamicTree | HybridTree,
            choose_root: Callable[[torch.Tensor], torch.Tensor] | None = None,
            new_cache: Callable[..., tuple[TreeCache, torch.Tensor, torch.Tensor]] | None = None
            ) -> DecodeState:
    """Run the prompt (left-padded ``[B, P]``) into a fresh cache (``new_cache``: default a ``DynamicCache``)
    like HF generate does; pick the root with ``choose_root`` (last logits ``[B, V]`` -> ``[B]``; default
    argmax); keep the last hidden state for the proposer (chosen here, once, for the model's heads)."""
    if new_cache is None:
        new_cache = functools.partial(dynamic_prefill, num_nodes=dt.num_nodes, capacity=0, dtype=dt.dtype)
    cache, last, hidden = new_cache(model, input_ids, mask2d)  # last logits [B, V], hidden [B, d]
    root = last.argmax(dim=-1) if choose_root is None else choose_root(last)
    context = new_context(input_ids, mask2d, root, dt.room) if isinstance(dt, HybridTree) else None
    proposer = choose_proposer(model.heads, dt, context)
    return DecodeState(proposer, cache, mask2d.sum(-1), root, hidden)


def _decode_loop(model: Any, state: DecodeState, run: _Run, first: list[int], streamer: Any,
                 fns: StepFns) -> int:
    """Verification steps until every row is done; returns the number of steps."""
    eos = run.gen.eos
    for row, tok in enumerate(first):
        _record(run, row, [tok], eos)
    if streamer is not None:
        streamer.put(torch.tensor(run.generated[0]))
    accept = functools.partial(_accept, run)
    steps = 0
    while not all(run.done):
        result: StepResult = step(model, state, accept, fns)
        steps += 1
        for row in range(len(run.done)):
            if run.done[row]:
                continue
            gained = _record(run, row, result.new_tokens(row), eos)
            run.accept_lengths[row].append(gained)
            if streamer is not None:
                streamer.put(torch.tensor(run.generated[row][-gained:]))
    return steps


def _assemble(input_ids: torch.Tensor, generated: list[list[int]], pad_id: int) -> torch.Tensor:
    """``[B, P + width]``: prompt then each row's new tokens, padded with ``pad_id`` as HF pads finished."""
    b = input_ids.shape[0]
    width = max(len(g) for g in generated)
    new_tokens = torch.full((b, width), pad_id, dtype=input_ids.dtype)  # [B, width]
    for row, g in enumerate(generated):
        new_tokens[row, :len(g)] = torch.tensor(g, dtype=input_ids.dtype)
    return torch.cat([input_ids, new_tokens.to(input_ids.device)], dim=1)


def _emit(out: list[int], new: list[int], eos: list[int], limit: int) -> bool:
    """Append ``new`` to ``out`` up to ``limit`` tokens or the first EOS; True when the row is finished."""
    for tok in new:
        out.append(tok)
        if tok in eos or len(out) >= limit:
            return True
    return len(out) >= limit


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


__all__ = ["ACCEPTANCE", "MedusaGenerateOutput", "medusa_generate", "prefill", "resolve_lookup_tokens"]
