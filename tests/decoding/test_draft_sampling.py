"""Sampled drafts (medusa.decoding.draft_sampling): Gumbel top-k children without replacement, each child's
q_r (q with the earlier siblings removed, renormalised) and the picked nodes' q_r on the target vocabulary."""

import torch

from medusa.decoding.draft_sampling import DraftSampling, node_q, sampled_children


def test_sampled_children_are_distinct_and_carry_q_without_earlier_siblings():
    logits = torch.randn(2, 3, 7, generator=torch.Generator().manual_seed(0))  # [B, E, N]
    base = torch.tensor([[0.0, -1.0, -2.0], [0.0, -0.5, -3.0]])  # [B, E]
    children = sampled_children(3, DraftSampling(0.7, torch.Generator().manual_seed(1)))
    scores, ids, q = children(logits, base)  # [B, 9], [B, 9], [B, 9, N]
    logq = torch.log_softmax(logits / 0.7, dim=-1)
    for b in range(2):
        for e in range(3):
            kids = ids[b, 3 * e:3 * e + 3].tolist()
            assert len(set(kids)) == 3
            for r, kid in enumerate(kids):
                row = q[b, 3 * e + r]
                assert torch.allclose(row.sum(), torch.tensor(1.0))
                assert all(float(row[k]) == 0.0 for k in kids[:r])
                want = torch.softmax(logq[b, e].masked_fill(torch.tensor(
                    [i in kids[:r] for i in range(7)]), float("-inf")), dim=-1)
                torch.testing.assert_close(row, want)
                torch.testing.assert_close(scores[b, 3 * e + r], base[b, e] + logq[b, e, kid])


def test_sampling_follows_q():
    """The first child is a draw from q: its frequencies over many draws match q (within 4 sigma)."""
    logits = torch.tensor([[[2.0, 1.0, 0.0, -1.0]]])  # [1, 1, 4]
    children = sampled_children(1, DraftSampling(1.0, torch.Generator().manual_seed(3)))
    counts = torch.zeros(4)
    n = 4000
    for _ in range(n):
        counts[children(logits, torch.zeros(1, 1))[1][0, 0]] += 1
    q = torch.softmax(logits[0, 0], dim=-1)
    assert ((counts / n - q).abs() <= 4 * (q * (1 - q) / n).sqrt()).all()


def test_node_q_maps_draft_rows_to_target_ids_and_zeroes_the_root():
    pool_q = torch.tensor([[[0.5, 0.5, 0.0], [0.0, 0.25, 0.75]]])  # [1, P=2, N=3]
    picked = torch.tensor([[1]])  # [1, N-1=1]
    full = node_q(pool_q, picked, torch.tensor([4, 0, 2]), vocab_size=5)  # [1, 2, 5]
    assert full[0, 0].tolist() == [0.0] * 5
    assert full[0, 1].tolist() == [0.25, 0.0, 0.75, 0.0, 0.0]
    assert node_q(pool_q, picked, None, 3)[0, 1].tolist() == [0.0, 0.25, 0.75]
