"""forward_cost_curve: one forward of n tokens over a fixed cache, per n; the cache is restored each time."""

import torch

from medusa.decoding.hf import CACHE_KWARG
from medusa.eval.timing import forward_cost_curve

from tiny_models import tiny_model


def test_cost_curve_times_each_size_over_the_same_cache(monkeypatch):
    base = tiny_model("llama").eval()
    seen = []
    forward = base.forward

    def spy(*args, **kwargs):
        cache = kwargs[CACHE_KWARG]  # the keyword the installed transformers wants: no deprecation warning
        seen.append((kwargs["input_ids"].shape[1], cache.get_seq_length()))
        return forward(*args, **kwargs)

    monkeypatch.setattr(base, "forward", spy)
    curve = forward_cost_curve(base, sizes=(1, 4, 16), cache_len=20, repeats=2)
    assert list(curve) == [1, 4, 16] and all(t > 0 for t in curve.values())
    assert seen[0] == (20, 0)  # the prefill
    assert seen[1:] == [(n, 20) for n in (1, 4, 16) for _ in range(3)]  # each timed call: 20 cached tokens
    assert torch.is_grad_enabled()
