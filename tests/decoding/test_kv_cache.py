"""After many steps, the compacted KV cache equals the cache of one prefill over the same tokens."""

import pytest
import torch
from decoding_helpers import check_compaction_equals_prefill
from transformers.cache_utils import DynamicLayer

from medusa.decoding.kv_cache import compact_cache, new_cache


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gpt_neox"])
def test_compacted_cache_equals_prefill(arch):
    check_compaction_equals_prefill(arch)  # the default DynamicKV


def test_compact_cache_gathers_in_place():
    cache = new_cache()
    keys = torch.arange(2 * 1 * 7 * 2, dtype=torch.float32).view(2, 1, 7, 2)  # [B, H, T, hd]
    cache.layers.append(DynamicLayer())
    cache.layers[0].update(keys.clone(), keys.clone() + 100)
    before = cache.layers[0].keys.data_ptr()
    compact_cache(cache, 3, torch.tensor([[0, 2, 3], [0, 1, 0]]))  # tree nodes kept per row
    k = cache.layers[0].keys
    assert k.shape == (2, 1, 6, 2) and k.data_ptr() == before
    torch.testing.assert_close(k[0, 0, 3:], keys[0, 0, [3, 5, 6]])
    torch.testing.assert_close(k[1, 0, 3:], keys[1, 0, [3, 4, 3]])
    torch.testing.assert_close(k[:, :, :3], keys[:, :, :3])
    torch.testing.assert_close(cache.layers[0].values[0, 0, 3:], keys[0, 0, [3, 5, 6]] + 100)
