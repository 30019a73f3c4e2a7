"""medusa.calibrate.lookup: the host lookup chain against the device's ``lookup_chain``, the replay against
the decode loop (exactly, on the model's own greedy outputs: heads + chain and the chain alone), choosing
the chain's length and storing it in tree.json."""

import json

import pytest
import torch
from decoding_helpers import greedy_examples

from medusa.calibrate.calibrate import HeadStats, calibrate, collect_hit_ranks, simulated_tokens_per_step
from medusa.calibrate.lookup import (
    chain_starts,
    choose_lookup,
    host_lookup_chain,
    lookup_matches,
    lookup_predictions,
    lookup_summary,
    replay_lookup,
)
from medusa.decoding.lookup import lookup_chain, new_context
from medusa.tree import MedusaTree

from fit_heads import fitted_stories_heads, stories_prompts
from tiny_models import stories_tokenizer


def _repetitive(length, vocab, g):
    """Random tokens with many repeats: copies of earlier stretches spliced in."""
    seq = torch.randint(0, vocab, (length,), generator=g).tolist()
    for _ in range(length // 6):
        a = int(torch.randint(0, length - 4, (1,), generator=g))
        b = int(torch.randint(0, length - 4, (1,), generator=g))
        n = int(torch.randint(2, 5, (1,), generator=g))
        seq[b:b + n] = seq[a:a + n]
    return seq[:length]


@pytest.mark.parametrize("vocab", [3, 6, 20])
def test_host_chain_equals_the_device_lookup_chain(vocab):
    g = torch.Generator().manual_seed(vocab)
    length = 7
    for _ in range(4):
        seq = _repetitive(40, vocab, g)
        contexts = [seq[:e] for e in range(2, len(seq) + 1)]  # every prefix: the whole context grows
        width = max(len(c) for c in contexts) - 1
        ids = torch.zeros(len(contexts), width, dtype=torch.long)  # [B, P] left-padded prompts
        mask = torch.zeros_like(ids)
        for row, c in enumerate(contexts):
            ids[row, width - len(c) + 1:] = torch.tensor(c[:-1])
            mask[row, width - len(c) + 1:] = 1
        root = torch.tensor([c[-1] for c in contexts])  # [B] the last context token is the root
        chain, valid = lookup_chain(new_context(ids, mask, root, room=8), length)  # [B, length]
        for row, c in enumerate(contexts):
            assert chain[row][valid[row]].tolist() == host_lookup_chain(c, length), (c, row)
        starts = chain_starts(seq)
        assert [host_lookup_chain(seq[:e], length) for e in range(len(seq) + 1)] == [
            seq[s:min(s + length, e)] if s >= 0 else [] for e, s in enumerate(starts)]


def test_matches_and_replay_by_hand():
    # context a b c a b | true tokens c x ...: suffix "a b" last seen at 0, chain c a b (inside the context)
    tokens = [1, 2, 3, 1, 2, 3, 9, 9]
    labels = [-100, -100] + tokens[2:]
    match = lookup_matches(tokens, labels, cap=8)
    assert match[5] == 1  # chain 3 1 2 vs true 3 9: one token
    assert match[6] == 0  # chain after "1 2 3" at 0..2 is 1 2 3 vs true 9
    assert match[2] == 0 and match[1] == 0  # no earlier occurrence / unlabelled
    assert lookup_matches(tokens, [-100] * 6 + [1, 1], cap=8)[5] == 0  # an unlabelled true token stops it
    rows = [[-1]] * len(tokens)
    stats = HeadStats(ranks=[torch.tensor(rows, dtype=torch.int8)], starts=[2], topk=1, num_tokens=8)
    # steps at s=1 (context 1 2 3: no match), s=2 (context 1 2 3 1: chain 2 3 1 vs true 2 3 9: 2 tokens
    # -> 3 gained), s=5 writes the last token (its bonus would be past the end)
    assert replay_lookup([], stats, [match], 4) == pytest.approx((1 + 3 + 1) / 3)
    # L=1: s=2 gains 2; s=4 (context 1 2 3 1 2 3: chain 1 vs true 9) 1; s=5 1
    assert replay_lookup([], stats, [match], 1) == pytest.approx((1 + 2 + 1 + 1) / 4)
    assert replay_lookup([], stats, [match], 0) == simulated_tokens_per_step([], stats) == 1.0


@pytest.fixture(scope="module")
def stories():
    model = fitted_stories_heads(4, 1)
    tokenizer = stories_tokenizer()
    prompts = stories_prompts(6)
    new = 64
    examples = greedy_examples(model, tokenizer, prompts, new)
    return model, tokenizer, prompts, examples, new


def test_replay_is_the_decode_loop_with_a_lookup_chain(stories):
    """On the model's own greedy replies the replay is the decode loop, exactly: heads + chain and the
    chain alone, batch 1."""
    model, tokenizer, prompts, examples, new = stories
    stats = collect_hit_ranks(model, examples, topk=4, progress=False)
    tree = calibrate(model, examples, nodes=8, topk=4, progress=False, stats=stats)
    hybrid, alone = lookup_predictions(tree.choices, stats, examples, (0, 3, 8))
    assert hybrid[0] == pytest.approx(simulated_tokens_per_step(tree.choices, stats), rel=1e-12)

    def measured(**kw):
        lengths = []
        for p in prompts:
            ids = tokenizer(p, return_tensors="pt").input_ids
            out = model.generate(ids, max_new_tokens=new, return_dict_in_generate=True, **kw)
            lengths += out.accept_lengths[0]
        return sum(lengths) / len(lengths)

    for n in (3, 8):
        assert hybrid[n] == pytest.approx(measured(tree=tree, lookup_tokens=n), rel=1e-12), n
        assert alone[n] == pytest.approx(measured(tree="lookup", lookup_tokens=n), rel=1e-12), n
    assert hybrid[8] > hybrid[0] and alone[8] > 1.0  # the stories repeat themselves: the chain is accepted


def test_calibrate_stores_the_chosen_length(stories, tmp_path):
    model, _, _, examples, _ = stories
    stats = collect_hit_ranks(model, examples, topk=4, progress=False)
    off = calibrate(model, examples, nodes=8, topk=4, progress=False, stats=stats)
    assert off.lookup_tokens == 0 and off.calibration["lookup"]["chosen"] == 0
    fixed = calibrate(model, examples, nodes=8, topk=4, progress=False, stats=stats, lookup_tokens=5)
    rec = fixed.calibration["lookup"]
    assert fixed.lookup_tokens == 5 and rec["chosen"] == 5 and rec["relative_step_cost"] == {}
    assert rec["max_ngram"] == 3 and "5" in rec["predicted_tokens_per_step"]
    fixed.to_json(tmp_path / "tree.json")
    back = MedusaTree.from_json(tmp_path / "tree.json")
    assert back.lookup_tokens == 5 and back.calibration["lookup"] == json.loads(json.dumps(rec))
    auto = calibrate(model, examples, nodes=8, topk=4, progress=False, stats=stats, lookup_tokens="auto")
    rec = auto.calibration["lookup"]
    json.dumps(rec, allow_nan=False)
    assert auto.lookup_tokens == rec["chosen"]
    costs, predicted = rec["relative_step_cost"], rec["predicted_tokens_per_step"]
    assert costs and costs["0"] == 1.0
    score = {n: predicted[n] / costs.get(n, 1.0) for n in ["0", *costs]}
    assert str(rec["chosen"]) == max(score, key=score.__getitem__)
    assert lookup_summary(rec).startswith("lookup chain: ")


def test_choose_lookup_fixed_and_bad_values(stories):
    model, _, _, examples, _ = stories
    stats = collect_hit_ranks(model, examples[:2], topk=2, progress=False)
    rec = choose_lookup(model, [(0,)], stats, examples[:2], 0, candidates=(0, 4))
    assert rec["chosen"] == 0 and set(rec["predicted_tokens_per_step"]) == {"0", "4"}
    assert set(rec["lookup_only_tokens_per_step"]) == {"4"}
    for bad in (-1, "many", 1.5, True):
        with pytest.raises(Exception, match="--lookup-tokens must be"):
            choose_lookup(model, [(0,)], stats, examples[:2], bad)


def test_summary_lines():
    rec = {"chosen": 8, "predicted_tokens_per_step": {"0": 2.31, "4": 2.5, "8": 2.61},
           "lookup_only_tokens_per_step": {"4": 1.3, "8": 1.4}}
    assert lookup_summary(rec) == ("lookup chain: L=8 -> predicted 2.61 tokens/step (heads only 2.31, "
                                   "lookup alone 1.40)")
    assert lookup_summary({**rec, "chosen": 0}) == ("lookup chain: off -> predicted 2.31 tokens/step (L=8 "
                                                    "would give 2.61, lookup alone 1.40)")
