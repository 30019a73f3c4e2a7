"""The Hugging Face accessors decoding uses: the text config of a plain model, a peft wrapper unwrapped, and
the KV cache passed and read back by the keyword the installed transformers takes (no deprecation warning)."""

import inspect
import warnings

import torch

from medusa.decoding.hf import CACHE_KWARG, cache_kwargs, output_cache, text_config, unwrap

from tiny_models import tiny_model


class _Wrapped:
    def __init__(self, model):
        self.model = model

    def get_base_model(self):
        return self.model


def test_unwrap_and_text_config():
    model = tiny_model("llama")
    assert unwrap(model) is model
    assert unwrap(_Wrapped(model)) is model
    assert text_config(model).hidden_size == 32 and text_config(_Wrapped(model)).vocab_size == 96


def test_the_cache_goes_by_the_keyword_the_installed_transformers_takes():
    """Every causal LM of the installed transformers takes ``CACHE_KWARG``; passing the cache that way warns
    nothing (``past_key_values`` is a FutureWarning from transformers 5.24 on) and the output carries it."""
    from transformers import DynamicCache

    model = tiny_model("llama")
    for arch in ("llama", "qwen2", "gpt2", "gemma2"):
        assert CACHE_KWARG in inspect.signature(type(tiny_model(arch)).forward).parameters, arch
    cache = DynamicCache()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = model(input_ids=torch.tensor([[5, 6, 7]]), use_cache=True, **cache_kwargs(cache))
    assert output_cache(out) is cache and cache.get_seq_length() == 3


def test_every_kv_cache_has_the_attention_facing_interface():
    """transformers' DynamicCache (the target's), the drafter's DraftKV and the refill backend's SlotCache
    all provide AttentionCache (update + get_seq_length); an object without it does not pass."""
    import torch
    from transformers import DynamicCache

    from medusa.decoding.hf import AttentionCache
    from medusa.modeling.eagle3 import DraftKV
    from medusa.selfdistill.backends.refill import SlotCache

    k = torch.randn(1, 2, 3, 4)
    for cache in (DynamicCache(), DraftKV(), SlotCache(8)):
        assert isinstance(cache, AttentionCache)
        keys, _ = cache.update(k, k, 0)
        assert tuple(keys.shape) == (1, 2, 3, 4)
    assert not isinstance(object(), AttentionCache)
