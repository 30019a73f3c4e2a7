"""benchmarks.llama_cpp_cost without a server: the most a chain of k can gain over plain, from the cost of
k+1 rows, the accepted rate per position and the drafter's pass."""

import pytest

from benchmarks.llama_cpp_cost import chain_bound


def _costs(**ms):
    return {int(n[1:]): {"ms_median": v} for n, v in ms.items()}


def test_chain_bound_divides_tokens_per_step_by_the_step_in_plain_steps():
    costs = _costs(r1=30.0, r2=40.0, r3=45.0)
    got = chain_bound(costs, [0.5, 0.25, 0.1], draft_ms=5.0)
    assert [b["k"] for b in got] == [1, 2]  # no 4-row cost measured: k=3 left out
    assert got[0]["tokens_per_step"] == pytest.approx(1.5)
    assert got[0]["step_ms"] == pytest.approx(45.0)
    assert got[0]["vs_plain"] == pytest.approx(1.5 * 30.0 / 45.0)
    assert got[1]["step_ms"] == pytest.approx(55.0)
    assert got[1]["vs_plain"] == pytest.approx(1.75 * 30.0 / 55.0)


def test_chain_bound_free_verification_and_drafts_gain_the_tokens_per_step():
    costs = _costs(r1=30.0, r2=30.0)
    assert chain_bound(costs, [0.4], draft_ms=0.0)[0]["vs_plain"] == pytest.approx(1.4)
