"""heads-size (meta tensors) counts what real heads hold: full vocabulary vs a draft vocabulary."""

import argparse

from benchmarks.training import heads_size
from medusa.modeling.heads import MedusaHeads


def test_heads_size_matches_real_modules():
    args = argparse.Namespace(what="heads-size", hidden=16, vocab=300, heads=3, layers=2, draft_vocab=64)
    result = heads_size(args)
    real = {n: sum(p.numel() for p in MedusaHeads(16, 300, 3, 2, "linear", draft_vocab=n).parameters())
            for n in (0, 64)}
    assert result["full_parameters"] == real[0] == 3 * (2 * (16 * 16 + 16) + 300 * 16)
    assert result["draft_parameters"] == real[64]
    assert result["ratio"] == real[0] / real[64]
