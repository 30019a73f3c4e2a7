"""Calibration predicts decoding (medusa.calibrate with medusa.decoding on stories260K with fitted heads):
the tokens/step the calibration record predicts against the tokens/step the decode loop measures, for
MEDUSA and Hydra heads and for the dynamic tree under the calibrated path score, whose greedy decoding
equals HF greedy ``generate``."""

import pytest
import torch
from decoding_helpers import greedy_examples

from medusa.calibrate.calibrate import calibrate

from fit_heads import fitted_stories_heads, stories_prompts
from tiny_models import stories_tokenizer


def test_prediction_within_15_percent_of_measured_greedy_decoding():
    """stories260K with fitted heads: calibrate on the model's greedy replies to some held-out prompts,
    then decode other held-out prompts greedily with the calibrated tree and compare tokens/step."""
    model = fitted_stories_heads(4, 1)
    tokenizer = stories_tokenizer()
    prompts = stories_prompts(24)
    examples = greedy_examples(model, tokenizer, prompts[:12], 64)
    def measured(tree, ps):
        lengths = []
        for p in ps:
            ids = tokenizer(p, return_tensors="pt").input_ids
            out = model.generate(ids, max_new_tokens=64, tree=tree, return_dict_in_generate=True)
            lengths += out.accept_lengths[0]
        return sum(lengths) / len(lengths)

    for nodes in (8, 32):
        tree = calibrate(model, examples, nodes=nodes, progress=False)
        predicted = tree.calibration["expected_tokens_per_step"]
        held_out = measured(tree, prompts[12:])
        assert held_out > 1.3, held_out  # the heads are accepted at all
        assert abs(predicted - held_out) / held_out < 0.15, (nodes, predicted, held_out)
        if nodes == 8:  # on the calibration replies themselves the replay is the decode loop, exactly
            assert predicted == pytest.approx(measured(tree, prompts[:12]), rel=1e-9)


def test_hydra_calibration_predicts_greedy_decoding():
    model = fitted_stories_heads(4, 1, head_type="hydra")
    tokenizer = stories_tokenizer()
    prompts = stories_prompts(24)
    examples = greedy_examples(model, tokenizer, prompts[:12], 64)

    def measured(tree, ps):
        lengths = []
        for p in ps:
            ids = tokenizer(p, return_tensors="pt").input_ids
            out = model.generate(ids, max_new_tokens=64, tree=tree, return_dict_in_generate=True)
            lengths += out.accept_lengths[0]
        return sum(lengths) / len(lengths)

    tree = calibrate(model, examples, nodes=16, progress=False)
    predicted = tree.calibration["expected_tokens_per_step"]
    assert predicted == pytest.approx(measured(tree, prompts[:12]), rel=1e-9)  # the replay is the decode loop
    held_out = measured(tree, prompts[12:])
    assert held_out > 1.8 and abs(predicted - held_out) / held_out < 0.15, (predicted, held_out)


def test_calibrate_writes_a_score_and_greedy_decoding_with_it_equals_hf():
    """stories260K with fitted heads: calibrate on the model's greedy replies; the dynamic tree under the
    fitted score decodes other prompts exactly as HF greedy ``generate``, batch 1."""
    model = fitted_stories_heads(4, 1)
    tok = stories_tokenizer()
    prompts = stories_prompts(16)
    examples = []
    for p in prompts[:10]:
        ids = tok(p, return_tensors="pt").input_ids
        seq = model.base_model.generate(ids, max_new_tokens=48, do_sample=False)[0].tolist()
        examples.append({"input_ids": seq, "labels": [-100] * ids.shape[1] + seq[ids.shape[1]:]})
    tree = calibrate(model, examples, nodes=8, progress=False)
    score = tree.calibration["path_score"]
    assert len(score["weight"]) == 4 and score["raw"] == [] and all(w > 0 for w in score["weight"])
    previous, model.tree = model.tree, tree
    try:
        # the replay predicts the dynamic decode loop on the calibration replies themselves
        predicted = tree.calibration["dynamic_expected_tokens_per_step"]["calibrated"]
        lengths = []
        for ex, p in zip(examples, prompts[:10]):
            ids = tok(p, return_tensors="pt").input_ids
            out = model.generate(ids, max_new_tokens=48, tree="dynamic:8", return_dict_in_generate=True)
            lengths += out.accept_lengths[0]
        assert predicted == pytest.approx(sum(lengths) / len(lengths), rel=0.02)
        assert tree.calibration["dynamic_expected_tokens_per_step"]["raw"] > 1.5
        for p in prompts[10:13]:
            ids = tok(p, return_tensors="pt").input_ids
            ref = model.base_model.generate(ids, max_new_tokens=64, do_sample=False)
            out = model.generate(ids, max_new_tokens=64, tree="dynamic:16", return_dict_in_generate=True)
            assert torch.equal(out.sequences, ref)
            assert out.tokens_per_step > 1.5
    finally:
        model.tree = previous
