"""benchmarks/forward_cost.py: the stock vs packed forward-cost table, measured in one process, leaving the
model's linears as they came."""

import torch

from benchmarks.forward_cost import (
    format_curves,
    format_floor,
    main,
    memory_floor,
    stock_vs_packed,
    stream_bandwidth,
)
from medusa.modeling.cpu_linear import (
    linear_bytes,
    pack_linears,
    packed_count,
    packing_supported,
    unpack_linears,
)

from tiny_models import tiny_model


def test_stock_vs_packed_times_both_and_restores_the_model():
    base = tiny_model("llama").eval()
    curves = stock_vs_packed(base, sizes=(1, 4), rounds=1, repeats=1, cache_len=8)
    assert set(curves["stock"]) == {1, 4} and all(s > 0 for s in curves["stock"].values())
    assert set(curves["packed"]) == ({1, 4} if packing_supported() else set())
    assert packed_count(base) == 0
    if packing_supported():
        pack_linears(base)
        stock_vs_packed(base, sizes=(2,), rounds=1, repeats=1, cache_len=8)
        assert packed_count(base) > 0  # packed before, packed after
        unpack_linears(base)


def test_format_curves_from_fixed_figures():
    text = format_curves({"stock": {1: 0.010, 8: 0.020}, "packed": {1: 0.010, 8: 0.015}})
    assert text.splitlines()[2:] == ["| 1 | 10.0 | 1.00 | 10.0 | 1.00 | 1.00 |",
                                     "| 8 | 20.0 | 2.00 | 15.0 | 1.50 | 0.75 |"]
    stock_only = format_curves({"stock": {1: 0.01}, "packed": {}})
    assert stock_only.splitlines()[2] == "| 1 | 10.0 | 1.00 | - | - | - |"


def test_main_prints_the_table(capsys, tmp_path):
    tiny_model("llama").save_pretrained(tmp_path / "m")
    assert main([str(tmp_path / "m"), "--repeats", "1", "--rounds", "1", "--cache-len", "8"]) == 0
    out = capsys.readouterr().out
    assert "| tokens in the forward | stock ms |" in out and "| 64 |" in out


def test_memory_floor_is_the_linear_weights_over_the_bandwidth_and_keeps_the_packing():
    base = tiny_model("llama").eval()
    floor = memory_floor(base, bandwidth=1e9)
    assert floor["weight_bytes"] == linear_bytes(base) > 0
    assert floor["seconds"] == floor["weight_bytes"] / 1e9
    if packing_supported():
        pack_linears(base)
        assert memory_floor(base, 1e9)["weight_bytes"] == floor["weight_bytes"] and packed_count(base) > 0
    assert stream_bandwidth(mib=8, rounds=1) > 0


def test_format_floor_from_fixed_figures():
    floor = {"weight_bytes": 270e6, "bandwidth": 13.5e9, "seconds": 0.02}
    assert format_floor(floor, 0.03) == ("memory floor of one token: 270 MB of weights / 13.5 GB/s streamed"
                                         " = 20.0 ms; the packed 1-token forward is 1.50x the floor")
    assert format_floor(floor, None).endswith("= 20.0 ms")


def test_main_in_bfloat16_prints_the_floor_and_the_table(capsys, tmp_path):
    tiny_model("llama").to(torch.bfloat16).save_pretrained(tmp_path / "m")
    assert main([str(tmp_path / "m"), "--dtype", "bfloat16", "--repeats", "1", "--rounds", "1",
                 "--cache-len", "8"]) == 0
    out = capsys.readouterr().out
    assert ": bfloat16, " in out and "memory floor of one token:" in out and "| 32 |" in out
