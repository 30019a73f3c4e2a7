"""benchmarks.vllm_env without installing anything: a stamped venv is reused, the engine's environment."""

import os

from benchmarks.vllm_env import PINS, STAMP, engine_env, ensure_venv


def test_a_stamped_venv_is_reused(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    (venv / STAMP).write_text(" ".join(PINS) + "\n")
    assert ensure_venv(venv) == venv / "bin" / "python"  # no pip run: it would fail on this fake venv


def test_engine_env_binds_the_given_cores_and_preloads_what_exists(tmp_path):
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libiomp5.so").write_text("")
    env = engine_env(tmp_path, cores="1")
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "1" and env["OMP_NUM_THREADS"] == "1"
    assert env["HF_HUB_OFFLINE"] == "1" and env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert str(tmp_path / "lib" / "libiomp5.so") in env["LD_PRELOAD"].split(":")
    default = engine_env(tmp_path)  # this process's cores
    cores = [str(c) for c in sorted(os.sched_getaffinity(0))]
    assert default["VLLM_CPU_OMP_THREADS_BIND"].split(",") == cores
