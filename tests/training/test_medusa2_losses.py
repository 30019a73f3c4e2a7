import math

import pytest
import torch
import torch.nn.functional as F

from medusa.data.tokenize import IGNORE_INDEX
from medusa.errors import ConfigError
from medusa.training.losses import causal_lm_loss, medusa2_loss, self_distill_kl


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
