"""``medusa train`` / ``python -m medusa.train`` (medusa/cli/train.py, the entry medusa/train.py runs): a user
error is one ``error:`` line on stderr, exit 2, nothing on stdout. (Training itself: tests/training.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from medusa.cli import main as cli_main

from tiny_models import SHARED, require_shared

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "recipes" / "tiny" / "medusa1.yaml"


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="200", HF_HUB_OFFLINE="1")


def test_python_m_medusa_train_missing_recipe(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "medusa.train", "missing.yaml"], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "missing.yaml" in lines[0], proc.stderr


@pytest.fixture
def _at_root(monkeypatch):
    monkeypatch.chdir(ROOT)


@pytest.mark.usefixtures("_at_root")
def test_cli_exits_2_naming_the_key(capsys):
    require_shared(SHARED)
    assert cli_main(["train", str(TINY), "train.lr_rate=1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "train.lr_rate" in err and "did you mean train.lr" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.usefixtures("_at_root")
def test_cli_bad_data_row_names_file_and_line(tmp_path, capsys):
    require_shared(SHARED)
    data = tmp_path / "rows.jsonl"
    data.write_text('{"prompt": "a", "completion": " b c d"}\n{"prompt": "a", "completion": 3}\n')
    code = cli_main(["train", str(TINY), f"data.train={data}", "data.format=auto",
                     f"output_dir={tmp_path / 'o'}"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and f"{data}:2" in err and "completion" in err


@pytest.mark.usefixtures("_at_root")
def test_module_entry_point_exits_2(capsys):
    from medusa.train import main

    assert main([str(ROOT / "recipes" / "does-not-exist.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "does-not-exist.yaml: not found" in err and err.count("\n") == 1


@pytest.mark.usefixtures("_at_root")
@pytest.mark.parametrize("argv", [["train.lr=-5"], ["train.lr_rate=1"]])
def test_a_launch_reports_each_user_error_once(argv, monkeypatch, capsys, tmp_path):
    """Under ``accelerate launch`` every process meets the same recipe error: each exits 2 and the first to
    meet it prints it (one line for the launch); an error only one process meets is printed by that one."""
    import tempfile

    from medusa.train import main

    require_shared(SHARED)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the launch's markers
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank, lines in (("1", 1), ("0", 0)):  # the same error: printed once, whichever process is first
        monkeypatch.setenv("RANK", rank)
        assert main([str(TINY), *argv]) == 2
        captured = capsys.readouterr()
        assert len(captured.err.splitlines()) == lines and captured.out == "", captured
    monkeypatch.setenv("RANK", "1")  # an error of one process alone still reaches the user
    assert main([str(ROOT / "recipes" / "does-not-exist.yaml")]) == 2
    assert capsys.readouterr().err.startswith("error: ")
    monkeypatch.setenv("RANK", "0")
    assert main([str(ROOT / "recipes" / "does-not-exist.yaml")]) == 2
    assert capsys.readouterr().err == ""


def test_outside_a_launch_every_user_error_is_reported(monkeypatch, tmp_path):
    from medusa.cli.train import first_to_report

    for world in ("", "1", "two"):  # unset, one process, or a value no launcher writes
        monkeypatch.setenv("WORLD_SIZE", world)
        assert first_to_report("error", root=str(tmp_path)) and first_to_report("error", root=str(tmp_path))
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert first_to_report("error", root=str(tmp_path)) and not first_to_report("error", root=str(tmp_path))


def test_a_marker_from_an_earlier_run_does_not_silence_the_next(monkeypatch, tmp_path):
    """The same environment, parent and message an hour later (a shell that keeps WORLD_SIZE): reported."""
    import os
    import time

    from medusa.cli.train import first_to_report

    monkeypatch.setenv("WORLD_SIZE", "2")
    assert first_to_report("error", root=str(tmp_path))
    (marker,) = (tmp_path / "medusa-launch-errors").iterdir()
    hour_ago = time.time() - 3600
    os.utime(marker, (hour_ago, hour_ago))
    assert first_to_report("error", root=str(tmp_path)) and not first_to_report("error", root=str(tmp_path))
