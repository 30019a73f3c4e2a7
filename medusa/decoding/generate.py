"""The MEDUSA decode loop's entry point: check the arguments, resolve the tree option and the generation
settings, build the run's scorer and proposer once, prefill, then :func:`medusa.decoding.step.decode_loop`.
Statistics are returned, not printed.
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
from medusa.decoding.acceptance import Progress, Scorer
from medusa.decoding.compiled import compact_function, compiled_scorer, step_functions
from medusa.decoding.draft_sampling import DraftSampling
from medusa.decoding.hf import unwrap
from medusa.decoding.kv_cache import TreeCache, check_supported, dynamic_prefill
from medusa.decoding.processors import merged_config, resolve_generation
from medusa.decoding.proposals import Proposer, choose_proposer
from medusa.decoding.static_cache import static_capacity, static_prefill
from medusa.decoding.step import DecodeState, PhaseClock, StepFns, decode_loop, record
from medusa.decoding.tree_option import DynamicTreeOption, TreeChoice, resolve_tree
from medusa.errors import MedusaError
from medusa.native import fixed_weights
from medusa.tree import MedusaTree

# (model, input_ids [B, P], mask2d [B, P]) -> (cache, last logits [B, V], features [B, P, F], last [B, F])
NewCache = Callable[..., tuple[TreeCache, torch.Tensor, torch.Tensor, torch.Tensor]]


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




def _check_arguments(model: Any, input_ids: torch.Tensor, mask: torch.Tensor | None, acceptance: str,
                     max_new_tokens: int, streamer: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate the call; returns the prompt ``[B, P]`` and its mask ``[B, P]`` on model.device."""
    if acceptance not in ACCEPTANCE:
        raise MedusaError(f"acceptance must be one of {ACCEPTANCE}, got {acceptance!r}")
    if input_ids.dim() != 2 or input_ids.shape[1] == 0:
        raise MedusaError(f"input_ids must be [batch, length>0], got shape {tuple(input_ids.shape)}")
    if max_new_tokens < 1:
        raise MedusaError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if streamer is not None and input_ids.shape[0] != 1:
        raise MedusaError(f"streamers need batch size 1, got {input_ids.shape[0]}")
    input_ids = input_ids.to(model.device)
    mask2d = (torch.ones_like(input_ids) if mask is None
              else mask.to(model.device)).long()
    if input_ids.shape[0] > 1 and bool((mask2d[:, -1] == 0).any()):
        raise MedusaError("attention_mask is right-padded; tokenize batches with padding_side='left'")
    return input_ids, mask2d


def compute_dtype(model: Any) -> torch.dtype:
    """The base model's compute dtype (its first floating parameter's), float32 when it has none."""
    dtype = getattr(unwrap(model.base_model), "dtype", None)
    return dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else torch.float32


def build_scorer(model: Any, input_ids: torch.Tensor, mask2d: torch.Tensor, acceptance: str,
                 max_new_tokens: int, settings: dict[str, Any]) -> Scorer:
    """The run's scorer (generation settings resolved as HF resolves them) and its empty progress."""
    b, p = input_ids.shape
    gen = resolve_generation(model.base_model, acceptance != "greedy", input_ids, mask2d,
                             settings["eos_token_id"], settings["generation_config"], **settings["hf"])
    history = None
    if gen.needs_ids:
        history = torch.zeros(b, p + max_new_tokens, dtype=torch.long, device=input_ids.device)  # [B, P+new]
        history[:, :p] = input_ids
    progress = Progress(p, history, [[] for _ in range(b)], [False] * b)
    return Scorer(gen, acceptance, progress, (settings["posterior_threshold"], settings["posterior_alpha"]),
                  settings["generator"])


def new_proposer(model: Any, choice: TreeChoice, device: torch.device, max_new_tokens: int,
                 trim_lookup: bool = False, scorer: Scorer | None = None) -> Proposer:
    """The run's proposer for the model's heads on ``choice`` (masks in the compute dtype); a lookup
    context's room: the run's tokens, then one step's overshoot. A "sample" ``scorer`` hands a drafter that
    samples its drafts the run's temperature and generator."""
    room = max_new_tokens + choice.depth + choice.lookup_tokens + 1
    sampling = None
    if scorer is not None and scorer.acceptance == "sample":
        sampling = DraftSampling(float(scorer.gen.temperature or 1.0), scorer.generator)
    return choose_proposer(model.heads, choice, device, compute_dtype(model), room, trim_lookup, sampling)


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
    tree: MedusaTree | DynamicTreeOption | str | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    return_dict_in_generate: bool = False,
    streamer: Any = None,
    generator: torch.Generator | None = None,
    generation_config: Any = None,
    compile: bool = False,
    cache_implementation: str | None = None,
    lookup_tokens: int | None = None,
    step_clock: PhaseClock | None = None,
    **generation_kwargs: Any,
) -> torch.Tensor | MedusaGenerateOutput:
    """Decode with MEDUSA heads: several tokens per forward pass of the base model. ``acceptance="greedy"``
    returns exactly ``base_model.generate(do_sample=False)``'s tokens; ``"sample"`` is lossless: tokens are
    distributed exactly as ``generate(do_sample=True)``'s; ``"typical"`` is MEDUSA's typical acceptance
    (``posterior_threshold`` epsilon, ``posterior_alpha`` delta): faster at high temperature but lossy.

    Settings resolve as in HF: arguments (``temperature`` / ``top_k`` / ``top_p``, other GenerationConfig
    fields as ``generation_kwargs``, e.g. ``repetition_penalty=1.1``; None means unset), then
    ``generation_config`` or the base model's, then HF's defaults. Every logits processor sees each tree
    node's own prefix; a setting MEDUSA does not reproduce raises :class:`MedusaError` naming it.
    ``input_ids [B, P]``, optional left-padding ``attention_mask [B, P]``; rows stop independently (at
    ``max_new_tokens`` or an EOS of ``eos_token_id`` / the generation_config's), padded like HF. ``streamer``
    for batch 1. Returns ``[B, P + new]``, or a :class:`MedusaGenerateOutput` (return_dict_in_generate).

    ``cache_implementation="static"``: preallocated cache and buffers, fixed step shapes
    (:mod:`medusa.decoding.static_cache`); ``compile=True`` (implies static): the step is ``torch.compile``d
    once per (batch, tree size, cache bucket); compile time is reported apart (``compile_time_s``).
    ``tree``: a MedusaTree, ``"dynamic[:N]"`` / a DynamicTreeOption, or ``"lookup"``. ``lookup_tokens=L``:
    a chain of L context-lookup tokens (:mod:`medusa.decoding.lookup`) verified in the same forward as the
    heads' tree; None: the calibrated tree's ``lookup_tokens`` (0 when it has none), 0: off.
    ``tree="lookup"``: the lookup chain alone; ``"plain"``: no drafts. ``step_clock``: a ``PhaseClock`` (eager
    steps time their phases: ``--profile``). Acceptance stays exact (greedy == HF; sample lossless)."""
    input_ids, mask2d = _check_arguments(model, input_ids, attention_mask, acceptance, max_new_tokens,
                                         streamer)
    choice = _check_compile(resolve_tree(model, tree, lookup_tokens), compile)
    scorer = build_scorer(model, input_ids, mask2d, acceptance, max_new_tokens, dict(
        eos_token_id=eos_token_id, generation_config=generation_config, generator=generator,
        hf=dict(generation_kwargs, temperature=temperature, top_k=top_k, top_p=top_p),
        posterior_threshold=posterior_threshold, posterior_alpha=posterior_alpha))
    # eager CPU: a lookup chain is cut each step to what some row can accept (static / compiled: fixed)
    eager_cpu = not compile and cache_implementation in (None, "dynamic") and input_ids.device.type == "cpu"
    proposer = new_proposer(model, choice, input_ids.device, max_new_tokens, eager_cpu, scorer)
    new_cache, fns = _path(model, proposer, input_ids.shape, max_new_tokens, compile, cache_implementation,
                           step_clock)
    if fns.compiled:
        scorer = compiled_scorer(model, scorer)
    out = _timed_decode(model, proposer, scorer, input_ids, mask2d, streamer, new_cache, fns, max_new_tokens)
    return out if return_dict_in_generate else out.sequences


def _check_compile(choice: TreeChoice, compile: bool) -> TreeChoice:
    """``choice``, or an error where ``compile=True`` cannot run it (an eagle3 drafter runs eagerly)."""
    if compile and choice.draft is not None:
        raise MedusaError("compile=True: not available for eagle3 heads (their drafter's loop and KV cache "
                          "run eagerly); decode without it (cache_implementation='static' works)")
    return choice


@fixed_weights.during()  # the packed weights are checked once for the whole call
def _timed_decode(model: Any, proposer: Proposer, scorer: Scorer, input_ids: torch.Tensor,
                  mask2d: torch.Tensor, streamer: Any, new_cache: NewCache, fns: StepFns,
                  max_new_tokens: int) -> MedusaGenerateOutput:
    """Prefill, then the decode loop, timed apart (compilation, if any, reported apart from decoding)."""
    device = model.device
    t0 = time.perf_counter()
    if streamer is not None:
        streamer.put(input_ids.cpu())
    state = prefill(model, input_ids, mask2d, proposer, functools.partial(scorer.first_token, input_ids),
                    new_cache)
    first = state.root.cpu().tolist()
    _sync(device)
    prefill_time = time.perf_counter() - t0
    t1 = time.perf_counter()
    eos, progress = scorer.gen.eos, scorer.progress
    for row, tok in enumerate(first):
        record(progress, row, [tok], eos, max_new_tokens)
    if streamer is not None:
        streamer.put(torch.tensor(progress.generated[0]))
    accept_lengths: list[list[int]] = [[] for _ in first]
    # the steps verify through the model's forward with its base resolved once (MedusaModel.tree_verifier)
    verifier = model.tree_verifier()
    steps = decode_loop(verifier, state, scorer, eos, max_new_tokens, accept_lengths, streamer, fns)
    _sync(device)
    decode_time = time.perf_counter() - t1 - state.compile_time_s
    if streamer is not None:
        streamer.end()
    sequences = _assemble(input_ids, progress.generated, scorer.gen.pad_id)
    return MedusaGenerateOutput(sequences, accept_lengths, steps, prefill_time, decode_time,
                                state.compile_time_s)


def _path(model: Any, proposer: Proposer, shape: torch.Size, max_new_tokens: int, compile: bool,
          cache_implementation: str | None, clock: PhaseClock | None = None) -> tuple[NewCache, StepFns]:
    """(the cache's prefill, the step's functions) of the eager path (default: ``DynamicCache``) or the
    static / compiled one (``StaticCache``, fixed shapes); ``clock``: the eager step times its phases. The
    base must verify a tree over the run's length."""
    if clock is not None and compile:
        raise MedusaError("step_clock times the eager step's phases; a compiled step fuses them")
    b, p = shape
    check_supported(model.base_model, p + max_new_tokens + proposer.depth + 1)
    if cache_implementation not in (None, "dynamic", "static"):
        raise MedusaError(f"cache_implementation must be 'dynamic' or 'static', got {cache_implementation!r}")
    n, dtype = proposer.num_nodes, compute_dtype(model)
    if not compile and cache_implementation != "static":
        capacity = p + 2 * max_new_tokens + n
        return (functools.partial(dynamic_prefill, num_nodes=n, capacity=capacity, dtype=dtype),
                StepFns(clock=clock))
    capacity = static_capacity(p, max_new_tokens, b, n, proposer.depth)
    new_cache = functools.partial(static_prefill, num_nodes=n, capacity=capacity, dtype=dtype,
                                  compact_fn=compact_function(model, compile))
    return new_cache, dataclasses.replace(step_functions(model, compile), clock=clock)


def prefill(model: Any, input_ids: torch.Tensor, mask2d: torch.Tensor, proposer: Proposer,
            choose_root: Callable[[torch.Tensor], torch.Tensor] | None = None,
            new_cache: NewCache | None = None) -> DecodeState:
    """Run the prompt (left-padded ``[B, P]``) into a fresh cache (``new_cache``: default a ``DynamicCache``)
    like HF generate does; pick the root with ``choose_root`` (last logits ``[B, V]`` -> ``[B]``; default
    argmax); hand the proposer the prompt, its features ``[B, P, F]`` and the root (its prefill hook); keep
    the last position's features for the first proposal."""
    if new_cache is None:
        new_cache = functools.partial(dynamic_prefill, num_nodes=proposer.num_nodes, capacity=0,
                                      dtype=compute_dtype(model))
    cache, last, features, hidden = new_cache(model, input_ids, mask2d)  # [B, V], [B, P, F], [B, F]
    root = last.argmax(dim=-1) if choose_root is None else choose_root(last)
    proposer.prefill(input_ids, mask2d, features, root)
    return DecodeState(proposer, cache, mask2d.sum(-1), root, hidden)


def _assemble(input_ids: torch.Tensor, generated: list[list[int]], pad_id: int) -> torch.Tensor:
    """``[B, P + width]``: prompt then each row's new tokens, padded with ``pad_id`` as HF pads finished."""
    b = input_ids.shape[0]
    width = max(len(g) for g in generated)
    new_tokens = torch.full((b, width), pad_id, dtype=input_ids.dtype)  # [B, width]
    for row, g in enumerate(generated):
        new_tokens[row, :len(g)] = torch.tensor(g, dtype=input_ids.dtype)
    return torch.cat([input_ids, new_tokens.to(input_ids.device)], dim=1)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


__all__ = ["ACCEPTANCE", "MedusaGenerateOutput", "build_scorer", "compute_dtype", "medusa_generate",
           "new_proposer", "prefill", "sampling_defaults"]
