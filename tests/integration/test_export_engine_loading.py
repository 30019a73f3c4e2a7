"""Every export loads in its engine (tests/helpers/engine_loaders.py: the engines' loading logic, CPU-only)
with the documented command and no other flag, on the backbone the heads were trained for (a MEDUSA-2
checkpoint's merged one), and gives our head logits: linear and shared_lm_head heads, 1 and 2 ResBlocks."""

import json
import shlex
from pathlib import Path

import pytest
import torch
from engine_loaders import (
    official_load,
    save_tiny_tokenizer,
    tgi_load,
    trt_convert,
    trt_from_hugging_face,
    vllm_load,
)
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from medusa import MedusaModel
from medusa.cli import main
from medusa.errors import CheckpointError, MedusaError
from medusa.export import export_checkpoint

from tiny_models import tiny_model

IDS = torch.tensor([[1, 5, 9, 17, 33, 60, 7]])
# name: (head_type, num_heads, num_layers, MEDUSA-2 merged backbone)
VARIANTS = {"m1-linear-2L": ("linear", 3, 2, False), "m1-shared-1L": ("shared_lm_head", 3, 1, False),
            "m2-linear-2L": ("linear", 3, 2, True), "m2-shared-1L": ("shared_lm_head", 3, 1, True),
            "m2-shared-2L": ("shared_lm_head", 2, 2, True), "m2-linear-1L": ("linear", 3, 1, True)}


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("base") / "llama"
    tiny_model("llama").save_pretrained(path)
    save_tiny_tokenizer(path, 96)
    return path


def _make(path, base_dir, head_type, num_heads, num_layers, merged, tokenizer=True, same_layers=False):
    base = AutoModelForCausalLM.from_pretrained(base_dir)
    torch.manual_seed(num_heads * 10 + num_layers)
    if merged:  # stands for the fine-tuned (LoRA-merged) backbone MEDUSA-2 trains: other weights, same shapes
        with torch.no_grad():
            for p in base.parameters():
                p.add_(torch.randn_like(p) * 0.05)
    model = MedusaModel.from_base(base, num_heads=num_heads, num_layers=num_layers, head_type=head_type)
    with torch.no_grad():
        for p in model.heads.parameters():
            p.add_(torch.randn_like(p) * 0.1)
        if same_layers:  # what an imported official [ResBlock] * L head holds
            for blocks in model.heads.blocks:
                for block in blocks[1:]:
                    block.load_state_dict(blocks[0].state_dict())
    tok = AutoTokenizer.from_pretrained(base_dir) if merged and tokenizer else None
    model.save_pretrained(path, save_base=merged, tokenizer=tok)
    return path, model


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, base_dir):
    root = tmp_path_factory.mktemp("ck")
    return {name: _make(root / name, base_dir, *spec) for name, spec in VARIANTS.items()}


def _backbone_of(name, ck, base_dir):
    return str(ck / "base_model") if VARIANTS[name][3] else str(base_dir.resolve())


def _check_served(model, backbone, engine_heads, base=None, atol=1e-5):
    """The engine's backbone is the one the heads were trained for; its hidden states through the engine's
    heads give our head logits (for as many heads as both have: official MEDUSA builds 5)."""
    base = base if base is not None else AutoModelForCausalLM.from_pretrained(backbone)
    with torch.no_grad():
        assert torch.equal(base(input_ids=IDS).logits, model.base_model(input_ids=IDS).logits)
        hidden = base.model(input_ids=IDS).last_hidden_state  # [1, T, d]
        ours = model.heads(hidden)[:, 0]  # [K, T, V]
        got = engine_heads(hidden[0])
    k = min(got.shape[0], ours.shape[0])
    torch.testing.assert_close(got[:k].float(), ours[:k], rtol=1e-5, atol=atol)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_vllm_serves_with_the_head_count(tmp_path, base_dir, checkpoints, name):
    ck, model = checkpoints[name]
    summary = export_checkpoint(ck, tmp_path / "vllm", "vllm")
    argv = shlex.split(summary["commands"][0])
    assert argv[:2] == ["vllm", "serve"] and len(argv) == 5
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec == {"method": "medusa", "model": str(tmp_path / "vllm"),
                    "num_speculative_tokens": model.num_heads}
    engine = vllm_load(Path(spec["model"]), target=argv[2])
    assert engine.info["num_speculative_tokens"] == engine.num_heads == model.num_heads
    assert argv[2] == summary["backbone"] == _backbone_of(name, ck, base_dir)
    _check_served(model, argv[2], engine.heads)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_tgi_serves_the_recorded_backbone_and_tokenizer(tmp_path, base_dir, checkpoints, name):
    ck, model = checkpoints[name]
    summary = export_checkpoint(ck, tmp_path / "tgi", "tgi")
    launch = ["text-generation-launcher", "--model-id", str(tmp_path / "tgi")]
    assert shlex.split(summary["commands"][0]) == launch
    engine = tgi_load(tmp_path / "tgi")
    head_type, k, n, merged = VARIANTS[name]
    assert engine.info["layout"] == ("v2" if head_type == "shared_lm_head" and n == 1 else "v1")
    assert engine.backbone == summary["backbone"] == _backbone_of(name, ck, base_dir)
    assert summary["backbone_source"] == ("merged" if merged else "config")
    # the router's tokenizer: the backbone's own files, copied beside the heads
    assert Path(engine.tokenizer).read_bytes() == (Path(engine.backbone) / "tokenizer.json").read_bytes()
    _check_served(model, engine.backbone, engine.heads, base=engine.info["base"])


@pytest.mark.parametrize("name", ["m1-linear-2L", "m2-shared-2L", "m2-linear-1L"])
def test_tensorrt_llm_printed_convert_command_builds_our_heads(tmp_path, base_dir, checkpoints, name):
    ck, model = checkpoints[name]
    summary = export_checkpoint(ck, tmp_path / "trt", "tensorrt-llm")
    engine = trt_convert(summary["commands"][0])
    _, k, n, _ = VARIANTS[name]
    assert engine.info["engine_config"]["num_medusa_heads"] == k
    assert engine.info["engine_config"]["num_medusa_layers"] == n and engine.info["unused_weights"] == []
    assert engine.info["engine_config"]["max_draft_len"] == summary["tree_nodes"] - 1
    assert engine.backbone == _backbone_of(name, ck, base_dir)
    assert trt_from_hugging_face(tmp_path / "trt") == (k, n)
    _check_served(model, engine.backbone, engine.heads)
    # the same converter without the flags: its defaults (4 heads x 1 layer) do not fit these heads
    bare = shlex.split(summary["commands"][0])
    for flag in ("--num_medusa_heads", "--num_medusa_layers", "--max_medusa_token_len"):
        i = bare.index(flag)
        del bare[i:i + 2]
    with pytest.raises(KeyError):
        trt_convert(shlex.join(bare))


@pytest.mark.parametrize("name", ["m1-shared-1L", "m2-linear-1L", "m2-shared-1L"])
def test_official_medusa_loads_medusa_v1(tmp_path, base_dir, checkpoints, name):
    ck, model = checkpoints[name]
    summary = export_checkpoint(ck, tmp_path / "v1", "medusa-v1")
    out = tmp_path / "v1"
    pt = torch.load(out / "medusa_lm_head.pt", weights_only=True)
    st = load_file(str(out / "medusa_lm_head.safetensors"))
    assert pt.keys() == st.keys() and all(torch.equal(pt[key], st[key]) for key in pt)
    engine = official_load(out)
    assert engine.num_heads == 5 and engine.info["unexpected"] == []
    assert sorted(engine.info["missing"]) == sorted(f"{h}.{p}" for h in range(3, 5)
                                                    for p in ("0.linear.weight", "0.linear.bias", "1.weight"))
    assert engine.backbone == summary["backbone"] == _backbone_of(name, ck, base_dir)
    _check_served(model, engine.backbone, engine.heads, base=engine.info["base"])
    choices = json.loads((out / "medusa_choices.txt").read_text())  # what medusa_generate must be given
    assert max(len(c) for c in choices) == summary["tree_depth"] <= 3
    note = summary["notes"][0]
    assert "builds 5 heads" in note and "heads 4..5 stay randomly initialised" in note
    legacy = official_load(out, legacy=True)  # medusa_model_legacy.py builds medusa_num_heads heads
    assert legacy.num_heads == 3 and legacy.info["missing"] == []
    _check_served(model, legacy.backbone, legacy.heads, base=legacy.info["base"])


def test_medusa_v1_refuses_distinct_resblocks_and_takes_identical_ones(tmp_path, base_dir, checkpoints):
    ck, _ = checkpoints["m1-linear-2L"]
    with pytest.raises(CheckpointError, match=r"head 0's 2 different ResBlocks .*\[ResBlock\(d\)\] \* "
                                              r"medusa_num_layers, one module repeated"):
        export_checkpoint(ck, tmp_path / "v1", "medusa-v1")
    assert not (tmp_path / "v1").exists()
    ck, model = _make(tmp_path / "same", base_dir, "linear", 2, 2, False, same_layers=True)
    export_checkpoint(ck, tmp_path / "v1", "medusa-v1")
    engine = official_load(tmp_path / "v1")
    _check_served(model, engine.backbone, engine.heads, base=engine.info["base"])


def test_medusa_v1_with_more_heads_than_official_builds(tmp_path, base_dir):
    ck, model = _make(tmp_path / "six", base_dir, "linear", 6, 1, False)
    summary = export_checkpoint(ck, tmp_path / "v1", "medusa-v1")
    engine = official_load(tmp_path / "v1")
    assert engine.info["missing"] == [] and sorted(engine.info["unexpected"]) == [
        "5.0.linear.bias", "5.0.linear.weight", "5.1.weight"]
    assert summary["tree_depth"] <= 5 and "ignores heads 6..6" in summary["notes"][0]
    _check_served(model, engine.backbone, engine.heads, base=engine.info["base"])
    deep = tmp_path / "deep.json"
    deep.write_text(json.dumps([[0] * d for d in range(1, 7)]))  # a chain of depth 6
    with pytest.raises(MedusaError, match="deeper than the 5 heads official MEDUSA builds"):
        export_checkpoint(ck, tmp_path / "v1b", "medusa-v1", tree=deep)


def test_with_backbone_writes_the_merged_backbone_beside_the_heads(tmp_path, base_dir, checkpoints):
    ck, model = checkpoints["m2-shared-2L"]
    summary = export_checkpoint(ck, tmp_path / "tgi", "tgi", with_backbone=True)
    copied = (tmp_path / "tgi" / "base_model").resolve()
    assert summary["backbone"] == str(copied) and summary["backbone_source"] == "merged-copy"
    assert summary["tokenizer"] == str(copied) and (copied / "tokenizer.json").is_file()
    engine = tgi_load(tmp_path / "tgi")
    assert engine.backbone == str(copied)
    _check_served(model, engine.backbone, engine.heads, base=engine.info["base"])
    ck1, _ = checkpoints["m1-linear-2L"]
    with pytest.raises(MedusaError, match="has no merged backbone"):
        export_checkpoint(ck1, tmp_path / "x", "tgi", with_backbone=True)
    assert not (tmp_path / "x").exists()


def test_merged_backbone_saved_without_tokenizer_takes_the_original_one(tmp_path, base_dir):
    ck, _ = _make(tmp_path / "notok", base_dir, "linear", 2, 1, True, tokenizer=False)
    assert not (ck / "base_model" / "tokenizer.json").exists()
    summary = export_checkpoint(ck, tmp_path / "tgi", "tgi")
    assert summary["backbone"] == str(ck / "base_model") and summary["tokenizer"] == str(base_dir.resolve())
    assert (tmp_path / "tgi" / "tokenizer.json").read_bytes() == (base_dir / "tokenizer.json").read_bytes()
    vllm = export_checkpoint(ck, tmp_path / "vllm", "vllm")["commands"][0]
    assert shlex.split(vllm)[-2:] == ["--tokenizer", str(base_dir.resolve())]


def test_cli_prints_backbone_and_full_convert_command(tmp_path, checkpoints, capsys):
    ck, _ = checkpoints["m2-linear-2L"]
    capsys.readouterr()
    assert main(["export", "--format", "tensorrt-llm", str(ck), str(tmp_path / "trt")]) == 0
    out = capsys.readouterr().out
    assert f"backbone: {ck / 'base_model'} (the merged MEDUSA-2 backbone inside the checkpoint" in out
    nodes = len(json.loads((tmp_path / "trt" / "medusa_choices.txt").read_text()))
    assert f"--num_medusa_heads 3 --num_medusa_layers 2 --max_medusa_token_len {nodes}" in out
    cfg = json.loads((tmp_path / "trt" / "config.json").read_text())
    assert cfg["base_model_name_or_path"] == str(ck / "base_model") and cfg["num_medusa_heads"] == 3
