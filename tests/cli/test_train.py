"""``medusa train`` / ``python -m medusa.train`` (medusa/cli/train.py, the entry medusa/train.py runs): a user
error is one ``error:`` line on stderr, exit 2, nothing on stdout. (Training itself: tests/training.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="200", HF_HUB_OFFLINE="1")


def test_python_m_medusa_train_missing_recipe(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "medusa.train", "missing.yaml"], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "missing.yaml" in lines[0], proc.stderr
