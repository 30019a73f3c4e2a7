"""``medusa export`` / ``medusa import`` user errors: one ``error:`` line, exit 2, nothing written."""

import os

import pytest
from export_helpers import checkpoint as _checkpoint
from export_helpers import save_tiny_base

from medusa import MedusaTree
from medusa.cli import main


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    return save_tiny_base(tmp_path_factory.mktemp("base") / "llama")


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
    code, err = _err(capsys, ["export", "--format", "vllm", "--no-embed-tokens", str(ck),
                              str(tmp_path / "o")])
    assert code == 2 and len(err) == 1 and "--no-embed-tokens applies to --format speculators only" in err[0]
    code, err = _err(capsys, ["export", "--format", "gguf", str(ck), str(tmp_path / "o")])
    assert code == 2 and len(err) == 1 and err[0].startswith("error:") and "llama.cpp has no MEDUSA" in err[0]
    code, err = _err(capsys, ["export", "--format", "gguf", "--base-precision", "bf16", str(ck),
                              str(tmp_path / "o")])
    assert code == 2 and len(err) == 1 and "--base-precision applies with --with-base only" in err[0]
    code, err = _err(capsys, ["export", "--format", "vllm", "--with-base", str(ck), str(tmp_path / "o")])
    assert code == 2 and len(err) == 1 and "--with-base applies to --format gguf only" in err[0]
    assert not (tmp_path / "o").exists()
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".o.")]


def test_cli_export_prints_the_layout_backbone_and_commands(tmp_path, base_dir, capsys):
    ck, _ = _checkpoint(tmp_path, base_dir, num_heads=2, num_layers=1, head_type="shared_lm_head")
    capsys.readouterr()
    assert main(["export", "--format", "vllm", str(ck), str(tmp_path / "v")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (f"wrote {tmp_path / 'v'} (vllm): 2 heads x 1 layer(s), W2 materialised from the base "
                        "LM head once (original_lm_head: one lm_head.weight shared by all heads)")
    assert lines[1] == (f"backbone: {base_dir.resolve()} (the base model the checkpoint was trained on (its "
                        f"base_model_name_or_path); tokenizer: {base_dir.resolve()})")
    assert lines[2] == "load it with:" and lines[3].startswith(f"  vllm serve {base_dir.resolve()} ")
