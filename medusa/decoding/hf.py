"""The Hugging Face model accessors decoding needs (and modeling re-uses: it sits above decoding), and the
keyword the installed transformers' model forwards take the KV cache by."""

from __future__ import annotations

import inspect
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn
from transformers.models.llama.modeling_llama import LlamaModel


def _cache_keyword() -> str:
    """``cache`` where transformers' forwards take the KV cache by that name (5.24 on: ``past_key_values`` is
    then a deprecated alias that warns on every call and is to be removed), else ``past_key_values``. Every
    causal LM of one transformers version uses the same name, so one model class answers for all."""
    return "cache" if "cache" in inspect.signature(LlamaModel.forward).parameters else "past_key_values"


CACHE_KWARG = _cache_keyword()  # the keyword a transformers model's forward takes its KV cache by


@runtime_checkable
class AttentionCache(Protocol):
    """What a transformers attention module asks of the KV cache it is handed (``Cache``'s attention-facing
    part): ``update`` stores a layer's new keys / values ``[B, H_kv, q, hd]`` and returns everything the
    layer attends to; ``get_seq_length`` says how many entries it holds. transformers' own caches (the
    target's, :mod:`medusa.decoding.kv_cache`), the drafter's :class:`medusa.modeling.eagle3.DraftKV` and the
    refill backend's :class:`medusa.selfdistill.backends.refill.SlotCache` each provide it; what else each
    does differs (docs/design.md, "Caches")."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]: ...

    def get_seq_length(self, layer_idx: int = 0) -> int: ...


def cache_kwargs(cache: Any) -> dict[str, Any]:
    """``{CACHE_KWARG: cache}``: the KV cache as keyword arguments of a transformers model's forward."""
    return {CACHE_KWARG: cache}


def output_cache(out: Any) -> Any:
    """The KV cache a transformers model output carries (``out.cache``, or ``out.past_key_values`` before
    5.24), None when it has none."""
    return out.get(CACHE_KWARG)


def unwrap(model: nn.Module) -> nn.Module:
    """The underlying ``PreTrainedModel`` of a peft wrapper (LoRA layers stay injected), else the model."""
    if hasattr(model, "get_base_model"):
        return model.get_base_model()
    return model


def text_config(model: nn.Module) -> Any:
    """The model's text config (``get_text_config()`` of a multimodal config, else the config)."""
    config = unwrap(model).config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


__all__ = ["CACHE_KWARG", "AttentionCache", "cache_kwargs", "output_cache", "text_config", "unwrap"]
