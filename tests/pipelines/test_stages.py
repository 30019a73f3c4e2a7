"""Pipeline stages: calibrating in place keeps everything the checkpoint holds (MEDUSA-2's base_model/)."""

import json

from medusa import MedusaModel
from medusa.modeling.config import TREE_NAME
from medusa.pipelines.stages import calibrate_stage

from tiny_models import STORIES, require_shared


def test_calibrate_stage_in_place_keeps_subdirectories(tmp_path):
    require_shared()
    heads = tmp_path / "final"
    MedusaModel.from_base(str(STORIES), num_heads=2).save_pretrained(heads)
    (heads / "base_model").mkdir()  # what a MEDUSA-2 checkpoint holds beside the heads
    (heads / "base_model" / "marker.txt").write_text("merged backbone")
    data = tmp_path / "calib.jsonl"
    rows = [{"prompt": "Once upon a time", "completion": " there was a girl named Lily. She liked"}] * 3
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = calibrate_stage(heads, heads, data, nodes=4, progress=False)
    assert result["nodes"] == 4 and (heads / TREE_NAME).is_file()
    assert (heads / "base_model" / "marker.txt").read_text() == "merged backbone"
    assert MedusaModel.from_pretrained(heads, base_model=str(STORIES)).num_heads == 2
