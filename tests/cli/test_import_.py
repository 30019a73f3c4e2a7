"""``medusa import`` (cli/import_.py): an export read back through the command is our checkpoint again."""

import pytest
from export_helpers import checkpoint as _checkpoint
from export_helpers import heads_tensors as _ours
from export_helpers import save_tiny_base

from medusa.cli import main


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    return save_tiny_base(tmp_path_factory.mktemp("base") / "llama")


def test_cli_export_import(tmp_path, base_dir, capsys):
    ck, _ = _checkpoint(tmp_path, base_dir, num_heads=2, num_layers=1)
    assert main(["export", "--format", "medusa-v1", str(ck), str(tmp_path / "v1")]) == 0
    assert main(["import", str(tmp_path / "v1"), str(tmp_path / "back")]) == 0
    assert "wrote" in capsys.readouterr().out
    assert _ours(ck).keys() == _ours(tmp_path / "back").keys()
