"""medusa/training/ttt_attention.py: the unroll's attention split into one causal fused block and each
position's chain entries gives the dense-mask path's loss and gradients (Llama with grouped K / V, Qwen3's
q / k norms, right-padded rows, a teacher), equals a naive softmax over the allowed keys, and is used only
where it applies (right-padded CPU batches)."""

import copy

import pytest
import torch

from medusa.modeling.model import MedusaModel
from medusa.training import ttt_attention
from medusa.training.eagle3 import ttt_loss
from medusa.training.losses import Teacher
from medusa.training.medusa1 import draft_teacher_logits

from tiny_models import tiny_model


def _heads(arch: str) -> MedusaModel:
    model = MedusaModel.from_base(tiny_model(arch, layers=4), num_heads=4, head_type="eagle3",
                                  heads_dtype=torch.float32)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.heads.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model


def _batch(b: int = 3, t: int = 20) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 96, (b, t), generator=g)  # [B, T]
    mask = torch.ones_like(ids)
    mask[1, 13:] = 0
    mask[2, 7:] = 0
    return ids, ids.masked_fill(mask == 0, -100), mask


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3"])
def test_split_attention_gives_the_dense_paths_loss_and_gradients(arch):
    model = _heads(arch)
    ids, labels, mask = _batch()
    feats = torch.randn(3, 20, model.heads.fc.in_features, generator=torch.Generator().manual_seed(3))
    assert model.heads.layers[0].self_attn.num_key_value_groups > 1 or arch == "qwen3"
    assert ttt_attention.applies(model.heads, mask.bool())
    results = []
    for split in (True, False):
        heads = copy.deepcopy(model.heads)
        teacher = Teacher(torch.randn(3, 20, 32, generator=torch.Generator().manual_seed(4)),
                          draft_teacher_logits(model.base_model.lm_head, heads), 0.3)
        out = ttt_loss(heads, feats, ids, labels, mask, 0.8, teacher=teacher, split=split)
        out.loss.backward()
        grads = {n: p.grad for n, p in heads.named_parameters() if p.requires_grad}
        results.append((out, grads))
    (split_out, split_grads), (dense_out, dense_grads) = results
    assert torch.allclose(split_out.loss, dense_out.loss, rtol=1e-5)
    assert torch.equal(split_out.correct1, dense_out.correct1)
    assert torch.equal(split_out.count, dense_out.count)
    assert split_grads.keys() == dense_grads.keys()
    for name, grad in dense_grads.items():
        assert grad is not None and split_grads[name] is not None, name
        assert torch.allclose(split_grads[name], grad, rtol=1e-4, atol=1e-6), name


def test_split_attention_equals_a_naive_softmax_over_the_allowed_keys():
    g = torch.Generator().manual_seed(5)
    b, h, t, hd, j = 2, 3, 9, 8, 2
    q, k0, v0 = (torch.randn(b, h, t, hd, generator=g, requires_grad=True) for _ in range(3))
    chain_k = [torch.randn(b, h, t, hd, generator=g) for _ in range(j)]
    chain_v = [torch.randn(b, h, t, hd, generator=g) for _ in range(j)]
    scale = hd ** -0.5
    got = ttt_attention.split_attention(q, k0, v0, chain_k, chain_v, scale)  # [B, H, T, hd]
    causal = (q @ k0.transpose(-1, -2)) * scale  # [B, H, T, T]
    causal = causal.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    own = torch.stack([(q * kc).sum(-1) * scale for kc in chain_k], dim=-1)  # [B, H, T, j]
    p = torch.softmax(torch.cat([causal, own], dim=-1), dim=-1)
    want = p[..., :t] @ v0 + sum(p[..., t + c:t + c + 1] * chain_v[c] for c in range(j))
    assert torch.allclose(got, want, atol=1e-5)
    grads = torch.autograd.grad(got.square().sum(), (q, k0, v0))
    wants = torch.autograd.grad(want.square().sum(), (q, k0, v0))
    for a, w in zip(grads, wants, strict=True):
        assert torch.allclose(a, w, atol=1e-4)
    alone = ttt_attention.split_attention(q, k0, v0, [], [], scale)  # step 0: the causal block alone
    assert torch.allclose(alone, torch.softmax(causal, dim=-1) @ v0, atol=1e-5)


def test_it_applies_to_right_padded_cpu_batches_only():
    heads = _heads("llama").heads
    _, _, mask = _batch()
    assert ttt_attention.applies(heads, mask.bool())
    left = mask.flip(-1)  # the same rows, left-padded
    assert not ttt_attention.applies(heads, left.bool())
    ids, labels, _ = _batch()
    feats = torch.randn(3, 20, heads.fc.in_features)
    auto = ttt_loss(heads, feats, ids, labels, left, 0.8)
    dense = ttt_loss(heads, feats, ids, labels, left, 0.8, split=False)
    assert torch.equal(auto.loss, dense.loss)
    other = copy.deepcopy(heads)  # a Llama-shaped layer of another model type (OLMo clips q / k / v)
    attn = other.layers[0].self_attn
    attn.config = copy.copy(attn.config)
    attn.config.model_type = "olmo2"
    assert not ttt_attention.applies(other, mask.bool())  # its own attention forward: the dense path
