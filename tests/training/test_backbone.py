"""LoRA / full fine-tuning setup, optimizer groups, training steps and the self-distillation teacher."""

import pytest
import torch
from medusa2_helpers import batch, naive_heads_loss

from medusa import MedusaModel
from medusa.errors import ConfigError, MedusaError
from medusa.modeling.base import unwrap
from medusa.training.backbone import LORA_TARGETS, apply_lora, setup_full_finetune
from medusa.training.losses import medusa2_loss
from medusa.training.medusa2 import teacher_logits
from medusa.training.setup import param_groups

from tiny_models import ARCHITECTURES, tiny_model


def _lora_model(arch="llama", dropout=0.0, **kw):
    model = MedusaModel.from_base(tiny_model(arch), num_heads=2, num_layers=1)
    return apply_lora(model, r=4, alpha=8, dropout=dropout, **kw)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_lora_targets_every_attention_and_mlp_linear_but_not_the_lm_head(arch):
    base = tiny_model(arch)
    ids, _ = batch(base.config.vocab_size)
    with torch.no_grad():
        ref = base(input_ids=ids).logits
    model = apply_lora(MedusaModel.from_base(base, num_heads=2), r=4, alpha=8, dropout=0.0)
    adapted = {name.rsplit(".", 1)[-1] for name, m in model.base_model.named_modules()
               if hasattr(m, "lora_A")}
    assert adapted == set(LORA_TARGETS[arch])
    lm_head = unwrap(model.base_model).get_output_embeddings()
    assert not hasattr(lm_head, "lora_A") and not lm_head.weight.requires_grad
    with torch.no_grad():  # B = 0: the adapted model starts exactly as the base
        torch.testing.assert_close(model(input_ids=ids).logits, ref, rtol=0, atol=0)


def test_target_modules_override_and_bad_override():
    model = _lora_model(target_modules=["q_proj", "v_proj"])
    adapted = {n.rsplit(".", 1)[-1] for n, m in model.base_model.named_modules() if hasattr(m, "lora_A")}
    assert adapted == {"q_proj", "v_proj"}
    with pytest.raises(ConfigError, match="lora.target_modules"):
        _lora_model(target_modules=["no_such_proj"])


def _names(model, group):
    ids = {id(p) for p in group["params"]}
    return {n for n, p in model.named_parameters() if id(p) in ids}


def test_param_groups_lora():
    model = _lora_model()
    groups = {g["name"]: g for g in param_groups(model, lr=1e-4, weight_decay=0.1, lr_multiplier=4.0)}
    assert set(groups) == {"backbone_decay", "heads_decay", "heads_no_decay"}  # LoRA has no biases here
    assert groups["backbone_decay"]["lr"] == 1e-4 and groups["backbone_decay"]["weight_decay"] == 0.1
    assert groups["heads_decay"]["lr"] == pytest.approx(4e-4) and groups["heads_decay"]["weight_decay"] == 0.1
    assert (groups["heads_no_decay"]["lr"] == pytest.approx(4e-4)
            and groups["heads_no_decay"]["weight_decay"] == 0.0)
    assert all("lora_" in n for n in _names(model, groups["backbone_decay"]))
    head_names = {"heads." + n for n, _ in model.heads.named_parameters()}
    assert _names(model, groups["heads_decay"]) | _names(model, groups["heads_no_decay"]) == head_names
    assert _names(model, groups["heads_no_decay"]) == {n for n in head_names if n.endswith(".bias")}
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert set().union(*(_names(model, g) for g in groups.values())) == trainable
    # AdamW accepts them as they are
    opt = torch.optim.AdamW(list(groups.values()))
    assert len(opt.param_groups) == 3


def test_param_groups_full_finetune_split_decay():
    base = tiny_model("gpt2")  # has biases and LayerNorms everywhere
    model = MedusaModel.from_base(base, num_heads=2, num_layers=1)
    setup_full_finetune(model)
    groups = {g["name"]: g for g in param_groups(model, lr=1e-5, weight_decay=0.01, lr_multiplier=4.0)}
    no_decay = _names(model, groups["backbone_no_decay"])
    assert any(".ln_" in n and n.endswith(".weight") for n in no_decay)  # norm weights
    assert any(n.endswith(".bias") for n in no_decay)
    assert all(".ln_" not in n and not n.endswith(".bias") for n in _names(model, groups["backbone_decay"]))
    counted = [id(p) for g in groups.values() for p in g["params"]]
    assert len(counted) == len(set(counted)) == len({id(p) for p in model.parameters()})
    assert groups["backbone_decay"]["lr"] == 1e-5 and groups["heads_decay"]["lr"] == pytest.approx(4e-5)


def _train(model, steps, lambda0=0.2, self_distill=False, reference=None, lr=5e-2):
    ids, labels = batch(96)
    opt = torch.optim.AdamW(param_groups(model, lr=lr, weight_decay=0.0, lr_multiplier=4.0))
    model.train()
    kls = []
    for _ in range(steps):
        teacher = teacher_logits(model, ids, reference=reference) if self_distill else None
        out = model(input_ids=ids)
        loss, metrics = medusa2_loss(out.logits, labels, naive_heads_loss(out.head_logits, labels), lambda0,
                                     teacher_logits=teacher)
        kls.append(metrics.get("distill_kl"))
        loss.backward()
        opt.step()
        opt.zero_grad()
    return kls


def _snapshot(module):
    return {n: p.detach().clone() for n, p in module.named_parameters()}


def test_lora_training_moves_lora_and_heads_only():
    model = _lora_model()
    base_before = {n: p for n, p in _snapshot(model.base_model).items() if "lora_" not in n}
    lora_before = {n: p for n, p in _snapshot(model.base_model).items() if "lora_" in n}
    heads_before = _snapshot(model.heads)
    _train(model, steps=3)
    after = dict(model.base_model.named_parameters())
    for n, p in base_before.items():
        assert torch.equal(after[n], p), f"frozen base weight {n} changed"
    assert all(not torch.equal(after[n], p) for n, p in lora_before.items() if "lora_B" in n)
    for n, p in model.heads.named_parameters():
        assert not torch.equal(p, heads_before[n]), f"head parameter {n} did not move"


def test_self_distill_kl_zero_at_step_zero_then_positive():
    model = _lora_model()
    kls = _train(model, steps=3, lambda0=0.01, self_distill=True)
    assert kls[0] == 0.0
    assert kls[1] > 0.0 and kls[2] > 0.0


def test_full_finetune_with_reference_teacher():
    model = MedusaModel.from_base(tiny_model("llama"), num_heads=2, num_layers=1)
    reference = setup_full_finetune(model, self_distill=True)
    assert reference is not model.base_model and not any(p.requires_grad for p in reference.parameters())
    ref_before = _snapshot(reference)
    base_before = _snapshot(model.base_model)
    kls = _train(model, steps=2, lambda0=0.01, self_distill=True, reference=reference, lr=1e-2)
    assert kls[0] == 0.0 and kls[1] > 0.0
    assert all(torch.equal(p, ref_before[n]) for n, p in reference.named_parameters())
    moved = [n for n, p in model.base_model.named_parameters() if not torch.equal(p, base_before[n])]
    assert len(moved) > len(base_before) // 2


def test_teacher_needs_adapters_or_reference():
    model = MedusaModel.from_base(tiny_model("llama"), num_heads=1)
    with pytest.raises(MedusaError, match="self_distill"):
        teacher_logits(model, batch(96)[0])


def test_teacher_restores_training_mode():
    model = _lora_model(dropout=0.1)
    model.train()
    teacher_logits(model, batch(96)[0])
    assert model.base_model.training
