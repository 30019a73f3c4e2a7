"""The wheel is what a user installs: build it from a copy of the repository (offline, no build isolation),
install it into a bare target directory, and run ``python -m medusa demo`` from elsewhere with it.

It checks that the embedded default model really travels in the wheel (medusa/demo/default_model is
a link to data/default_model) and that the run imports medusa from the install, not from this checkout.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
               "training_summary.json")
RECIPES = ("default_model_medusa1.yaml",)


def _source_copy(dst: Path) -> Path:
    """What the wheel is built from, copied so that the build's ``build/`` and ``*.egg-info`` stay out of
    the checkout: the package (links kept as links), the data it links to, and the project files."""
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "medusa", dst / "medusa", symlinks=True, ignore=skip)
    shutil.copytree(ROOT / "data", dst / "data", symlinks=True, ignore=skip)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dst / name)
    assert (dst / "medusa" / "demo" / "default_model").is_symlink()  # the case this test is about
    return dst


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    src = _source_copy(tmp / "src")
    dist = tmp / "dist"
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                           "--no-build-isolation", "--no-index",
                           "-q", "-w", str(dist), str(src)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    wheels = list(dist.glob("medusa_heads-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_wheel_holds_the_default_model_files_not_a_link(wheel):
    source = ROOT / "data" / "default_model"
    with zipfile.ZipFile(wheel) as zf:
        infos = {i.filename: i for i in zf.infolist()}
        for name in MODEL_FILES:
            arc = f"medusa/demo/default_model/{name}"
            assert arc in infos, f"{arc} missing from {wheel.name}"
            assert not stat.S_ISLNK(infos[arc].external_attr >> 16), f"{arc} is a link"
            assert zf.read(arc) == (source / name).read_bytes(), arc
        for name in RECIPES:
            assert f"medusa/demo/recipes/{name}" in infos


@pytest.mark.slow
def test_installed_wheel_runs_the_demo_from_another_directory(wheel, tmp_path):
    target = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index",
                           "-q", "--target",
                           str(target), str(wheel)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert not (target / "medusa" / "demo" / "default_model").is_symlink()
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    env.update(PYTHONPATH=str(target), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", PYTHONSAFEPATH="1")

    where = subprocess.run([sys.executable, "-c", "import medusa; print(medusa.__file__)"], cwd=work, env=env,
                           capture_output=True, text=True, timeout=300)
    assert where.returncode == 0, where.stderr[-3000:]
    medusa_file = Path(where.stdout.strip()).resolve()
    assert medusa_file.is_relative_to(target.resolve()), medusa_file
    assert not medusa_file.is_relative_to(ROOT), medusa_file

    cmd = [sys.executable, "-m", "medusa", "demo", "--out", "out", "--no-progress", "--distill-prompts", "24",
           "--bench-prompts", "1", "--max-new-tokens", "12", "--nodes", "8", "--threads", "1",
           "--set", "train.epochs=1", "--set", "train.batch_size=8", "--set", "data.max_length=96"]
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = work / "out"
    report = json.loads((out / "report.json").read_text())
    assert report["greedy_exact_match"] == 1.0
    assert (out / "final" / "medusa_heads.safetensors").is_file()
    assert (out / "final" / "tree.json").is_file()
    assert any((out / "export" / "vllm").glob("*.safetensors"))
    stages = sorted(p.stem for p in (out / ".stages").glob("*.json"))
    assert stages == ["bench", "calibrate", "distill", "export", "prompts", "train"]
    assert "one completion, streamed" in proc.stdout
