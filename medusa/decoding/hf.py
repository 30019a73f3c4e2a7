"""The two Hugging Face model accessors decoding needs (and modeling re-uses: it sits above decoding)."""

from __future__ import annotations

from typing import Any

from torch import nn


def unwrap(model: nn.Module) -> nn.Module:
    """The underlying ``PreTrainedModel`` of a peft wrapper (LoRA layers stay injected), else the model."""
    if hasattr(model, "get_base_model"):
        return model.get_base_model()
    return model


def text_config(model: nn.Module) -> Any:
    """The model's text config (``get_text_config()`` of a multimodal config, else the config)."""
    config = unwrap(model).config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


__all__ = ["text_config", "unwrap"]
