"""Head loss with a draft vocabulary: labels outside it are misses (counted, no CE term, no gradient)."""

import pytest
import torch
import torch.nn.functional as F

from medusa.modeling.heads import MedusaHeads
from medusa.training.losses import medusa_head_loss, naive_head_loss, summarise_stats

V, N, D = 50, 20, 16


def _setup(K=3, seed=0):
    torch.manual_seed(seed)
    heads = MedusaHeads(D, V, K, 1, draft_vocab=N)
    heads.set_token_map(torch.randperm(V)[:N])
    for p in heads.parameters():
        torch.nn.init.normal_(p, std=0.3)
    hidden = torch.randn(2, 29, D, requires_grad=True)  # [B, T, d]
    labels = torch.randint(0, V, (2, 29))  # [B, T]: about 60% of them outside the draft vocabulary
    labels[0, :4] = -100
    labels[1, 25:] = -100
    return heads, hidden, labels


@pytest.mark.parametrize("chunk", [1, 5, 1000])
def test_chunked_equals_naive_with_draft_vocab(chunk):
    heads, hidden, labels = _setup()
    t2d = heads.target_to_draft()
    naive = naive_head_loss(hidden, labels, heads.head_logits, heads.num_heads, label_map=t2d)
    naive.loss.backward()
    ref = [p.grad.clone() for p in heads.parameters()] + [hidden.grad.clone()]
    heads.zero_grad()
    hidden.grad = None
    out = medusa_head_loss(hidden, labels, heads.head_logits, heads.num_heads,
                           chunk_size=chunk, label_map=t2d)
    out.loss.backward()
    torch.testing.assert_close(out.loss, naive.loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.stats(), naive.stats(), rtol=1e-5, atol=1e-4)
    for g, r in zip([p.grad for p in heads.parameters()] + [hidden.grad], ref):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-6)
    assert out.missed.sum() > 0 and (out.missed < out.count).all()


def test_outside_labels_are_excluded_exactly():
    heads, hidden, labels = _setup(K=1)
    t2d = heads.target_to_draft()
    out = medusa_head_loss(hidden, labels, heads.head_logits, 1, decay=1.0, chunk_size=4, label_map=t2d)
    out.loss.backward()
    # by hand: head 0 at t predicts labels[t + 2]; only targets inside the draft vocabulary have a CE term
    y = labels[:, 2:]  # [B, T-2]
    labelled = y != -100
    inside = labelled & (t2d[y.clamp(min=0)] >= 0)
    h = hidden[:, :-2][inside]
    ce = F.cross_entropy(heads.head_logits(0, h), t2d[y[inside]])
    torch.testing.assert_close(out.loss, ce, rtol=1e-5, atol=1e-6)
    assert out.count.item() == int(labelled.sum()) and out.missed.item() == int((labelled & ~inside).sum())
    logits = heads.head_logits(0, hidden[:, :-2][labelled]).argmax(-1)  # draft ids
    assert out.correct1.item() == int((logits == t2d[y[labelled]]).sum())  # a miss is never a hit
    # positions whose only target lies outside the draft vocabulary get no gradient at all
    no_target = torch.zeros_like(labels, dtype=torch.bool)
    no_target[:, :-2] = labelled & ~inside
    assert torch.count_nonzero(hidden.grad[no_target]) == 0
    assert torch.count_nonzero(hidden.grad[:, :-2][inside]) > 0
    summary = summarise_stats(out.stats())
    assert summary["head1_draft_miss"] == pytest.approx(out.missed.item() / out.count.item())
    assert summary["head1_top1"] == pytest.approx(out.correct1.item() / out.count.item())


def test_every_label_outside_does_not_crash():
    heads, hidden, _ = _setup(K=2)
    outside = [t for t in range(V) if t not in set(heads.token_map.tolist())]
    labels = torch.tensor(outside[:29] * 2).view(2, 29)
    t2d = heads.target_to_draft()
    for fn in (medusa_head_loss, naive_head_loss):
        out = fn(hidden, labels, heads.head_logits, 2, label_map=t2d)
        assert out.loss.item() == 0.0 and out.loss.requires_grad
        out.loss.backward()
        assert out.count.tolist() == [54.0, 52.0] and torch.equal(out.missed, out.count)
        assert out.correct1.sum() == 0 and out.correct5.sum() == 0
