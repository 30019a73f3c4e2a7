"""vLLM's Medusa draft-model format (``vllm/model_executor/models/medusa.py``).

vLLM builds ``blocks[i] = ResidualBlock(num_hidden_layers linear layers, bias=medusa_fc_bias)`` and
``lm_heads[i] = ParallelLMHead(truncated_vocab_size, hidden_size)`` from ``config.json`` and loads
``blocks.{i}.layers.{j}.weight|bias`` and ``lm_heads.{i}.weight`` (a ``medusa_heads.`` prefix is stripped).
With ``original_lm_head: true`` it builds one ``lm_head = ParallelLMHead(truncated_vocab_size, hidden_size)``
shared by every head instead and loads ``lm_head.weight`` (or a ``lm_heads.0.weight`` mapped onto it):
``shared_lm_head`` heads are written that way, with the base LM head materialised once
(``HeadsState.tied_w2``); ``linear`` heads get ``lm_heads.{i}.weight`` and ``original_lm_head: false``.

``n_predict`` (= the head count) is what vLLM's ``SpeculativeConfig`` defaults ``num_speculative_tokens`` to;
without it the count must be passed, and a wrong one rewrites ``num_heads`` (``num_lookahead_tokens``).

Draft vocabulary: vLLM 0.32's own ``token_map`` path (``truncated_vocab_size < vocab_size``) cannot be used:
its loader assigns ``token_map`` as a new parameter but never reports it loaded, so the engine's strict
check (``DefaultModelLoader.track_weights_loading``) refuses the checkpoint. We write the FULL-vocabulary
layout instead (``truncated_vocab_size == vocab_size``): W2 is ``[V, d]``, the draft rows scattered to their
target ids and every other row set to the MEAN of the draft rows. A non-draft token's logit is then the mean
of the draft logits, strictly below their maximum unless all N are equal, so vLLM's top-1 draft is exactly
our draft-vocabulary argmax for every hidden state (a zero row would not do: the best draft logit of these
heads is sometimes negative). Cost: ``(V - N) * d`` more elements per W2 (SmolLM2, V = 49152, N = 8192,
d = 576, one shared W2 in bfloat16: 9.4 MB -> 56.6 MB) and a V-wide instead of N-wide head matmul per draft.
Gemma-3-270m's 3 ``linear`` float32 heads, V = 262144: 3 x 21 MB -> 3 x 671 MB. The ``token_map`` tensor
stays in the file (vLLM ignores it when the sizes are equal) with ``draft_vocab_size`` in config.json, so
:func:`read_vllm` gives the draft-vocabulary heads back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from medusa.errors import CheckpointError
from medusa.export.common import HeadsState, named_tensors, read_json, write_json
from medusa.io import save_safetensors
from medusa.modeling.base import dtype_name

WEIGHTS = "model.safetensors"
CONFIG = "config.json"


def full_vocab_rows(w2: torch.Tensor, token_map: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Draft rows ``w2 [N, d]`` -> ``[V, d]``: row ``token_map[i]`` = ``w2[i]``, every other row the mean of
    the N draft rows (computed in float32), so no non-draft row ever has the largest logit."""
    full = w2.float().mean(dim=0).expand(vocab_size, -1).clone()  # [V, d]
    full[token_map] = w2.float()
    return full.to(w2.dtype).contiguous()


def vllm_tensors(heads: HeadsState) -> dict[str, torch.Tensor]:
    head = "lm_head.weight" if heads.tied_w2 else "lm_heads.{k}.weight"  # tied: one W2 written once
    out = named_tensors(heads, "blocks.{k}.layers.{l}", head)
    if heads.token_map is not None:
        assert heads.full_vocab_size is not None
        for name in [n for n in out if n.startswith("lm_head")]:  # [N, d] -> [V, d]
            out[name] = full_vocab_rows(out[name], heads.token_map, heads.full_vocab_size)
        out["token_map"] = heads.token_map.to(torch.int64).contiguous()
    return out


def vllm_config(heads: HeadsState) -> dict[str, Any]:
    return {
        "model_type": "medusa",
        "architectures": ["MedusaModel"],
        "num_heads": heads.num_heads,
        # SpeculativeConfig: num_speculative_tokens defaults to n_predict, so `vllm serve` needs no count
        # (a count passed anyway overrides num_heads: fewer drops heads, more finds no weights)
        "n_predict": heads.num_heads,
        "num_hidden_layers": heads.num_layers,
        "hidden_size": heads.hidden_size,
        "vocab_size": heads.full_vocab_size if heads.token_map is not None else heads.vocab_size,
        # full-vocabulary rows even with a draft vocabulary (see the module docstring): vLLM then ignores
        # token_map, and draft_vocab_size (a key vLLM does not read) tells read_vllm to slice it back
        "truncated_vocab_size": heads.full_vocab_size if heads.token_map is not None else heads.vocab_size,
        "draft_vocab_size": int(heads.token_map.shape[0]) if heads.token_map is not None else None,
        "medusa_fc_bias": True,  # we always write the biases; vLLM silently drops them without this
        # tied (shared_lm_head) heads: one lm_head.weight for all; else one lm_heads.{i}.weight per head
        "original_lm_head": heads.tied_w2,
        "torch_dtype": dtype_name(heads.dtype),
        "base_model_name_or_path": heads.base_model_name_or_path,
    }


def write_vllm(heads: HeadsState, out: Path) -> None:
    save_safetensors(vllm_tensors(heads), out / WEIGHTS, metadata={"format": "pt"})
    write_json(out / CONFIG, vllm_config(heads))


def is_vllm_dir(path: Path) -> bool:
    if not (path / CONFIG).is_file() or not (path / WEIGHTS).is_file():
        return False
    return read_json(path / CONFIG).get("model_type") == "medusa"


def read_vllm(path: Path) -> HeadsState:
    """A vLLM Medusa directory -> canonical heads (head / layer counts from config.json, checked)."""
    cfg = read_json(path / CONFIG)
    src = str(path / WEIGHTS)
    try:
        state = load_file(src)
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{src}: corrupt safetensors file ({exc})") from None
    state = {k.removeprefix("medusa_heads."): v for k, v in state.items()}
    for key in ("num_heads", "num_hidden_layers"):
        if not isinstance(cfg.get(key), int):
            raise CheckpointError(f"{path / CONFIG}: missing integer key {key!r}")
    k_heads, n_layers = cfg["num_heads"], cfg["num_hidden_layers"]
    token_map, vocab = _token_map(cfg, state, path)

    def get(key: str) -> torch.Tensor:
        if key not in state:
            raise CheckpointError(f"{src}: missing tensor {key}")
        return state.pop(key)

    w1 = [[get(f"blocks.{k}.layers.{l}.weight") for l in range(n_layers)] for k in range(k_heads)]
    if cfg.get("medusa_fc_bias", False):
        b1 = [[get(f"blocks.{k}.layers.{l}.bias") for l in range(n_layers)] for k in range(k_heads)]
    else:  # vLLM's default: bias-free ResBlocks, i.e. a zero bias in ours
        b1 = [[torch.zeros(w.shape[0], dtype=w.dtype) for w in row] for row in w1]
    if cfg.get("original_lm_head", False):
        # vLLM's parameter is lm_head.weight; its loader also maps lm_heads.0.weight onto it
        shared = get("lm_head.weight" if "lm_head.weight" in state else "lm_heads.0.weight")
        w2 = [shared.clone() for _ in range(k_heads)]
    else:
        w2 = [get(f"lm_heads.{k}.weight") for k in range(k_heads)]
    if token_map is not None:  # vLLM slices a full-vocabulary W2 with the map
        w2 = [w.index_select(0, token_map) if w.shape[0] == vocab else w for w in w2]
    if state:
        raise CheckpointError(f"{src}: unexpected tensor(s) {', '.join(sorted(state)[:5])}")
    heads = HeadsState(w1, b1, w2, base_model_name_or_path=str(cfg.get("base_model_name_or_path") or ""),
                       token_map=token_map, full_vocab_size=vocab if token_map is not None else None)
    heads.check(src)
    return heads


def _token_map(cfg: dict[str, Any], state: dict[str, torch.Tensor],
               path: Path) -> tuple[torch.Tensor | None, Any]:
    """vLLM's rule: ``token_map`` is used only when ``truncated_vocab_size < vocab_size`` (then required);
    our full-vocabulary layout keeps it beside ``draft_vocab_size`` (vLLM ignores both)."""
    vocab = cfg.get("vocab_size")
    truncated = cfg.get("truncated_vocab_size", vocab)
    token_map = state.pop("token_map", None)
    draft = cfg.get("draft_vocab_size")
    if truncated == vocab and draft is not None and token_map is not None:
        if tuple(token_map.shape) != (draft,):
            raise CheckpointError(f"{path / WEIGHTS}: token_map has shape {tuple(token_map.shape)}, expected "
                                  f"({draft},) (draft_vocab_size)")
        return token_map.to(torch.int64), vocab
    if truncated == vocab:
        return None, vocab
    if not isinstance(vocab, int) or not isinstance(truncated, int) or token_map is None:
        raise CheckpointError(f"{path / CONFIG}: truncated_vocab_size {truncated!r} < vocab_size "
                              f"{vocab!r} needs integer sizes and a token_map tensor in {path / WEIGHTS}")
    if tuple(token_map.shape) != (truncated,):
        raise CheckpointError(f"{path / WEIGHTS}: token_map has shape {tuple(token_map.shape)}, expected "
                              f"({truncated},) (truncated_vocab_size)")
    return token_map.to(torch.int64), vocab
