"""medusa.io: the output-path policy (never delete or replace what the command did not create), umask modes,
and readers whose failures name the file and line."""

from __future__ import annotations

import os
import stat

import pytest

from medusa.errors import ConfigError, MedusaError
from medusa.io import (
    MANIFEST_NAME,
    atomic_directory,
    atomic_write_text,
    check_output_dir,
    check_output_file,
    output_lock,
    read_json,
    read_manifest,
    read_text,
    read_yaml,
    umask,
)


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_new_directory_and_files_get_the_umask_mode(tmp_path, umask_022):
    with atomic_directory(tmp_path / "out") as tmp:
        (tmp / "a.json").write_text("{}")
        (tmp / "sub").mkdir()
    assert _mode(tmp_path / "out") == 0o755 and _mode(tmp_path / "out" / "a.json") == 0o644
    atomic_write_text(tmp_path / "t.json", "{}")
    assert _mode(tmp_path / "t.json") == 0o644
    os.umask(0o077)
    with atomic_directory(tmp_path / "private") as tmp:
        (tmp / "a.json").write_text("{}")
    assert _mode(tmp_path / "private") == 0o700 and _mode(tmp_path / "private" / "a.json") == 0o600


def test_non_empty_output_is_refused_and_left_alone(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("the user's")
    with pytest.raises(MedusaError, match="out: exists and is not empty; pass --overwrite"):
        with atomic_directory(out) as tmp:
            (tmp / "a.json").write_text("{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temp dir left behind
    assert [p.name for p in out.iterdir()] == ["mine.txt"]


def test_overwrite_replaces_only_what_medusa_wrote_there(tmp_path):
    out = tmp_path / "out"
    with atomic_directory(out) as tmp:  # an earlier run: its names go into the manifest
        for name in ("a.json", "tree.json", "gone.json"):
            (tmp / name).write_text("old")
        (tmp / "base_model").mkdir()
        (tmp / "base_model" / "old.bin").write_text("old")
    assert set(read_manifest(out)) == {"a.json", "tree.json", "gone.json", "base_model"}
    (out / "mine.txt").write_text("the user's")
    (out / "gone.json").write_text("edited by the user since")  # no longer ours: kept
    with atomic_directory(out, overwrite=True) as tmp:
        (tmp / "a.json").write_text("new")
        (tmp / "base_model").mkdir()
        (tmp / "base_model" / "new.bin").write_text("new")
    assert (out / "mine.txt").read_text() == "the user's"
    assert (out / "gone.json").read_text() == "edited by the user since"
    assert (out / "a.json").read_text() == "new" and not (out / "tree.json").exists()
    assert [p.name for p in (out / "base_model").iterdir()] == ["new.bin"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert set(read_manifest(out)) == {"a.json", "base_model"}


def test_overwrite_never_replaces_or_removes_a_file_medusa_did_not_write(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "model.safetensors").mkdir()  # the user's folder, with a name the command writes
    (out / "model.safetensors" / "x").write_text("the user's")
    (out / "tree.json").write_text("the user's tree")
    (out / MANIFEST_NAME).write_text('{"entries": {"tree.json": [1, 2]}}')  # a stale or forged stamp
    before = {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(MedusaError, match="model.safetensors: exists and was not written by medusa"):
        with atomic_directory(out, overwrite=True) as tmp:
            (tmp / "model.safetensors").write_text("new")
    after = {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert after == before
    with atomic_directory(out, overwrite=True) as tmp:
        (tmp / "other.json").write_text("new")
    assert (out / "tree.json").read_text() == "the user's tree"


def test_one_run_per_output_and_a_dead_runs_lock_is_taken_over(tmp_path):
    out = tmp_path / "out"
    with output_lock(out):
        lock = tmp_path / ".out.lock"
        assert lock.read_text().strip() == str(os.getpid())
        with pytest.raises(MedusaError, match=f"another run \\(pid {os.getpid()}\\) is writing"):
            with output_lock(out):
                pass
        with pytest.raises(MedusaError, match="another run"):
            with atomic_directory(out) as tmp:
                (tmp / "a").write_text("x")
    assert not lock.exists() and not out.exists()
    lock.write_text("999999999\n")  # a killed run's lock file: nobody holds it
    with atomic_directory(out) as tmp:
        (tmp / "a").write_text("x")
    assert not lock.exists() and (out / "a").read_text() == "x"
    with output_lock(tmp_path / "missing" / "deeper" / "out"):  # parents not created, lock beside them
        assert (tmp_path / ".missing__deeper__out.lock").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_empty_directory_is_filled_and_a_failed_body_changes_nothing(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    with atomic_directory(out) as tmp:
        (tmp / "a.json").write_text("{}")
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST_NAME, "a.json"]
    assert (out / "a.json").stat().st_mode & 0o777 == 0o666 & ~umask()
    with pytest.raises(RuntimeError):
        with atomic_directory(tmp_path / "new") as tmp:
            (tmp / "half").write_text("x")
            raise RuntimeError("interrupted")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_output_holding_an_input_is_refused_even_with_overwrite(tmp_path):
    src = tmp_path / "proj" / "heads"
    src.mkdir(parents=True)
    (src / "w.bin").write_text("weights")
    for overwrite in (False, True):
        with pytest.raises(MedusaError, match="holds the input"):
            check_output_dir(tmp_path / "proj", overwrite=overwrite, inputs=[src])
        with pytest.raises(MedusaError, match="holds the input"):
            check_output_dir(src, overwrite=overwrite, inputs=[src])
        with pytest.raises(MedusaError, match="is the input"):
            check_output_file(src / "w.bin", overwrite=overwrite, inputs=[src / "w.bin"])
    assert (src / "w.bin").read_text() == "weights"


def test_wrong_kinds_are_named(tmp_path):
    a_file = tmp_path / "f.txt"
    a_file.write_text("x")
    with pytest.raises(MedusaError, match="f.txt: exists and is not a directory"):
        check_output_dir(a_file)
    with pytest.raises(MedusaError, match="f.txt is a file, not a directory"):
        check_output_dir(a_file / "sub")
    with pytest.raises(MedusaError, match="is a directory; give a file path"):
        check_output_file(tmp_path)
    with pytest.raises(MedusaError, match="f.txt: exists; pass --overwrite"):
        check_output_file(a_file)
    check_output_file(a_file, overwrite=True)
    with pytest.raises(MedusaError, match="is a directory"):
        atomic_write_text(tmp_path, "x")


def test_readers_name_the_file_and_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_bytes(b'{"a":\n "\xff"}')
    with pytest.raises(MedusaError, match=r"bad.json:2: not UTF-8 text"):
        read_text(bad)
    with pytest.raises(MedusaError, match="bad.json:2: not UTF-8"):
        read_json(bad)
    with pytest.raises(MedusaError, match="is a directory"):
        read_text(tmp_path)
    with pytest.raises(MedusaError, match="nope.json: not found"):
        read_json(tmp_path / "nope.json")


def test_yaml_duplicate_keys_are_errors(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("train:\n  lr: 1\n  epochs: 2\n  lr: 3\n")
    with pytest.raises(ConfigError, match=r"r.yaml:4: duplicate key 'lr' \(first given on line 2\)"):
        read_yaml(path, ConfigError)
    path.write_text("a: {b: 1}\nc: [1, {d: 2}]\n")
    assert read_yaml(path) == {"a": {"b": 1}, "c": [1, {"d": 2}]}
    path.write_text("a: [1\n")
    with pytest.raises(MedusaError, match="r.yaml:2: invalid YAML"):
        read_yaml(path)


def test_a_yaml_alias_bomb_fails_fast_naming_the_file(tmp_path):
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]  # 9^9 values
    (tmp_path / "bomb.yaml").write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match=r"bomb.yaml: its aliases expand to [\d,]+ values \(at most"):
        read_yaml(tmp_path / "bomb.yaml", ConfigError)
    (tmp_path / "ok.yaml").write_text("base: &b {lr: 1}\ntrain: *b\neval: *b\n")  # ordinary anchors load
    assert read_yaml(tmp_path / "ok.yaml") == {"base": {"lr": 1}, "train": {"lr": 1}, "eval": {"lr": 1}}
