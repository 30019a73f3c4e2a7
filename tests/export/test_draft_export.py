"""Exports of heads with a draft vocabulary: vLLM's truncated_vocab_size / token_map, errors elsewhere."""

import json

import pytest
import torch
from engine_loaders import vllm_load
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from medusa import MedusaModel
from medusa.errors import MedusaError
from medusa.export import export_checkpoint, import_checkpoint
from medusa.modeling.base import lm_head_of

from tiny_models import tiny_model

N = 40


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("base") / "llama"
    tiny_model("llama").save_pretrained(path)
    return path


def _draft_checkpoint(tmp_path, base_dir, head_type="linear", num_heads=3, num_layers=2):
    base = AutoModelForCausalLM.from_pretrained(base_dir)
    tm = torch.randperm(base.config.vocab_size, generator=torch.Generator().manual_seed(3))[:N]
    model = MedusaModel.from_base(base, num_heads=num_heads, num_layers=num_layers, head_type=head_type,
                                  token_map=tm)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.heads.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    path = tmp_path / f"ck-{head_type}"
    model.save_pretrained(path)
    return path, model, tm


@pytest.mark.parametrize("head_type", ["linear", "shared_lm_head"])
def test_vllm_export_writes_truncated_vocab_and_token_map(tmp_path, base_dir, head_type):
    src, model, tm = _draft_checkpoint(tmp_path, base_dir, head_type)
    export_checkpoint(src, tmp_path / "vllm", "vllm", base=str(base_dir))
    cfg = json.loads((tmp_path / "vllm" / "config.json").read_text())
    V, d = model.config.vocab_size, model.config.hidden_size
    assert cfg["vocab_size"] == V and cfg["truncated_vocab_size"] == N and cfg["hidden_size"] == d
    shared = head_type == "shared_lm_head"
    assert cfg["num_heads"] == 3 and cfg["num_hidden_layers"] == 2 and cfg["original_lm_head"] is shared
    state = load_file(tmp_path / "vllm" / "model.safetensors")
    expected = {f"blocks.{i}.layers.{j}.{p}" for i in range(3) for j in range(2) for p in ("weight", "bias")}
    lm_names = ["lm_head.weight"] if shared else [f"lm_heads.{i}.weight" for i in range(3)]
    assert set(state) == expected | set(lm_names) | {"token_map"}
    assert state["token_map"].dtype == torch.int64 and torch.equal(state["token_map"], tm)
    for name in lm_names:
        assert state[name].shape == (N, d)
    if shared:  # the draft vocabulary's rows of the base LM head, written once
        assert torch.equal(state["lm_head.weight"], lm_head_of(model.base_model).weight[tm])
    hidden = torch.randn(2, 5, d)
    with torch.no_grad():
        ours = model.heads(hidden)
    engine = vllm_load(tmp_path / "vllm", target=str(base_dir))  # vLLM's loader: token_map scatter, -inf
    assert engine.info["num_speculative_tokens"] == 3
    torch.testing.assert_close(engine.heads(hidden), ours, rtol=1e-5, atol=1e-5)


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


@pytest.mark.parametrize("fmt", ["medusa-v1", "tensorrt-llm", "tgi"])
@pytest.mark.parametrize("head_type", ["linear", "shared_lm_head"])
def test_formats_without_a_draft_vocab_refuse_it(tmp_path, base_dir, fmt, head_type):
    src, _, _ = _draft_checkpoint(tmp_path, base_dir, head_type, num_layers=1)
    with pytest.raises(MedusaError, match=f"--format {fmt} cannot express a draft vocabulary "
                                          rf"\(heads.draft_vocab: {N}\)"):
        export_checkpoint(src, tmp_path / "out", fmt, base=str(base_dir))
    assert not (tmp_path / "out").exists()
