"""The demo's stages: calibrating in place keeps everything the checkpoint holds (MEDUSA-2's base_model/),
progress bars follow --no-progress."""

import json

from medusa import MedusaModel
from medusa.demo.stages import calibrate_stage
from medusa.modeling.config import TREE_NAME

from tiny_models import STORIES, require_shared


def test_calibrate_stage_in_place_keeps_subdirectories(tmp_path):
    require_shared()
    heads = tmp_path / "final"
    # a MEDUSA-2 checkpoint: the merged backbone in base_model/ beside the heads, written by medusa (in the
    # checkpoint's manifest, as the output policy requires of what a later run replaces)
    from transformers import AutoTokenizer

    MedusaModel.from_base(str(STORIES), num_heads=2).save_pretrained(
        heads, save_base=True, tokenizer=AutoTokenizer.from_pretrained(STORIES))
    backbone = (heads / "base_model" / "config.json").read_bytes()
    data = tmp_path / "calib.jsonl"
    rows = [{"prompt": "Once upon a time", "completion": " there was a girl named Lily. She liked"}] * 3
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = calibrate_stage(heads, heads, data, nodes=4, progress=False)
    assert result["nodes"] == 4 and (heads / TREE_NAME).is_file()
    assert (heads / "base_model" / "config.json").read_bytes() == backbone
    assert MedusaModel.from_pretrained(heads, base_model=str(STORIES)).num_heads == 2


def _bars(err: str) -> list[str]:
    """tqdm bars in captured stderr (a bar renders as ``desc: NN%|...| n/total [...it/s]``)."""
    return [line for line in err.replace("\r", "\n").splitlines() if "%|" in line or "it/s" in line]


def test_train_recipe_progress_off_draws_no_bar(tmp_path, capsys, tiny_recipe_env):
    from medusa.demo.stages import hf_progress_bars, train_recipe

    overrides = [f"output_dir={tmp_path / 'off'}", "train.max_steps=2", "train.batch_size=2",
                 "data.max_length=32", "data.eval_split=0.0", "train.eval_steps=0", "train.logging_steps=1"]
    capsys.readouterr()
    with hf_progress_bars(False):
        off = train_recipe("recipes/tiny/medusa1.yaml", overrides, progress=False)
    err = capsys.readouterr().err
    assert off["steps"] == 2 and _bars(err) == [], err

    overrides[0] = f"output_dir={tmp_path / 'on'}"
    train_recipe("recipes/tiny/medusa1.yaml", overrides, progress=True)
    err = capsys.readouterr().err
    assert any(line.startswith("train:") for line in _bars(err)), err
    assert any(line.startswith("Loading weights") for line in _bars(err)), err
