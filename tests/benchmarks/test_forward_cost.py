"""benchmarks/forward_cost.py: the stock vs packed forward-cost table, measured in one process, leaving the
model's linears as they came."""

from benchmarks.forward_cost import format_curves, main, stock_vs_packed
from medusa.modeling.cpu_linear import pack_linears, packed_count, packing_supported, unpack_linears

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
