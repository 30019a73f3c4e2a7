"""--format speculators (medusa.export.speculators): eagle3 heads -> the speculators eagle3 layout vLLM 0.32
reads: config keys, tensor names, fc blocks in ascending layer order, d2t offsets / t2d, the base's input
embeddings as embed_tokens.weight in the heads' dtype (left out on request), MEDUSA heads refused."""

import json

import pytest
import torch
from safetensors.torch import load_file

from medusa import MedusaModel
from medusa.errors import CheckpointError, MedusaError
from medusa.export import export_checkpoint
from medusa.modeling.heads_file import pack_heads_file

from tiny_models import tiny_model


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("base") / "llama"
    tiny_model("llama", layers=4).save_pretrained(path)  # 4 layers: three distinct feature layers
    return path


def _eagle3(tmp_path, base_dir, feature_layers, token_map=None, heads_dtype=None):
    model = MedusaModel.from_base(str(base_dir), num_heads=3, head_type="eagle3",
                                  feature_layers=feature_layers, token_map=token_map, heads_dtype=heads_dtype)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.heads.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(tmp_path / "heads")
    return tmp_path / "heads", model


def test_speculators_config_and_tensors(tmp_path, base_dir):
    V = MedusaModel.from_base(str(base_dir), num_heads=1).config.vocab_size
    tm = torch.arange(0, V, 2)[: V // 4].flip(0)  # every other id, unsorted as training's frequency order
    src, model = _eagle3(tmp_path, base_dir, [2, 0, 3], token_map=tm)
    summary = export_checkpoint(src, tmp_path / "spec", "speculators")
    cfg = json.loads((tmp_path / "spec" / "config.json").read_text())
    assert cfg["speculators_model_type"] == "eagle3" and cfg["draft_vocab_size"] == len(tm)
    assert cfg["norm_before_residual"] is False  # vLLM would default it to True
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [0, 2, 3]
    spec = cfg["speculators_config"]
    assert spec["proposal_methods"][0]["speculative_tokens"] == 3
    assert spec["verifier"]["name_or_path"] == summary["backbone"] == str(base_dir.resolve())
    layer = cfg["transformer_layer_config"]
    assert layer["num_hidden_layers"] == 1 and layer["vocab_size"] == V and layer["model_type"] == "llama"
    state = load_file(tmp_path / "spec" / "model.safetensors")
    ours = model.heads.state_dict()
    assert "token_map" not in state
    embed = model.base_model.get_input_embeddings().weight  # [V, d]: what our drafter embeds tokens with
    assert state["embed_tokens.weight"].shape == (V, embed.shape[1])
    assert torch.equal(state["embed_tokens.weight"], embed.detach())
    # target = draft + d2t[draft], ascending (speculators: draft id k = the k-th smallest target id)
    assert torch.equal(state["d2t"] + torch.arange(len(tm)), tm.sort().values)
    # lm_head rows follow: the exported drafter's logit of each target id is ours
    assert torch.equal(state["lm_head.weight"], ours["lm_head.weight"].flip(0))
    assert state["t2d"].dtype == torch.bool and int(state["t2d"].sum()) == len(tm) and state["t2d"][tm].all()
    d = ours["fc.weight"].shape[0]
    blocks = ours["fc.weight"].split(d, dim=1)  # ours: layers 2, 0, 3 -> written 0, 2, 3
    assert torch.equal(state["fc.weight"], torch.cat([blocks[1], blocks[0], blocks[2]], dim=1))
    for name in ours:
        if name not in ("fc.weight", "token_map", "lm_head.weight"):
            assert torch.equal(state[name], ours[name]), name
    assert set(state) == set(ours) - {"token_map"} | {"d2t", "t2d", "embed_tokens.weight"}
    assert summary["embed_tokens"] is True
    assert summary["commands"][0].startswith(f"vllm serve {tmp_path / 'spec'}")


def test_full_vocabulary_eagle3_has_no_mapping(tmp_path, base_dir):
    src, _ = _eagle3(tmp_path, base_dir, None)
    export_checkpoint(src, tmp_path / "spec", "speculators")
    state = load_file(tmp_path / "spec" / "model.safetensors")
    assert "d2t" not in state and "t2d" not in state  # vLLM has no parameter for d2t when N == V


def test_embeddings_in_the_heads_dtype_or_left_out(tmp_path, base_dir):
    src, model = _eagle3(tmp_path, base_dir, None, heads_dtype=torch.bfloat16)
    export_checkpoint(src, tmp_path / "spec", "speculators")
    state = load_file(tmp_path / "spec" / "model.safetensors")
    embed = model.base_model.get_input_embeddings().weight.detach()  # float32 base
    assert state["embed_tokens.weight"].dtype == state["lm_head.weight"].dtype == torch.bfloat16
    assert torch.equal(state["embed_tokens.weight"], embed.to(torch.bfloat16))
    summary = export_checkpoint(src, tmp_path / "small", "speculators", embed_tokens=False)
    small = load_file(tmp_path / "small" / "model.safetensors")
    assert summary["embed_tokens"] is False and set(small) == set(state) - {"embed_tokens.weight"}
    for name in small:
        assert torch.equal(small[name], state[name]), name
    with pytest.raises(MedusaError, match="--no-embed-tokens applies to --format speculators only"):
        export_checkpoint(src, tmp_path / "v", "vllm", embed_tokens=False)
    assert not (tmp_path / "v").exists()


@pytest.mark.parametrize("head_type", ["linear", "hydra"])
def test_other_heads_are_refused(tmp_path, base_dir, head_type):
    model = MedusaModel.from_base(str(base_dir), num_heads=2, head_type=head_type)
    model.save_pretrained(tmp_path / "m")
    with pytest.raises(CheckpointError, match=f"eagle3 heads .this checkpoint's is '{head_type}'"):
        export_checkpoint(tmp_path / "m", tmp_path / "spec", "speculators")
    assert not (tmp_path / "spec").exists()


def test_embeddings_read_alone_from_the_bases_safetensors(tmp_path, base_dir, monkeypatch):
    from safetensors.torch import save_file

    from medusa.export import speculators as spec

    base = MedusaModel.from_base(str(base_dir), num_heads=1).base_model
    embed = base.get_input_embeddings().weight.detach()  # [V, d]
    assert torch.equal(spec.embeddings_from_files(str(base_dir)), embed)  # one model.safetensors
    sharded = tmp_path / "sharded"  # an index naming the shard that holds the table
    sharded.mkdir()
    save_file({"model.embed_tokens.weight": embed.clone()}, sharded / "model-00002-of-00002.safetensors")
    (sharded / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"model.embed_tokens.weight": "model-00002-of-00002.safetensors",
                        "lm_head.weight": "model-00001-of-00002.safetensors"}}))
    assert torch.equal(spec.embeddings_from_files(str(sharded)), embed)
    assert spec.embeddings_from_files(str(tmp_path / "no-such-dir")) is None  # e.g. a hub id: load the base
    (sharded / "model.safetensors.index.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"index.json: cannot read the base.s input embeddings"):
        spec.embeddings_from_files(str(sharded))
    monkeypatch.setattr(spec, "load_base_model", lambda _: pytest.fail("the base was loaded whole"))
    assert torch.equal(spec.verifier_embeddings(str(base_dir), embed.shape[0], torch.bfloat16),
                       embed.to(torch.bfloat16))


def test_file_values_are_checked_before_any_tensor_is_written(tmp_path, base_dir):
    """--tree / --with-backbone do not apply; a token map past the vocabulary, a reordered fc, NaN weights
    and feature layers past the base's depth are one CheckpointError naming the file, nothing written."""
    from safetensors.torch import save_file

    V = MedusaModel.from_base(str(base_dir), num_heads=1).config.vocab_size
    src, _ = _eagle3(tmp_path, base_dir, [0, 1, 2], token_map=torch.arange(5, 25))
    with pytest.raises(MedusaError, match="--tree does not apply to --format speculators"):
        export_checkpoint(src, tmp_path / "spec", "speculators", tree=str(tmp_path / "tree.json"))
    with pytest.raises(MedusaError, match="--with-backbone does not apply"):
        export_checkpoint(src, tmp_path / "spec", "speculators", with_backbone=True)
    state = load_file(src / "medusa_heads.safetensors")
    d = state["fc.weight"].shape[0]
    past = state["token_map"].clone().index_fill_(0, torch.tensor([0]), V)  # an id past the vocabulary
    cases = {"token_map": (past, "ids must lie in"),
             "fc.weight": (state["fc.weight"].T.reshape(3 * d, d).contiguous(), "fc.weight is"),
             "norm.weight": (torch.full_like(state["norm.weight"], float("nan")), "holds NaN")}
    for name, (bad, needle) in cases.items():
        save_file({**state, name: bad}, str(src / "medusa_heads.safetensors"))
        with pytest.raises(CheckpointError, match=needle):
            export_checkpoint(src, tmp_path / "spec", "speculators")
    save_file(state, str(src / "medusa_heads.safetensors"))
    cfg = json.loads((src / "medusa_config.json").read_text())
    (src / "medusa_config.json").write_text(json.dumps({**cfg, "feature_layers": [0, 1, 9]}))
    with pytest.raises(CheckpointError, match=r"feature_layers \[0, 1, 9\] lie outside the base's hidden"):
        export_checkpoint(src, tmp_path / "spec", "speculators")
    assert not (tmp_path / "spec").exists()


def test_a_packed_drafter_exports_the_same_bytes(tmp_path, base_dir):
    """Shipped drafters are xz-compressed (medusa/modeling/heads_file.py): exported as the plain file."""
    src, _ = _eagle3(tmp_path, base_dir, [0, 2, 3], heads_dtype="bfloat16")
    export_checkpoint(src, tmp_path / "plain", "speculators")
    pack_heads_file(src)
    export_checkpoint(src, tmp_path / "packed", "speculators")
    for name in ("config.json", "model.safetensors"):
        assert (tmp_path / "packed" / name).read_bytes() == (tmp_path / "plain" / name).read_bytes(), name
