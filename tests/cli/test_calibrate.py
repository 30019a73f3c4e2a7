"""``medusa calibrate`` (medusa/cli/calibrate.py) without a model: the options checked against the
checkpoint's config and the files the run would write, the node weights of the tree drawing, the printed
summary; and calibrating a stories260K checkpoint through the command (tree.json, plots, --nodes auto,
bad input)."""

from __future__ import annotations

import argparse

import pytest
from pipeline_helpers import stories_calibration_checkpoint

from medusa import MedusaModel
from medusa.calibrate.auto import AUTO_SIZES
from medusa.cli import main
from medusa.cli.calibrate import _check_before_loading, _path_weights, _print_summary
from medusa.errors import MedusaError
from medusa.modeling.config import MedusaConfig
from medusa.tree import MedusaTree


def _args(tmp_path, **kw) -> argparse.Namespace:
    heads = tmp_path / "heads"
    if not heads.exists():
        heads.mkdir()
        MedusaConfig(base_model_name_or_path="b", base_model_type="llama", hidden_size=8, vocab_size=16,
                     num_heads=3).save(heads)
        (tmp_path / "calib.jsonl").write_text('{"prompt": "a", "completion": " b"}\n')
    base = dict(heads=str(heads), data=str(tmp_path / "calib.jsonl"), method="empirical", max_depth=None,
                topk=2, nodes=15, overwrite=False, no_plots=True, plots=None, base=None, max_length=None)
    return argparse.Namespace(**{**base, **kw})


def test_nodes_are_bounded_by_topk_and_depth(tmp_path):
    _check_before_loading(_args(tmp_path))  # 1 + 2 + 4 + 8 = 15 nodes fit 3 heads of top-2
    with pytest.raises(MedusaError, match=r"--nodes 16: a tree of --topk 2 ranks and depth 3 has at most 15 "
                                          r"nodes \(allowed: 1..15 or auto\)"):
        _check_before_loading(_args(tmp_path, nodes=16))
    with pytest.raises(MedusaError, match="--nodes 8: a tree of --topk 2 ranks and depth 2 has at most 7 "):
        _check_before_loading(_args(tmp_path, nodes=8, max_depth=2))
    _check_before_loading(_args(tmp_path, nodes="auto", max_depth=1))
    with pytest.raises(MedusaError, match="--max-depth 4 must be between 1 and the checkpoint's 3 heads"):
        _check_before_loading(_args(tmp_path, max_depth=4))
    with pytest.raises(MedusaError, match="unknown --method 'magic'; choose one of empirical"):
        _check_before_loading(_args(tmp_path, method="magic"))


def test_max_length_is_bounded_by_the_base_models_positions(tmp_path, capsys):
    """--max-length past the base's max_position_embeddings (read from its config) is refused naming both
    numbers; the default is the smaller of 2048 and them; a base whose config cannot be read is left to the
    model load."""
    from tiny_models import STORIES, require_shared

    require_shared(STORIES)
    with pytest.raises(MedusaError, match=r"^--max-length 600 exceeds the model's 512 positions"):
        _check_before_loading(_args(tmp_path, base=str(STORIES), max_length=600))
    args = _args(tmp_path, base=str(STORIES))
    _check_before_loading(args)
    assert args.max_length == 512 and capsys.readouterr().out == ""
    args = _args(tmp_path, max_length=4096)  # the recorded base "b" is not here: nothing to check against
    _check_before_loading(args)
    assert args.max_length == 4096


def test_files_the_run_writes_are_checked_first(tmp_path):
    plots = tmp_path / "plots"
    plots.mkdir()
    (plots / "tree.png").write_bytes(b"the user's plot")
    _check_before_loading(_args(tmp_path, plots=str(plots)))  # --no-plots: the plots are not written
    with pytest.raises(MedusaError, match=r"tree\.png: exists; pass --overwrite"):
        _check_before_loading(_args(tmp_path, plots=str(plots), no_plots=False))
    _check_before_loading(_args(tmp_path, plots=str(plots), no_plots=False, overwrite=True))
    (tmp_path / "heads" / "tree.json").write_text("{}")
    with pytest.raises(MedusaError, match=r"tree\.json: exists; pass --overwrite"):
        _check_before_loading(_args(tmp_path))
    with pytest.raises(MedusaError, match="is the input"):  # the data file cannot be an output
        _check_before_loading(_args(tmp_path, data=str(tmp_path / "heads" / "tree.json"), overwrite=True))


def test_path_weights_multiply_conditional_accuracies():
    tree = MedusaTree.from_choices([[0], [1], [0, 0], [0, 2]])
    cal = {"conditional_accuracy": [[0.5, 0.2], [0.4, 0.1]]}  # ranks measured per depth: 2
    assert _path_weights(tree, cal) == pytest.approx({(0,): 0.5, (1,): 0.2, (0, 0): 0.2, (0, 2): 0.0})


def test_print_summary(capsys):
    tree = MedusaTree.from_choices([[0], [1], [0, 0]])
    cal = {"num_positions": 12345, "num_examples": 7, "top1": [0.61, 0.4], "draft_vocab": 0,
           "draft_vocab_coverage": None, "auto": {"sizes": [8, 16], "step_time_s": [0.002, 0.003],
                                                  "expected_tokens_per_step": [2.0, 2.5],
                                                  "tokens_per_s": [1000.0, 833.3]},
           "expected_tokens_per_step": 2.25, "independent_formula_tokens_per_step": 2.5,
           "dynamic_expected_tokens_per_step": {"calibrated": 2.4, "raw": 2.1}}
    _print_summary(cal, tree, "heads/tree.json", "calib.jsonl")
    assert capsys.readouterr().out.splitlines() == [
        "measured 12,345 positions in 7 examples of calib.jsonl", "top-1 accuracy per head: 0.61 / 0.40",
        "     8 nodes: step    2.00 ms, 2.00 tokens/step,    1000.0 tokens/s",
        "    16 nodes: step    3.00 ms, 2.50 tokens/step,     833.3 tokens/s",
        "wrote heads/tree.json: 4 nodes, depth 2, expected 2.25 tokens/step (independence formula: 2.50)",
        "a dynamic tree of 4 nodes (--tree dynamic --nodes 4) would give 2.40 tokens/step on this data "
        "(2.10 with raw head probabilities)"]
    _print_summary({**cal, "auto": None, "draft_vocab": 64, "draft_vocab_coverage": 0.875,
                    "dynamic_expected_tokens_per_step": None}, tree, "t.json", "d")
    out = capsys.readouterr().out.splitlines()
    assert out[2] == "draft vocabulary: 64 tokens cover 87.50% of the target tokens" and len(out) == 4


@pytest.fixture(scope="module")
def stories_checkpoint(tmp_path_factory):
    return stories_calibration_checkpoint(tmp_path_factory.mktemp("cal"))


def test_cli_calibrate_writes_tree_and_plots(stories_checkpoint, tmp_path, capsys):
    path, data = stories_checkpoint
    heads_before = (path / "medusa_heads.safetensors").read_bytes()
    assert main(["calibrate", "--heads", str(path), "--data", str(data), "--nodes", "12", "--topk", "4",
                 "--plots", str(tmp_path), "--quiet"]) == 0
    assert (path / "medusa_heads.safetensors").read_bytes() == heads_before
    tree = MedusaTree.from_json(path / "tree.json")
    assert len(tree) == 12 and tree.calibration["data"] == str(data)
    for png in ("calibration_accuracy.png", "tree.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    loaded = MedusaModel.from_pretrained(path)
    assert loaded.tree == tree
    assert "expected" in capsys.readouterr().out


def test_cli_calibrate_auto_nodes(stories_checkpoint, tmp_path, capsys, monkeypatch):
    import torch

    from medusa.modeling import cpu_linear

    packed = []  # the timed steps run on the model as `medusa generate` loads it: linears packed
    monkeypatch.setattr(cpu_linear, "auto_pack", lambda model: packed.append(cpu_linear.pack_linears(model)))
    threads = torch.get_num_threads()
    path, data = stories_checkpoint
    if (path / "tree.json").exists():  # an earlier calibration is replaced only with --overwrite
        before = (path / "tree.json").read_bytes()
        assert main(["calibrate", "--heads", str(path), "--data", str(data), "--no-plots", "--quiet"]) == 2
        assert "tree.json: exists; pass --overwrite" in capsys.readouterr().err
        assert (path / "tree.json").read_bytes() == before
    try:
        assert main(["calibrate", "--heads", str(path), "--data", str(data), "--nodes", "auto", "--no-plots",
                     "--quiet", "--overwrite", "--threads", "1"]) == 0
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
    assert len(packed) == 1 and (packed[0] > 0 or not cpu_linear.packing_supported())
    cal = MedusaTree.from_json(path / "tree.json").calibration
    auto = cal["auto"]
    assert auto["chosen"] in auto["sizes"] and len(auto["step_time_s"]) == len(auto["sizes"])
    best = max(range(len(auto["sizes"])), key=lambda i: auto["tokens_per_s"][i])
    assert auto["sizes"][best] == auto["chosen"]
    assert cal["nodes"] <= auto["chosen"]
    assert auto["sizes"] == list(AUTO_SIZES) and max(AUTO_SIZES) <= 64  # the "<= 64 nodes" the CLIs document


def test_cli_calibrate_bad_input(stories_checkpoint, tmp_path, capsys):
    path, data = stories_checkpoint
    for argv, needle in (
        (["--heads", str(tmp_path), "--data", str(data)], "medusa_config.json"),
        (["--heads", str(path), "--data", str(data), "--max-depth", "4"], "--max-depth"),
        (["--heads", str(path), "--data", str(tmp_path / "missing.jsonl")], "missing.jsonl"),
        (["--heads", str(path), "--data", str(data), "--method", "magic"], "magic"),
    ):
        capsys.readouterr()
        assert main(["calibrate", *argv, "--quiet", "--no-plots"]) == 2
        err = [l for l in capsys.readouterr().err.splitlines() if l.startswith("error:")]
        assert len(err) == 1 and needle in err[0], err


def test_cli_calibrate_lookup_tokens(stories_checkpoint, capsys):
    path, data = stories_checkpoint
    base = ["calibrate", "--heads", str(path), "--data", str(data), "--nodes", "6", "--topk", "2",
            "--no-plots", "--quiet", "--overwrite"]
    assert main([*base, "--lookup-tokens", "0"]) == 0
    tree = MedusaTree.from_json(path / "tree.json")
    assert tree.lookup_tokens == 0 and tree.calibration["lookup"]["chosen"] == 0
    assert tree.calibration["lookup"]["relative_step_cost"] == {}  # a fixed length is not timed
    assert "lookup chain: off -> predicted" in capsys.readouterr().out
    assert main([*base, "--lookup-tokens", "3"]) == 0
    tree = MedusaTree.from_json(path / "tree.json")
    assert tree.lookup_tokens == 3 and MedusaModel.from_pretrained(path).tree.lookup_tokens == 3
    assert "lookup chain: L=3 -> predicted" in capsys.readouterr().out
    assert main(base) == 0  # auto: the default
    tree = MedusaTree.from_json(path / "tree.json")
    assert tree.lookup_tokens == tree.calibration["lookup"]["chosen"]
    assert "lookup chain: " in capsys.readouterr().out
    for bad in ("-1", "many", "1.5", "100000"):
        before = (path / "tree.json").read_bytes()
        assert main([*base, "--lookup-tokens", bad]) == 2
        err = [l for l in capsys.readouterr().err.splitlines() if l.strip()]
        assert len(err) == 1 and err[0].startswith("error:") and "--lookup-tokens" in err[0], err
        assert (path / "tree.json").read_bytes() == before


def test_cli_lookup_bound_is_the_library_one():
    from medusa.calibrate.lookup import MAX_LOOKUP_TOKENS
    from medusa.cli import calibrate as cli

    assert cli.MAX_LOOKUP_TOKENS == MAX_LOOKUP_TOKENS


def test_cli_calibrate_times_an_eagle3_tree_in_the_decoding_dtype(tmp_path):
    """``--dtype bfloat16`` loads the drafter in bfloat16 too, as ``medusa generate --dtype`` does: the timed
    steps are the steps decoding will run (it timed a float32 drafter before)."""
    import json

    from tiny_models import STORIES, require_shared, stories_model

    require_shared(STORIES)
    heads = tmp_path / "heads"
    MedusaModel.from_base(stories_model(), num_heads=2, head_type="eagle3").save_pretrained(heads)
    data = tmp_path / "calib.jsonl"
    data.write_text(json.dumps({"prompt": "Once upon a time", "completion": " there was a girl."}) + "\n")
    assert main(["calibrate", "--heads", str(heads), "--data", str(data), "--dtype", "bfloat16", "--nodes",
                 "4", "--lookup-tokens", "0", "--quiet", "--no-plots", "--threads", "1"]) == 0
    record = json.loads((heads / "tree.json").read_text())["calibration"]
    assert record["dtype"] == "bfloat16" and record["drafter_dtype"] == "bfloat16"
