"""``medusa calibrate`` (medusa/cli/calibrate.py) without a model: the options checked against the
checkpoint's config and the files the run would write, the node weights of the tree drawing, the printed
summary. (Calibrating through the command: tests/tree/test_calibrate.py.)"""

from __future__ import annotations

import argparse

import pytest

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
                topk=2, nodes=15, overwrite=False, no_plots=True, plots=None)
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
