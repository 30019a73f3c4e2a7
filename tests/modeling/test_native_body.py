"""medusa/modeling/native_body.py: the bfloat16 Llama-family body run through the AMX kernel and its C ops.
It is as close to the float32 truth as the model's own bfloat16 forward, it returns the model's
hidden-state tuple, every node of a verified tree (side branches included) gets bit for bit what one-token
forwards give it, decoding with drafts equals plain decoding through it, a changed weight is repacked,
and what it cannot run is named and left to the model's own code."""

import copy

import pytest
import torch
from tree_masks import tree_mask

from medusa.decoding.growing_cache import growing_cache
from medusa.decoding.kv_cache import FIRST_PIECE, KV_PAD, dynamic_prefill, new_cache, pieces_prefill
from medusa.modeling import bf16_kernel, native_body
from medusa.modeling.base import decoder_of, text_config
from medusa.modeling.cpu_linear import pack_linears
from medusa.modeling.model import MedusaModel
from medusa.native import fixed_weights

from tiny_models import tiny_model

pytestmark = pytest.mark.skipif(not bf16_kernel.available(),
                                reason=f"AMX kernel unavailable: {bf16_kernel.unavailable_reason()}")


def _model(arch: str = "llama", **kwargs) -> torch.nn.Module:
    """A tiny model whose widths the kernels take (hidden 128, 4 heads of 32, MLP 256), float32."""
    return tiny_model(arch, hidden_size=128, intermediate_size=256, layers=3, **kwargs)


def _bf16(model: torch.nn.Module) -> torch.nn.Module:
    model = copy.deepcopy(model).bfloat16()
    assert pack_linears(model) > 0
    return model


def _cache(model: torch.nn.Module, prompt: torch.Tensor):
    cache = growing_cache()
    model(input_ids=prompt, past_key_values=cache, use_cache=True)
    for layer in cache.layers:
        layer.pad = KV_PAD
    return cache


def _native(model: torch.nn.Module) -> native_body.NativeBody:
    body, config = decoder_of(model), text_config(model)
    assert native_body.unsupported_reason(body, config) == ""
    return native_body.build(body, config)


@pytest.mark.parametrize("arch,extra", [("llama", {}), ("qwen2", {}), ("llama", {"attention_bias": True})])
def test_as_close_to_float32_as_the_models_own_bf16_forward_with_its_hidden_states(arch, extra):
    f32 = _model(arch, **extra)
    bf16 = _bf16(f32)
    native = _native(bf16)
    prompt = torch.randint(3, 96, (1, 37), generator=torch.Generator().manual_seed(3))
    nodes = torch.tensor([[5, 17, 22, 40, 9, 3]])
    mask, positions = tree_mask(37, [-1, 0, 0, 1, 2, 3])
    with torch.no_grad():
        f32_mask = mask.float().clamp(min=torch.finfo(torch.float32).min)
        truth = f32.model(input_ids=nodes, attention_mask=f32_mask,
                          position_ids=positions, past_key_values=_cache(f32, prompt), use_cache=True,
                          output_hidden_states=True)
        theirs = bf16.model(input_ids=nodes, attention_mask=mask, position_ids=positions,
                            past_key_values=_cache(bf16, prompt), use_cache=True, output_hidden_states=True)
        ours, states = native_body.forward(native, nodes, mask, positions, _cache(bf16, prompt),
                                           hidden_states=True)
    assert ours.dtype == torch.bfloat16 and ours.shape == truth.last_hidden_state.shape
    assert len(states) == len(theirs.hidden_states) == 4
    assert torch.equal(states[-1], ours)  # the tuple ends with the last hidden state, as the model's does
    for mine, model_bf16, exact in zip(states, theirs.hidden_states, truth.hidden_states):
        their_error = (model_bf16.float() - exact).abs().max().item()
        my_error = (mine.float() - exact).abs().max().item()
        assert my_error <= 2 * their_error + 1e-3, (my_error, their_error)


@pytest.mark.parametrize("past,seed", [(45, 0), (77, 1), (130, 2), (200, 3), (260, 4)])
def test_every_node_of_a_tree_gets_what_one_token_forwards_give_it(past, seed):
    """Side branches included: attention sums only the columns a row sees, in column order (a node's
    ancestors sit at other columns, so in other lanes of a 16-column block, than when decoded one by one)."""
    model = _bf16(_model())
    native = _native(model)
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(3, 96, (1, past), generator=g)
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, 14)]  # a random tree
    tokens = torch.randint(3, 96, (14,), generator=g).tolist()
    with torch.no_grad():
        mask, positions = tree_mask(past, parents)
        tree, _ = native_body.forward(native, torch.tensor([tokens]), mask, positions, _cache(model, prompt))
        for node in range(len(tokens)):
            path = [node]
            while parents[path[0]] >= 0:
                path.insert(0, parents[path[0]])
            cache = _cache(model, prompt)
            for depth, i in enumerate(path):  # one-token forwards along the node's path
                mask, positions = tree_mask(past + depth, [-1])
                last, _ = native_body.forward(native, torch.tensor([[tokens[i]]]), mask, positions, cache)
            assert torch.equal(tree[0, node], last[0, 0]), (node, path)


@pytest.mark.parametrize("arch,extra", [("llama", {}), ("qwen2", {}), ("llama", {"attention_bias": True})])
def test_the_one_call_body_computes_the_layer_by_layer_bits(arch, extra):
    """A cache of growing layers takes every layer in one C call (kernels/bf16_layers.c); any other cache
    (transformers' own here) the layer-by-layer path: the same outputs, hidden states and cache entries."""
    from transformers import DynamicCache

    model = _bf16(_model(arch, **extra))
    native = _native(model)
    prompt = torch.randint(3, 96, (1, 41), generator=torch.Generator().manual_seed(8))
    nodes = torch.tensor([[5, 17, 22, 40, 9, 3, 60, 61]])
    mask, positions = tree_mask(41, [-1, 0, 0, 1, 2, 3, 5, 6])
    with torch.no_grad():
        grown = _cache(model, prompt)
        stock = DynamicCache(config=model.config)
        model(input_ids=prompt, past_key_values=stock, use_cache=True)
        assert native_body._append_slots(stock, len(native.layers), 1) is None  # the stepwise path
        one, one_states = native_body.forward(native, nodes, mask, positions, grown, hidden_states=True)
        each, each_states = native_body.forward(native, nodes, mask, positions, stock, hidden_states=True)
    assert torch.equal(one, each)
    assert all(torch.equal(a, b) for a, b in zip(one_states, each_states, strict=True))
    for a, b in zip(grown.layers, stock.layers, strict=True):
        assert a.keys.shape == b.keys.shape
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_decoding_with_drafts_equals_plain_decoding_through_it():
    medusa = MedusaModel.from_base(_bf16(_model()), num_heads=3)
    ids = torch.randint(3, 96, (1, 20), generator=torch.Generator().manual_seed(5))
    calls = []
    with torch.no_grad():
        plain = medusa.generate(ids, max_new_tokens=40, tree="plain")
        base = medusa.base_model
        assert native_body.native_for(medusa, decoder_of(base), text_config(base), ids[:, :1],
                          tree_mask(20, [-1])[0], _cache(medusa.base_model, ids)) is not None
        for kwargs in ({}, {"tree": "lookup", "lookup_tokens": 4}):
            out = medusa.generate(ids, max_new_tokens=40, **kwargs)
            calls.append(torch.equal(out, plain))
    assert calls == [True, True]


def test_a_prompt_in_pieces_computes_what_one_token_steps_give_it():
    """A one-row bfloat16 prompt goes in pieces of up to MAX_ROWS tokens through the native body after its
    first FIRST_PIECE: every position's features, the last logits and the cache are bit for bit those of the
    same prompt fed one token at a time after that first piece. A float32 model runs its prompt whole."""
    medusa = MedusaModel.from_base(_bf16(_model()), num_heads=2)
    assert medusa.prefill_chunk() == native_body.MAX_ROWS
    assert MedusaModel.from_base(_model(), num_heads=2).prefill_chunk() == 0
    p = FIRST_PIECE + native_body.MAX_ROWS + 21  # two pieces after the first
    ids = torch.randint(3, 96, (1, p), generator=torch.Generator().manual_seed(11))
    ones = torch.ones_like(ids)
    with torch.no_grad():
        cache, last, features, hidden = dynamic_prefill(medusa, ids, ones, num_nodes=4, capacity=0,
                                                        dtype=torch.bfloat16)
        steps = new_cache()
        first = medusa(input_ids=ids[:, :FIRST_PIECE], attention_mask=ones[:, :FIRST_PIECE],
                       position_ids=torch.arange(FIRST_PIECE).view(1, -1), past_key_values=steps,
                       use_cache=True, positions=torch.tensor([FIRST_PIECE - 1]), compute_heads=False)
        for layer in steps.layers:
            layer.pad = KV_PAD
        one_last, one_features = pieces_prefill(medusa, ids, steps, FIRST_PIECE, 1, first.hidden_states,
                                                torch.bfloat16)
    assert features.shape == (1, p, 128) and torch.equal(hidden, features[:, -1])
    assert torch.equal(features, one_features) and torch.equal(last, one_last)
    for a, b in zip(cache.hf.layers, steps.layers, strict=True):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_a_changed_weight_is_repacked():
    medusa = MedusaModel.from_base(_bf16(_model()), num_heads=2)
    body = decoder_of(medusa.base_model)
    ids = torch.tensor([[7]])
    mask = tree_mask(10, [-1])[0]
    with torch.no_grad():
        cache = _cache(medusa.base_model, torch.randint(3, 96, (1, 10)))
        first = native_body.native_for(medusa, body, text_config(medusa.base_model), ids, mask, cache)
        again = native_body.native_for(medusa, body, text_config(medusa.base_model), ids, mask, cache)
        assert first is not None and again is first
        body.layers[1].mlp.down_proj.weight.mul_(2)
        assert not first.fresh()
        second = native_body.native_for(medusa, body, text_config(medusa.base_model), ids, mask, cache)
    assert second is not None and second is not first and second.fresh()
    x = torch.ones(1, 256, dtype=torch.bfloat16)
    assert torch.equal(bf16_kernel.rows_matmul(x, second.layers[1].down), body.layers[1].mlp.down_proj(x))


def test_within_one_generate_the_packing_is_checked_once_and_again_in_the_next():
    medusa = MedusaModel.from_base(_bf16(_model()), num_heads=2)
    body, config = decoder_of(medusa.base_model), text_config(medusa.base_model)
    ids, mask = torch.tensor([[7]]), tree_mask(10, [-1])[0]
    with torch.no_grad():
        cache = _cache(medusa.base_model, torch.randint(3, 96, (1, 10)))
        with fixed_weights.during():
            first = native_body.native_for(medusa, body, config, ids, mask, cache)
            body.layers[1].mlp.down_proj.weight.mul_(2)  # against the contract: the scope keeps its answer
            assert native_body.native_for(medusa, body, config, ids, mask, cache) is first
        after = native_body.native_for(medusa, body, config, ids, mask, cache)
    assert first is not None and after is not first and after.fresh()


def test_what_it_cannot_run_is_named_and_left_to_the_model(monkeypatch):
    def reason(model):
        return native_body.unsupported_reason(decoder_of(model), text_config(model))

    gemma = tiny_model("gemma", hidden_size=128, intermediate_size=256).bfloat16()
    assert "model_type 'gemma'" in reason(gemma)
    assert "not bfloat16" in reason(_model())
    assert "multiples of 32" in reason(tiny_model("llama", hidden_size=64).bfloat16())  # head_dim 16
    # the forwards it does not take: prefill-sized inputs, a 2-D mask, gradients
    model = _bf16(_model())
    with torch.no_grad():
        cache = _cache(model, torch.randint(3, 96, (1, 8)))
    mask = tree_mask(8, [-1])[0]
    with torch.no_grad():
        assert native_body.applies(torch.tensor([[4]]), mask, cache)
        too_many = torch.zeros(1, native_body.MAX_ROWS + 1, dtype=torch.long)
        assert not native_body.applies(too_many, mask, cache)
        assert not native_body.applies(torch.tensor([[4]]), torch.ones(1, 9), cache)
    assert not native_body.applies(torch.tensor([[4]]), mask, cache)  # gradients on: the model's own code
    monkeypatch.setenv(native_body.ENV, "0")
    assert reason(model) == f"{native_body.ENV}=0"


def _attention(q, keys, values, mask):
    """The C attention of ``q [B, 1, hq hd]`` over ``keys`` / ``values [B, Hkv, S, hd]`` under ``mask
    [B, 1, S]`` (bfloat16, additive) -> ``[B, 1, hq hd]``."""
    from medusa.native.library import library

    b, hkv, cols, hd = keys.shape
    hq = q.shape[-1] // hd
    out = torch.empty(b, 1, hq * hd, dtype=torch.bfloat16)
    scratch = torch.empty(16 * (cols + 32) + 512, dtype=torch.float32)
    library().medusa_attention(q.data_ptr(), q.shape[-1], b, 1, hq, hkv, hd, keys.data_ptr(),
                               values.data_ptr(), keys.stride(0), keys.stride(1), keys.stride(2), cols,
                               mask.data_ptr(), mask.stride(0), mask.stride(1), hd ** -0.5, out.data_ptr(),
                               hq * hd, scratch.data_ptr())
    return out


def test_attention_skips_the_blocks_outside_a_rows_columns_bit_for_bit():
    """A row attending to columns [lo, hi) of a long buffer (a refill slot admitted late, its reply not yet
    at the end) gets bit for bit what it gets over those columns alone; a row with no live column gets
    zeros; rows do not depend on each other's spans."""
    g = torch.Generator().manual_seed(3)
    b, hq, hkv, hd, cols = 4, 6, 2, 64, 150
    q = torch.randn(b, 1, hq * hd, generator=g).bfloat16()
    keys = torch.randn(b, hkv, cols, hd, generator=g).bfloat16()
    values = torch.randn(b, hkv, cols, hd, generator=g).bfloat16()
    spans = [(0, cols), (37, 121), (96, 97), (0, 0)]
    neg = torch.finfo(torch.bfloat16).min
    mask = torch.full((b, 1, cols), neg, dtype=torch.bfloat16)
    for row, (lo, hi) in enumerate(spans):
        mask[row, 0, lo:hi] = 0
    mask[1, 0, 50] = neg  # a hole inside the span
    got = _attention(q, keys, values, mask)
    for row, (lo, hi) in enumerate(spans):
        if hi == lo:
            assert torch.equal(got[row], torch.zeros_like(got[row]))
            continue
        part = [t[row:row + 1, :, lo:hi].contiguous() for t in (keys, values, mask)]
        alone = _attention(q[row:row + 1].contiguous(), *part)
        assert torch.equal(got[row], alone[0])
        kk = keys[row, :, lo:hi].float().repeat_interleave(hq // hkv, 0)  # [hq, n, hd]
        vv = values[row, :, lo:hi].float().repeat_interleave(hq // hkv, 0)
        qq = q[row, 0].float().view(hq, 1, hd)
        ref = torch.softmax(qq @ kk.transpose(1, 2) * hd ** -0.5 + mask[row, :, lo:hi].float(), -1) @ vv
        assert torch.allclose(got[row, 0].float(), ref.reshape(-1), atol=2e-2)
