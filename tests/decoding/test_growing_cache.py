"""medusa/decoding/growing_cache.py: a transformers cache layer that writes in place into a preallocated
buffer. Its forwards give exactly DynamicCache's logits, cutting keeps the buffer, and anything that is not a
prefix view of the buffer is copied into a new one."""

import torch
from transformers import DynamicCache

from medusa.decoding.growing_cache import MIN_CAPACITY, GrowingLayer, growing_cache
from medusa.decoding.kv_cache import compact_cache

from tiny_models import tiny_model


def _kv(n: int, start: float = 0.0) -> torch.Tensor:
    return torch.arange(n * 2 * 3, dtype=torch.float32).view(1, 2, n, 3) + start  # [B, H, n, hd]


def test_update_writes_in_place_and_cuts_keep_the_buffer():
    layer = GrowingLayer()
    k, v = layer.update(_kv(5), _kv(5, 100.0))
    buffer = k.data_ptr()
    assert k.shape == (1, 2, 5, 3) and layer.get_seq_length() == 5 and layer.get_mask_sizes(2) == (7, 0)
    k, v = layer.update(_kv(2, 1000.0), _kv(2, 2000.0))
    assert k.data_ptr() == buffer and k.shape[2] == 7  # written after the first five, no copy
    torch.testing.assert_close(k[:, :, :5], _kv(5))
    torch.testing.assert_close(v[:, :, 5:], _kv(2, 2000.0))
    layer.crop(-3)
    assert layer.get_seq_length() == 4 and layer.keys.data_ptr() == buffer
    k, _ = layer.update(_kv(1, -1.0), _kv(1, -1.0))
    assert k.data_ptr() == buffer and k.shape[2] == 5
    torch.testing.assert_close(k[:, :, 4:], _kv(1, -1.0))  # the cropped columns were overwritten


def test_growing_past_the_capacity_and_a_foreign_tensor_copy_into_a_new_buffer():
    layer = GrowingLayer()
    quarter = MIN_CAPACITY // 4
    layer.update(_kv(quarter), _kv(quarter))  # a new buffer of MIN_CAPACITY columns
    first = layer.keys.data_ptr()
    layer.update(_kv(MIN_CAPACITY - quarter - 2, 1.0), _kv(MIN_CAPACITY - quarter - 2, 1.0))
    assert layer.keys.data_ptr() == first and layer.get_seq_length() == MIN_CAPACITY - 2
    k, _ = layer.update(_kv(4, 7.0), _kv(4, 7.0))  # past the capacity: a larger buffer, contents copied
    assert k.data_ptr() != first and k.shape[2] == MIN_CAPACITY + 2
    torch.testing.assert_close(k[:, :, :quarter], _kv(quarter))
    torch.testing.assert_close(k[:, :, MIN_CAPACITY - 2:], _kv(4, 7.0))
    layer.keys = layer.keys[:, :, [0, 2]]  # not a view of the buffer (an index copy)
    layer.values = layer.values[:, :, [0, 2]]
    k, _ = layer.update(_kv(1, 9.0), _kv(1, 9.0))
    assert k.shape[2] == 3
    torch.testing.assert_close(k[:, :, :2], _kv(quarter)[:, :, [0, 2]])
    torch.testing.assert_close(k[:, :, 2:], _kv(1, 9.0))


def test_compact_cache_moves_the_kept_entries_inside_the_buffer():
    cache = growing_cache()
    cache.layers.append(GrowingLayer())
    keys = _kv(7)
    cache.layers[0].update(keys.clone(), keys.clone())
    buffer = cache.layers[0].keys.data_ptr()
    compact_cache(cache, 3, torch.tensor([[0, 2, 3]]))  # keep tree nodes 0, 2, 3 after 3 cached entries
    k = cache.layers[0].keys
    assert k.shape[2] == 6 and k.data_ptr() == buffer
    torch.testing.assert_close(k[0, :, 3:], keys[0, :, [3, 5, 6]])
    cache.layers[0].update(_kv(1, 5.0), _kv(1, 5.0))
    assert cache.layers[0].keys.data_ptr() == buffer  # the next step writes after them, in place


def test_forwards_give_dynamic_cache_logits_exactly():
    model = tiny_model("llama")
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, 96, (2, 9), generator=g)
    caches = {"dynamic": DynamicCache(), "growing": growing_cache()}
    logits: dict[str, list[torch.Tensor]] = {name: [] for name in caches}
    with torch.no_grad():
        for name, cache in caches.items():
            model(input_ids=prompt, past_key_values=cache, use_cache=True)
            pos = 9
            for n in (1, 4, 2, 1):  # tree-sized forwards, each cropped back to one kept token
                ids = torch.randint(3, 96, (2, n), generator=torch.Generator().manual_seed(pos))
                out = model(input_ids=ids, past_key_values=cache, use_cache=True,
                            position_ids=torch.arange(pos, pos + n).expand(2, n))
                cache.crop(-(n - 1))
                pos += 1
                logits[name].append(out.logits)
    assert all(torch.equal(a, b) for a, b in zip(logits["dynamic"], logits["growing"]))
    assert caches["growing"].get_seq_length() == caches["dynamic"].get_seq_length() == pos
