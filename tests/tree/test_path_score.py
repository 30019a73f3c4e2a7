"""The dynamic tree's calibrated path score: the samples it is fitted on, the fit, the stored record, the
top-N tree under it. (Calibrating the score and lossless greedy decoding with it:
tests/integration/test_calibration_predicts_decoding.py.)"""

import itertools
import math

import pytest
import torch

from medusa.decoding.dynamic_tree import TIE_BREAK, build_step_tree, medusa_children
from medusa.decoding.tree_option import DynamicTreeOption, resolve_dynamic, tree_kind, tree_option
from medusa.tree import MedusaTree
from medusa.tree.path_score import depth_samples, fit_logistic, fit_path_score, score_log_probs


def test_depth_samples_keep_positions_whose_shallower_heads_hit():
    # one example, 4 positions, 2 heads, top-3; ranks -1 = miss, -2 = no target
    ranks = torch.tensor([[0, 1], [-1, 0], [2, -2], [1, 2]], dtype=torch.int8)
    logp = -torch.arange(24, dtype=torch.float16).view(4, 2, 3)  # [T, D, k]
    x0, y0 = depth_samples([logp], [ranks], 0)  # depth 0: every position with a target
    assert x0.tolist() == [-0.0, -1, -2, -6, -7, -8, -12, -13, -14, -18, -19, -20]
    assert y0.tolist() == [1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0]
    x1, y1 = depth_samples([logp], [ranks], 1)  # depth 1: head 0 hit (rows 0, 2, 3), head 1 has a target
    assert x1.tolist() == [-3, -4, -5, -21, -22, -23]
    assert y1.tolist() == [0, 1, 0, 0, 0, 1]


def test_fit_logistic_recovers_known_parameters():
    g = torch.Generator().manual_seed(0)
    x = -5 * torch.rand(40_000, generator=g)
    y = torch.bernoulli(torch.sigmoid(2.0 * x + 1.0), generator=g)
    w, b = fit_logistic(x, y)
    assert w == pytest.approx(2.0, abs=0.1) and b == pytest.approx(1.0, abs=0.1)


def test_fit_path_score_marks_thin_or_decreasing_depths_raw():
    g = torch.Generator().manual_seed(1)
    t, k = 400, 4
    logp = torch.log_softmax(torch.randn(t, 3, k, generator=g) * 2, -1).sort(-1, descending=True).values
    ranks = torch.zeros(t, 3, dtype=torch.int8)  # head 0 always right at rank 0: higher p -> hit
    ranks[:, 1] = k - 1  # head 1 always right at its *last* rank: higher p -> miss (w <= 0)
    ranks[5:, 2] = -2  # head 2: only 5 positions have a target
    rec = fit_path_score([logp.half()], [ranks])
    assert rec["positions"] == [t, t, 5]
    assert rec["weight"][0] > 0 and rec["raw"] == [1, 2]
    assert all(math.isfinite(v) for v in rec["weight"] + rec["bias"])


def test_score_log_probs_is_a_monotone_negative_map():
    lp = torch.linspace(-12, 0, 50)
    score = {"weight": [2.0, 1.5], "bias": [1.0, 3.0], "raw": [1]}
    s = score_log_probs(lp, 1, score)
    assert (s < 0).all() and (s.diff() > 0).all()
    assert torch.equal(score_log_probs(lp, 2, score), lp)  # a raw depth
    assert torch.equal(score_log_probs(lp, 1, None), lp)


def test_calibrated_dynamic_tree_is_the_top_n_paths_under_the_score():
    torch.manual_seed(0)
    k, b, v, n = 3, 2, 6, 12
    logp = torch.log_softmax(torch.randn(k, b, v) * 2, dim=-1)  # [K, B, V]
    score = {"weight": [2.0, 0.5, 3.0], "bias": [1.0, -1.0, 4.0], "raw": []}
    tree = build_step_tree(torch.tensor([1, 2]), medusa_children(logp, v), n, k, torch.float32, branch=v,
                           path_score=score)
    raw = build_step_tree(torch.tensor([1, 2]), medusa_children(logp, v), n, k, torch.float32, branch=v)
    inc = lambda d, lp: float(torch.nn.functional.logsigmoid(torch.tensor(score["weight"][d] * lp
                                                                          + score["bias"][d])))
    differs = False
    for row in range(b):
        scored = [(sum(inc(i, float(logp[i, row, t])) for i, t in enumerate(p)) - len(p) * TIE_BREAK, p)
                  for d in range(1, k + 1) for p in itertools.product(range(v), repeat=d)]
        best = {p for _, p in sorted(scored, reverse=True)[:n - 1]}
        got = set()
        for i in range(1, n):
            path, j = [], i
            while j:
                path.append(int(tree.tokens[row, j]))
                j = int(tree.parents[row, j])
            got.add(tuple(reversed(path)))
        assert got == best
        differs |= not torch.equal(tree.tokens[row].sort().values, raw.tokens[row].sort().values) or \
            not torch.equal(tree.depths[row], raw.depths[row])
    assert differs  # the score changes which nodes are kept


def test_resolve_dynamic_takes_the_checkpoints_score():
    score = {"weight": [1.5, 2.0], "bias": [0.5, 1.0], "positions": [100, 80], "raw": []}
    calibrated = MedusaTree.from_choices([(0,), (1,), (0, 0)], num_heads=2, calibration={"path_score": score})
    plain = MedusaTree.from_choices([(0,), (1,)], num_heads=2)
    assert resolve_dynamic("dynamic:8", 2, calibrated).score == score
    assert resolve_dynamic("dynamic:8", 2, plain).score is None
    assert resolve_dynamic(DynamicTreeOption(8, calibrated=False), 2, calibrated).score is None
    assert tree_option("dynamic-raw", 8) == DynamicTreeOption(8, calibrated=False)
    assert tree_kind("dynamic", calibrated) == "dynamic (calibrated path score)"
    assert tree_kind(DynamicTreeOption(8, calibrated=False), calibrated) == "dynamic (raw head probabilities)"
    assert tree_kind(plain, calibrated) == "static"
