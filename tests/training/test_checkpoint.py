"""The training output directory: a run never starts over an earlier run or the user's files unless resumed or
``--overwrite`` (which removes only the earlier run's files), and a resumed run logs each step once."""

import json
from pathlib import Path

import pytest

from medusa.config import load_recipe
from medusa.errors import ConfigError
from medusa.training.checkpoint import STATE_NAME, check_output_dir, truncate_metrics
from medusa.training.loop import train

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "recipes" / "tiny" / "medusa1.yaml"


def _run_dir(tmp_path: Path, finished: bool = True, checkpoints: tuple[int, ...] = (2,)) -> Path:
    out = tmp_path / "run"
    out.mkdir(parents=True)
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    (out / "recipe.json").write_text("{}")
    for step in checkpoints:
        (out / f"checkpoint-{step}").mkdir()
        (out / f"checkpoint-{step}" / STATE_NAME).write_text("{}")
    if finished:
        (out / "final").mkdir()
    return out


def test_output_dir_policy(tmp_path):
    out = _run_dir(tmp_path)
    with pytest.raises(ConfigError, match="holds a finished run"):
        check_output_dir(out, resuming=False, overwrite=False, inputs={})
    assert check_output_dir(out, resuming=True, overwrite=False, inputs={}) == []
    (out / "notes.txt").write_text("the user's")
    stale = check_output_dir(out, resuming=False, overwrite=True, inputs={})
    assert sorted(p.name for p in stale) == ["checkpoint-2", "final", "metrics.jsonl", "recipe.json"]

    unfinished = _run_dir(tmp_path / "u", finished=False)
    with pytest.raises(ConfigError, match="unfinished run; set train.resume=auto"):
        check_output_dir(unfinished, resuming=False, overwrite=False, inputs={})
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "x.txt").write_text("x")
    with pytest.raises(ConfigError, match="foreign exists and is not empty; pass --overwrite"):
        check_output_dir(tmp_path / "foreign", resuming=False, overwrite=False, inputs={})
    cache = tmp_path / "cached" / "hidden"
    cache.mkdir(parents=True)
    assert check_output_dir(tmp_path / "cached", False, False, {}, keep=str(cache)) == []
    (tmp_path / "data.jsonl").write_text("{}\n")
    for overwrite in (False, True):
        with pytest.raises(ConfigError, match=r"holds the input .*data.jsonl \(data.train\)"):
            check_output_dir(tmp_path, False, overwrite, {"data.train": str(tmp_path / "data.jsonl")})
    (tmp_path / "file_out").write_text("x")
    with pytest.raises(ConfigError, match="file_out exists and is not a directory"):
        check_output_dir(tmp_path / "file_out", False, True, {})


def test_truncate_metrics_keeps_the_steps_up_to_the_checkpoint(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, "eval_loss": 1.0}\n{"step": 3}\n{"step": 4}\n{"ste')
    truncate_metrics(path, 2)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2]


@pytest.mark.usefixtures("tiny_recipe_env")
def test_resume_logs_each_step_once_and_a_finished_run_is_kept(tmp_path):
    out = tmp_path / "run"
    args = [f"output_dir={out}", "data.max_length=64", "train.max_steps=4", "train.batch_size=4",
            "train.logging_steps=1", "data.eval_split=0.0", "train.eval_steps=0", "train.save_steps=2"]
    train(load_recipe(TINY, args), stop_at_step=3, progress=False)
    assert (out / "checkpoint-3").is_dir()
    import shutil

    shutil.rmtree(out / "checkpoint-3")  # killed after step 3 was logged, before its checkpoint
    train(load_recipe(TINY, args + ["train.resume=auto"]), progress=False)  # resumes at step 2
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]

    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    with pytest.raises(ConfigError, match="holds a finished run"):
        train(load_recipe(TINY, args), progress=False)
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
    (out / "notes.txt").write_text("the user's")
    fresh = args[:-1] + ["train.save_steps=0", "train.max_steps=2"]
    result = train(load_recipe(TINY, fresh), progress=False, overwrite=True)
    assert result.final_dir == out / "final"
    assert sorted(p.name for p in out.iterdir()) == ["final", "metrics.jsonl", "notes.txt", "recipe.json"]
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]
