"""The training losses (medusa/training/losses.py): the chunked head loss equals the naive reference in
value, metrics and gradients (MEDUSA heads; a draft vocabulary, whose outside labels are misses: counted,
no CE term, no gradient; Hydra heads, teacher-forced, with the teacher KL); MEDUSA-2's causal LM loss,
self-distillation KL and combined loss."""

import math

import pytest
import torch
import torch.nn.functional as F

from medusa.data.tokenize import IGNORE_INDEX
from medusa.errors import ConfigError
from medusa.modeling.heads import MedusaHeads
from medusa.modeling.hydra import HydraHeads
from medusa.training.losses import (
    Teacher,
    causal_lm_loss,
    head_weights,
    medusa2_loss,
    medusa_head_loss,
    naive_head_loss,
    self_distill_kl,
    summarise_stats,
    teacher_kl,
)


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


V, N, D = 50, 20, 16


def _draft_setup(K=3, seed=0):
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
    heads, hidden, labels = _draft_setup()
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


def _draft_teacher(heads, seed=1):
    from medusa.training.medusa1 import draft_teacher_logits

    base_head = torch.nn.Linear(D, V, bias=True)
    torch.nn.init.normal_(base_head.weight, std=0.5, generator=torch.Generator().manual_seed(seed))
    return base_head, draft_teacher_logits(base_head, heads)


def test_draft_teacher_logits_are_the_base_logits_of_the_draft_tokens():
    heads, hidden, _ = _draft_setup()
    base_head, fn = _draft_teacher(heads)
    h = torch.randn(7, D)
    with torch.no_grad():
        torch.testing.assert_close(fn(h), base_head(h)[:, heads.token_map])  # [7, N]
    from medusa.training.medusa1 import draft_teacher_logits

    full = MedusaHeads(D, V, 3, 1)  # no draft vocabulary: every row
    torch.testing.assert_close(draft_teacher_logits(base_head, full)(h), base_head(h))


@pytest.mark.parametrize("chunk", [1, 1000])
def test_chunked_equals_naive_with_draft_vocab_and_teacher(chunk):
    heads, hidden, labels = _draft_setup()
    t2d = heads.target_to_draft()
    base_head, fn = _draft_teacher(heads)
    teacher = Teacher(hidden.detach(), fn, 0.5)
    naive = naive_head_loss(hidden, labels, heads.head_logits, heads.num_heads, label_map=t2d,
                            teacher=teacher)
    naive.loss.backward()
    ref = [p.grad.clone() for p in heads.parameters()]
    heads.zero_grad()
    out = medusa_head_loss(hidden, labels, heads.head_logits, heads.num_heads, chunk_size=chunk,
                           label_map=t2d, teacher=teacher)
    out.loss.backward()
    torch.testing.assert_close(out.loss, naive.loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.stats(), naive.stats(), rtol=1e-5, atol=1e-4)
    for g, r in zip([p.grad for p in heads.parameters()], ref):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-6)
    assert base_head.weight.grad is None  # the teacher is a fixed target


def test_draft_teacher_kl_by_hand():
    """Head 0 at t reads h_t, target labels[t + 2]; the teacher is the base on h_{t+1} over the draft
    tokens only (renormalised there), at the positions whose target is inside the draft vocabulary."""
    heads, hidden, labels = _draft_setup(K=1)
    t2d = heads.target_to_draft()
    base_head, fn = _draft_teacher(heads)
    w = 0.25
    out = medusa_head_loss(hidden, labels, heads.head_logits, 1, decay=1.0, chunk_size=4, label_map=t2d,
                           teacher=Teacher(hidden, fn, w))
    y = labels[:, 2:]  # [B, T-2]
    inside = (y != -100) & (t2d[y.clamp(min=0)] >= 0)
    logits = heads.head_logits(0, hidden[:, :-2][inside])  # [M, N]
    with torch.no_grad():
        base = base_head(hidden[:, 1:-1][inside])[:, heads.token_map]  # [M, N]
    ce = F.cross_entropy(logits, t2d[y[inside]], reduction="sum")
    kl = F.kl_div(F.log_softmax(logits, -1), F.log_softmax(base, -1), log_target=True, reduction="sum")
    torch.testing.assert_close(out.loss, ((1 - w) * ce + w * kl) / int(inside.sum()), rtol=1e-5, atol=1e-6)


def test_outside_labels_are_excluded_exactly():
    heads, hidden, labels = _draft_setup(K=1)
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
    heads, hidden, _ = _draft_setup(K=2)
    outside = [t for t in range(V) if t not in set(heads.token_map.tolist())]
    labels = torch.tensor(outside[:29] * 2).view(2, 29)
    t2d = heads.target_to_draft()
    for fn in (medusa_head_loss, naive_head_loss):
        out = fn(hidden, labels, heads.head_logits, 2, label_map=t2d)
        assert out.loss.item() == 0.0 and out.loss.requires_grad
        out.loss.backward()
        assert out.count.tolist() == [54.0, 52.0] and torch.equal(out.missed, out.count)
        assert out.correct1.sum() == 0 and out.correct5.sum() == 0


def _hydra_setup(seed=0, B=2, T=21, d=8, V=30, K=3):
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
    heads, base_head, hidden, ids, labels = _hydra_setup()
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
    heads, base_head, hidden, ids, labels = _hydra_setup(B=1, T=4, K=1)
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


def _logits(seed, shape=(2, 7, 11)):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 3


def _labels():
    labels = torch.randint(0, 11, (2, 7), generator=torch.Generator().manual_seed(9))
    labels[0, :3] = IGNORE_INDEX
    labels[1, 5] = IGNORE_INDEX
    return labels


def test_causal_lm_loss_matches_reference():
    logits, labels = _logits(0), _labels()
    ref = F.cross_entropy(logits[:, :-1].reshape(-1, 11), labels[:, 1:].reshape(-1), ignore_index=-100)
    torch.testing.assert_close(causal_lm_loss(logits, labels), ref)
    none = torch.full_like(labels, IGNORE_INDEX)
    assert causal_lm_loss(logits.requires_grad_(), none).item() == 0.0


@pytest.mark.parametrize("tau", [1.0, 2.0])
def test_kl_matches_naive_reference(tau):
    s, t, labels = _logits(1), _logits(2), _labels()
    got = self_distill_kl(s, t, labels, temperature=tau)
    terms = []
    for b in range(2):
        for pos in range(6):
            if labels[b, pos + 1] == IGNORE_INDEX:
                continue
            p = F.softmax(t[b, pos] / tau, -1)
            q = F.softmax(s[b, pos] / tau, -1)
            terms.append(sum(p[v] * math.log(p[v] / q[v]) for v in range(11)))
    ref = torch.stack([torch.as_tensor(x) for x in terms]).mean() * tau**2
    torch.testing.assert_close(got, ref.float(), rtol=1e-5, atol=1e-6)
    assert got.item() > 0


def test_kl_is_exactly_zero_for_equal_logits_and_ignores_unlabelled_positions():
    s, labels = _logits(3), _labels()
    assert self_distill_kl(s, s.clone(), labels).item() == 0.0
    t = s.clone()
    t[0, 1, 3] += 5.0  # position 1 of row 0 predicts labels[0, 2] = -100: not counted
    assert self_distill_kl(s, t, labels).item() == 0.0
    t[0, 2, 3] += 5.0  # predicts labels[0, 3], an assistant token: counted
    assert self_distill_kl(s, t, labels).item() > 0.0


def test_kl_gradient_flows_to_student_only():
    s, t, labels = _logits(4).requires_grad_(), _logits(5).requires_grad_(), _labels()
    self_distill_kl(s, t, labels).backward()
    assert s.grad is not None and s.grad.abs().sum() > 0
    assert t.grad is None


def test_bad_temperature():
    with pytest.raises(ConfigError, match="distill_temperature"):
        self_distill_kl(_logits(0), _logits(1), _labels(), temperature=0.0)


def test_medusa2_loss_combines_terms():
    logits, labels = _logits(6), _labels()
    heads = torch.tensor(2.5)
    loss, metrics = medusa2_loss(logits, labels, heads, lambda0=0.2)
    torch.testing.assert_close(loss, causal_lm_loss(logits, labels) + 0.2 * heads)
    assert metrics["lambda0"] == 0.2 and metrics["heads_loss"] == 2.5
    teacher = _logits(7)
    loss, metrics = medusa2_loss(logits, labels, heads, lambda0=0.01, teacher_logits=teacher, temperature=2.0)
    torch.testing.assert_close(loss, self_distill_kl(logits, teacher, labels, 2.0) + 0.01 * heads)
    assert metrics["distill_kl"] == pytest.approx(float(self_distill_kl(logits, teacher, labels, 2.0)))
    # the student equal to its teacher: L_LM is 0 (the KL), not the CE, which is not
    loss, metrics = medusa2_loss(logits, labels, heads, lambda0=0.01, teacher_logits=logits.clone())
    assert metrics["distill_kl"] == 0.0 and float(causal_lm_loss(logits, labels)) > 1.0
    torch.testing.assert_close(loss, 0.01 * heads)
