"""eagle3 heads: the speculators tensor names, the base's own layer class with 2d-wide q/k/v, the feature
layers, strict round trips with and without a draft vocabulary, refusals, and the draft layer's KV cache
agreeing with one pass over the whole sequence."""

import json

import pytest
import torch

from medusa import CheckpointError, MedusaModel
from medusa.modeling.eagle3 import DraftKV, base_features, default_feature_layers

from tiny_models import tiny_model

NAMES = {"fc.weight", "norm.weight", "lm_head.weight", "layers.0.input_layernorm.weight",
         "layers.0.hidden_norm.weight", "layers.0.post_attention_layernorm.weight",
         "layers.0.self_attn.q_proj.weight", "layers.0.self_attn.k_proj.weight",
         "layers.0.self_attn.v_proj.weight", "layers.0.self_attn.o_proj.weight",
         "layers.0.mlp.gate_proj.weight", "layers.0.mlp.up_proj.weight", "layers.0.mlp.down_proj.weight"}


def _causal(b, t, dtype=torch.float32):
    allowed = torch.ones(t, t, dtype=torch.bool).tril()
    return torch.zeros(b, 1, t, t, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)


def test_tensor_names_shapes_and_nothing_of_the_base():
    base = tiny_model("llama", layers=4)
    model = MedusaModel.from_base(base, num_heads=3, head_type="eagle3")
    state = model.heads.state_dict()
    assert set(state) == NAMES  # the speculators eagle3 names; no embedding, no base tensor
    d = 32
    assert state["fc.weight"].shape == (d, 3 * d)
    assert state["layers.0.self_attn.q_proj.weight"].shape[1] == 2 * d
    assert state["layers.0.self_attn.k_proj.weight"].shape[1] == 2 * d
    assert state["lm_head.weight"].shape == (96, d)
    assert torch.equal(state["lm_head.weight"], base.lm_head.weight)  # initialised from the base LM head
    assert type(model.heads.layers[0]) is type(base.model.layers[0])
    assert model.config.feature_layers == [1, 2, 3]
    assert not any(p is q for p in model.heads.parameters() for q in base.parameters())


@pytest.mark.parametrize("n, want", [(30, (2, 15, 27)), (8, (2, 4, 5)), (5, (1, 2, 4)), (2, (1, 1, 1))])
def test_default_feature_layers(n, want):
    assert default_feature_layers(n) == want


def test_round_trip_with_draft_vocab(tmp_path):
    base = tiny_model("llama", layers=4)
    token_map = torch.tensor([5, 9, 2, 40, 77, 13])
    model = MedusaModel.from_base(base, num_heads=2, head_type="eagle3", token_map=token_map,
                                  feature_layers=[0, 1, 3])
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.heads.parameters():
            p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(tmp_path / "ck")
    config = json.loads((tmp_path / "ck" / "medusa_config.json").read_text())
    assert config["head_type"] == "eagle3" and config["feature_layers"] == [0, 1, 3]
    assert config["draft_vocab"] == 6
    back = MedusaModel.from_pretrained(tmp_path / "ck", base_model=base)
    assert back.heads.feature_layers == (0, 1, 3)
    for k, v in model.heads.state_dict().items():
        assert torch.equal(v, back.heads.state_dict()[k]), k
    assert torch.equal(back.heads.token_map, token_map)
    assert model.heads.lm_head.weight.shape == (6, 32)


def test_strict_load_refuses_a_missing_tensor(tmp_path):
    from safetensors.torch import load_file, save_file

    base = tiny_model("llama", layers=4)
    MedusaModel.from_base(base, num_heads=2, head_type="eagle3").save_pretrained(tmp_path / "ck")
    path = tmp_path / "ck" / "medusa_heads.safetensors"
    state = load_file(path)
    del state["layers.0.hidden_norm.weight"]
    save_file(state, path)
    with pytest.raises(CheckpointError, match="hidden_norm"):
        MedusaModel.from_pretrained(tmp_path / "ck", base_model=base)


def test_feature_layers_out_of_range_and_unsupported_layer():
    with pytest.raises(ValueError, match="outside"):
        MedusaModel.from_base(tiny_model("llama", layers=2), num_heads=2, head_type="eagle3",
                              feature_layers=[0, 1, 2])
    with pytest.raises(ValueError, match="Llama-style"):
        MedusaModel.from_base(tiny_model("gemma2"), num_heads=2, head_type="eagle3")
    with pytest.raises(ValueError, match="cannot find the decoder layers"):
        MedusaModel.from_base(tiny_model("gpt2"), num_heads=2, head_type="eagle3")


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_cache_equals_one_pass(arch):
    """Entries appended in pieces through the drafter's KV cache give the outputs of one causal pass."""
    base = tiny_model(arch, layers=3)
    heads = MedusaModel.from_base(base, num_heads=2, head_type="eagle3").heads
    torch.manual_seed(0)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(0.2 * torch.randn_like(p))
    ids = torch.randint(3, 96, (2, 9))
    feats = base_features(base, ids, None, heads.feature_layers)  # [2, 9, 3d]
    pos = torch.arange(1, 10).expand(2, 9)
    with torch.no_grad():
        whole = heads.layer(heads.embed(ids), heads.fuse(feats), pos, _causal(2, 9), DraftKV())
        cache, parts = DraftKV(), []
        for lo, hi in ((0, 4), (4, 5), (5, 9)):
            s = cache.get_seq_length()
            allowed = torch.ones(hi - lo, s + hi - lo, dtype=torch.bool)
            allowed[:, s:] = torch.ones(hi - lo, hi - lo, dtype=torch.bool).tril()
            mask = torch.zeros(2, 1, hi - lo, s + hi - lo)
            mask = mask.masked_fill(~allowed, torch.finfo(torch.float32).min)
            parts.append(heads.layer(heads.embed(ids[:, lo:hi]), heads.fuse(feats[:, lo:hi]), pos[:, lo:hi],
                                     mask, cache))
    torch.testing.assert_close(torch.cat(parts, dim=1), whole, atol=1e-5, rtol=1e-5)
    assert cache.get_seq_length() == 9
    cache.truncate(4)
    assert cache.get_seq_length() == 4
