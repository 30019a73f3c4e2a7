"""The model's generation_config as HF ``generate`` applies it, per tree node.

:func:`resolve_generation` merges the decoding arguments over the base model's ``generation_config`` over
HF's global defaults (HF's priority), refuses every setting that would change the output and that MEDUSA
does not reproduce (:class:`MedusaError` naming it), and builds transformers' own ``LogitsProcessor``
objects in the order ``GenerationMixin._get_logits_processor`` builds them.

Processors see token ids (sequence bias, repetition penalty, n-gram bans, min length, bad words...):
:func:`process_tree` gives each tree node its own prefix (padded prompt + the row's emitted tokens + the
node's path), so the scores at a node are exactly those HF computes after that prefix. Warpers (temperature,
top-k...) only see scores, so they run on all nodes at once (:func:`warp_scores`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from medusa.decoding.hf import unwrap
from medusa.decoding.trees import VerifyTree
from medusa.errors import MedusaError

Warp = Callable[[torch.Tensor], torch.Tensor]  # sampling scores [..., V] -> [..., V]

# Settings that change HF's output and that MEDUSA does not reproduce: (name, "is it active?").
_UNSUPPORTED = (
    ("num_beams", lambda v: v is not None and v > 1),
    ("num_beam_groups", lambda v: v is not None and v > 1),
    ("penalty_alpha", lambda v: v is not None and v > 0),
    ("guidance_scale", lambda v: v is not None and v != 1),
    ("encoder_repetition_penalty", lambda v: v is not None and v != 1.0),
    ("encoder_no_repeat_ngram_size", lambda v: v is not None and v > 0),
    ("forced_bos_token_id", lambda v: v is not None),
    ("forced_eos_token_id", lambda v: v is not None),
    ("exponential_decay_length_penalty", lambda v: v is not None),
    ("watermarking_config", lambda v: v is not None),
    ("constraints", lambda v: v is not None),
    ("force_words_ids", lambda v: v is not None),
    ("dola_layers", lambda v: v is not None),
    ("stop_strings", lambda v: v is not None),
    ("max_time", lambda v: v is not None),
    ("num_return_sequences", lambda v: v is not None and v > 1),
    ("token_healing", lambda v: bool(v)),
)


@dataclass
class Generation:
    """The resolved decoding settings of one ``medusa_generate`` call."""

    config: Any  # the merged GenerationConfig
    eos: list[int]  # stop tokens
    pad_id: int  # fills finished rows, as HF: generation_config.pad_token_id, else the first EOS
    temperature: float
    processors: list = field(default_factory=list)  # need token ids (HF's order); repetition penalty unbound
    warpers: list = field(default_factory=list)  # sampling only; scores only
    pad_lengths: torch.Tensor | None = None  # [B] left padding per row (repetition penalty ignores it)

    @property
    def needs_ids(self) -> bool:
        return bool(self.processors)


def merged_config(base: Any, generation_config: Any, overrides: dict[str, Any]) -> Any:
    """User config (or the model's), then the model's for unset values, then HF's defaults, then overrides."""
    from transformers import GenerationConfig

    model_cfg = getattr(unwrap(base), "generation_config", None) or GenerationConfig()
    cfg = copy.deepcopy(generation_config if generation_config is not None else model_cfg)
    cfg.update(**model_cfg.to_dict(), defaults_only=True, allow_custom_entries=True)
    cfg.update(**GenerationConfig._get_default_generation_params(), defaults_only=True)
    unknown = sorted(k for k in overrides if not hasattr(cfg, k))
    if unknown:
        raise MedusaError(f"unknown generation setting(s): {', '.join(unknown)}")
    for key, value in overrides.items():
        if value is not None:
            setattr(cfg, key, value)
    return cfg


def _eos_list(cfg: Any, eos_token_id: int | Sequence[int] | None) -> list[int]:
    eos = cfg.eos_token_id if eos_token_id is None else eos_token_id
    if eos is None:
        return []
    if isinstance(eos, torch.Tensor):
        eos = eos.tolist()
    return [int(eos)] if isinstance(eos, int) else [int(e) for e in eos]


def _pad_id(cfg: Any, eos: list[int]) -> int:
    pad = cfg.pad_token_id
    if isinstance(pad, (list, tuple)):
        pad = pad[0] if pad else None
    return int(pad) if pad is not None else (eos[0] if eos else 0)


def _first_unsupported(cfg: Any) -> tuple[str, Any] | None:
    """``(name, value)`` of the first setting of ``cfg`` in :data:`_UNSUPPORTED` that is active, else None."""
    for name, active in _UNSUPPORTED:
        value = getattr(cfg, name, None)
        if active(value):
            return name, value
    return None


def check_supported_settings(cfg: Any) -> None:
    """Raise :class:`MedusaError` naming the first setting that changes HF's output and is not reproduced."""
    found = _first_unsupported(cfg)
    if found is not None:
        raise MedusaError(f"generation setting {found[0]}={found[1]!r} (from the arguments or the model's "
                          "generation_config) is not supported by MEDUSA decoding; unset it")


def sampling_only_blocker(base: Any) -> str | None:
    """Why a loop that applies only temperature / top-k / top-p (self-distillation's refill loop) would not
    reproduce ``base.generate``: the first setting of its generation_config that MEDUSA does not reproduce
    either, or that adds a logits processor (named by the processor); None when there is none."""
    cfg = merged_config(base, None, {})
    found = _first_unsupported(cfg)
    if found is not None:
        return f"generation_config.{found[0]}={found[1]!r}"
    procs = _build_processors(cfg, _eos_list(cfg, None), 1, torch.device("cpu"))
    return f"generation_config adds {type(procs[0]).__name__}" if procs else None


def _build_processors(cfg: Any, eos: list[int], prompt_len: int, device: torch.device) -> list:
    """HF's id-dependent processors for ``cfg``, in ``_get_logits_processor``'s order."""
    from transformers.generation import logits_process as lp

    procs: list = []
    eos_t = torch.tensor(eos, dtype=torch.long, device=device) if eos else None
    if cfg.sequence_bias is not None:
        procs.append(lp.SequenceBiasLogitsProcessor(sequence_bias=cfg.sequence_bias))
    if cfg.repetition_penalty is not None and cfg.repetition_penalty != 1.0:
        procs.append(lp.RepetitionPenaltyLogitsProcessor(float(cfg.repetition_penalty)))
    if cfg.no_repeat_ngram_size is not None and cfg.no_repeat_ngram_size > 0:
        procs.append(lp.NoRepeatNGramLogitsProcessor(cfg.no_repeat_ngram_size))
    if cfg.bad_words_ids is not None:
        procs.append(lp.NoBadWordsLogitsProcessor(cfg.bad_words_ids, eos_t))
    min_length = cfg.min_length
    if cfg.min_new_tokens is not None:  # HF's _prepare_generated_length: min_new_tokens takes precedence
        min_length = cfg.min_new_tokens + prompt_len
    if min_length is not None and eos_t is not None and min_length > 0:
        procs.append(lp.MinLengthLogitsProcessor(min_length, eos_t, device=device))
    if cfg.min_new_tokens is not None and eos_t is not None and cfg.min_new_tokens > 0:
        procs.append(lp.MinNewTokensLengthLogitsProcessor(prompt_len, cfg.min_new_tokens, eos_t,
                                                          device=device))
    if cfg.remove_invalid_values is True:
        procs.append(lp.InfNanRemoveLogitsProcessor())
    if cfg.suppress_tokens is not None:
        procs.append(lp.SuppressTokensLogitsProcessor(cfg.suppress_tokens, device=device))
    if cfg.begin_suppress_tokens is not None:
        procs.append(lp.SuppressTokensAtBeginLogitsProcessor(cfg.begin_suppress_tokens, prompt_len,
                                                             device=device))
    return procs


def build_warpers(cfg: Any, device: torch.device | str = "cpu") -> list:
    """HF's sampling warpers for ``cfg`` in HF's order (``do_sample=True``, one sequence per row)."""
    from transformers.generation import logits_process as lp

    w: list = []
    if cfg.temperature is not None and cfg.temperature != 1.0:
        w.append(lp.TemperatureLogitsWarper(cfg.temperature))
    if getattr(cfg, "top_h", None) is not None:
        w.append(lp.TopHLogitsWarper(top_h=cfg.top_h))
    if cfg.top_k is not None and cfg.top_k != 0:
        w.append(lp.TopKLogitsWarper(top_k=cfg.top_k, min_tokens_to_keep=1))
    if cfg.top_p is not None and cfg.top_p < 1.0:
        w.append(lp.TopPLogitsWarper(top_p=cfg.top_p, min_tokens_to_keep=1))
    if getattr(cfg, "min_p", None) is not None:
        w.append(lp.MinPLogitsWarper(min_p=cfg.min_p, min_tokens_to_keep=1))
    if cfg.typical_p is not None and cfg.typical_p < 1.0:
        w.append(lp.TypicalLogitsWarper(mass=cfg.typical_p, min_tokens_to_keep=1))
    if cfg.epsilon_cutoff is not None and 0.0 < cfg.epsilon_cutoff < 1.0:
        w.append(lp.EpsilonLogitsWarper(epsilon=cfg.epsilon_cutoff, min_tokens_to_keep=1))
    if cfg.eta_cutoff is not None and 0.0 < cfg.eta_cutoff < 1.0:
        w.append(lp.EtaLogitsWarper(epsilon=cfg.eta_cutoff, min_tokens_to_keep=1, device=device))
    return w


# sampling temperatures (the CLI's --temperature bounds too): below 1e-4, logits / T overflow in float32
MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-4, 100.0


def resolve_generation(base: Any, sampling: bool, input_ids: torch.Tensor, mask2d: torch.Tensor,
                       eos_token_id: int | Sequence[int] | None = None, generation_config: Any = None,
                       **overrides: Any) -> Generation:
    """Decoding settings as HF ``generate`` resolves them (arguments > generation_config > HF defaults).

    ``overrides`` are GenerationConfig fields (``temperature=None`` means the generation_config's).
    ``input_ids [B, P]`` / ``mask2d [B, P]``: the left-padded prompt. ``sampling`` adds the warpers.
    """
    cfg = merged_config(base, generation_config, overrides)
    check_supported_settings(cfg)
    eos = _eos_list(cfg, eos_token_id)
    device = input_ids.device
    temperature = float(cfg.temperature) if cfg.temperature is not None else 1.0
    if sampling and not MIN_TEMPERATURE <= temperature <= MAX_TEMPERATURE:
        raise MedusaError(f"temperature {temperature} is out of range when sampling (must be in "
                          f"[{MIN_TEMPERATURE}, {MAX_TEMPERATURE}]: below, logits / temperature overflow)")
    cfg.temperature = temperature
    gen = Generation(cfg, eos, _pad_id(cfg, eos), temperature,
                     _build_processors(cfg, eos, input_ids.shape[1], device),
                     build_warpers(cfg, device) if sampling else [])
    if cfg.renormalize_logits is True:
        from transformers.generation.logits_process import LogitNormalization

        (gen.warpers if sampling else gen.processors).append(LogitNormalization())
    gen.pad_lengths = (mask2d != 0).int().argmax(dim=1)  # [B], as HF computes prompt_ignore_length
    return gen


def apply_processors(gen: Generation, ids: torch.Tensor, scores: torch.Tensor,
                     rows: torch.Tensor) -> torch.Tensor:
    """``scores [R, V]`` (fp32) after ``ids [R, T]``, whose batch rows are ``rows [R]``: HF's processors."""
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    for proc in gen.processors:
        if isinstance(proc, RepetitionPenaltyLogitsProcessor):  # bind the rows' own left padding
            proc = RepetitionPenaltyLogitsProcessor(proc.penalty, prompt_ignore_length=gen.pad_lengths[rows])
        scores = proc(ids, scores)
    return scores


def apply_warpers(warpers: list, scores: torch.Tensor) -> torch.Tensor:
    """HF warpers (``build_warpers``) on ``scores [..., V]``, in order (they read no token ids)."""
    if not warpers:
        return scores
    shape = scores.shape
    flat = scores.reshape(-1, shape[-1])  # [R, V]
    for w in warpers:
        flat = w(None, flat)
    return flat.view(shape)


def warp_scores(gen: Generation, scores: torch.Tensor) -> torch.Tensor:
    """The run's sampling warpers on ``scores [..., V]``."""
    return apply_warpers(gen.warpers, scores)


def warp_logits(temperature: float | None = 1.0, top_k: int | None = None, top_p: float | None = None,
                device: torch.device | str = "cpu") -> Warp:
    """HF's sampling warpers for these three settings alone, in HF's order (:func:`build_warpers`:
    temperature 1.0, top_k 0/None and top_p 1.0/None are skipped). ``[..., V] -> [..., V]`` fp32 scores."""
    from transformers import GenerationConfig

    cfg = GenerationConfig(do_sample=True, temperature=1.0 if temperature is None else temperature,
                           top_k=top_k or 0, top_p=1.0 if top_p is None else top_p)
    warpers = build_warpers(cfg, device)

    def warp(logits: torch.Tensor) -> torch.Tensor:
        return apply_warpers(warpers, logits.float())

    return warp


def process_tree(gen: Generation, history: torch.Tensor, lengths: list[int], active: list[bool],
                 tokens: torch.Tensor, logits: torch.Tensor, ancestors: torch.Tensor, depths: list[int]
                 ) -> torch.Tensor:
    """Each node's scores after its own prefix, for the rows in ``active`` (others keep raw logits).

    ``history [B, H]``: padded prompt + emitted tokens, the tree root last, ``lengths[b]`` of them real.
    ``tokens [B, N]`` tree tokens, ``logits [B, N, V]``, ``ancestors [N, D+1]``: node index of each node's
    ancestor at each depth (``ancestors[i, d_i] = i``), ``depths``: each node's depth (host list).
    Rows of equal length and nodes of equal depth share one call: their prefixes have one length.
    """
    out = logits.float().clone()  # [B, N, V]
    v = out.shape[-1]
    device = logits.device
    by_len: dict[int, list[int]] = {}
    for row, (n, on) in enumerate(zip(lengths, active)):
        if on:
            by_len.setdefault(n, []).append(row)
    by_depth: dict[int, list[int]] = {}
    for node, d in enumerate(depths):
        by_depth.setdefault(d, []).append(node)
    for length, row_list in by_len.items():
        rows = torch.tensor(row_list, device=device)  # [r]
        prefix = history.index_select(0, rows)[:, :length]  # [r, L]
        for d, node_list in by_depth.items():
            nodes = torch.tensor(node_list, device=device)  # [n_d]
            path = ancestors.index_select(0, nodes)[:, 1:d + 1]  # [n_d, d] nodes below the root
            path_tok = tokens.index_select(0, rows)[:, path]  # [r, n_d, d]
            r, n_d = len(row_list), len(node_list)
            ids = torch.cat([prefix.unsqueeze(1).expand(r, n_d, length), path_tok],
                            dim=2).reshape(r * n_d, -1)
            sel = out[rows.view(r, 1), nodes.view(1, n_d)].reshape(r * n_d, v)  # [r * n_d, V]
            done = apply_processors(gen, ids, sel, rows.repeat_interleave(n_d))
            out[rows.view(r, 1), nodes.view(1, n_d)] = done.view(r, n_d, v)
    return out


def process_nodes(gen: Generation, history: torch.Tensor, lengths: list[int], active: list[bool],
                  tokens: torch.Tensor, logits: torch.Tensor, tree: VerifyTree) -> torch.Tensor:
    """:func:`process_tree` on a static tree, :func:`process_step_tree` on per-row trees."""
    if tree.per_row:
        return process_step_tree(gen, history, lengths, active, tokens, logits, tree)
    return process_tree(gen, history, lengths, active, tokens, logits, tree.ancestors, tree.depth_list)


def process_step_tree(gen: Generation, history: torch.Tensor, lengths: list[int], active: list[bool],
                      tokens: torch.Tensor, logits: torch.Tensor, tree: Any) -> torch.Tensor:
    """:func:`process_tree` for per-row trees (``RowTrees``): node depths differ between
    rows and live on the device, so, with no host read, every node of the active rows is processed once per
    depth d = 0..D with its path cut to d tokens, and keeps the result of its own depth.

    ``tree.ancestors [B, N, D+1]`` (node indices, the node itself at its own depth), ``tree.depths [B, N]``.
    """
    out = logits.float().clone()  # [B, N, V]
    b, n, v = out.shape
    device = logits.device
    by_len: dict[int, list[int]] = {}
    for row, (length, on) in enumerate(zip(lengths, active)):
        if on:
            by_len.setdefault(length, []).append(row)
    for length, row_list in by_len.items():
        rows = torch.tensor(row_list, device=device)  # [r]
        r = len(row_list)
        prefix = history.index_select(0, rows)[:, :length].unsqueeze(1).expand(r, n, length)  # [r, N, L]
        anc = tree.ancestors.index_select(0, rows)  # [r, N, D+1]
        path_tok = tokens.index_select(0, rows).gather(1, anc.view(r, -1)).view(anc.shape)  # [r, N, D+1]
        depth = tree.depths.index_select(0, rows).unsqueeze(-1)  # [r, N, 1]
        raw = out.index_select(0, rows)  # [r, N, V]
        done = raw
        for d in range(tree.depth + 1):
            ids = torch.cat([prefix, path_tok[:, :, 1:d + 1]], dim=2).reshape(r * n, length + d)
            at_d = apply_processors(gen, ids, raw.reshape(r * n, v).clone(), rows.repeat_interleave(n))
            done = torch.where(depth == d, at_d.view(r, n, v), done)
        out[rows] = done
    return out


__all__ = ["Generation", "Warp", "apply_processors", "apply_warpers", "build_warpers",
           "check_supported_settings", "merged_config", "process_nodes", "process_step_tree", "process_tree",
           "resolve_generation",
           "sampling_only_blocker", "warp_logits", "warp_scores"]
