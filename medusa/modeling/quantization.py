"""bitsandbytes quantisation: the one config builder and the one CPU 4-bit layout fix.

Every place that loads a quantised model (training backbones, the local self-distillation backend)
builds its ``BitsAndBytesConfig`` here, and every 4-bit model that runs on a CPU goes through
:func:`keep_plain_4bit_layout`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from medusa.errors import ConfigError
from medusa.modeling.base import resolve_dtype


def bnb_config(bits: str, compute_dtype: str | torch.dtype = torch.bfloat16,
               double_quant: bool = True) -> Any:
    """A ``transformers.BitsAndBytesConfig``: ``"4bit"`` -> NF4 weights computing in ``compute_dtype``
    (with double quantisation unless ``double_quant`` is False), ``"8bit"`` -> LLM.int8()."""
    from transformers import BitsAndBytesConfig

    if bits == "4bit":
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                  bnb_4bit_use_double_quant=double_quant,
                                  bnb_4bit_compute_dtype=resolve_dtype(compute_dtype))
    if bits == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    raise ConfigError(f"quantization: {bits!r} is not one of 4bit, 8bit")


def keep_plain_4bit_layout(model: nn.Module) -> None:
    """Keep every 4-bit layer of ``model`` in the plain NF4 layout on CPU.

    bitsandbytes 0.50 repacks 4-bit weights in place for its AVX512-bf16 CPU kernel on the first eval +
    no-grad forward (a frozen MEDUSA-1 backbone, a self-distillation teacher) and asserts unless every
    dimension is a multiple of its block sizes (stories260K's 172-wide MLP is not); a repacked weight is
    also not what a trained (QLoRA) layer expects. The repacking is only an inference speed-up, so it is
    switched off for every layer that has it (a no-op on GPU and for models without 4-bit layers).
    """
    for module in model.modules():
        if hasattr(module, "support_avx512bf16_for_cpu"):
            module.support_avx512bf16_for_cpu = False
