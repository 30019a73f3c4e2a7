"""medusa.io: the output-path policy (never delete or replace what the command did not create), umask modes,
and readers whose failures name the file and line."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from medusa.errors import MedusaError
from medusa.io import (
    MANIFEST_NAME,
    atomic_directory,
    atomic_write_text,
    build_lock,
    check_output_dir,
    check_output_file,
    output_lock,
    read_json,
    read_manifest,
    read_text,
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


def test_a_killed_runs_temp_folder_is_removed_by_the_next_run_and_only_it(tmp_path):
    """A run killed while filling its temp folder leaves ``.out.tmp-*`` behind: the next run on ``out`` (lock
    held) removes the ones marked for ``out``; a folder without the mark, or marked for another output, is
    kept."""
    from medusa.io import PARTIAL_MARK, remove_stale_temps

    out = tmp_path / "out"
    killed = tmp_path / ".out.tmp-abc123"
    killed.mkdir()
    (killed / PARTIAL_MARK).write_text("out\n")
    (killed / "model.safetensors").write_bytes(b"x" * 1000)
    users = tmp_path / ".out.tmp-mine"
    users.mkdir()
    (users / "keep.txt").write_text("the user's")
    other = tmp_path / ".out.tmp-x.tmp-live"  # the temp folder of an output named "out.tmp-x"
    other.mkdir()
    (other / PARTIAL_MARK).write_text("out.tmp-x\n")
    with atomic_directory(out) as tmp:
        (tmp / "a.json").write_text("{}")
        assert (tmp / PARTIAL_MARK).is_file()
    assert not killed.exists() and users.is_dir() and other.is_dir()
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST_NAME, "a.json"]  # the mark does not land
    assert remove_stale_temps(out) == []


def test_an_error_inside_the_temp_folder_names_the_output(tmp_path):
    """The temp folder is gone once the command fails: its error names the path in the output instead."""
    import errno

    out = tmp_path / "out"
    with pytest.raises(OSError) as info:
        with atomic_directory(out) as tmp:
            raise OSError(errno.ENOSPC, "No space left on device", str(tmp / "model.safetensors"))
    assert info.value.filename == str(out / "model.safetensors") and info.value.errno == errno.ENOSPC
    with pytest.raises(MedusaError, match=f"^{out / 'x.json'}: bad$"):
        with atomic_directory(out) as tmp:
            raise MedusaError(f"{tmp / 'x.json'}: bad")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_device_is_never_an_output_file(tmp_path):
    """/dev/null is neither a file nor a directory: refused by name (a rename would replace the device)."""
    with pytest.raises(MedusaError, match=f"^{os.devnull}: is a character device; give a file path$"):
        check_output_file(os.devnull, overwrite=True)
    with pytest.raises(MedusaError, match="is a character device; give a file path"):
        atomic_write_text(os.devnull, "{}")


KILLER = """
import os, sys
from pathlib import Path
from medusa.io import atomic_directory
out, stage = Path(sys.argv[1]), sys.argv[2]
real, moved = os.replace, []
def replace(src, dst):  # kill -9 (no cleanup runs) after the first file moved into the output
    real(src, dst)
    if stage == "merge" and Path(dst).parent == out and not Path(dst).name.startswith("."):
        moved.append(dst)
        if len(moved) == 1:
            os._exit(9)
os.replace = replace
with atomic_directory(out, overwrite=True, kind="export") as tmp:
    for name in ("a.json", "b.json", "c.json"):
        (tmp / name).write_text("new")
"""


def test_a_run_killed_in_the_middle_of_a_merge_is_finished_by_the_next(tmp_path):
    """kill -9 between two renames of an --overwrite merge: the output holds new and old files, the temp
    folder is left; the next --overwrite run owns both, finishes the output and removes the temp folder."""
    import subprocess
    import sys

    out = tmp_path / "out"
    with atomic_directory(out, kind="export") as tmp:
        for name in ("a.json", "b.json", "c.json", "gone.json"):
            (tmp / name).write_text("old")
    (out / "mine.txt").write_text("the user's")
    run = subprocess.run([sys.executable, "-c", KILLER, str(out), "merge"], cwd=os.getcwd())
    assert run.returncode == 9
    assert sorted(p.name for p in out.iterdir() if p.read_text() == "new") == ["a.json"]  # half merged
    assert len(list(tmp_path.glob(".out.tmp-*"))) == 1
    with atomic_directory(out, overwrite=True, kind="export") as tmp:
        for name in ("a.json", "b.json", "c.json"):
            (tmp / name).write_text("newer")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert {p.name: p.read_text() for p in out.iterdir() if p.name != MANIFEST_NAME} == {
        "a.json": "newer", "b.json": "newer", "c.json": "newer", "mine.txt": "the user's"}


_HOLD_AND_BUILD = """
import sys, time
from pathlib import Path
from medusa.io import build_lock
with build_lock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(1.0)
    Path(sys.argv[1]).mkdir()
"""


def test_a_build_lock_makes_the_second_process_wait_for_the_first_ones_build(tmp_path):
    """Two processes (two pytest-xdist workers) ask for one cached thing: the second waits for the first
    to let go, then finds it built; an atomic write of the same path inside the body is not refused."""
    target = tmp_path / "model"
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_AND_BUILD, str(target)], stdout=subprocess.PIPE,
                              text=True, cwd=Path(__file__).resolve().parents[1])
    try:
        assert holder.stdout.readline().strip() == "held"
        with build_lock(target):
            assert target.is_dir()  # only after the holder built it
            with atomic_directory(target / "inner") as tmp:
                (tmp / "a").write_text("x")
    finally:
        assert holder.wait(timeout=60) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # both lock files removed


def test_save_safetensors_reports_a_write_past_the_file_size_limit_as_the_os_error(tmp_path):
    """A file-size limit (RLIMIT_FSIZE, in a child process) makes the weights' write fail with EFBIG, as a
    full disk fails with ENOSPC: safetensors' own error type becomes the OSError it is, errno and file
    kept (the CLI prints it as one line); a write that works is the file safetensors writes."""
    import errno

    import torch
    from safetensors.torch import load_file

    from medusa.io import save_safetensors

    ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # noqa: N806  (this checkout's medusa)
    code = ("import resource, torch, medusa.io as m\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (10000, 10000))\n"
            "try:\n    m.save_safetensors({'w': torch.zeros(100000)}, 'big.safetensors')\n"
            "except OSError as e:\n    print(e.errno, e.filename)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                          env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.stdout.split() == [str(errno.EFBIG), "big.safetensors"], proc.stderr[-1000:]
    tensors = {"w": torch.arange(4096, dtype=torch.float32)}
    save_safetensors(tensors, tmp_path / "ok.safetensors", metadata={"format": "pt"})
    assert torch.equal(load_file(str(tmp_path / "ok.safetensors"))["w"], tensors["w"])
