"""``medusa demo``: a failing stage is one ``error:`` line (exit 2) and leaves no marker; an --out that is
neither new, empty nor a demo directory is refused before anything runs."""

from __future__ import annotations

import pytest


def test_demo_stage_failure_is_one_line_error_without_marker(tmp_path, capsys):
    from benchmarks.stages import StageError, marker_path, run_stage
    from medusa.cli import main

    def broken() -> dict:
        raise RuntimeError("disk on fire\nsecond line")

    with pytest.raises(StageError, match=r"^stage 'train' failed: RuntimeError: disk on fire \(re-run"):
        run_stage(tmp_path, "train", broken, log=lambda _: None)
    assert not marker_path(tmp_path, "train").exists()

    rc = main(["demo", "--model", str(tmp_path / "nothing"), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("error:") and "nothing" in err and "\n" not in err


def test_out_that_is_not_a_demo_directory_is_refused_before_any_stage(tmp_path, capsys):
    from medusa.cli import main

    out = tmp_path / "busy"
    out.mkdir()
    (out / "notes.txt").write_text("the user's")
    assert main(["demo", "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {out}: exists, is not empty and is not a demo directory (no .stages/); give a "
                   "new or empty --out"]
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    bad = tmp_path / "r.yaml"
    bad.write_text("train: {lr: 1}\ntrain: {lr: 2}\n")
    assert main(["demo", "--out", str(tmp_path / "new"), "--recipe", str(bad), "--no-progress"]) == 2
    assert "r.yaml:2: duplicate key 'train'" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()  # the recipe is read before the first stage runs
