"""Exports refuse Hydra heads with an error naming the head types the formats serve."""

import pytest

from medusa import MedusaModel
from medusa.errors import CheckpointError
from medusa.export import EXPORT_FORMATS, export_checkpoint

from tiny_models import tiny_model


@pytest.mark.parametrize("format", EXPORT_FORMATS)
def test_export_refuses_hydra_heads(tmp_path, format):
    model = MedusaModel.from_base(tiny_model("llama"), num_heads=2, head_type="hydra")
    model.save_pretrained(tmp_path / "ck")
    with pytest.raises(CheckpointError) as err:
        export_checkpoint(tmp_path / "ck", tmp_path / "out", format)
    message = str(err.value)
    assert "'hydra'" in message and format in message and "linear or shared_lm_head" in message
    assert not (tmp_path / "out").exists()
