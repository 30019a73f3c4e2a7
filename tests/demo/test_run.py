"""medusa.demo.run: the demo's prompts come from the default model's held-out files, split by file.
(The reduced demo end to end: tests/integration/test_demo_pipeline.py.)"""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest
from pipeline_helpers import demo_settings as _settings

from tiny_models import STORIES, require_shared


def test_demo_prompts_come_from_held_out_files_split_by_file(tmp_path):
    require_shared(STORIES)
    from medusa.demo.run import held_out_files, split_prompts

    files = held_out_files(STORIES)  # no training_summary.json: the default model's held-out modules
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    modules = ("argparse", "csv", "dataclasses", "difflib", "fractions", "heapq", "json",
               "shlex", "statistics", "textwrap")
    for f in files:
        rel = f.relative_to(stdlib).parts
        assert rel[0].removesuffix(".py") in modules or (
            rel[0] == "test" and any(rel[1].removesuffix(".py") == f"test_{m}"
                                     or rel[1].startswith(f"test_{m}_")
                                     for m in modules)), rel
    assert any(f.name == "heapq.py" for f in files)
    rows = split_prompts(_settings(tmp_path, STORIES))
    texts = {name: {r["prompt"] for r in r_} for name, r_ in rows.items()}
    assert len(rows["bench"]) == 2 and len(rows["calib"]) == 8 and len(rows["distill"]) == 48
    assert not texts["bench"] & texts["distill"] and not texts["calib"] & texts["distill"]


def test_settings_are_checked_before_any_stage(tmp_path):
    """A --set key the recipe does not know, or a bad value, fails before the first stage (nothing is
    written); the recipe with the demo's own overrides passes although its training data does not exist
    yet."""
    from medusa.demo.run import DEFAULT_MODEL, DemoSettings, check_settings
    from medusa.errors import ConfigError, MedusaError

    out = tmp_path / "demo"
    check_settings(DemoSettings(out=str(out), recipe_overrides=("train.epochs=1",)))
    with pytest.raises(ConfigError, match="unknown key foo"):
        check_settings(DemoSettings(out=str(out), recipe_overrides=("foo.bar=1",)))
    with pytest.raises(ConfigError, match=r"train\.lr: -1\.0 is out of range"):
        check_settings(DemoSettings(out=str(out), recipe_overrides=("train.lr=-1",)))
    with pytest.raises(MedusaError, match="no model there"):
        check_settings(DemoSettings(model=str(tmp_path), out=str(out)))
    assert not out.exists() and DEFAULT_MODEL.exists()
