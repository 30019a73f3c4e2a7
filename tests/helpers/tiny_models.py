"""Tiny random-weight models of several architectures, built in-process (no downloads)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
STORIES = SHARED / "models" / "stories260K"

ARCHITECTURES = ["llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "gpt_neox", "gpt2"]


def require_shared(path: Path = SHARED) -> Path:
    """Skip (or, with MEDUSA_REQUIRE_SHARED=1 as in CI, fail) when ../shared is absent."""
    if not path.exists():
        if os.environ.get("MEDUSA_REQUIRE_SHARED") == "1":
            pytest.fail(f"{path} is missing and MEDUSA_REQUIRE_SHARED=1")
        pytest.skip(f"{path} is not present (the shared assets live beside the project)")
    return path


def require_module(name: str):
    """Import an optional dependency, or skip (fail in CI, where MEDUSA_REQUIRE_SHARED=1) when it is absent.

    ``pytest.importorskip`` alone skips silently in CI too, hiding a missing dependency.
    """
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError as exc:
        if os.environ.get("MEDUSA_REQUIRE_SHARED") == "1":
            pytest.fail(f"{name} cannot be imported ({exc}) and MEDUSA_REQUIRE_SHARED=1")
        pytest.skip(f"{name} is not installed")


def tiny_config(arch: str, vocab_size: int = 96, hidden_size: int = 32, layers: int = 2, **overrides):
    import transformers as tf

    common = dict(vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=layers,
                  num_attention_heads=4, intermediate_size=64, max_position_embeddings=512,
                  bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if arch == "llama":
        cfg = tf.LlamaConfig(num_key_value_heads=2, **common)
    elif arch == "mistral":
        cfg = tf.MistralConfig(num_key_value_heads=2, sliding_window=None, **common)
    elif arch == "qwen2":
        cfg = tf.Qwen2Config(num_key_value_heads=2, **common)
    elif arch == "qwen3":
        cfg = tf.Qwen3Config(num_key_value_heads=2, head_dim=8, **common)
    elif arch == "gemma":
        cfg = tf.GemmaConfig(num_key_value_heads=2, head_dim=8, **common)
    elif arch == "gemma2":
        cfg = tf.Gemma2Config(num_key_value_heads=2, head_dim=8, sliding_window=256, **common)
    elif arch == "phi3":
        cfg = tf.Phi3Config(num_key_value_heads=2, **common)
    elif arch == "gpt_neox":
        cfg = tf.GPTNeoXConfig(vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=layers,
                               num_attention_heads=4, intermediate_size=64, max_position_embeddings=512,
                               bos_token_id=1, eos_token_id=2, pad_token_id=0)
    elif arch == "gpt2":
        cfg = tf.GPT2Config(vocab_size=vocab_size, n_embd=hidden_size, n_layer=layers, n_head=4,
                            n_positions=512, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    else:
        raise ValueError(arch)
    for key, value in overrides.items():
        setattr(cfg, key, value)
    if arch == "gemma2":
        cfg._attn_implementation = "eager"
    return cfg


def tiny_model(arch: str = "llama", seed: int = 0, **kwargs) -> torch.nn.Module:
    """A random-weight ``*ForCausalLM`` of ``arch`` in eval mode (fp32, CPU)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = tiny_config(arch, **kwargs)
    attn = "eager" if arch == "gemma2" else "sdpa"
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn)
    # Random init gives near-uniform logits; scale the LM head up so argmax is decisive and greedy
    # comparisons are not decided by float noise.
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4.0) if p.dim() == 2 and p.shape[0] == cfg.vocab_size else None
    return model.eval()


def stories_model() -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    require_shared(STORIES)
    return AutoModelForCausalLM.from_pretrained(STORIES).eval()


def stories_tokenizer():
    from transformers import AutoTokenizer

    require_shared(STORIES)
    return AutoTokenizer.from_pretrained(STORIES)
