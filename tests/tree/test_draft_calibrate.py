"""Calibration and bench with draft-vocabulary heads: ranks over target ids, coverage reported."""

import pytest
import torch

from medusa import MedusaModel
from medusa.calibrate.calibrate import NO_TARGET, calibrate, collect_hit_ranks
from medusa.eval.bench import bench
from medusa.modeling.draft_vocab import coverage

from fit_heads import fitted_stories_heads
from tiny_models import STORIES, require_shared, stories_model, stories_tokenizer, tiny_model


def _draft_model(n=32, seed=0):
    torch.manual_seed(seed)
    tm = torch.randperm(96)[:n]
    model = MedusaModel.from_base(tiny_model("llama"), num_heads=3, num_layers=1, token_map=tm)
    with torch.no_grad():
        for p in model.heads.parameters():
            if p.is_floating_point():
                p.add_(torch.randn_like(p) * 0.2)
    return model.eval(), tm


def _examples(tm, n=6):
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


def _naive_ranks(model, example, topk):
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
    examples = _examples(tm)
    stats = collect_hit_ranks(model, examples, topk=4, batch_size=2, chunk=3, progress=False)
    hits = 0
    for ex, ranks in zip(examples, stats.ranks):
        naive = _naive_ranks(model, ex, 4)
        assert ranks.tolist() == naive
        hits += sum(r >= 0 for row in naive for r in row)
    assert hits > 0  # the draft ids really were mapped back to target ids
    tree = calibrate(model, examples, nodes=6, topk=4, progress=False, stats=stats)
    labels = torch.tensor([t for e in examples for t in e["labels"]])
    assert tree.calibration["draft_vocab"] == 32
    assert tree.calibration["draft_vocab_coverage"] == pytest.approx(coverage(tm, labels))
    assert 0 < tree.calibration["draft_vocab_coverage"] < 1


def test_bench_reports_draft_vocab_coverage_of_generated_tokens():
    require_shared(STORIES)
    prompt = "Once upon a time, there was a little dog."
    tok = stories_tokenizer()
    ids = tok(prompt, return_tensors="pt").input_ids
    ref = stories_model().generate(ids, do_sample=False, max_new_tokens=16, min_new_tokens=16)
    new = ref[0, ids.shape[1]:]
    # 200 of 512 ids: every generated id but the last new one, so the coverage is neither 0 nor 1
    seen = list(dict.fromkeys(new.tolist()))
    tm = torch.tensor(sorted(seen[:-1] + [t for t in range(3, 512) if t not in seen][:201 - len(seen)]))
    model = fitted_stories_heads(4, 1)  # fitted full-vocabulary heads restricted to the draft ids
    model.use_draft_vocab(tm)
    report = bench(model, tok, [prompt], max_new_tokens=16, progress=False)
    assert report["greedy_exact_match"] == 1.0
    assert max(int(k) for k in report["accept_length_histogram"]) >= 3  # accepted runs through draft ids
    assert report["draft_vocab"] == 200
    assert report["draft_vocab_coverage"] == pytest.approx(coverage(tm, new))
    assert 0 < report["draft_vocab_coverage"] < 1
