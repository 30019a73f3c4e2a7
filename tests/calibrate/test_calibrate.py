"""medusa.calibrate.calibrate: hit ranks against naive references (MEDUSA, Hydra and draft-vocabulary
heads), the accuracy tables, path frequencies and the tree built on them, the replay of the decode loop and
the calibration record. (The command: tests/cli/test_calibrate.py; the prediction against measured decoding:
tests/integration/test_calibration_predicts_decoding.py.)"""

import json

import pytest
import torch
from decoding_helpers import greedy_examples

from medusa import MedusaModel
from medusa.calibrate.calibrate import (
    NO_TARGET,
    HeadStats,
    accuracy_tables,
    build_choices,
    calibrate,
    collect_hit_ranks,
    draft_vocab_loss,
    empirical_tokens_per_step,
    oracle_stats,
    out_of_vocab,
    path_counts,
    simulated_tokens_per_step,
)
from medusa.modeling.draft_vocab import coverage

from fit_heads import fitted_stories_heads, stories_prompts
from tiny_models import stories_tokenizer, tiny_model


def _perturbed(num_heads=3, seed=0):
    torch.manual_seed(seed)
    model = MedusaModel.from_base(tiny_model("llama"), num_heads=num_heads, num_layers=1)
    with torch.no_grad():
        for p in model.heads.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return model.eval()


def _examples(n=5, vocab=96, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        length = 9 + 3 * i
        ids = torch.randint(3, vocab, (length,), generator=g).tolist()
        prompt = 2 + i % 3
        labels = [-100] * prompt + ids[prompt:]
        if i == 2:
            labels[prompt + 2] = -100  # a hole in the labels (e.g. a user turn)
        out.append({"input_ids": ids, "labels": labels})
    return out


def _naive_ranks(model, example, topk):
    """Hit ranks of one example, alone and unpadded: ``ranks[t][k]`` (-1 miss, NO_TARGET no target)."""
    ids, labels = example["input_ids"], example["labels"]
    with torch.no_grad():
        hidden = model(input_ids=torch.tensor([ids])).hidden_states[0]  # [T, d]
        tops = [model.heads.head_logits(k, hidden).topk(topk, dim=-1).indices.tolist()
                for k in range(model.num_heads)]
    ranks = [[NO_TARGET] * model.num_heads for _ in ids]
    for k, top in enumerate(tops):
        for t in range(len(ids)):
            j = t + k + 2
            if j < len(ids) and labels[j] != -100:
                ranks[t][k] = top[t].index(ids[j]) if ids[j] in top[t] else -1
    return ranks


def test_hit_ranks_match_a_naive_reference():
    model = _perturbed()
    examples = _examples()
    topk = 4
    stats = collect_hit_ranks(model, examples, topk=topk, batch_size=2, chunk=3, progress=False)
    for ex, ranks, start in zip(examples, stats.ranks, stats.starts):
        assert start == next(i for i, l in enumerate(ex["labels"]) if l != -100)
        assert ranks.tolist() == _naive_ranks(model, ex, topk)


def _stats(rows, topk=3):
    return HeadStats(ranks=[torch.tensor(rows, dtype=torch.int8)], starts=[1], topk=topk,
                     num_tokens=len(rows))


def test_tables_paths_and_predictions_by_hand():
    rows = [[0, 0], [0, 1], [1, -1], [-1, 0], [0, NO_TARGET], [NO_TARGET, NO_TARGET]]
    stats = _stats(rows)
    t = accuracy_tables(stats)
    assert t["totals"] == [5, 4] and t["counts"] == [[3, 1, 0], [2, 1, 0]]
    # head 2 given head 1 right (rows 0, 1, 2; row 4 has no target for head 2)
    assert t["conditional_totals"] == [5, 3] and t["conditional_counts"][1] == [1, 1, 0]
    assert (t["accuracy"][0][0] == pytest.approx(0.6)
            and t["conditional_accuracy"][1][0] == pytest.approx(1 / 3))
    counts, total = path_counts(stats)
    assert total == 4  # positions with both targets present
    assert counts == {(0,): 2, (1,): 1, (0, 0): 1, (0, 1): 1}
    choices = build_choices(stats, t, counts, total, 3, "empirical")
    assert choices[0] == (0,) and len(choices) == 2
    # by frequency, not by the product of accuracies: (0, 0) (seen once) beats (2,) (never seen) although
    # head 1's rank-2 accuracy makes (2,)'s product larger
    counts2, acc2 = {(0,): 4, (0, 0): 1}, [[0.5, 0.0, 0.4], [0.1, 0.0, 0.0]]
    stats2 = _stats([[0, 0]])
    assert build_choices(stats2, {"accuracy": acc2, "conditional_accuracy": acc2}, counts2, 8,
                         3) == [(0,), (0, 0)]
    assert build_choices(stats2, {"accuracy": acc2, "conditional_accuracy": acc2}, counts2, 8, 3,
                         "conditional") == [(0,), (2,)]
    assert empirical_tokens_per_step([(0,), (0, 0)], counts, total) == pytest.approx(1 + 2 / 4 + 1 / 4)


def test_simulation_replays_the_decode_loop():
    # start=1: the prefill writes token 1; steps run at hidden positions 0, then jump by tokens gained
    rows = [[0, 0], [0, 0], [-1, 0], [1, 0], [0, -1], [0, NO_TARGET], [NO_TARGET, NO_TARGET],
            [NO_TARGET, NO_TARGET]]
    stats = _stats(rows)
    # s=0: path (0,0) -> 3 tokens (2..4); s=3: (1,) in tree, (1,0) not -> 2 (5, 6); s=5: (0,) accepts
    # token 7, the last one (the bonus would be past the end) -> 1; s=6 stops
    assert simulated_tokens_per_step([(0,), (1,), (0, 0)], stats) == pytest.approx((3 + 2 + 1) / 3)
    # only the root: one token per step
    assert simulated_tokens_per_step([], stats) == pytest.approx(1.0)


def test_calibrate_record_and_budget():
    model = _perturbed()
    tree = calibrate(model, _examples(8), nodes=10, topk=5, progress=False, data_name="mem")
    cal = tree.calibration
    assert len(tree) == 10 and tree.depth <= 3 and tree.num_heads == 3
    assert cal["nodes"] == 10 and cal["data"] == "mem" and len(cal["accuracy"]) == 3
    assert all(len(r) == 5 for r in cal["accuracy"]) and cal["top1"] == [r[0] for r in cal["accuracy"]]
    # the record's figures against an independent replay on naively computed hit ranks
    ranks = [_naive_ranks(model, ex, 5) for ex in _examples(8)]
    assert cal["expected_tokens_per_step"] == pytest.approx(_naive_replay(set(tree.choices),
                                                                          ranks, _examples(8)))
    full = [r for rs in ranks for r in rs if NO_TARGET not in r]  # positions with all 3 targets
    assert cal["num_positions"] == len(full)
    assert cal["position_mean_tokens_per_step"] == pytest.approx(
        1 + sum(_accepted(set(tree.choices), r) for r in full) / len(full))
    valid = [[r[k] for rs in ranks for r in rs if r[k] != NO_TARGET] for k in range(3)]
    assert cal["top1"] == pytest.approx([v.count(0) / len(v) for v in valid])
    json.dumps(tree.to_dict())  # serialisable
    shallow = calibrate(model, _examples(8), nodes=10, topk=5, max_depth=1, progress=False)
    assert shallow.depth == 1
    with pytest.raises(Exception, match="deeper"):
        calibrate(model, _examples(8), nodes=10, max_depth=4, progress=False)


def _accepted(tree, ranks):
    """How many tree nodes greedy verification accepts at a position with hit ranks ``ranks``."""
    n = 0
    while n < len(ranks) and ranks[n] >= 0 and tuple(ranks[:n + 1]) in tree:
        n += 1
    return n


def _naive_replay(tree, ranks, examples):
    """Tokens per step of greedy tree decoding replayed on each example from its first labelled token."""
    tokens = steps = 0
    for rs, ex in zip(ranks, examples):
        labels = ex["labels"]
        pos = next(i for i in range(1, len(labels)) if labels[i] != -100) - 1  # the prefill's hidden position
        last = len(labels) - 1
        while pos + 2 <= last:  # a step writes tokens pos + 2 .. pos + 2 + accepted, the last one at most
            gained = min(1 + _accepted(tree, rs[pos]), last - pos - 1)
            tokens, steps, pos = tokens + gained, steps + 1, pos + gained
    return tokens / steps


def test_hydra_hit_ranks_read_the_true_tokens():
    model = fitted_stories_heads(4, 1, head_type="hydra")
    tokenizer = stories_tokenizer()
    ex = greedy_examples(model, tokenizer, stories_prompts(1), 24)
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


def _draft_model(n=32, seed=0):
    torch.manual_seed(seed)
    tm = torch.randperm(96)[:n]
    model = MedusaModel.from_base(tiny_model("llama"), num_heads=3, num_layers=1, token_map=tm)
    with torch.no_grad():
        for p in model.heads.parameters():
            if p.is_floating_point():
                p.add_(torch.randn_like(p) * 0.2)
    return model.eval(), tm


def _draft_examples(tm, n=6):
    """Rows whose tokens are mostly inside the draft vocabulary (so heads do hit), some outside."""
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(n):
        length = 10 + 2 * i
        ids = tm[torch.randint(0, tm.numel(), (length,), generator=g)]
        ids[::4] = torch.randint(3, 96, (ids[::4].numel(),), generator=g)
        ids = ids.tolist()
        out.append({"input_ids": ids, "labels": [-100] * 2 + ids[2:]})
    return out


def _naive_target_ranks(model, example, topk):
    """Hit ranks from the heads' target-id logits (``model.heads(hidden)``, -inf outside the draft vocab)."""
    ids, labels = example["input_ids"], example["labels"]
    with torch.no_grad():
        hidden = model(input_ids=torch.tensor([ids])).hidden_states  # [1, T, d]
        tops = model.heads(hidden)[:, 0].topk(topk, dim=-1).indices.tolist()  # [K][T][topk] target ids
    ranks = [[NO_TARGET] * model.num_heads for _ in ids]
    for k, top in enumerate(tops):
        for t in range(len(ids)):
            j = t + k + 2
            if j < len(ids) and labels[j] != -100:
                ranks[t][k] = top[t].index(ids[j]) if ids[j] in top[t] else -1
    return ranks


def test_hit_ranks_are_over_target_ids_and_coverage_is_recorded():
    model, tm = _draft_model()
    examples = _draft_examples(tm)
    stats = collect_hit_ranks(model, examples, topk=4, batch_size=2, chunk=3, progress=False)
    hits = 0
    for ex, ranks in zip(examples, stats.ranks):
        naive = _naive_target_ranks(model, ex, 4)
        assert ranks.tolist() == naive
        hits += sum(r >= 0 for row in naive for r in row)
    assert hits > 0  # the draft ids really were mapped back to target ids
    tree = calibrate(model, examples, nodes=6, topk=4, progress=False, stats=stats)
    labels = torch.tensor([t for e in examples for t in e["labels"]])
    assert tree.calibration["draft_vocab"] == 32
    assert tree.calibration["draft_vocab_coverage"] == pytest.approx(coverage(tm, labels))
    assert 0 < tree.calibration["draft_vocab_coverage"] < 1
    loss = tree.calibration["draft_vocab_loss"]  # the examples hold tokens outside the vocabulary
    assert loss["oov_share"] > 0
    assert loss["oracle_tokens_per_step"] >= loss["tokens_per_step"] == pytest.approx(
        simulated_tokens_per_step(tree.choices, stats))
    ratio = loss["tokens_per_step"] / loss["oracle_tokens_per_step"]
    assert loss["lost_upper_bound"] == pytest.approx(1 - ratio)


def test_draft_vocab_loss_by_hand():
    """One example, one head, tree [(0,)]; token 9 is outside the vocabulary {1}: head 0's target at t=1
    (ids[3]) is a forced miss. Decoding starts at hidden position 1 and ends at 8."""
    ids = [0, 1, 1, 9, 1, 1, 1, 1, 1]
    example = {"input_ids": ids, "labels": [-100, -100] + ids[2:]}
    tm = torch.tensor([1])
    assert out_of_vocab([example], tm, 1)[0][:, 0].tolist() == [False, True] + [False] * 7
    ranks = torch.tensor([[0], [-1], [0], [0], [0], [0], [0], [NO_TARGET], [NO_TARGET]], dtype=torch.int8)
    stats = HeadStats(ranks=[ranks], starts=[2], topk=4, num_tokens=len(ids))
    loss = draft_vocab_loss([(0,)], stats, [example], tm)
    # measured: s=1 misses (+1), s=2 -> 4 -> 6 (+2 each), s=6 keeps 1 at the end: 6 tokens in 4 steps;
    # oracle: s=1 -> 3 -> 5 (+2 each), s=5 -> 7 (+2): 6 tokens in 3 steps
    assert loss == {"tokens_per_step": 1.5, "oracle_tokens_per_step": 2.0, "lost_upper_bound": 0.25,
                    "oov_share": pytest.approx(1 / 7)}
    assert oracle_stats(stats, out_of_vocab([example], tm, 1)).ranks[0][1, 0] == 0
