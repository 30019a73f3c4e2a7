"""``MedusaModel`` (medusa/modeling/model.py): bit-exact save / load round trips, atomic saves, the strict
loader's errors (missing, extra, mis-shaped tensors; a base that does not fit; corrupt files), and the
forward's head logits."""

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from medusa import CheckpointError, MedusaModel, MedusaTree

from tiny_models import tiny_model


def _trained(model):
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.heads.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model


def test_round_trip_bit_exact(tmp_path):
    base = tiny_model("llama")
    model = _trained(MedusaModel.from_base(base, num_heads=3, num_layers=2))
    model.tree = MedusaTree.from_choices([[0], [1], [0, 0]])
    model.save_pretrained(tmp_path / "ck")
    loaded = MedusaModel.from_pretrained(tmp_path / "ck", base_model=base)
    for (n1, p1), (n2, p2) in zip(model.heads.state_dict().items(), loaded.heads.state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2)
    assert loaded.tree == model.tree
    assert sorted(os.listdir(tmp_path / "ck")) == [".medusa-manifest.json", "medusa_config.json",
                                                   "medusa_heads.safetensors", "tree.json"]


def test_round_trip_bf16_heads(tmp_path):
    base = tiny_model("qwen2")
    model = _trained(MedusaModel.from_base(base, num_heads=2, heads_dtype="bfloat16"))
    model.save_pretrained(tmp_path / "ck")
    loaded = MedusaModel.from_pretrained(tmp_path / "ck", base_model=base)
    assert loaded.config.dtype == "bfloat16"
    for p1, p2 in zip(model.heads.parameters(), loaded.heads.parameters()):
        assert p2.dtype == torch.bfloat16 and torch.equal(p1, p2)


def test_from_pretrained_loads_named_base(tmp_path):
    base = tiny_model("mistral")
    base.save_pretrained(tmp_path / "base")
    reloaded_base = type(base).from_pretrained(tmp_path / "base")
    model = _trained(MedusaModel.from_base(reloaded_base, num_heads=2))
    model.save_pretrained(tmp_path / "ck")
    cfg = json.loads((tmp_path / "ck" / "medusa_config.json").read_text())
    assert cfg["base_model_name_or_path"] == str((tmp_path / "base").resolve())
    loaded = MedusaModel.from_pretrained(tmp_path / "ck")
    ids = torch.randint(3, 90, (1, 6))
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).head_logits, model(input_ids=ids).head_logits)


def test_save_with_base_loads_alone(tmp_path):
    base = tiny_model("phi3")
    model = _trained(MedusaModel.from_base(base, num_heads=2))
    model.save_pretrained(tmp_path / "ck", save_base=True)
    loaded = MedusaModel.from_pretrained(tmp_path / "ck")
    ids = torch.randint(3, 90, (1, 6))
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits)


def test_save_is_atomic_on_failure(tmp_path):
    model = MedusaModel.from_base(tiny_model("llama"), num_heads=2)
    model.save_pretrained(tmp_path / "ck")
    before = (tmp_path / "ck" / "medusa_heads.safetensors").read_bytes()

    class Boom:
        def to_json(self, path):
            raise RuntimeError("disk full")

    model.tree = Boom()
    with torch.no_grad():
        model.heads.lm_heads[0].weight.add_(1)
    with pytest.raises(RuntimeError):
        model.save_pretrained(tmp_path / "ck", overwrite=True)
    assert (tmp_path / "ck" / "medusa_heads.safetensors").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


def test_missing_tensor(saved):
    base, ck = saved
    state = load_file(ck / "medusa_heads.safetensors")
    del state["blocks.1.0.linear.bias"]
    save_file(state, ck / "medusa_heads.safetensors")
    with pytest.raises(CheckpointError, match="missing tensor.*blocks.1.0.linear.bias"):
        MedusaModel.from_pretrained(ck, base_model=base)


def test_extra_tensor(saved):
    base, ck = saved
    state = load_file(ck / "medusa_heads.safetensors")
    state["blocks.2.0.linear.bias"] = torch.zeros(32)
    save_file(state, ck / "medusa_heads.safetensors")
    with pytest.raises(CheckpointError, match="unexpected tensor.*blocks.2.0.linear.bias"):
        MedusaModel.from_pretrained(ck, base_model=base)


def test_wrong_shape(saved):
    base, ck = saved
    state = load_file(ck / "medusa_heads.safetensors")
    state["lm_heads.0.weight"] = torch.zeros(95, 32)
    save_file(state, ck / "medusa_heads.safetensors")
    with pytest.raises(CheckpointError, match=r"lm_heads.0.weight has shape \(95, 32\), expected \(96, 32\)"):
        MedusaModel.from_pretrained(ck, base_model=base)


@pytest.mark.parametrize("key,kwargs,pattern", [
    ("hidden_size", dict(hidden_size=48), "hidden_size is 48 but the heads were trained for 32"),
    ("vocab_size", dict(vocab_size=100), "vocab_size is 100 but the heads were trained for 96"),
])
def test_mismatched_base(saved, key, kwargs, pattern):
    _, ck = saved
    with pytest.raises(CheckpointError, match=pattern):
        MedusaModel.from_pretrained(ck, base_model=tiny_model("llama", **kwargs))


def test_mismatched_model_type(saved):
    _, ck = saved
    with pytest.raises(CheckpointError, match="model_type is 'qwen2' but the heads were trained for 'llama'"):
        MedusaModel.from_pretrained(ck, base_model=tiny_model("qwen2"))


def test_corrupt_weights(saved):
    base, ck = saved
    (ck / "medusa_heads.safetensors").write_bytes(b"\x00garbage" * 10)
    with pytest.raises(CheckpointError, match="corrupt safetensors"):
        MedusaModel.from_pretrained(ck, base_model=base)


def test_not_a_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="not a MEDUSA heads checkpoint"):
        MedusaModel.from_pretrained(tmp_path, base_model=tiny_model("llama"))


@pytest.mark.parametrize("head_type", ["linear", "shared_lm_head", "hydra"])
def test_forward_head_logits_come_from_the_hidden_state_alone_or_none(head_type):
    """``forward`` returns the heads' logits at the hidden state for MEDUSA heads, None for Hydra heads,
    which also read draft tokens (the heads' ``hidden_logits``)."""
    model = MedusaModel.from_base(tiny_model("llama"), num_heads=2, head_type=head_type)
    ids = torch.tensor([[1, 5, 7, 9]])
    with torch.no_grad():
        out = model(ids)
        if head_type == "hydra":
            assert out.head_logits is None and model(ids, compute_heads=False).head_logits is None
        else:
            assert torch.equal(out.head_logits, model.heads(out.hidden_states))  # [K, B, T, V]
            assert out.head_logits.shape == (2, 1, 4, 96)
            assert model(ids, compute_heads=False).head_logits is None
