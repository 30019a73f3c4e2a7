"""medusa.training.setup: ``train.mixed_precision: auto`` resolves by what the device computes natively."""

from pathlib import Path

import pytest

from medusa.config import load_recipe
from medusa.training import setup

from tiny_models import SHARED, require_shared

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _at_root(monkeypatch):
    require_shared(SHARED)
    monkeypatch.chdir(ROOT)  # the tiny recipe's data paths are relative to the repository root


@pytest.mark.parametrize("native, expected", [(True, "bf16"), (False, "no")])
def test_auto_mixed_precision_follows_native_bf16(monkeypatch, native, expected):
    recipe = load_recipe(ROOT / "recipes" / "tiny" / "medusa1.yaml", ["train.mixed_precision=auto"])
    monkeypatch.setattr(setup, "native_bf16", lambda device: native)
    assert setup.mixed_precision(recipe) == expected


@pytest.mark.parametrize("value", ["no", "bf16", "fp16", None])
def test_explicit_mixed_precision_is_kept(value):
    override = "null" if value is None else f'"{value}"'  # bare `no` is YAML's false
    recipe = load_recipe(ROOT / "recipes" / "tiny" / "medusa1.yaml", [f"train.mixed_precision={override}"])
    assert setup.mixed_precision(recipe) == value
