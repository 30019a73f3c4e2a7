"""The chunked head loss equals the naive reference in value, metrics and gradients."""

import pytest
import torch

from medusa.modeling.heads import MedusaHeads
from medusa.training.losses import head_weights, medusa_head_loss, naive_head_loss


def _setup(seed=0, B=2, T=33, d=16, V=50, K=4, layers=1):
    torch.manual_seed(seed)
    heads = MedusaHeads(d, V, K, layers)
    for p in heads.parameters():  # non-trivial weights (ResBlocks start at zero)
        torch.nn.init.normal_(p, std=0.3)
    hidden = torch.randn(B, T, d)  # [B, T, d]
    labels = torch.randint(0, V, (B, T))  # [B, T]
    labels[0, :5] = -100  # a prompt
    if B > 1:
        labels[1, 30:] = -100  # padding
    return heads, hidden, labels


@pytest.mark.parametrize("chunk", [1, 7, 1000])
def test_chunked_equals_naive_value_metrics_and_grads(chunk):
    heads, hidden, labels = _setup()
    hidden.requires_grad_(True)  # MEDUSA-2 backpropagates into the backbone too
    naive = naive_head_loss(hidden, labels, heads.head_logits, heads.num_heads, decay=0.8)
    naive.loss.backward()
    ref_grads = [p.grad.clone() for p in heads.parameters()]
    ref_hidden_grad = hidden.grad.clone()
    heads.zero_grad()
    hidden.grad = None
    chunked = medusa_head_loss(hidden, labels, heads.head_logits, heads.num_heads, decay=0.8,
                               chunk_size=chunk)
    chunked.loss.backward()
    torch.testing.assert_close(chunked.loss, naive.loss, rtol=1e-5, atol=1e-6)
    for name in ("ce_sum", "correct1", "correct5", "count"):
        torch.testing.assert_close(getattr(chunked, name), getattr(naive, name), rtol=1e-5, atol=1e-4)
    for p, g in zip(heads.parameters(), ref_grads):
        torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(hidden.grad, ref_hidden_grad, rtol=1e-4, atol=1e-6)


def test_loss_definition_on_one_head():
    """Head 1 at position t is scored against token t + 2, weighted decay^1."""
    heads, hidden, labels = _setup(K=1, T=6, B=1)
    labels[:] = torch.tensor([[-100, -100, 3, 4, 5, -100]])
    out = medusa_head_loss(hidden, labels, heads.head_logits, 1, decay=0.5, chunk_size=2)
    logits = heads.head_logits(0, hidden[0, :3])  # positions 0, 1, 2 predict tokens 2, 3, 4
    expected = 0.5 * torch.nn.functional.cross_entropy(logits, torch.tensor([3, 4, 5]))
    torch.testing.assert_close(out.loss, expected)
    assert out.count.tolist() == [3.0]
    assert head_weights(3, 0.8) == pytest.approx([0.8, 0.64, 0.512])


def test_heads_without_targets_stay_in_graph():
    heads, hidden, labels = _setup(K=3, T=4, B=1)  # head 3 would need position t + 4: none
    out = medusa_head_loss(hidden, labels, heads.head_logits, 3, chunk_size=4)
    out.loss.backward()
    assert out.count.tolist()[2] == 0
    assert all(p.grad is not None for p in heads.parameters())
    assert out.loss.requires_grad


def test_metrics_match_argmax():
    heads, hidden, labels = _setup(K=2)
    with torch.no_grad():
        out = medusa_head_loss(hidden, labels, heads.head_logits, 2, chunk_size=5)
    pred = heads.head_logits(0, hidden).argmax(-1)  # [B, T]
    y = labels[:, 2:]
    mask = y != -100
    assert out.correct1[0].item() == ((pred[:, :-2] == y) & mask).sum().item()
