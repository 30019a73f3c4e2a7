"""medusa/eval/fidelity.py: where two greedy outputs first differ, the base's top-2 margin there (from one
uncached forward of the reference's prefix), and the per-pair summary."""

import pytest
import torch

from medusa.eval.fidelity import divergence, fidelity_fields, fidelity_summary, first_divergence, top2_margin

from tiny_models import tiny_model


def test_first_divergence():
    a = torch.tensor([1, 2, 3, 4])
    assert first_divergence(a, a.clone()) is None
    assert first_divergence(a, torch.tensor([1, 2, 9, 4])) == 2
    assert first_divergence(a, torch.tensor([1, 2])) == 2  # a length difference: at the shorter one's end
    assert first_divergence(torch.tensor([5]), torch.tensor([6, 7])) == 0


def test_top2_margin_is_the_gap_of_the_two_best_logits_of_the_prefix():
    torch.manual_seed(0)
    base = tiny_model("llama").eval()
    seq = torch.randint(3, 100, (12,))
    with torch.no_grad():
        logits = base(input_ids=seq[:7].view(1, -1)).logits[0, -1]
    best = logits.topk(2).values
    assert top2_margin(base, seq, 7) == pytest.approx(float(best[0] - best[1]))


def test_divergence_and_fields_on_real_outputs():
    torch.manual_seed(1)
    base = tiny_model("llama").eval()
    ref = torch.randint(3, 100, (10,))
    other = ref.clone()
    other[7] = (ref[7] + 1) % 100
    record = divergence(base, other, ref, prompt_len=4)
    assert record["identical"] is False and record["at"] == 3
    assert record["margin"] == pytest.approx(top2_margin(base, ref, 7))
    assert divergence(base, ref, ref.clone(), 4) == {"identical": True, "at": None, "margin": None}
    fields = fidelity_fields(base, {"medusa": other, "own_plain": other, "baseline": ref}, 4)
    assert fields["fidelity_vs_own_plain"]["identical"] and not fields["fidelity_vs_hf"]["identical"]
    assert fields["fidelity_own_plain_vs_hf"]["at"] == 3
    assert set(fidelity_fields(base, {"medusa": ref, "baseline": ref}, 4)) == {"fidelity_vs_hf"}


def test_summary_counts_identity_and_margins():
    rows = [{"fidelity_vs_hf": {"identical": True, "at": None, "margin": None}},
            {"fidelity_vs_hf": {"identical": False, "at": 5, "margin": 0.125}},
            {"fidelity_vs_hf": {"identical": False, "at": 9, "margin": 0.0625}},
            {"fidelity_vs_hf": {"identical": False, "at": 2, "margin": None}}]
    assert fidelity_summary(rows) == {"vs_hf": {"identical": 0.25, "divergences": 3, "max_margin": 0.125,
                                                "median_margin": pytest.approx(0.09375)}}
