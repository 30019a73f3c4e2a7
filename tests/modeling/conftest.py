"""Fixtures shared by the modeling tests."""

import pytest

from medusa import MedusaModel

from tiny_models import tiny_model


@pytest.fixture
def saved(tmp_path):
    base = tiny_model("llama")
    MedusaModel.from_base(base, num_heads=2, num_layers=1).save_pretrained(tmp_path / "ck")
    return base, tmp_path / "ck"
