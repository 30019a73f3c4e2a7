"""medusa.manifest: who wrote which names of an output folder. A command's --overwrite owns only its own
kind's entries (a converted model's or an export's files are never a heads checkpoint's), a manifest without
a kind owns nothing, and a listed folder holding a file added since is not ours whole."""

from __future__ import annotations

import json

import pytest

from medusa.errors import MedusaError
from medusa.io import atomic_directory
from medusa.manifest import MANIFEST_NAME, owned_now, read_full, record_in_manifest, stamp


def _write(out, kind, names):
    with atomic_directory(out, overwrite=True, kind=kind) as tmp:
        for name in names:
            (tmp / name).write_text(f"{kind} {name}")


def _files(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_another_kinds_files_are_never_replaced_or_removed(tmp_path):
    out = tmp_path / "model"
    _write(out, "model", ["config.json", "model.safetensors", "tokenizer.json"])
    assert read_full(out)[0] == "model"
    before = _files(tmp_path)
    with pytest.raises(MedusaError, match="config.json: exists and was not written by medusa"):
        _write(out, "export", ["config.json"])
    assert _files(tmp_path) == before
    _write(out, "heads", ["medusa_config.json"])  # no collision: added, the model's files all kept
    assert (out / "tokenizer.json").read_text() == "model tokenizer.json"
    assert (out / "medusa_config.json").exists()


def test_a_manifest_without_a_kind_owns_nothing(tmp_path):
    out = tmp_path / "old"
    out.mkdir()
    (out / "config.json").write_text("converted")
    (out / MANIFEST_NAME).write_text(json.dumps({"entries": {"config.json": stamp(out / "config.json")}}))
    assert owned_now(out, "export") == {}
    with pytest.raises(MedusaError, match="was not written by medusa"):
        _write(out, "export", ["config.json"])
    record_in_manifest(out, ["config.json"], kind="heads")  # not rewritten: it stays unowned
    assert read_full(out)[0] is None and (out / "config.json").read_text() == "converted"


def test_a_listed_folder_with_a_file_added_since_is_kept(tmp_path):
    out = tmp_path / "out"
    with atomic_directory(out, kind="export") as tmp:
        (tmp / "base_model").mkdir()
        (tmp / "base_model" / "w.bin").write_text("old")
        (tmp / "config.json").write_text("old")
    (out / "base_model" / "note.txt").write_text("the user's")
    with atomic_directory(out, overwrite=True, kind="export") as tmp:  # base_model not written: not stale
        (tmp / "config.json").write_text("new")
    assert (out / "base_model" / "note.txt").read_text() == "the user's"
    with pytest.raises(MedusaError, match="base_model: exists and was not written by medusa"):
        with atomic_directory(out, overwrite=True, kind="export") as tmp:
            (tmp / "base_model").mkdir()
    assert (out / "base_model" / "note.txt").read_text() == "the user's"


def test_corrupt_or_deep_manifests_own_nothing(tmp_path):
    (tmp_path / MANIFEST_NAME).write_text("[" * 100000 + "]" * 100000)
    assert read_full(tmp_path) == (None, {}, {})
    (tmp_path / MANIFEST_NAME).write_text(json.dumps({"kind": "heads", "entries": {"../x": [1, 2],
                                                                                     "a": [True, 2]}}))
    assert read_full(tmp_path) == ("heads", {}, {})
