"""Hydra heads' loss: teacher forcing on the data's tokens and the teacher KL, chunked == naive reference."""

import pytest
import torch
import torch.nn.functional as F

from medusa.modeling.hydra import HydraHeads
from medusa.training.losses import Teacher, medusa_head_loss, naive_head_loss, teacher_kl


def _setup(seed=0, B=2, T=21, d=8, V=30, K=3):
    torch.manual_seed(seed)
    embedding = torch.nn.Embedding(V, d)
    heads = HydraHeads(d, V, K, num_layers=2, embedding=embedding)
    for p in heads.parameters():
        torch.nn.init.normal_(p, std=0.3)
    base_head = torch.nn.Linear(d, V, bias=False)
    hidden = torch.randn(B, T, d)  # [B, T, d]
    ids = torch.randint(0, V, (B, T))  # [B, T]
    labels = ids.clone()
    labels[0, :4] = -100
    if B > 1:
        labels[1, 17:] = -100
    return heads, base_head, hidden, ids, labels


@pytest.mark.parametrize("weight,chunk", [(0.0, 5), (0.5, 3), (1.0, 1000)])
def test_chunked_equals_naive_with_teacher(weight, chunk):
    heads, base_head, hidden, ids, labels = _setup()
    wide = heads.teacher_inputs(hidden, ids)  # [B, T, d * (K+1)]
    teacher = Teacher(hidden, base_head, weight)
    naive = naive_head_loss(wide, labels, heads.head_logits, 3, decay=0.8, teacher=teacher)
    naive.loss.backward()
    ref = [p.grad.clone() for p in heads.parameters()]
    heads.zero_grad()
    chunked = medusa_head_loss(wide, labels, heads.head_logits, 3, decay=0.8, chunk_size=chunk,
                               teacher=teacher)
    chunked.loss.backward()
    torch.testing.assert_close(chunked.loss, naive.loss, rtol=1e-5, atol=1e-6)
    for name in ("ce_sum", "correct1", "correct5", "count"):
        torch.testing.assert_close(getattr(chunked, name), getattr(naive, name), rtol=1e-5, atol=1e-4)
    for p, g in zip(heads.parameters(), ref):
        torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=1e-6)
    assert base_head.weight.grad is None  # the teacher is a fixed target


def test_loss_definition_on_one_head_and_position():
    """Head 1 at t reads h_t and e(x_{t+1}); target x_{t+2}; teacher: the base head on h_{t+1}."""
    heads, base_head, hidden, ids, labels = _setup(B=1, T=4, K=1)
    labels[:] = torch.tensor([[-100, -100, -100, int(ids[0, 3])]])  # only position 1 has a target
    out = medusa_head_loss(heads.teacher_inputs(hidden, ids), labels, heads.head_logits, 1, decay=0.5,
                           chunk_size=4, teacher=Teacher(hidden, base_head, 0.25))
    wide = torch.cat([hidden[0, 1], heads.embed(ids[0, 2])])  # [2d]
    logits = heads.head_logits(0, wide)  # [V]
    base = base_head(hidden[0, 2])  # the base distribution that predicts token 3
    ce = F.cross_entropy(logits.view(1, -1), ids[0, 3].view(1))
    kl = F.kl_div(F.log_softmax(logits, -1), F.log_softmax(base, -1), log_target=True, reduction="sum")
    torch.testing.assert_close(out.loss, 0.5 * (0.75 * ce + 0.25 * kl))
    assert out.count.tolist() == [1.0]


def test_teacher_kl_is_zero_on_equal_logits_and_positive_otherwise():
    logits = torch.randn(6, 11)
    assert float(teacher_kl(logits, logits)) == pytest.approx(0.0, abs=1e-6)
    assert float(teacher_kl(logits, logits + torch.randn(6, 11))) > 0
