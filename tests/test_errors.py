"""medusa.errors: the user-error classes the CLI turns into ``error:`` + exit 2, and ``first_line``, which
keeps a library exception's message to the one line those errors show."""

import pytest

from medusa.errors import CheckpointError, ConfigError, DataError, MedusaError, first_line


def test_user_errors_are_medusa_errors_and_not_value_errors():
    for cls in (CheckpointError, ConfigError, DataError):
        assert issubclass(cls, MedusaError) and not issubclass(cls, ValueError)
    with pytest.raises(MedusaError, match="bad.yaml: no such key"):
        raise ConfigError("bad.yaml: no such key 'x'")


@pytest.mark.parametrize("exc, line", [
    (OSError("disk on fire\nsecond line\nthird"), "disk on fire"),
    (ValueError("  \n  leading blank lines\ntail  "), "leading blank lines"),
    (KeyError(), "KeyError"),  # no message: the type names it
    (RuntimeError("   \n  "), "RuntimeError"),
    (DataError("d.jsonl:3: not JSON"), "d.jsonl:3: not JSON"),
])
def test_first_line(exc, line):
    assert first_line(exc) == line


def test_path_kind_names_what_is_there(tmp_path):
    import os

    from medusa.errors import path_kind

    (tmp_path / "f").write_text("x")
    os.mkfifo(tmp_path / "pipe")
    assert path_kind(tmp_path / "f") == "a file" and path_kind(tmp_path) == "a directory"
    assert path_kind(os.devnull) == "a character device" and path_kind(tmp_path / "pipe") == "a named pipe"
    assert path_kind(tmp_path / "missing") == "missing"
