"""After many steps, the compacted KV cache equals the cache of one prefill over the same tokens."""

import pytest
import torch
from decoding_helpers import left_padded_batch, memorise_heads, real_rows
from transformers.cache_utils import DynamicLayer

from medusa import MedusaModel
from medusa.decoding.acceptance import greedy_accept
from medusa.decoding.candidates import decode_tree
from medusa.decoding.generate import prefill
from medusa.decoding.kv_cache import compact_cache, new_cache
from medusa.decoding.step import step
from medusa.tree import default_tree

from tiny_models import tiny_model


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gpt_neox"])
def test_compacted_cache_equals_prefill(arch):
    base = tiny_model(arch)
    ids, mask = left_padded_batch(base.config.vocab_size, seed=11)
    ref = base.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=60, eos_token_id=None)
    model = MedusaModel.from_base(base, num_heads=4)
    memorise_heads(model, real_rows(ref, mask)[:2], steps=30)  # row 2 unknown to the heads: uneven accepts
    dt = decode_tree(default_tree(4, 64), torch.device("cpu"), torch.float32)
    with torch.no_grad():
        state = prefill(model, ids, mask, dt)
        cached = [ids[row][mask[row].bool()].tolist() for row in range(3)]  # tokens in each row's cache
        kept = []
        for _ in range(12):
            result = step(model, state, lambda logits, tokens, tree: greedy_accept(logits, tokens, tree))
            kept.append(result.kept.tolist())
            for row in range(3):
                cached[row] += result.tokens[row, :kept[-1][row]].tolist()
    assert max(max(k) for k in kept) >= 4  # long accepted runs
    assert any(len(set(k)) > 1 for k in kept), kept  # rows kept different counts: holes in the cache
    valid = state.cache.valid  # [B, past_len]
    assert valid.sum(-1).tolist() == [len(c) for c in cached] == state.n_valid.tolist()
    for row in range(3):
        seq = torch.tensor([cached[row]])
        assert seq[0].tolist() == real_rows(ref, mask)[row][:seq.shape[1]].tolist()  # greedy tokens
        fresh = base(input_ids=seq, use_cache=True).past_key_values
        for layer, fresh_layer in zip(state.cache.hf.layers, fresh.layers):
            for name in ("keys", "values"):
                ours = getattr(layer, name)[row][:, valid[row]]  # [H, T_row, hd]
                torch.testing.assert_close(ours, getattr(fresh_layer, name)[0], rtol=1e-4, atol=1e-5)


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
