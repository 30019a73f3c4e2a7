"""medusa/modeling/bf16_kernel.py: the AMX bfloat16 kernel for few-row products. Its outputs are the float32
products rounded to bfloat16 (within one rounding), a row's result is bit for bit the same whatever rows share
the call, what it cannot take is refused, it is built once per machine, and with it a verified tree computes
its root and any chain in depth order exactly as one-token forwards do."""


import pytest
import torch
from tree_masks import tree_mask

from medusa.decoding.growing_cache import growing_cache
from medusa.decoding.kv_cache import KV_PAD
from medusa.modeling import bf16_kernel
from medusa.modeling.cpu_linear import pack_linears

from tiny_models import tiny_model

pytestmark = pytest.mark.skipif(not bf16_kernel.available(),
                                reason=f"AMX kernel unavailable: {bf16_kernel.unavailable_reason()}")


def _reference(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    y = x.double() @ w.double().T  # [M, N], exact enough to stand for the true product
    return (y if bias is None else y + bias.double()).float()


@pytest.mark.parametrize("n,k", [(576, 576), (1536, 576), (576, 1536), (37, 64), (100, 32), (8, 1728)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_products_are_rounded_float32_products_and_rows_do_not_depend_on_their_batch(n, k, with_bias):
    g = torch.Generator().manual_seed(n * 7 + k)
    w = torch.randn(n, k, generator=g).bfloat16()
    bias = torch.randn(n, generator=g).bfloat16() if with_bias else None
    packed = bf16_kernel.pack(w, bias)
    x = torch.randn(150, k, generator=g).bfloat16()
    alone = torch.cat([bf16_kernel.rows_matmul(x[i:i + 1], packed) for i in range(150)])  # [150, n]
    ref = _reference(x, w, bias)
    scale = x.float().abs() @ w.float().abs().T + (0 if bias is None else bias.float().abs())  # [150, n]
    # float32 accumulation over k products, then one bfloat16 rounding (2^-8 relative)
    assert ((alone.float() - ref).abs() <= scale * 2e-6 * k ** 0.5 + ref.abs() * 2 ** -8 + 1e-6).all()
    for m in (1, 2, 5, 16, 17, 31, 32, 33, 63, 64, 70, 96, 150):  # from 64 rows: the panel path
        y = bf16_kernel.rows_matmul(x[:m], packed)
        assert y.shape == (m, n) and y.dtype == torch.bfloat16
        assert torch.equal(y, alone[:m]), m  # bit for bit
    shuffled = torch.randperm(150, generator=g)
    assert torch.equal(bf16_kernel.rows_matmul(x[shuffled], packed), alone[shuffled])
    batched = bf16_kernel.rows_matmul(x[:12].view(3, 4, k), packed)  # any leading shape
    assert torch.equal(batched.view(12, n), alone[:12])


def test_no_rows_give_an_empty_product():
    packed = bf16_kernel.pack(torch.randn(40, 64).bfloat16())
    assert bf16_kernel.rows_matmul(torch.empty(0, 64, dtype=torch.bfloat16), packed).shape == (0, 40)


def test_what_the_kernel_cannot_take_is_refused():
    assert bf16_kernel.fits(torch.zeros(8, 64, dtype=torch.bfloat16))
    assert not bf16_kernel.fits(torch.zeros(8, 48, dtype=torch.bfloat16))  # k not a multiple of 32
    assert not bf16_kernel.fits(torch.zeros(8, 64))  # float32
    with pytest.raises(ValueError, match="multiple of 32"):
        bf16_kernel.pack(torch.zeros(8, 48, dtype=torch.bfloat16))


def _forward(model, cache, ids: torch.Tensor, past: int, parents: list[int]) -> torch.Tensor:
    """Logits ``[n, V]`` of nodes ``ids [1, n]`` after ``past`` cached tokens; node i sees the cache, itself
    and its ancestors (``parents[i]``: its parent's index, -1 for the root). Keys span a multiple of 16
    columns, the extra ones masked, as the decoder's cache gives them (``DynamicKV``)."""
    mask, positions = tree_mask(past, parents)
    out = model(input_ids=ids, past_key_values=cache, use_cache=True, attention_mask=mask,
                position_ids=positions)
    return out.logits[0]


def _cache(model, prompt: torch.Tensor):
    cache = growing_cache()
    model(input_ids=prompt, past_key_values=cache, use_cache=True)
    for layer in cache.layers:
        layer.pad = KV_PAD
    return cache


@pytest.mark.parametrize("past", [40, 46])  # 46: the chain's key lengths cross a 16-column boundary
def test_a_verified_tree_computes_each_row_as_one_token_steps_do(past):
    """With every linear through the kernel and keys padded to 16 columns, a tree forward's root row and a
    chain laid out in depth order give bit for bit the logits of one-token forwards over the same context:
    only attention over columns at other positions (a tree's side branches) can round differently
    (docs/results/bf16-step.md)."""
    model = tiny_model("llama", hidden_size=64, layers=3).bfloat16()
    assert pack_linears(model) > 0
    assert all(m.native is not None for m in model.modules() if type(m).__name__ == "PackedLinear")
    prompt = torch.randint(3, 96, (1, past), generator=torch.Generator().manual_seed(1))
    chain = torch.tensor([[5, 17, 40, 3]])
    with torch.no_grad():
        steps = _cache(model, prompt)
        one_by_one = torch.stack([_forward(model, steps, chain[:, i:i + 1], past + i, [-1])[0]
                                  for i in range(4)])  # [4, V]
        tree = _cache(model, prompt)
        as_chain = _forward(model, tree, chain, past, [-1, 0, 1, 2])  # [4, V]
        tree.crop(-4)
        branched = _forward(model, tree, torch.tensor([[5, 17, 22, 40, 9, 3]]), past, [-1, 0, 0, 1, 2, 3])
    assert torch.equal(as_chain, one_by_one)
    assert torch.equal(branched[0], one_by_one[0]) and torch.equal(branched[1], one_by_one[1])
