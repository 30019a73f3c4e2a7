"""vLLM's Medusa layout (medusa.export.vllm): keys, config and values; the shared LM head written once;
importing original_lm_head files; draft vocabularies as full-vocabulary rows (the draft rows scattered, the
others their mean) that vLLM's loader takes unmodified and that give the same top-1 draft, read back."""

import json
import os

import pytest
import torch
from engine_loaders import vllm_load
from export_helpers import DRAFT_N as N
from export_helpers import checkpoint as _checkpoint
from export_helpers import draft_checkpoint as _draft_checkpoint
from export_helpers import heads_tensors as _ours
from export_helpers import save_tiny_base
from safetensors.torch import load_file, save_file

from medusa import MedusaModel
from medusa.export import export_checkpoint, import_checkpoint
from medusa.modeling.base import lm_head_of


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    return save_tiny_base(tmp_path_factory.mktemp("base") / "llama")


@pytest.mark.parametrize("head_type", ["linear", "shared_lm_head"])
def test_vllm_export_writes_full_vocab_rows_with_the_same_top1(tmp_path, base_dir, head_type):
    src, model, tm = _draft_checkpoint(tmp_path, base_dir, head_type)
    export_checkpoint(src, tmp_path / "vllm", "vllm", base=str(base_dir))
    cfg = json.loads((tmp_path / "vllm" / "config.json").read_text())
    V, d = model.config.vocab_size, model.config.hidden_size
    # vLLM 0.32 refuses a truncated vocabulary (its loader never reports token_map loaded): full rows
    assert cfg["vocab_size"] == V and cfg["truncated_vocab_size"] == V and cfg["draft_vocab_size"] == N
    shared = head_type == "shared_lm_head"
    assert cfg["num_heads"] == 3 and cfg["num_hidden_layers"] == 2 and cfg["original_lm_head"] is shared
    state = load_file(tmp_path / "vllm" / "model.safetensors")
    expected = {f"blocks.{i}.layers.{j}.{p}" for i in range(3) for j in range(2) for p in ("weight", "bias")}
    lm_names = ["lm_head.weight"] if shared else [f"lm_heads.{i}.weight" for i in range(3)]
    assert set(state) == expected | set(lm_names) | {"token_map"}  # token_map: ignored by vLLM, ours
    assert state["token_map"].dtype == torch.int64 and torch.equal(state["token_map"], tm)
    others = torch.ones(V, dtype=torch.bool)
    others[tm] = False
    for name in lm_names:
        assert state[name].shape == (V, d)
        mean = state[name][tm].float().mean(0).to(state[name].dtype)
        assert torch.equal(state[name][others], mean.expand(int(others.sum()), d))
    if shared:  # the draft vocabulary's rows of the base LM head, written once
        assert torch.equal(state["lm_head.weight"][tm], lm_head_of(model.base_model).weight[tm])
    hidden = torch.randn(2, 5, d)
    with torch.no_grad():
        ours = model.heads(hidden)  # [K, 2, 5, V], -inf outside the draft vocabulary
    engine = vllm_load(tmp_path / "vllm", target=str(base_dir))  # vLLM's loading rules
    assert engine.info["num_speculative_tokens"] == 3
    theirs = engine.heads(hidden)
    torch.testing.assert_close(theirs[..., tm], ours[..., tm], rtol=1e-5, atol=1e-5)
    assert torch.equal(theirs.argmax(-1), ours.argmax(-1))  # vLLM's Medusa proposer takes the top-1


@pytest.mark.parametrize("head_type", ["linear", "shared_lm_head"])
def test_vllm_round_trip_keeps_the_map(tmp_path, base_dir, head_type):
    src, model, tm = _draft_checkpoint(tmp_path, base_dir, head_type)
    export_checkpoint(src, tmp_path / "vllm", "vllm")
    import_checkpoint(tmp_path / "vllm", tmp_path / "back", base=str(base_dir))
    back = MedusaModel.from_pretrained(tmp_path / "back", base_model=model.base_model)
    assert back.config.draft_vocab == N and torch.equal(back.heads.token_map, tm)
    hidden = torch.randn(3, model.config.hidden_size)
    with torch.no_grad():
        # linear: bit-identical. Shared heads project all K heads in ONE matmul ([K * M, d] @ W2^T), the
        # imported linear ones head by head: same tensors, other blocking -> float rounding, hence 1e-6
        atol = 0 if head_type == "linear" else 1e-6
        torch.testing.assert_close(back.heads(hidden), model.heads(hidden), rtol=0, atol=atol)


def test_vllm_keys_config_and_values(tmp_path, base_dir):
    ck, _ = _checkpoint(tmp_path, base_dir)
    export_checkpoint(ck, tmp_path / "v", "vllm")
    assert sorted(os.listdir(tmp_path / "v")) == [".medusa-manifest.json", "config.json", "model.safetensors"]
    cfg = json.loads((tmp_path / "v" / "config.json").read_text())
    assert cfg["model_type"] == "medusa" and cfg["architectures"] == ["MedusaModel"]
    assert (cfg["num_heads"], cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"],
            cfg["truncated_vocab_size"], cfg["medusa_fc_bias"], cfg["original_lm_head"]) == (3, 2, 32, 96, 96,
                                                                                          True, False)
    # vLLM's MedusaConfig.from_pretrained renames every key holding "num" + "heads" / "layers": only ours may
    renamed = {k for k in cfg if "num" in k and ("heads" in k or "layers" in k)}
    assert renamed == {"num_heads", "num_hidden_layers"}
    tensors = load_file(str(tmp_path / "v" / "model.safetensors"))
    expected = {f"blocks.{k}.layers.{l}.{w}" for k in range(3) for l in range(2) for w in ("weight", "bias")}
    expected |= {f"lm_heads.{k}.weight" for k in range(3)}
    assert set(tensors) == expected
    src = _ours(ck)
    for k in range(3):
        assert torch.equal(tensors[f"lm_heads.{k}.weight"], src[f"lm_heads.{k}.weight"])
        for l in range(2):
            assert torch.equal(tensors[f"blocks.{k}.layers.{l}.weight"], src[f"blocks.{k}.{l}.linear.weight"])
            assert torch.equal(tensors[f"blocks.{k}.layers.{l}.bias"], src[f"blocks.{k}.{l}.linear.bias"])


def test_shared_lm_head_is_written_once_for_vllm(tmp_path, base_dir):
    ck, model = _checkpoint(tmp_path, base_dir, num_heads=3, num_layers=2, head_type="shared_lm_head")
    summary = export_checkpoint(ck, tmp_path / "v", "vllm")
    assert (summary["layout"], summary["materialised_lm_head"], summary["lm_head_copies"]) == (
        "vllm-original-lm-head", True, 1)
    cfg = json.loads((tmp_path / "v" / "config.json").read_text())
    assert cfg["original_lm_head"] is True and cfg["truncated_vocab_size"] == cfg["vocab_size"] == 96
    tensors = load_file(str(tmp_path / "v" / "model.safetensors"))
    blocks = {f"blocks.{k}.layers.{l}.{p}" for k in range(3) for l in range(2) for p in ("weight", "bias")}
    assert set(tensors) == blocks | {"lm_head.weight"}  # ONE LM head, vLLM's shared lm_head parameter
    assert torch.equal(tensors["lm_head.weight"], model.base_model.get_output_embeddings().weight)
    # and importing gives linear heads that compute what the shared ones did
    import_checkpoint(tmp_path / "v", tmp_path / "back")
    back = MedusaModel.from_pretrained(tmp_path / "back", base_model=model.base_model)
    assert back.config.head_type == "linear"
    hidden = torch.randn(1, 4, 32)
    with torch.no_grad():
        assert torch.equal(back.heads(hidden), model.heads(hidden))


@pytest.mark.parametrize("name", ["lm_head.weight", "lm_heads.0.weight"])
def test_import_vllm_original_lm_head(tmp_path, base_dir, name):
    ck, _ = _checkpoint(tmp_path, base_dir, num_heads=2, num_layers=1)
    export_checkpoint(ck, tmp_path / "v", "vllm")
    tensors = load_file(str(tmp_path / "v" / "model.safetensors"))
    shared = torch.randn(96, 32)
    for k in range(2):
        del tensors[f"lm_heads.{k}.weight"]
    tensors[name] = shared
    save_file(tensors, str(tmp_path / "v" / "model.safetensors"))
    cfg = json.loads((tmp_path / "v" / "config.json").read_text())
    (tmp_path / "v" / "config.json").write_text(json.dumps({**cfg, "original_lm_head": True}))
    import_checkpoint(tmp_path / "v", tmp_path / "back")
    back = _ours(tmp_path / "back")
    assert all(torch.equal(back[f"lm_heads.{k}.weight"], shared) for k in range(2))
