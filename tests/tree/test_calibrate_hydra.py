"""Calibration of Hydra heads: their teacher-forced hit ranks replay the decode loop exactly on the model's
own greedy replies, and the calibrated tree predicts held-out tokens/step."""

import pytest
import torch

from medusa.calibrate.calibrate import calibrate, collect_hit_ranks

from fit_heads import fitted_stories_heads, stories_prompts
from tiny_models import stories_tokenizer


def _greedy_examples(model, tokenizer, prompts, new_tokens):
    rows = []
    for p in prompts:
        ids = tokenizer(p, return_tensors="pt").input_ids  # [1, P]
        with torch.no_grad():
            out = model.base_model.generate(ids, max_new_tokens=new_tokens, do_sample=False)
        seq, n = out[0].tolist(), ids.shape[1]
        rows.append({"input_ids": seq, "labels": [-100] * n + seq[n:]})
    return rows


def test_hydra_hit_ranks_read_the_true_tokens():
    model = fitted_stories_heads(4, 1, head_type="hydra")
    tokenizer = stories_tokenizer()
    ex = _greedy_examples(model, tokenizer, stories_prompts(1), 24)
    stats = collect_hit_ranks(model, ex, topk=5, progress=False)
    ids = torch.tensor([ex[0]["input_ids"]])
    with torch.no_grad():
        hidden = model(input_ids=ids).hidden_states[0]  # [T, d]
        emb = model.heads.embed(ids[0])  # [T, d]
        k, t = 2, len(ex[0]["input_ids"]) - 12  # t + k + 2 is one of the 24 labelled (generated) tokens
        # head 3 at t reads h_t, e(x_{t+1}), e(x_{t+2}), e(x_{t+3}) and predicts x_{t+4}
        wide = torch.cat([hidden[t], emb[t + 1], emb[t + 2], emb[t + 3]])
        top = model.heads.head_logits(k, wide).topk(5).indices.tolist()
    target = ex[0]["input_ids"][t + k + 2]
    assert int(stats.ranks[0][t, k]) == (top.index(target) if target in top else -1)


def test_hydra_calibration_predicts_greedy_decoding():
    model = fitted_stories_heads(4, 1, head_type="hydra")
    tokenizer = stories_tokenizer()
    prompts = stories_prompts(24)
    examples = _greedy_examples(model, tokenizer, prompts[:12], 64)

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
