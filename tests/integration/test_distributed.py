"""Scale-out engines for real (medusa/training/setup.py: make_accelerator, check_engine, engine_report;
medusa/training/engine_state.py: checkpoints): two processes (gloo, CPU) launched with the shipped accelerate
configs, exactly as the README's "Scale out" section shows, on the tiny recipes over stories260K.

- DDP (configs/accelerate/cpu.yaml), DeepSpeed ZeRO-2 (MEDUSA-1) and ZeRO-3 (MEDUSA-2 LoRA): each process's
  engine line shows the engine, the world size and the sharding (DDP / ZeRO-2: every parameter held, ZeRO-2
  updates half; ZeRO-3: half the parameters held).
- Equal to one process: the same recipe, seed and global batch (2 processes x batch 2 = 1 process x batch 2
  x grad_accum 2: each micro-batch's mean loss weighs the same as each process's): the losses of steps 1-4
  within 1e-5 relative (measured <= 1e-7).
- Resume across process counts: the 2-process run's checkpoint-2 resumed in 1 process gives the 2-process
  run's losses at steps 3 and 4 within 1e-5 relative, and the 1-process run's checkpoint-2 resumed in 2
  processes gives the 1-process run's (measured: equal to the last digit, ZeRO-3 within 1e-7); step 4 depends
  on the optimizer state moved across engines. ``final/`` has the same files and config keys whatever engine
  and process count trained it, and loads alone.
- FSDP: accelerate 1.15 applies FSDP only on a device backend; on a CPU its launch would train
  unsynchronised copies, so the run is refused with one ``error:`` line (per process) before any model loads.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from medusa.config import load_recipe
from medusa.errors import ConfigError
from medusa.modeling.model import MedusaModel
from medusa.training.loop import train
from medusa.training.setup import check_engine

from tiny_models import require_module

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs" / "accelerate"
TINY = ROOT / "recipes" / "tiny"
STEPS = ["train.max_steps=4", "data.max_length=32", "train.logging_steps=1", "data.eval_split=0.0"]
ONE = ["train.batch_size=2", "train.grad_accum=2"]  # 1 process, the 2-process runs' global batch (4)
HEADS = ["head1_loss", "head2_loss", "head3_loss"]
ENGINE = re.compile(r"engine: (.+?), (\d+) process\(es\); rank (\d+) holds ([\d,]+) of ([\d,]+) parameter "
                    r"elements; its optimizer updates ([\d,]+) of ([\d,]+)")

# stories260K present, run from the repository root; six 2-process launches: run first (tests/conftest.py)
pytestmark = [pytest.mark.heavy(300), pytest.mark.usefixtures("tiny_recipe_env")]


def _launch(config: str, recipe: str, out: Path, *extra: str) -> subprocess.CompletedProcess:
    """``accelerate launch --config_file configs/accelerate/<config> --num_processes 2 ...`` (README)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIGS / config),
           "--num_processes", "2", "--main_process_port", "0", "--mixed_precision", "no",
           "-m", "medusa.train", str(TINY / f"{recipe}.yaml"), f"output_dir={out}", "train.batch_size=2",
           *STEPS, *extra]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400, check=False)


def _engines(text: str) -> dict[int, tuple]:
    """rank -> (kind, processes, held, total, updated, trainable) from the processes' engine lines."""
    out = {}
    for m in ENGINE.finditer(text):
        kind, world, rank, *counts = m.groups()
        out[int(rank)] = (kind, int(world), *(int(c.replace(",", "")) for c in counts))
    return out


def _two_ranks(proc: subprocess.CompletedProcess, kind: str) -> list[tuple]:
    """The launch succeeded and both processes logged ``kind`` in a world of 2; their counts."""
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = _engines(proc.stdout)
    assert sorted(ranks) == [0, 1] and {r[:2] for r in ranks.values()} == {(kind, 2)}, ranks
    return [r[2:] for r in ranks.values()]


def _metrics(run_dir: Path) -> dict[int, dict]:
    """step -> its training row."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in rows if "loss" in r}


def _one_process(recipe: str, out: Path, capsys, *extra: str) -> tuple:
    """The recipe in this process at the 2-process runs' global batch; returns its engine line's fields."""
    capsys.readouterr()
    train(load_recipe(TINY / f"{recipe}.yaml", [f"output_dir={out}", *ONE, *STEPS, *extra]), progress=False)
    return _engines(capsys.readouterr().out)[0]


def _assert_equal_steps(a: Path, b: Path, steps: list[int]) -> None:
    ra, rb = _metrics(a), _metrics(b)
    assert sorted(rb) == steps
    for step in steps:
        for key in ["loss", *HEADS]:
            assert ra[step][key] == pytest.approx(rb[step][key], rel=1e-5), (step, key)


def _assert_same_final(two: Path, one: Path) -> None:
    names = [sorted(p.name for p in (run / "final").iterdir()) for run in (two, one)]
    assert names[0] == names[1]
    config = "medusa_config.json"
    assert json.loads((two / "final" / config).read_text()).keys() == json.loads(
        (one / "final" / config).read_text()).keys()
    MedusaModel.from_pretrained(two / "final", base_model=None if (two / "final" / "config.json").exists()
                                else str(ROOT.parent / "shared" / "models" / "stories260K"))


def _equal_and_resumable(config: str, kind: str, recipe: str, tmp_path: Path, capsys) -> list[tuple]:
    """2 processes and 1 process, 4 steps each with checkpoint-2; each checkpoint resumed at the other
    count. Returns the 2-process run's per-rank counts (held, total, updated, trainable)."""
    two, one = tmp_path / "two", tmp_path / "one"
    ranks = _two_ranks(_launch(config, recipe, two, "train.save_steps=2"), kind)
    assert sorted(_metrics(two)) == [1, 2, 3, 4] and (two / "checkpoint-2" / "trainer_state.json").is_file()
    assert json.loads((two / "final" / "medusa_config.json").read_text())["recipe"]["train"]["max_steps"] == 4
    total, trainable = ranks[0][1], ranks[0][3]
    engine = _one_process(recipe, one, capsys, "train.save_steps=2")
    assert engine == ("NO", 1, total, total, trainable, trainable)
    _assert_equal_steps(two, one, [1, 2, 3, 4])
    _one_process(recipe, tmp_path / "two_to_one", capsys, f"train.resume={two / 'checkpoint-2'}")
    _assert_equal_steps(two, tmp_path / "two_to_one", [3, 4])
    resumed = _launch(config, recipe, tmp_path / "one_to_two", f"train.resume={one / 'checkpoint-2'}")
    _two_ranks(resumed, kind)
    _assert_equal_steps(one, tmp_path / "one_to_two", [3, 4])
    for run in (one, tmp_path / "two_to_one", tmp_path / "one_to_two"):
        _assert_same_final(two, run)
    return ranks


def test_ddp_two_processes_equal_one_and_resume_across_counts(tmp_path, capsys):
    """MEDUSA-1 under DDP on CPU (configs/accelerate/cpu.yaml): both processes hold and update everything."""
    for held, total, updated, trainable in _equal_and_resumable("cpu.yaml", "MULTI_CPU", "medusa1", tmp_path,
                                                                 capsys):
        assert held == total == updated == trainable


def test_deepspeed_zero2_two_processes_equal_one_and_resume_across_counts(tmp_path, capsys):
    """MEDUSA-1 (frozen backbone) under ZeRO-2: parameters whole on each process, optimizer state halved."""
    require_module("deepspeed")
    for held, total, updated, trainable in _equal_and_resumable("deepspeed_zero2.yaml", "DEEPSPEED ZeRO-2",
                                                                 "medusa1", tmp_path, capsys):
        assert held == total == trainable and trainable / 2 <= updated < trainable


def test_deepspeed_zero3_two_processes_equal_one_and_resume_across_counts(tmp_path, capsys):
    """MEDUSA-2 with LoRA under ZeRO-3: each process holds about half of the parameters (backbone + heads)."""
    require_module("deepspeed")
    for held, total, updated, trainable in _equal_and_resumable("deepspeed_zero3.yaml", "DEEPSPEED ZeRO-3",
                                                                 "medusa2_lora", tmp_path, capsys):
        assert total / 2 <= held < total and trainable / 2 <= updated < trainable < total


def test_fsdp_on_cpu_is_refused_before_anything_loads(tmp_path):
    """The shipped FSDP config, 2 processes on this CPU: refused (not silently unsharded), nothing written."""
    proc = _launch("fsdp.yaml", "medusa1", tmp_path / "fsdp")
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors and set(errors) == {errors[0]} and "FSDP needs a GPU-class device" in errors[0]
    assert "engine:" not in proc.stdout and not (tmp_path / "fsdp").exists()


def test_check_engine_refuses_fsdp_only_without_a_device():
    with pytest.raises(ConfigError, match="FSDP needs a GPU-class device"):
        check_engine({"ACCELERATE_USE_FSDP": "true"}, has_device=False)
    check_engine({"ACCELERATE_USE_FSDP": "true"}, has_device=True)
    check_engine({"ACCELERATE_USE_DEEPSPEED": "true"}, has_device=False)
    check_engine({}, has_device=False)


def test_cpu_flag_with_several_processes_is_refused(tmp_path):
    """``accelerate launch --cpu --num_processes 2`` starts one process without mpirun (accelerate's simple
    launcher): refused with one error line naming the command that does start 2, nothing written."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--cpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "medusa.train",
           str(TINY / "medusa1.yaml"), f"output_dir={tmp_path / 'cpu'}", *STEPS]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400, check=False)
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr[-2000:]
    assert "configs/accelerate/cpu.yaml --num_processes N" in errors[0]
    assert "engine:" not in proc.stdout and not (tmp_path / "cpu").exists()


def test_check_engine_refuses_a_cpu_launch_that_runs_one_of_several_processes():
    one_of_two = {"ACCELERATE_USE_CPU": "True", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    with pytest.raises(ConfigError, match="starts only one process here"):
        check_engine(one_of_two, has_device=False)
    check_engine({"ACCELERATE_USE_CPU": "True"}, has_device=False)  # --cpu, one process: fine
    check_engine({**one_of_two, "PMI_SIZE": "2", "PMI_RANK": "0"}, has_device=False)  # under mpirun
    check_engine({**one_of_two, "LOCAL_RANK": "0", "WORLD_SIZE": "2"}, has_device=False)  # torchrun


def test_a_user_error_under_the_launcher_is_printed_once(tmp_path):
    """A bad recipe value, 2 processes through the real launcher: every process exits 2 (or the launcher
    stops it once another has), only the first prints its ``error:`` line, and neither prints a traceback. The
    launcher then reports the failed processes in its own words and exits 1 (torch's ChildFailedError,
    re-raised by accelerate: docs/usage.md, "A user error under accelerate launch"); if that ever changes,
    the doc must too."""
    proc = _launch("cpu.yaml", "medusa1", tmp_path / "bad", "train.lr=-5")
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == [errors[0]] and "train.lr: -5.0 is out of range" in errors[0], proc.stderr[-3000:]
    exits = re.findall(r"rank\s*: (\d+) \(local_rank: \d+\)\s*exitcode\s*: (-?\d+)", proc.stderr)
    # each process exits 2, unless the launcher terminated it first (SIGTERM, -15) once the other had failed
    assert sorted(rank for rank, _ in exits) == ["0", "1"], proc.stderr[-3000:]
    codes = {code for _, code in exits}
    assert codes <= {"2", "-15"} and "2" in codes, proc.stderr[-3000:]
    assert proc.stderr.count("Traceback (most recent call last)") == 1  # the launcher's own, not a process's
    assert "ChildFailedError" in proc.stderr.split("Traceback (most recent call last)")[1]
    assert proc.returncode == 1 and not (tmp_path / "bad").exists()
