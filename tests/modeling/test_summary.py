"""medusa info's summary of an eagle3 checkpoint: the drafter's feature layers and its draft tree."""

from medusa import MedusaModel
from medusa.modeling.summary import summarize
from medusa.tree import DraftTreeShape

from tiny_models import tiny_model


def test_eagle3_summary(tmp_path):
    model = MedusaModel.from_base(tiny_model("llama", layers=4), num_heads=3, head_type="eagle3")
    model.tree = DraftTreeShape(8, 4, 2, 2, lookup_tokens=3, calibration={"expected_tokens_per_step": 2.25})
    model.save_pretrained(tmp_path / "ck")
    s = summarize(tmp_path / "ck")
    assert s["head_type"] == "eagle3" and s["feature_layers"] == [1, 2, 3]
    assert s["tree"] == {"nodes": 8, "depth": 4, "branch": 2, "expand": 2, "lookup_tokens": 3,
                         "expected_tokens_per_step": 2.25}
    assert s["parameters"] == sum(p.numel() for p in model.heads.parameters())
