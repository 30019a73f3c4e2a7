"""The static-cache path (preallocated cache and buffers, fixed step shapes), eager: HF greedy equality and
compaction equal to a fresh prefill; Hydra heads and dynamic trees on it (greedy == HF greedy on stories260K
with fitted heads, the same decisions as the eager path, the sampling law by chi-square; compiled:
tests/decoding/test_compiled.py, later tokens: tests/integration/test_lossless_sampling.py)."""

import functools

import pytest
import torch
from chi_square import chi2_pvalue, exact_joint
from decoding_helpers import (
    COMBO_IDS,
    COMBOS,
    FITTED_NEW,
    FULL_TREE,
    SAMPLER_VOCAB,
    check_compaction_equals_prefill,
    check_stories_greedy,
    fitted_llama,
    sampler_heads,
    stories_left_padded,
)

from medusa import MedusaTree
from medusa.decoding.kv_cache import cache_bucket
from medusa.decoding.processors import warp_logits
from medusa.decoding.static_cache import compact, static_capacity, static_prefill
from medusa.errors import MedusaError

from fit_heads import fitted_stories_heads

NEW = FITTED_NEW
STORIES_NEW = 96


@pytest.mark.parametrize("gen", [{}, {"repetition_penalty": 1.3}], ids=["plain", "rep-penalty"])
def test_static_greedy_equals_hf(gen):
    model, ids, mask, ref, ref1 = fitted_llama(**gen)
    out = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, cache_implementation="static",
                         return_dict_in_generate=True)
    assert torch.equal(out.sequences, ref)
    one = model.generate(ids[:1], max_new_tokens=NEW, cache_implementation="static",
                         return_dict_in_generate=True)
    assert torch.equal(one.sequences, ref1)
    assert one.tokens_per_step > 2.0, one.accept_lengths  # long accepted runs: compaction really happened
    assert out.compile_time_s == 0.0
    eager = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, return_dict_in_generate=True)
    assert eager.accept_lengths == out.accept_lengths


def test_static_compaction_equals_prefill():
    def new_cache(ids, dt):
        return functools.partial(static_prefill, num_nodes=dt.num_nodes,
                                 capacity=static_capacity(ids.shape[1], 60, 3, dt.num_nodes, dt.depth),
                                 dtype=dt.dtype,
                                 compact_fn=compact)

    cache = check_compaction_equals_prefill("llama", new_cache).cache  # StaticKV
    assert int(cache.past) == cache.past_host
    assert not bool((cache.mask[:, 0, 0, cache.past_host:] == 0).any())  # nothing valid past the used columns


def test_cache_bucket_and_errors():
    assert [cache_bucket(n) for n in (1, 64, 65, 200, 256, 257)] == [64, 64, 128, 256, 256, 512]
    model, ids, mask, _, _ = fitted_llama(new=4)
    with pytest.raises(MedusaError, match="cache_implementation"):
        model.generate(ids, attention_mask=mask, max_new_tokens=4, cache_implementation="offloaded")


@pytest.mark.parametrize("head_type,tree", COMBOS, ids=COMBO_IDS)
def test_static_cache_greedy_equals_hf(head_type, tree):
    model = fitted_stories_heads(num_heads=4, num_layers=1, head_type=head_type)
    out = check_stories_greedy(model, tree, STORIES_NEW, cache_implementation="static")[0]
    enc, _ = stories_left_padded()
    eager = model.generate(enc["input_ids"], attention_mask=enc["attention_mask"], max_new_tokens=STORIES_NEW,
                           tree=tree, return_dict_in_generate=True)
    assert eager.accept_lengths == out.accept_lengths  # the same trees and decisions as the eager path
    assert out.compile_time_s == 0.0


def _joint_counts(out, n):
    v = SAMPLER_VOCAB
    x1, x2 = out[:, 4], out[:, 5]
    ones = torch.ones(n, dtype=torch.float64)
    return torch.zeros(v * v, dtype=torch.float64).index_add_(0, x1 * v + x2, ones)


def _sample_check(head_type, tree, **path):
    base, model = sampler_heads(head_type)
    prompt = torch.tensor([[3, 5, 4, 6]])
    n = 6000
    setting = {"temperature": 0.7, "top_k": 4}
    out = model.generate(prompt.repeat(n, 1), max_new_tokens=2, acceptance="sample", eos_token_id=[],
                         tree=tree, generator=torch.Generator().manual_seed(1234), **setting, **path)
    expected = exact_joint(base, prompt, warp_logits(**setting)).view(-1) * n
    assert chi2_pvalue(_joint_counts(out, n), expected) > 1e-3


@pytest.mark.parametrize("head_type,tree", [("linear", "dynamic:12"), ("hydra", "dynamic:12"),
                                            ("linear", "dynamic:5"), ("hydra", "full")])
def test_static_sample_is_lossless_chi_square(head_type, tree):
    tree = MedusaTree.from_choices(FULL_TREE) if tree == "full" else tree  # Hydra on a static tree
    _sample_check(head_type, tree, cache_implementation="static")
