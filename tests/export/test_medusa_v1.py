"""The official MEDUSA layouts (medusa.export.medusa_v1): version 1 (medusa-v1 / TensorRT-LLM / TGI
MedusaHeadV1) keys, config and values, official v0.1 ``.pt`` and prefixed imports; version 2 heads (ResBlocks
only, logits through the base LM head): import and TGI export.

The official module is re-implemented here independently of medusa.modeling (FasterDecoding/Medusa
train_legacy.py since "Creating medusa2"): ``ResBlock = x + SiLU(Linear(x))``, a head is
``Sequential(*[ResBlock(d)] * L)`` (one module repeated), logits = base ``lm_head(head(h))``.
"""

import json

import pytest
import torch
from export_helpers import checkpoint as _checkpoint
from export_helpers import heads_tensors as _ours
from export_helpers import perturb, save_tiny_base
from safetensors.torch import load_file, save_file
from torch import nn

from medusa import MedusaModel
from medusa.cli import main
from medusa.errors import CheckpointError
from medusa.export import export_checkpoint, import_checkpoint


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    return save_tiny_base(tmp_path_factory.mktemp("base") / "llama")


class OfficialResBlock(nn.Module):
    def __init__(self, hidden_size):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)
        self.act = nn.SiLU()

    def forward(self, x):
        return x + self.act(self.linear(x))


def official_v2_heads(num_heads, num_layers, hidden_size=32, seed=0):
    torch.manual_seed(seed)
    heads = nn.ModuleList([nn.Sequential(*([OfficialResBlock(hidden_size)] * num_layers))
                           for _ in range(num_heads)])
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return heads


def write_official_v2(path, heads, num_layers, base_dir, pt=False):
    """What train_legacy.py writes: medusa_head.state_dict() + MedusaConfig(..., version="2")."""
    path.mkdir()
    if pt:
        torch.save(heads.state_dict(), path / "medusa_lm_head.pt")
    else:
        save_file(heads.state_dict(), str(path / "medusa_lm_head.safetensors"))
    (path / "config.json").write_text(json.dumps({
        "base_model_name_or_path": str(base_dir), "medusa_num_heads": len(heads),
        "medusa_num_layers": num_layers, "transformers_version": "4.39.0", "version": "2"}))
    return path


def _hidden(base):
    ids = torch.tensor([[1, 5, 9, 17, 33, 60]])
    with torch.no_grad():
        return base.model(input_ids=ids).last_hidden_state  # [1, T, d]


def _assert_same_logits(official, base, ours_dir):
    model = MedusaModel.from_pretrained(ours_dir, base_model=base)
    assert model.config.head_type == "shared_lm_head" and model.heads.lm_heads is None
    hidden = _hidden(base)
    with torch.no_grad():
        # expected: [K, 1, T, V]
        expected = torch.stack([base.lm_head(official[k](hidden)) for k in range(len(official))])
        batched = model.heads(hidden)
        per_head = torch.stack([model.heads.head_logits(k, hidden) for k in range(len(official))])
    assert per_head.dtype == torch.float32 and torch.equal(per_head, expected)
    assert torch.allclose(batched, expected, rtol=0, atol=1e-6)  # baddbmm path


def test_import_official_v2_safetensors(tmp_path, base_dir):
    from transformers import AutoModelForCausalLM

    official = official_v2_heads(3, 1)
    src = write_official_v2(tmp_path / "v2", official, 1, base_dir)
    assert sorted(load_file(str(src / "medusa_lm_head.safetensors"))) == sorted(
        f"{h}.0.linear.{w}" for h in range(3) for w in ("weight", "bias"))
    summary = import_checkpoint(src, tmp_path / "ours")
    assert (summary["format"], summary["num_heads"], summary["num_layers"]) == ("medusa-v2", 3, 1)
    cfg = json.loads((tmp_path / "ours" / "medusa_config.json").read_text())
    assert (cfg["head_type"], cfg["vocab_size"], cfg["hidden_size"],
            cfg["dtype"]) == ("shared_lm_head", 96, 32,
                                                                                      "float32")
    ours = load_file(str(tmp_path / "ours" / "medusa_heads.safetensors"))
    assert sorted(ours) == sorted(f"blocks.{h}.0.linear.{w}" for h in range(3) for w in ("weight", "bias"))
    base = AutoModelForCausalLM.from_pretrained(base_dir)
    _assert_same_logits(official, base, tmp_path / "ours")


def test_import_official_v2_cli(tmp_path, base_dir, capsys):
    from transformers import AutoModelForCausalLM

    official = official_v2_heads(2, 1, seed=3)
    src = write_official_v2(tmp_path / "v2", official, 1, base_dir)
    capsys.readouterr()
    assert main(["import", str(src), str(tmp_path / "ours")]) == 0
    out = capsys.readouterr().out
    assert "from medusa-v2" in out and "2 heads x 1 layer(s)" in out
    _assert_same_logits(official, AutoModelForCausalLM.from_pretrained(base_dir), tmp_path / "ours")


def test_import_official_v2_repeated_resblock(tmp_path, base_dir):
    """num_layers=2: the official head repeats ONE ResBlock (only a .pt can hold the shared tensors)."""
    from transformers import AutoModelForCausalLM

    official = official_v2_heads(2, 2, seed=5)
    with pytest.raises(RuntimeError):  # why a v2 file with L > 1 cannot be a safetensors file
        save_file(official.state_dict(), str(tmp_path / "shared.safetensors"))
    src = write_official_v2(tmp_path / "v2", official, 2, base_dir, pt=True)
    import_checkpoint(src, tmp_path / "ours")
    ours = load_file(str(tmp_path / "ours" / "medusa_heads.safetensors"))
    for h in range(2):
        assert torch.equal(ours[f"blocks.{h}.0.linear.weight"], ours[f"blocks.{h}.1.linear.weight"])
    _assert_same_logits(official, AutoModelForCausalLM.from_pretrained(base_dir), tmp_path / "ours")
    model = MedusaModel.from_pretrained(tmp_path / "ours", base_model=str(base_dir))
    block = model.heads.blocks[0]
    assert block[0].linear.weight.data_ptr() != block[1].linear.weight.data_ptr()  # distinct layers


def _v2_state(num_heads=2):
    official = official_v2_heads(num_heads, 1)
    return {k: v.detach().clone() for k, v in official.state_dict().items()}


def test_import_v2_inconsistent_files_are_errors(tmp_path, base_dir):
    state = _v2_state()
    state["1.1.weight"] = torch.randn(96, 32)  # head 1 has a W2 (version 1), head 0 does not
    d = tmp_path / "mixed"
    d.mkdir()
    save_file(state, str(d / "medusa_lm_head.safetensors"))
    with pytest.raises(CheckpointError, match=r"heads \[1\] have a W2 .* heads \[0\] do not"):
        import_checkpoint(d, tmp_path / "o", base=str(base_dir))

    state = _v2_state()
    del state["1.0.linear.bias"]
    d = tmp_path / "nobias"
    d.mkdir()
    save_file(state, str(d / "medusa_lm_head.safetensors"))
    with pytest.raises(CheckpointError, match=r"head 1 layer 0 has \['linear.weight'\].*'1.0.linear.bias'"):
        import_checkpoint(d, tmp_path / "o", base=str(base_dir))

    d = write_official_v2(tmp_path / "layers", official_v2_heads(2, 1), 1, base_dir)
    (d / "config.json").write_text(json.dumps({"medusa_num_heads": 2, "medusa_num_layers": 2, "version": "2",
                                               "base_model_name_or_path": str(base_dir)}))
    with pytest.raises(CheckpointError, match="medusa_num_layers is 2 but the version-2 heads .* 1 ResBlock"):
        import_checkpoint(d, tmp_path / "o")

    d = write_official_v2(tmp_path / "hidden", official_v2_heads(2, 1, hidden_size=16), 1, base_dir)
    with pytest.raises(CheckpointError, match="hidden_size 32 but the heads .* have 16"):
        import_checkpoint(d, tmp_path / "o")
    assert not (tmp_path / "o").exists()


def _shared_checkpoint(tmp_path, base_dir, num_layers):
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(base_dir)
    model = MedusaModel.from_base(base, num_heads=3, num_layers=num_layers, head_type="shared_lm_head")
    perturb(model, seed=7, scale=0.2)
    path = tmp_path / f"shared-{num_layers}"
    model.save_pretrained(path)
    return path, model


def test_tgi_export_of_shared_heads_is_medusa_v2(tmp_path, base_dir):
    ck, model = _shared_checkpoint(tmp_path, base_dir, num_layers=1)
    summary = export_checkpoint(ck, tmp_path / "tgi", "tgi")
    assert summary["layout"] == "medusa-v2" and summary["materialised_lm_head"] is False
    out = tmp_path / "tgi"
    cfg = json.loads((out / "config.json").read_text())
    assert cfg == {"medusa_num_heads": 3, "medusa_num_layers": 1, "version": "2",
                   "base_model_name_or_path": str(base_dir.resolve())}  # no "architectures": TGI's path
    tensors = load_file(str(out / "medusa_lm_head.safetensors"))
    assert sorted(tensors) == sorted(f"{i}.0.linear.{w}" for i in range(3) for w in ("weight", "bias"))
    # TGI MedusaHeadV2: one column-parallel linear over the heads' concatenated W1/b, then the base lm_head
    w = torch.cat([tensors[f"{i}.0.linear.weight"] for i in range(3)], dim=0)  # [K * d, d]
    b = torch.cat([tensors[f"{i}.0.linear.bias"] for i in range(3)], dim=0)  # [K * d]
    hidden = _hidden(model.base_model)[0]  # [T, d]
    with torch.no_grad():
        res = nn.functional.silu(nn.functional.linear(hidden, w, b)).reshape(hidden.shape[0], 3, 32)
        tgi_logits = model.base_model.lm_head(hidden.unsqueeze(-2) + res)  # [T, K, V]
        ours = torch.stack([model.heads.head_logits(k, hidden) for k in range(3)], dim=1)  # [T, K, V]
    assert torch.allclose(tgi_logits, ours, rtol=0, atol=1e-5)
    # round trip: export -> import gives the same shared_lm_head heads, bit for bit
    assert import_checkpoint(out, tmp_path / "back")["format"] == "medusa-v2"
    a = load_file(str(ck / "medusa_heads.safetensors"))
    b = load_file(str(tmp_path / "back" / "medusa_heads.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    back_cfg = json.loads((tmp_path / "back" / "medusa_config.json").read_text())
    assert (back_cfg["head_type"], back_cfg["num_heads"], back_cfg["num_layers"]) == ("shared_lm_head", 3, 1)


def test_tgi_export_of_deeper_shared_heads_falls_back_to_v1(tmp_path, base_dir, capsys):
    ck, model = _shared_checkpoint(tmp_path, base_dir, num_layers=2)
    capsys.readouterr()
    assert main(["export", "--format", "tgi", str(ck), str(tmp_path / "tgi")]) == 0
    assert "W2 materialised from the base LM head" in capsys.readouterr().out
    cfg = json.loads((tmp_path / "tgi" / "config.json").read_text())
    assert cfg["medusa_num_layers"] == 2 and "version" not in cfg and "architectures" not in cfg
    tensors = load_file(str(tmp_path / "tgi" / "medusa_lm_head.safetensors"))
    lm = model.base_model.get_output_embeddings().weight
    for i in range(3):
        assert torch.equal(tensors[f"{i}.2.weight"], lm)
    import_checkpoint(tmp_path / "tgi", tmp_path / "back")  # MedusaHeadV1 layout -> linear heads
    back = MedusaModel.from_pretrained(tmp_path / "back", base_model=model.base_model)
    hidden = _hidden(model.base_model)
    with torch.no_grad():
        for k in range(3):
            assert torch.equal(back.heads.head_logits(k, hidden), model.heads.head_logits(k, hidden))


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
