"""medusa.export.backbone: which backbone an export records (the config's base, a MEDUSA-2 checkpoint's merged
one, a copy of it beside the heads, or --base) and where the server finds the tokenizer. No model is loaded:
the directories only hold the files that are looked at."""

import pytest

from medusa.errors import CheckpointError, MedusaError
from medusa.export.backbone import BACKBONE_DIR, resolve_backbone, write_backbone
from medusa.modeling.config import MedusaConfig


def _config(base: str, subdir: str | None = None) -> MedusaConfig:
    return MedusaConfig(base_model_name_or_path=base, base_model_type="llama", hidden_size=8, vocab_size=16,
                        base_model_subdir=subdir)


def _model_dir(path, tokenizer: bool):
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    if tokenizer:
        (path / "tokenizer.json").write_text("{}")
    return path


def test_medusa1_heads_record_the_config_base(tmp_path):
    base = _model_dir(tmp_path / "base", tokenizer=True)
    b = resolve_backbone(tmp_path / "ck", _config(str(base)), tmp_path / "out")
    here = base.resolve()
    assert (b.path, b.source, b.tokenizer, b.tokenizer_dir) == (str(here), "config", str(here), here)
    assert b.copy_from is None and "base_model_name_or_path" in b.description
    hub = resolve_backbone(tmp_path / "ck", _config("org/model"), tmp_path / "out")
    assert (hub.path, hub.tokenizer, hub.tokenizer_dir) == ("org/model", "org/model", None)  # a hub id
    bare = _model_dir(tmp_path / "bare", tokenizer=False)
    assert resolve_backbone(tmp_path / "ck", _config(str(bare)), tmp_path / "out").tokenizer is None


def test_medusa2_heads_record_their_merged_backbone(tmp_path):
    base = _model_dir(tmp_path / "base", tokenizer=True)
    merged = _model_dir(tmp_path / "ck" / "base_model", tokenizer=False)
    b = resolve_backbone(tmp_path / "ck", _config(str(base), "base_model"), tmp_path / "out")
    assert (b.path, b.source) == (str(merged.resolve()), "merged")
    assert b.tokenizer == str(base.resolve())  # saved without tokenizer files: the original base's
    _model_dir(tmp_path / "ck2" / "base_model", tokenizer=True)
    own = resolve_backbone(tmp_path / "ck2", _config("org/model", "base_model"), tmp_path / "out")
    assert own.tokenizer == str((tmp_path / "ck2" / "base_model").resolve())
    given = resolve_backbone(tmp_path / "ck", _config(str(base), "base_model"), tmp_path / "out",
                             base="org/other")
    assert (given.path, given.source, given.tokenizer) == ("org/other", "base", "org/other")
    (tmp_path / "ck3" / "base_model").mkdir(parents=True)  # no config.json: no model there
    with pytest.raises(CheckpointError, match="base_model_subdir 'base_model' but .* holds no model"):
        resolve_backbone(tmp_path / "ck3", _config(str(base), "base_model"), tmp_path / "out")


def test_with_backbone_copies_the_merged_one_and_its_tokenizer(tmp_path):
    base = _model_dir(tmp_path / "base", tokenizer=True)
    merged = _model_dir(tmp_path / "ck" / "base_model", tokenizer=False)
    (merged / "model.safetensors").write_bytes(b"merged weights")
    out = tmp_path / "out"
    b = resolve_backbone(tmp_path / "ck", _config(str(base), "base_model"), out, with_backbone=True)
    copied = str(out.resolve() / BACKBONE_DIR)  # where the export renamed into place will hold it
    assert (b.path, b.source, b.copy_from) == (copied, "merged-copy", merged.resolve())
    assert b.tokenizer == b.path  # the copy gets the tokenizer files
    tmp = tmp_path / "staging"
    tmp.mkdir()
    write_backbone(b, tmp)
    copied = tmp / BACKBONE_DIR
    assert (copied / "model.safetensors").read_bytes() == b"merged weights"
    assert (copied / "tokenizer.json").is_file() and not (merged / "tokenizer.json").exists()
    nothing = tmp_path / "nothing"
    nothing.mkdir()
    write_backbone(resolve_backbone(tmp_path / "ck", _config(str(base)), out), nothing)  # no copy asked
    assert list(nothing.iterdir()) == []


def test_with_backbone_needs_a_merged_backbone_and_no_base(tmp_path):
    with pytest.raises(MedusaError, match="has no merged backbone .* its heads belong to 'org/model'"):
        resolve_backbone(tmp_path / "ck", _config("org/model"), tmp_path / "out", with_backbone=True)
    with pytest.raises(MedusaError, match="--base names another backbone"):
        resolve_backbone(tmp_path / "ck", _config("org/model", "base_model"), tmp_path / "out", base="x",
                         with_backbone=True)
