"""``medusa calibrate --nodes auto`` and the pipelines' calibrate stage (medusa.cli, medusa.pipelines,
medusa.calibrate.auto) choose the tree size with the one chooser."""

import pytest
from pipeline_helpers import stories_calibration_checkpoint

from medusa import MedusaTree
from medusa.calibrate.auto import AUTO_SIZES
from medusa.cli import main


@pytest.fixture(scope="module")
def stories_checkpoint(tmp_path_factory):
    return stories_calibration_checkpoint(tmp_path_factory.mktemp("cal"))


def test_pipeline_and_cli_auto_share_the_chooser(stories_checkpoint, tmp_path, monkeypatch):
    """``medusa calibrate --nodes auto`` and the demo/bench pipelines' calibrate stage pick the size alike:
    with step times that make 24 nodes the fastest by far, both choose 24."""
    import medusa.calibrate.auto as A
    from medusa.demo.stages import calibrate_stage

    monkeypatch.setattr(A, "time_tree_steps", lambda model, trees,
                        prompt: {n: 1.0 if n == 24 else 1e6 for n in trees})
    path, data = stories_checkpoint
    summary = calibrate_stage(path, tmp_path / "final", data, nodes="auto", progress=False)
    assert summary["auto"]["chosen"] == 24 and summary["auto"]["sizes"] == list(AUTO_SIZES)
    assert main(["calibrate", "--heads", str(path), "--data", str(data), "--nodes", "auto", "--no-plots",
                 "--quiet", "--overwrite"]) == 0
    cli = MedusaTree.from_json(path / "tree.json")
    assert cli.calibration["auto"]["chosen"] == 24
    assert MedusaTree.from_json(tmp_path / "final" / "tree.json") == cli
