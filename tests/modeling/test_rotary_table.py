"""medusa/modeling/rotary_table.py: cos / sin from the table equal the rotary module's own, bit for bit, at
any positions and in any dtype; dynamic kinds and changed frequencies never read a stale table."""

import pytest
import torch

from medusa.modeling import rotary_table

from tiny_models import tiny_model


def _rotary(arch: str):
    return tiny_model(arch, hidden_size=64, intermediate_size=128, layers=1).model.rotary_emb


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_equal_to_the_module_bit_for_bit(arch, dtype):
    rotary = _rotary(arch)
    assert rotary_table.tabled(rotary)
    like = torch.zeros(1, dtype=dtype)
    g = torch.Generator().manual_seed(0)
    for positions in (torch.randint(0, 5000, (3, 7), generator=g), torch.tensor([[0, 1, 2, 4095, 4096]]),
                      torch.full((2, 5), 9000)):  # past the first table: it grows
        cos, sin = rotary_table.cos_sin(rotary, like, positions)
        want_cos, want_sin = rotary(like, positions)
        assert cos.dtype == dtype and cos.shape == want_cos.shape
        assert torch.equal(cos, want_cos) and torch.equal(sin, want_sin)
        cos = rotary_table.row_major(cos)
        assert cos.stride(-1) == 1 and cos.stride(0) == cos.shape[1] * cos.stride(1)


def test_changed_frequencies_rebuild_the_table():
    rotary = _rotary("llama")
    like = torch.zeros(1)
    positions = torch.tensor([[3, 300]])
    before = rotary_table.cos_sin(rotary, like, positions)[0].clone()
    with torch.no_grad():
        rotary.inv_freq.mul_(0.5)
    after = rotary_table.cos_sin(rotary, like, positions)[0]
    assert not torch.equal(before, after)
    assert torch.equal(after, rotary(like, positions)[0])


def test_dynamic_kinds_call_the_module():
    rotary = _rotary("llama")
    rotary.rope_type = "dynamic"  # its frequencies follow the sequence length: never tabled
    assert not rotary_table.tabled(rotary)
    like, positions = torch.zeros(1), torch.tensor([[1, 2]])
    assert torch.equal(rotary_table.cos_sin(rotary, like, positions)[0], rotary(like, positions)[0])


def test_row_major_copies_only_what_the_c_ops_cannot_read():
    t = torch.zeros(2, 3, 8)
    assert rotary_table.row_major(t) is t
    view = torch.zeros(2, 3, 16)[..., :8]
    assert rotary_table.row_major(view) is view  # rows 16 apart: one stride
    expanded = torch.zeros(1, 3, 8).expand(2, 3, 8)
    assert rotary_table.row_major(expanded).is_contiguous()
