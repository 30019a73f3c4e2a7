"""medusa.export: export_checkpoint / import_checkpoint across formats — the tree written, bit-exact round
trips, the summary's layout and W2 copies, refusals (Hydra heads, draft vocabularies outside vLLM, ...),
notes, and an output never half-written."""

import json
import os

import pytest
import torch
from export_helpers import DRAFT_N as N
from export_helpers import checkpoint as _checkpoint
from export_helpers import draft_checkpoint as _draft_checkpoint
from export_helpers import heads_tensors as _ours
from export_helpers import save_tiny_base
from safetensors.torch import load_file

from medusa import MedusaModel, MedusaTree
from medusa.errors import CheckpointError, MedusaError
from medusa.export import EXPORT_FORMATS, export_checkpoint, import_checkpoint

from tiny_models import tiny_model


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    return save_tiny_base(tmp_path_factory.mktemp("base") / "llama")


def test_tensorrt_llm_uses_calibrated_tree(tmp_path, base_dir):
    tree = MedusaTree.from_choices([[0], [1], [0, 0], [0, 1], [1, 0]], num_heads=2)
    ck, _ = _checkpoint(tmp_path, base_dir, num_heads=2, num_layers=1, tree=tree)
    export_checkpoint(ck, tmp_path / "trt", "tensorrt-llm")
    text = (tmp_path / "trt" / "medusa_choices.txt").read_text().strip()
    assert text == "[[0], [1], [0, 0], [0, 1], [1, 0]]"


@pytest.mark.parametrize("fmt", ["medusa-v1", "vllm", "tensorrt-llm"])
def test_round_trip_bit_exact(tmp_path, base_dir, fmt):
    layers = 1 if fmt == "medusa-v1" else 2  # official MEDUSA repeats ONE ResBlock: distinct ones refused
    ck, model = _checkpoint(tmp_path, base_dir, num_heads=3, num_layers=layers, dtype="bfloat16")
    export_checkpoint(ck, tmp_path / "exp", fmt)
    import_checkpoint(tmp_path / "exp", tmp_path / "back")
    a, b = _ours(ck), _ours(tmp_path / "back")
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].dtype == b[key].dtype == torch.bfloat16 and torch.equal(a[key], b[key])
    cfg_a = json.loads((ck / "medusa_config.json").read_text())
    cfg_b = json.loads((tmp_path / "back" / "medusa_config.json").read_text())
    for key in ("base_model_name_or_path", "base_model_type", "hidden_size", "vocab_size", "num_heads",
                "num_layers", "head_type", "dtype"):
        assert cfg_a[key] == cfg_b[key], key
    back = MedusaModel.from_pretrained(tmp_path / "back")
    for p1, p2 in zip(model.heads.parameters(), back.heads.parameters()):
        assert torch.equal(p1, p2)
    if fmt != "vllm":  # the tree travels in config.json
        assert back.tree is not None and len(back.tree) == 64


def test_linear_vllm_export_and_per_head_formats_keep_one_w2_per_head(tmp_path, base_dir):
    ck, _ = _checkpoint(tmp_path, base_dir, num_heads=2, num_layers=1)
    summary = export_checkpoint(ck, tmp_path / "v", "vllm")
    assert (summary["layout"], summary["materialised_lm_head"], summary["lm_head_copies"]) == (
        "vllm", False, 2)
    tensors = load_file(str(tmp_path / "v" / "model.safetensors"))
    assert {k for k in tensors if "lm_head" in k} == {"lm_heads.0.weight", "lm_heads.1.weight"}
    ck, model = _checkpoint(tmp_path, base_dir, num_heads=2, num_layers=2, head_type="shared_lm_head")
    summary = export_checkpoint(ck, tmp_path / "v1", "tensorrt-llm")
    assert (summary["layout"], summary["lm_head_copies"]) == ("medusa-v1", 2)
    tensors = load_file(str(tmp_path / "v1" / "medusa_lm_head.safetensors"))
    lm = model.base_model.get_output_embeddings().weight
    assert all(torch.equal(tensors[f"{k}.2.weight"], lm) for k in range(2))


def test_out_never_half_written(tmp_path, base_dir, monkeypatch):
    import medusa.export as export_mod

    ck, _ = _checkpoint(tmp_path, base_dir, num_heads=2, num_layers=1)
    export_checkpoint(ck, tmp_path / "out", "vllm")
    before = {p: (tmp_path / "out" / p).read_bytes() for p in os.listdir(tmp_path / "out")}

    def failing(heads, out, choices=None, target="medusa-v1"):
        (out / "medusa_lm_head.safetensors").write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(export_mod, "write_v1", failing)
    with pytest.raises(OSError):
        export_checkpoint(ck, tmp_path / "out", "medusa-v1", overwrite=True)
    assert {p: (tmp_path / "out" / p).read_bytes() for p in os.listdir(tmp_path / "out")} == before
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".out.")]


@pytest.mark.parametrize("fmt", ["medusa-v1", "tensorrt-llm", "tgi"])
@pytest.mark.parametrize("head_type", ["linear", "shared_lm_head"])
def test_formats_without_a_draft_vocab_refuse_it(tmp_path, base_dir, fmt, head_type):
    src, _, _ = _draft_checkpoint(tmp_path, base_dir, head_type, num_layers=1)
    with pytest.raises(MedusaError, match=f"--format {fmt} cannot express a draft vocabulary "
                                          rf"\(heads.draft_vocab: {N}\)"):
        export_checkpoint(src, tmp_path / "out", fmt, base=str(base_dir))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("format", [f for f in EXPORT_FORMATS if f not in ("speculators", "gguf")])
def test_export_refuses_hydra_heads(tmp_path, format):
    model = MedusaModel.from_base(tiny_model("llama"), num_heads=2, head_type="hydra")
    model.save_pretrained(tmp_path / "ck")
    with pytest.raises(CheckpointError) as err:
        export_checkpoint(tmp_path / "ck", tmp_path / "out", format)
    message = str(err.value)
    assert "'hydra'" in message and format in message and "linear or shared_lm_head" in message
    assert not (tmp_path / "out").exists()


def test_medusa_v1_names_the_backbones_official_medusa_serves(tmp_path):
    model = MedusaModel.from_base(tiny_model("qwen2"), num_heads=2, num_layers=1)
    model.save_pretrained(tmp_path / "ck")
    summary = export_checkpoint(tmp_path / "ck", tmp_path / "v1", "medusa-v1")
    assert "official MEDUSA serves llama and mistral backbones only (this one is qwen2)" in summary["notes"]
