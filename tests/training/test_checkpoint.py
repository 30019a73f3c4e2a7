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


class _Payload:
    """A pickle that creates ``marker`` when it is loaded: what a crafted checkpoint would carry."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        import os

        return os.system, (f"touch {self.marker}",)


def _tiny_args(out: Path, *extra: str) -> list[str]:
    return [f"output_dir={out}", "data.max_length=64", "train.max_steps=6", "train.batch_size=4",
            "train.logging_steps=1", "data.eval_split=0.0", "train.eval_steps=0", "train.save_steps=3",
            "train.warmup_ratio=0.34", "train.scheduler=cosine", *extra]


@pytest.mark.usefixtures("tiny_recipe_env")
@pytest.mark.parametrize("planted", ["custom_checkpoint_0.pkl", "random_states_0.pkl",
                                     "pytorch_model/mp_rank_00_model_states.pt", "optimizer.bin"])
def test_resume_refuses_a_checkpoint_holding_a_pickle_and_runs_none_of_it(tmp_path, planted):
    import pickle

    from medusa.errors import CheckpointError

    out = tmp_path / "run"
    train(load_recipe(TINY, _tiny_args(out)), stop_at_step=3, progress=False)
    ckpt = out / "checkpoint-3"
    marker = tmp_path / "marker"
    (ckpt / planted).parent.mkdir(exist_ok=True)
    (ckpt / planted).write_bytes(pickle.dumps(_Payload(marker)))
    for resume in (str(ckpt), "auto"):
        with pytest.raises(CheckpointError, match=f"{planted}: a pickle"):
            train(load_recipe(TINY, _tiny_args(out, f"train.resume={resume}")), progress=False)
    assert not marker.exists()
    pickle.loads((ckpt / planted).read_bytes())  # the payload is live: this test would see it run
    assert marker.exists()


@pytest.mark.usefixtures("tiny_recipe_env")
def test_checkpoint_holds_no_pickle_and_resumes_to_the_same_schedule(tmp_path):
    from medusa.io import umask

    straight = train(load_recipe(TINY, _tiny_args(tmp_path / "a", "train.save_steps=0")), progress=False)
    out = tmp_path / "b"
    train(load_recipe(TINY, _tiny_args(out)), stop_at_step=3, progress=False)
    ckpt = out / "checkpoint-3"
    names = sorted(p.name for p in ckpt.iterdir())
    assert not [n for n in names if n.endswith(".pkl")], names
    assert names == sorted(["model.safetensors", "optimizer.safetensors", "optimizer.json", "scheduler.json",
                            "rng_state_0.json", "rng_state_0.safetensors", STATE_NAME])
    state = json.loads((ckpt / STATE_NAME).read_text())
    assert (state["world_size"], state["global_batch"]) == (1, 4)
    sched = json.loads((ckpt / "scheduler.json").read_text())
    assert sched["last_epoch"] == 3 and sched["_step_count"] == 4
    for p in ckpt.iterdir():  # the umask's mode, not a temp file's 0600
        assert p.stat().st_mode & 0o777 == 0o666 & ~umask(), p
    resumed = train(load_recipe(TINY, _tiny_args(out, "train.resume=auto")), progress=False)
    assert resumed.global_step == 6

    def rows(run):
        return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]

    a, b = rows(straight.output_dir), rows(out)
    assert [r["step"] for r in b] == [1, 2, 3, 4, 5, 6]
    assert [r["lr"] for r in a] == [r["lr"] for r in b]  # the schedule picks up at step 3, bit for bit
    assert len({r["lr"] for r in a}) >= 4  # warm-up then cosine: a position error would show
    for x, y in zip(a, b):
        assert x["loss"] == pytest.approx(y["loss"], rel=1e-5)


@pytest.mark.usefixtures("tiny_recipe_env")
def test_resume_refuses_a_scheduler_state_of_the_wrong_kind(tmp_path):
    from medusa.errors import CheckpointError

    out = tmp_path / "run"
    train(load_recipe(TINY, _tiny_args(out)), stop_at_step=3, progress=False)
    path = out / "checkpoint-3" / "scheduler.json"
    state = json.loads(path.read_text())
    path.write_text(json.dumps({**state, "last_epoch": "3; rm -rf /"}))
    with pytest.raises(CheckpointError, match="scheduler.json: last_epoch"):
        train(load_recipe(TINY, _tiny_args(out, "train.resume=auto")), progress=False)


@pytest.mark.usefixtures("tiny_recipe_env")
def test_resume_keeps_the_output_dir_guard_and_refuses_a_changed_recipe_or_data(tmp_path):
    out = tmp_path / "run"
    train(load_recipe(TINY, _tiny_args(out)), stop_at_step=3, progress=False)
    ckpt = out / "checkpoint-3"
    # a checkpoint from elsewhere into a folder holding the user's files: the fresh run's guard
    other = tmp_path / "other"
    other.mkdir()
    (other / "recipe.json").write_text("the user's")
    (other / "metrics.jsonl").write_text('{"step": 1, "the": "user\'s"}\n')
    with pytest.raises(ConfigError, match="other exists and is not empty"):
        train(load_recipe(TINY, _tiny_args(other, f"train.resume={ckpt}")), progress=False)
    assert (other / "recipe.json").read_text() == "the user's"
    assert (other / "metrics.jsonl").read_text() == '{"step": 1, "the": "user\'s"}\n'

    recipe_json = (out / "recipe.json").read_bytes()
    metrics = (out / "metrics.jsonl").read_bytes()
    changed = r"another recipe or data \(train.lr: 0.003 -> 0.002\).*--resume-changed"
    with pytest.raises(ConfigError, match=changed):
        train(load_recipe(TINY, _tiny_args(out, "train.resume=auto", "train.lr=2e-3")), progress=False)
    data = ROOT / load_recipe(TINY, []).data.train
    copy = tmp_path / data.name
    copy.write_bytes(data.read_bytes())
    train(load_recipe(TINY, _tiny_args(tmp_path / "c", f"data.train={copy}")), stop_at_step=3, progress=False)
    with open(copy, "a") as fh:
        fh.write(data.read_text().splitlines()[0] + "\n")
    with pytest.raises(ConfigError, match=r"data \(file contents\)"):
        train(load_recipe(TINY, _tiny_args(tmp_path / "c", f"data.train={copy}", "train.resume=auto")),
              progress=False)
    assert (out / "recipe.json").read_bytes() == recipe_json
    assert (out / "metrics.jsonl").read_bytes() == metrics

    train(load_recipe(TINY, _tiny_args(out, "train.resume=auto", "train.lr=2e-3")), progress=False,
          resume_changed=True)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows[3] == {"step": 3, "resumed_from": str(ckpt), "resume_changes": {"train.lr": [0.003, 0.002]}}
    assert [r["step"] for r in rows] == [1, 2, 3, 3, 4, 5, 6]
    assert (out / "recipe.json").read_bytes() == recipe_json  # the run's recipe, as it started


def test_no_file_of_a_checkpoint_may_be_a_pickle(tmp_path):
    from medusa.errors import CheckpointError
    from medusa.training.checkpoint import check_no_pickles

    for name in (STATE_NAME, "scheduler.json", "model.safetensors", "optimizer.safetensors", "optimizer.json",
                 "scaler.json", "rng_state_0.json", "rng_state_0.safetensors"):
        (tmp_path / name).write_text("x")
    check_no_pickles(tmp_path)  # safetensors and JSON only
    for planted in ("optimizer.bin", "scaler.pt", "sub/optimizer.bin", "model.bin", "notes.PKL",
                    "custom_checkpoint_1", "x/.metadata"):
        (tmp_path / planted).parent.mkdir(exist_ok=True)
        (tmp_path / planted).write_text("x")
        with pytest.raises(CheckpointError, match=f"{planted}: a pickle"):
            check_no_pickles(tmp_path)
        (tmp_path / planted).unlink()


def test_resume_keeps_the_global_batch_at_any_number_of_processes(tmp_path):
    from medusa.training.checkpoint import check_global_batch, resume_changes

    recipe = load_recipe(TINY, []).to_dict()
    state = {"global_step": 2, "world_size": 2, "global_batch": 4, "recipe": recipe}
    (tmp_path / STATE_NAME).write_text(json.dumps(state))
    check_global_batch(state, tmp_path, world=1, batch_size=2, grad_accum=2)  # 2 x 2 x 1 == 1 x 2 x 2
    check_global_batch(state, tmp_path, world=2, batch_size=2, grad_accum=1)
    with pytest.raises(ConfigError, match=r"global batch of 4 \(2 process.*this run's is 2 \(1 x 2 x 1\)"):
        check_global_batch(state, tmp_path, world=1, batch_size=2, grad_accum=1)
    relaid = {**recipe, "train": {**recipe["train"], "batch_size": 2, "grad_accum": 2}}
    assert resume_changes(relaid, tmp_path, None, allow=False) == {}  # the layout is check_global_batch's
    del state["global_batch"]  # an older checkpoint: the batch keys are recipe changes like any other
    (tmp_path / STATE_NAME).write_text(json.dumps(state))
    with pytest.raises(ConfigError, match="train.batch_size"):
        resume_changes(relaid, tmp_path, None, allow=False)


def test_a_key_added_since_the_checkpoint_compares_as_its_default(tmp_path):
    from medusa.training.checkpoint import resume_changes

    recipe = load_recipe(TINY, []).to_dict()
    older = {**recipe, "data": {k: v for k, v in recipe["data"].items() if k != "group_by_length"}}
    (tmp_path / STATE_NAME).write_text(json.dumps({"global_step": 2, "recipe": older}))
    assert resume_changes(recipe, tmp_path, None, allow=False) == {}  # its default: no change
    grouped = {**recipe, "data": {**recipe["data"], "group_by_length": True}}
    with pytest.raises(ConfigError, match=r"data.group_by_length: False -> True"):
        resume_changes(grouped, tmp_path, None, allow=False)
