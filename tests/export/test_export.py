import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from medusa import MedusaModel, MedusaTree
from medusa.cli import main
from medusa.export import export_checkpoint, import_checkpoint

from tiny_models import tiny_model


def _perturb(model, seed=1):
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.heads.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("base") / "llama"
    tiny_model("llama").save_pretrained(path)
    # tokenizer files TGI export must copy (their content is not read by anything here)
    (path / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 64}))
    (path / "special_tokens_map.json").write_text(json.dumps({"eos_token": "</s>"}))
    return path


def _checkpoint(tmp_path, base_dir, num_heads=3, num_layers=2, head_type="linear", dtype=None, tree=None):
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(base_dir)
    model = _perturb(MedusaModel.from_base(base, num_heads=num_heads, num_layers=num_layers,
                                           head_type=head_type, heads_dtype=dtype))
    model.tree = tree
    path = tmp_path / f"ck-{head_type}-{num_heads}x{num_layers}"
    model.save_pretrained(path)
    return path, model


def _ours(path):
    return load_file(str(path / "medusa_heads.safetensors"))


def test_vllm_keys_config_and_values(tmp_path, base_dir):
    ck, _ = _checkpoint(tmp_path, base_dir)
    export_checkpoint(ck, tmp_path / "v", "vllm")
    assert sorted(os.listdir(tmp_path / "v")) == ["config.json", "model.safetensors"]
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


@pytest.mark.parametrize("fmt", ["medusa-v1", "tgi", "tensorrt-llm"])
def test_medusa_v1_family_keys_config_and_values(tmp_path, base_dir, fmt):
    ck, _ = _checkpoint(tmp_path, base_dir, num_heads=2, num_layers=1)
    summary = export_checkpoint(ck, tmp_path / fmt, fmt)
    out = tmp_path / fmt
    tensors = load_file(str(out / "medusa_lm_head.safetensors"))
    assert set(tensors) == {"0.0.linear.weight", "0.0.linear.bias", "0.1.weight",
                            "1.0.linear.weight", "1.0.linear.bias", "1.1.weight"}
    src = _ours(ck)
    for h in range(2):
        assert torch.equal(tensors[f"{h}.0.linear.weight"], src[f"blocks.{h}.0.linear.weight"])
        assert torch.equal(tensors[f"{h}.0.linear.bias"], src[f"blocks.{h}.0.linear.bias"])
        assert torch.equal(tensors[f"{h}.1.weight"], src[f"lm_heads.{h}.weight"])
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["medusa_num_heads"] == 2 and cfg["medusa_num_layers"] == 1
    assert cfg["base_model_name_or_path"] == str(base_dir.resolve())
    assert "architectures" not in cfg  # TGI picks MedusaHeadV1 only without it
    if fmt == "tgi":
        assert summary["tokenizer_files"] == ["tokenizer_config.json", "special_tokens_map.json"]
        for name in summary["tokenizer_files"]:
            assert (out / name).read_bytes() == (base_dir / name).read_bytes()
    else:
        assert summary["tokenizer_files"] == [] and not (out / "tokenizer_config.json").exists()
    if fmt in ("tensorrt-llm", "medusa-v1"):  # official medusa_generate / TensorRT-LLM run.py need the tree
        choices = json.loads(cfg["medusa_choices"])
        assert choices == json.loads((out / "medusa_choices.txt").read_text())
        assert max(len(c) for c in choices) <= 2
        assert cfg.get("max_draft_len") == (len(choices) if fmt == "tensorrt-llm" else None)
        assert cfg.get("num_medusa_heads") == (2 if fmt == "tensorrt-llm" else None)
    else:
        assert "medusa_choices" not in cfg


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


def test_import_official_v01_pt_and_v2_prefixed(tmp_path, base_dir):
    torch.manual_seed(0)
    state = {}
    for h in range(4):
        state[f"{h}.0.linear.weight"] = torch.randn(32, 32, dtype=torch.float16)
        state[f"{h}.0.linear.bias"] = torch.randn(32, dtype=torch.float16)
        state[f"{h}.1.weight"] = torch.randn(96, 32, dtype=torch.float16)
    v01 = tmp_path / "v01"
    v01.mkdir()
    torch.save(state, v01 / "medusa_lm_head.pt")
    # the official vicuna-7b-v1.3 config says 2 heads but ships 4: counts come from the tensors
    (v01 / "config.json").write_text(json.dumps({"medusa_num_heads": 2, "medusa_num_layers": 1,
                                                 "base_model_name_or_path": str(base_dir)}))
    summary = import_checkpoint(v01, tmp_path / "ours1")
    assert summary["num_heads"] == 4 and summary["format"] == "medusa-v1"
    ours = _ours(tmp_path / "ours1")
    for h in range(4):
        assert torch.equal(ours[f"blocks.{h}.0.linear.weight"], state[f"{h}.0.linear.weight"])
        assert torch.equal(ours[f"lm_heads.{h}.weight"], state[f"{h}.1.weight"])
    v2 = tmp_path / "v2"
    v2.mkdir()
    save_file({f"medusa_head.{k}": v for k, v in state.items()}, str(v2 / "medusa_lm_head.safetensors"))
    import_checkpoint(v2, tmp_path / "ours2", base=str(base_dir))
    assert all(torch.equal(a, b) for a, b in zip(_ours(tmp_path / "ours1").values(),
                                                 _ours(tmp_path / "ours2").values()))
    model = MedusaModel.from_pretrained(tmp_path / "ours2")
    assert model.num_heads == 4 and model.heads.blocks[0][0].linear.weight.dtype == torch.float16


def _err(capsys, argv):
    capsys.readouterr()  # drop what the fixtures printed (weight-loading progress bars)
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    return code, err


def test_cli_errors_exit_2(tmp_path, base_dir, capsys):
    ck, _ = _checkpoint(tmp_path, base_dir, num_heads=2, num_layers=1)
    code, err = _err(capsys, ["export", "--format", "onnx", str(ck), str(tmp_path / "o")])
    assert code == 2 and len(err) == 1 and err[0].startswith("error:") and "onnx" in err[0]
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "notes.txt").write_text("hi")
    code, err = _err(capsys, ["export", "--format", "vllm", str(tmp_path / "junk"), str(tmp_path / "o")])
    assert code == 2 and err[0].startswith("error:") and "medusa_config.json" in err[0]
    code, err = _err(capsys, ["import", str(tmp_path / "junk"), str(tmp_path / "o")])
    assert code == 2 and err[0].startswith("error:") and "not a MEDUSA checkpoint" in err[0]
    deep = tmp_path / "deep.json"
    MedusaTree.from_choices([[0], [0, 0], [0, 0, 0]]).to_json(deep)
    code, err = _err(capsys, ["export", "--format", "tensorrt-llm", "--tree", str(deep), str(ck),
                              str(tmp_path / "o")])
    assert code == 2 and err[0].startswith("error:") and "deeper" in err[0]
    assert not (tmp_path / "o").exists()
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".o.")]


def test_cli_export_import(tmp_path, base_dir, capsys):
    ck, _ = _checkpoint(tmp_path, base_dir, num_heads=2, num_layers=1)
    assert main(["export", "--format", "medusa-v1", str(ck), str(tmp_path / "v1")]) == 0
    assert main(["import", str(tmp_path / "v1"), str(tmp_path / "back")]) == 0
    assert "wrote" in capsys.readouterr().out
    assert _ours(ck).keys() == _ours(tmp_path / "back").keys()


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
