import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from medusa import CheckpointError, MedusaModel, MedusaTree

from tiny_models import STORIES, require_shared, tiny_model


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
    assert sorted(os.listdir(tmp_path / "ck")) == ["medusa_config.json",
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


@pytest.fixture
def saved(tmp_path):
    base = tiny_model("llama")
    MedusaModel.from_base(base, num_heads=2, num_layers=1).save_pretrained(tmp_path / "ck")
    return base, tmp_path / "ck"


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


def test_corrupt_config(saved):
    base, ck = saved
    (ck / "medusa_config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="medusa_config.json: corrupt JSON"):
        MedusaModel.from_pretrained(ck, base_model=base)


def test_unknown_config_key(saved):
    base, ck = saved
    cfg = json.loads((ck / "medusa_config.json").read_text())
    cfg["num_hedas"] = 3
    (ck / "medusa_config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="unknown key.*num_hedas"):
        MedusaModel.from_pretrained(ck, base_model=base)


def test_not_a_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="not a MEDUSA heads checkpoint"):
        MedusaModel.from_pretrained(tmp_path, base_model=tiny_model("llama"))


def _cli(*args, cwd=None):
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "medusa", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=300)


def test_cli_heads_init_and_info(tmp_path):
    require_shared(STORIES)
    out = tmp_path / "heads"
    r = _cli("heads", "init", "--base", str(STORIES), "--num-heads", "3", "--num-layers", "2",
             "--out", str(out))
    assert r.returncode == 0, r.stderr
    r = _cli("info", str(out))
    assert r.returncode == 0, r.stderr
    assert "3 x 2 ResBlock(s)" in r.stdout and "stories260K" in r.stdout and "llama" in r.stdout
    params = 3 * 2 * (64 * 64 + 64) + 3 * 512 * 64
    assert f"{params:,}" in r.stdout
    r = _cli("info", str(out), "--json")
    assert json.loads(r.stdout)["parameters"] == params


@pytest.mark.parametrize("flag,expected", [([], "own"), (["--hydra-projection", "own"], "own"),
                                           (["--hydra-projection", "shared_lm_head"], "shared_lm_head")])
def test_cli_heads_init_hydra_projection(tmp_path, capsys, flag, expected):
    from medusa.cli import main

    tiny_model("llama").save_pretrained(tmp_path / "base")
    out = tmp_path / "heads"
    assert main(["heads", "init", "--base", str(tmp_path / "base"), "--num-heads", "2",
                 "--head-type", "hydra", *flag, "--out", str(out)]) == 0
    assert f"(hydra, projection: {expected})" in capsys.readouterr().out
    assert json.loads((out / "medusa_config.json").read_text())["hydra_projection"] == expected
    loaded = MedusaModel.from_pretrained(out)
    assert loaded.config.hydra_projection == expected
    assert (loaded.heads.lm_heads is None) == (expected == "shared_lm_head")
    state = load_file(str(out / "medusa_heads.safetensors"))
    assert any(k.startswith("lm_heads.") for k in state) == (expected == "own")


@pytest.mark.parametrize("head_type", ["linear", "shared_lm_head"])
def test_cli_heads_init_hydra_projection_needs_hydra(tmp_path, capsys, head_type):
    from medusa.cli import main

    tiny_model("llama").save_pretrained(tmp_path / "base")
    capsys.readouterr()  # drop save_pretrained's progress bar
    code = main(["heads", "init", "--base", str(tmp_path / "base"), "--head-type", head_type,
                 "--hydra-projection", "own", "--out", str(tmp_path / "o")])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: --hydra-projection own only applies "
                                                                 "to --head-type hydra")
    assert head_type in lines[0] and not (tmp_path / "o").exists()


def test_cli_bad_path_exit_2(tmp_path):
    r = _cli("info", str(tmp_path / "nope"))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "nope" in lines[0]
    r = _cli("--debug", "info", str(tmp_path / "nope"))
    assert r.returncode != 0 and "Traceback" in r.stderr


def test_cli_bad_base_exit_2(tmp_path):
    r = _cli("heads", "init", "--base", str(tmp_path / "missing_model"), "--num-heads", "2",
             "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith("error:")
    assert not (tmp_path / "o").exists()
