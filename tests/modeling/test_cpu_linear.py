"""medusa/modeling/cpu_linear.py: pre-packed float32 linear layers for CPU decoding. The packed path is
taken only where it is meant to be (3..64 rows, no gradient, the weight it packed), gives F.linear's
values, leaves parameters and state dicts alone, and greedy MEDUSA decoding on a packed model still equals
HF ``generate``."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from medusa import MedusaModel
from medusa.modeling import bf16_kernel, cpu_linear
from medusa.modeling.cpu_linear import (
    MAX_ROWS,
    MIN_ROWS,
    PackedLinear,
    linear_bytes,
    pack_linears,
    packed_count,
    packing_supported,
    unpack_linears,
)
from medusa.modeling.loading import load_for_generation

from tiny_models import STORIES, require_shared, stories_model, tiny_model

pytestmark = pytest.mark.skipif(not packing_supported(), reason="no oneDNN weight reorder in torch")


@pytest.fixture
def calls(monkeypatch):
    """How many times the packed matmul ran."""
    seen = []
    real = cpu_linear.packed_matmul

    def counting(x, packed, bias):
        seen.append(x.shape[0])
        return real(x, packed, bias)

    monkeypatch.setattr(cpu_linear, "packed_matmul", counting)
    return seen


@pytest.mark.parametrize("bias", [True, False])
def test_packed_rows_give_f_linear_and_others_are_stock(calls, bias):
    torch.manual_seed(0)
    layer = nn.Sequential(nn.Linear(48, 200, bias=bias))  # the linear is swapped inside its parent
    ref = nn.Sequential(nn.Linear(48, 200, bias=bias))
    ref.load_state_dict(layer.state_dict())
    assert pack_linears(layer) == 1 and packed_count(layer) == 1
    assert isinstance(layer[0], PackedLinear) and "forward" not in layer[0].__dict__  # a module, not a patch
    with torch.no_grad():
        for rows in (1, MIN_ROWS - 1, MIN_ROWS, 8, 3 * 7, MAX_ROWS, MAX_ROWS + 1):
            x = torch.randn(3, 7, 48) if rows == 21 else torch.randn(rows, 48)  # any leading shape
            y = layer(x)
            assert y.shape == ref(x).shape
            if rows < MIN_ROWS or rows > MAX_ROWS:  # not packed: the very same computation
                assert torch.equal(y, ref(x))
            else:
                torch.testing.assert_close(y, ref(x), rtol=1e-5, atol=1e-5)
    assert calls == [MIN_ROWS, 8, 21, MAX_ROWS]
    assert list(layer.state_dict()) == list(ref.state_dict())  # nothing saved, nothing renamed


def test_gradients_and_a_changed_weight_take_the_stock_path(calls):
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(16, 32))
    pack_linears(model)
    layer = model[0]
    x = torch.randn(8, 16)
    layer(x).sum().backward()  # training: F.linear, gradients flow
    assert calls == [] and layer.weight.grad is not None
    with torch.no_grad():
        layer.weight.mul_(2.0)  # in place: the packed copy is stale and is re-packed
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
        layer.weight = nn.Parameter(torch.randn(32, 16))  # replaced: the same
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
        assert layer.to(torch.float16)(x.half()).dtype == torch.float16  # another dtype: stock
    assert calls == [8, 8]
    weight = layer.weight
    assert unpack_linears(model) == 1 and packed_count(model) == 0 and type(model[0]) is nn.Linear
    assert model[0].weight is weight and "forward" not in model[0].__dict__  # the same Parameter, stock


def test_only_float32_and_native_bfloat16_cpu_linears_are_packed_and_shared_weights_counted_once():
    model = tiny_model("llama")  # tied embeddings: the LM head shares the embedding's weight
    n = sum(isinstance(m, nn.Linear) for m in model.modules())
    sizes = {m.weight.data_ptr(): m.weight.numel() * 4 for m in model.modules() if isinstance(m, nn.Linear)}
    need = linear_bytes(model)
    assert pack_linears(model) == n
    tied = model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    assert not tied or model.lm_head.weight is model.get_input_embeddings().weight  # still tied once packed
    assert need == sum(sizes.values()) and (tied or len(sizes) == n)
    assert pack_linears(nn.Sequential(nn.Linear(8, 8).half())) == 0
    assert pack_linears(nn.Sequential(nn.Linear(8, 8).bfloat16())) == int(cpu_linear.BF16_NATIVE)


@pytest.fixture
def kernel_calls(monkeypatch):
    """How many times the AMX kernel ran (rows per call)."""
    seen = []
    real = bf16_kernel.rows_matmul

    def counting(x, packed):
        seen.append(x.shape[0])
        return real(x, packed)

    monkeypatch.setattr(bf16_kernel, "rows_matmul", counting)
    return seen


@pytest.mark.skipif(not cpu_linear.BF16_NATIVE, reason="no bfloat16 matrix unit (AMX / AVX-512-BF16)")
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("width", [64, 48])  # 64: the AMX kernel's (a multiple of 32); 48: oneDNN's
def test_bfloat16_packs_every_row_count_one_included(calls, kernel_calls, bias, width):
    torch.manual_seed(2)
    layer = nn.Sequential(nn.Linear(width, 300, bias=bias)).bfloat16()
    ref = nn.Sequential(nn.Linear(width, 300, bias=bias)).bfloat16()
    ref.load_state_dict(layer.state_dict())
    assert pack_linears(layer) == 1
    row_counts = (1, 2, 8, 16, 32, 33, MAX_ROWS + 1, 200)
    with torch.no_grad():
        for rows in row_counts:
            x = torch.randn(rows, width).bfloat16()
            b = None if ref[0].bias is None else ref[0].bias.float()
            exact = F.linear(x.float(), ref[0].weight.float(), b)
            y = layer(x)
            assert y.dtype == torch.bfloat16
            torch.testing.assert_close(y.float(), exact, rtol=2e-2, atol=2e-2)  # bf16 output rounding
    if bf16_kernel.available() and width % bf16_kernel.K_MULTIPLE == 0:  # the kernel, any row count
        assert kernel_calls == list(row_counts) and calls == []
    else:
        assert calls == list(row_counts) and kernel_calls == []


def test_greedy_equals_hf_generate_on_a_packed_model(calls, stories_medusa):
    model = stories_medusa
    prompt = torch.tensor([[1, 403, 407, 261, 378]])
    with torch.no_grad():
        ref = model.base_model.generate(prompt, max_new_tokens=40, do_sample=False)
    try:
        assert pack_linears(model) > 0
        out = model.generate(prompt, max_new_tokens=40, return_dict_in_generate=True)
    finally:
        unpack_linears(model)
    assert torch.equal(out.sequences, ref)
    assert max(out.accept_lengths[0]) >= 2 and any(rows > 1 for rows in calls)  # tree verification packed


def test_load_for_generation_packs_unless_told_not_to(tmp_path, monkeypatch):
    require_shared(STORIES)
    MedusaModel.from_base(stories_model(), num_heads=2).save_pretrained(tmp_path / "ck")
    model, _ = load_for_generation(tmp_path / "ck", base=str(STORIES))
    assert packed_count(model.base_model) > 0
    assert packed_count(load_for_generation(tmp_path / "ck", base=str(STORIES), cpu_pack=False)[0]) == 0
    monkeypatch.setenv("MEDUSA_CPU_PACK", "0")
    assert packed_count(load_for_generation(tmp_path / "ck", base=str(STORIES))[0]) == 0


def test_stock_linears_computes_f_linear_inside_the_block_only(calls, kernel_calls):
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(64, 40), nn.Linear(40, 8))
    pack_linears(model)
    x = torch.randn(8, 64)
    with torch.no_grad():
        with cpu_linear.stock_linears(model):
            inside = model(x)
        assert calls == [] and kernel_calls == []  # HF's own path: nothing packed ran
        outside = model(x)
    assert calls == [8, 8]
    torch.testing.assert_close(inside, outside, rtol=1e-5, atol=1e-5)
    assert not any(layer.stock for layer in model)
