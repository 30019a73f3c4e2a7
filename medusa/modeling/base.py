"""Loading a Hugging Face causal LM and reaching its decoder and LM head generically."""

from __future__ import annotations

import functools
import time
from typing import Any

import torch
from torch import nn

from medusa.decoding.hf import text_config, unwrap
from medusa.errors import CheckpointError, MedusaError, first_line
from medusa.io import read_text

_DTYPES = {
    "float32": torch.float32, "fp32": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16,
}


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype | str | None:
    """``"bf16"`` / ``"bfloat16"`` / ``torch.bfloat16`` -> ``torch.bfloat16``; "auto", None pass."""
    if dtype is None or isinstance(dtype, torch.dtype) or dtype == "auto":
        return dtype
    if dtype not in _DTYPES:
        raise CheckpointError(f"unknown dtype {dtype!r}; use one of {sorted(_DTYPES)} or 'auto'")
    return _DTYPES[dtype]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def expand_home(name_or_path: str) -> str:
    """``~/...`` -> the user's home (recipes may name a local model that way); anything else unchanged."""
    import os

    return os.path.expanduser(name_or_path) if str(name_or_path).startswith("~") else name_or_path


def load_base_model(
    name_or_path: str,
    dtype: str | torch.dtype | None = None,
    device_map: Any = None,
    quantization_config: Any = None,
    **kwargs: Any,
) -> nn.Module:
    """``AutoModelForCausalLM.from_pretrained`` with a one-line error when the model cannot be loaded."""
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM

    load_kwargs = dict(kwargs)
    if dtype is not None:
        load_kwargs["dtype"] = resolve_dtype(dtype)
    if device_map is not None:
        load_kwargs["device_map"] = device_map
    if quantization_config is not None:
        load_kwargs["quantization_config"] = quantization_config
    name_or_path = expand_home(name_or_path)
    try:
        return AutoModelForCausalLM.from_pretrained(name_or_path, **load_kwargs)
    except (OSError, ValueError, SafetensorError) as exc:  # SafetensorError: a truncated / corrupt file
        first = first_line(exc)
        raise CheckpointError(f"cannot load base model {name_or_path!r}: {first}") from exc


def max_positions(name_or_path: str) -> int | None:
    """The model's ``max_position_embeddings`` read from its config alone (no weights load); None when the
    model has no such limit or its config cannot be read here (loading the model then says why)."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(expand_home(name_or_path))
    except (OSError, ValueError, KeyError):
        return None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    limit = getattr(text, "max_position_embeddings", None)
    return limit if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 else None


def fit_max_length(key: str, value: int | None, limit: int | None, default: int,
                   error: type[MedusaError] = MedusaError) -> tuple[int, str | None]:
    """``(length, note)``: the longest sequence ``key`` allows, within the model's ``limit`` positions.

    ``value`` None (or equal to ``default``, the value a recipe gets when it does not set the key) is cut to
    ``limit``, with a ``note`` to log saying so; any other value past ``limit`` is an ``error`` naming the key
    and both numbers (past its positions a model's output is garbage, silently). A model without a limit
    takes the value as given."""
    length = default if value is None else value
    if limit is None or length <= limit:
        return length, None
    if value is not None and value != default:
        raise error(f"{key} {value} exceeds the model's {limit} positions (max_position_embeddings); "
                    f"use at most {limit}")
    return limit, (f"{key}: the default {default} is past the model's {limit} positions "
                   f"(max_position_embeddings); using {limit}")


def load_tokenizer(name_or_path: str, *, chat_template: str | None = None, padding_side: str | None = None,
                   error: type[MedusaError] = MedusaError, what: str = "a tokenizer") -> Any:
    """``AutoTokenizer.from_pretrained`` with a one-line ``error`` naming the source when it cannot load.

    ``chat_template`` (a file or a Jinja string) replaces the tokenizer's own; with ``padding_side`` set,
    a tokenizer without a pad token gets its unk (else EOS) token as pad.
    """
    from pathlib import Path

    from transformers import AutoTokenizer

    name_or_path = expand_home(name_or_path)
    try:
        tok = AutoTokenizer.from_pretrained(name_or_path)
    except (OSError, ValueError) as exc:
        raise error(f"cannot load {what} from {name_or_path!r}: {first_line(exc)}") from None
    if chat_template is not None:
        path = Path(chat_template)
        tok.chat_template = read_text(path, error) if path.is_file() else chat_template
    if padding_side is not None:
        tok.padding_side = padding_side
        if tok.pad_token is None:
            tok.pad_token = tok.unk_token if tok.unk_token is not None else tok.eos_token
    return tok


def decoder_of(model: nn.Module) -> nn.Module:
    """The transformer body (``model.model``, ``transformer``, ``gpt_neox``...) whose output is post-norm."""
    inner = unwrap(model)
    body = getattr(inner, inner.base_model_prefix, None)
    if body is None or body is inner:
        raise CheckpointError(f"{type(inner).__name__}: cannot find the decoder body of this model")
    return body


def lm_head_of(model: nn.Module) -> nn.Module:
    head = unwrap(model).get_output_embeddings()
    if head is None:
        raise CheckpointError(f"{type(unwrap(model)).__name__} has no output embeddings (LM head)")
    return head


def lm_head_weight(model: nn.Module) -> torch.Tensor:
    """The LM head weight ``[V, d]``; tied embeddings give the input embedding matrix."""
    return lm_head_of(model).weight


def base_logits(model: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """The base model's own logits from its last (post-norm) hidden state: ``[..., d] -> [..., V]``.

    Applies the same post-processing the ``*ForCausalLM`` classes do (Gemma-2 soft-capping,
    Cohere's logit_scale, Granite's logits_scaling) so the result equals ``model(...).logits``.
    """
    cfg = text_config(model)
    head = lm_head_of(model)
    logits = head(hidden.to(head.weight.dtype) if head.weight.is_floating_point() else hidden)
    scale = getattr(cfg, "logit_scale", None)
    if scale is not None and isinstance(scale, (int, float)):
        logits = logits * scale
    scaling = getattr(cfg, "logits_scaling", None)
    if scaling is not None and isinstance(scaling, (int, float)):
        logits = logits / scaling
    cap = getattr(cfg, "final_logit_softcapping", None)
    if cap is not None:
        logits = torch.tanh(logits / cap) * cap
    return logits


def logits_post_processed(model: nn.Module) -> bool:
    """Whether :func:`base_logits` changes the LM head's output for ``model`` (a scale or a soft cap)."""
    cfg = text_config(model)
    return any(isinstance(getattr(cfg, key, None), (int, float))
               for key in ("logit_scale", "logits_scaling", "final_logit_softcapping"))


def native_bf16(device: str | torch.device = "cpu") -> bool:
    """Whether ``device`` computes bfloat16 matmuls natively and faster than float32: CUDA (Ampere+), or a CPU
    that has AVX-512 BF16 / AMX *and* on which a bf16 matmul measurably beats float32
    (:func:`cpu_bf16_faster`; the flag alone is not enough: on some virtualised Xeons with ``avx512_bf16``,
    torch's bf16 matmuls ran 1.2-2x slower than float32, 2026-11-25)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device.type != "cpu":
        return False
    return cpu_bf16_flagged() and cpu_bf16_faster()


@functools.lru_cache(maxsize=1)
def cpu_bf16_flagged() -> bool:
    """Whether the CPU reports AVX-512 BF16 or AMX (``/proc/cpuinfo``, else oneDNN's check); read once per
    process (training asks every step)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
        return "avx512_bf16" in flags or "amx_bf16" in flags
    except OSError:
        try:
            return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
        except (AttributeError, RuntimeError):
            return False


@functools.lru_cache(maxsize=1)
def cpu_bf16_faster() -> bool:
    """Whether a ``[64, 1024] @ [1024, 1024]`` matmul runs at least 1.25x faster in bfloat16 than in float32
    on this CPU (best of 5 after a warm-up, each dtype; measured once per process, ~20 ms)."""
    a = torch.randn(64, 1024)
    w = torch.randn(1024, 1024)

    def best(x: torch.Tensor, y: torch.Tensor) -> float:
        torch.nn.functional.linear(x, y)
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            torch.nn.functional.linear(x, y)
            times.append(time.perf_counter() - t0)
        return min(times)

    return best(a.bfloat16(), w.bfloat16()) * 1.25 <= best(a, w)


def fast_dtype(device: str | torch.device = "cpu") -> str:
    """``"bfloat16"`` where the device computes it natively (:func:`native_bf16`), else ``"float32"``."""
    return "bfloat16" if native_bf16(device) else "float32"
