"""The command layer: the explicit subcommand list is what ``medusa --help`` shows, every (nested) subcommand
has a working ``--help``, and the one error handler turns user errors into one ``error:`` line, exit 2."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from medusa.cli import COMMANDS, build_parser, main, run_command
from medusa.errors import CheckpointError, ConfigError, DataError, MedusaError

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="200", HF_HUB_OFFLINE="1")


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return {name: p for a in actions for name, p in a.choices.items()}


def _command_paths(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every subcommand path, nested ones included: ``("heads",), ("heads", "init"), ...``."""
    paths = []
    for name, sub in _subparsers(parser).items():
        paths.append(prefix + (name,))
        paths.extend(_command_paths(sub, prefix + (name,)))
    return paths


def test_commands_list_is_what_help_lists():
    proc = subprocess.run([sys.executable, "-m", "medusa", "--help"], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    listed = re.findall(r"^ {4}(\S+)", proc.stdout.split("positional arguments:")[1].split("options:")[0],
                        flags=re.M)
    registered = list(_subparsers(build_parser()))
    assert listed == registered  # same names, same order
    assert registered == [name.rstrip("_").replace("_", "-") for name in COMMANDS]  # one per module, in order
    helpers = {"__init__", "decode_args"}  # decode_args: the flags generate and bench share, no command
    modules = sorted(p.stem for p in (ROOT / "medusa" / "cli").glob("*.py") if p.stem not in helpers)
    assert modules == sorted(COMMANDS), ("a medusa/cli/ module that is not a registered command "
                                         "(or the reverse)")


def test_every_subcommand_help_exits_zero(capsys):
    paths = _command_paths(build_parser())
    assert len(paths) > len(COMMANDS)  # the nested ones (heads init, export vllm, ...) are walked too
    for path in paths:
        with pytest.raises(SystemExit) as exc:
            main([*path, "--help"])
        assert exc.value.code == 0, path
        assert capsys.readouterr().out.startswith(f"usage: medusa {' '.join(path)}"), path


@pytest.mark.parametrize("error", [MedusaError("bad.yaml: no such key 'x'"),
                                   ConfigError("r.yaml: train.lr < 0"),
                                   DataError("d.jsonl:3: not JSON"), CheckpointError("ckpt: no config.json")])
def test_user_error_is_one_line_and_exit_2(error, capsys):
    def fail() -> int:
        raise error

    assert run_command(fail, debug=False) == 2
    captured = capsys.readouterr()
    assert captured.err == f"error: {error}\n" and captured.out == ""
    assert run_command(fail, debug=True) == 2  # --debug adds the traceback, the status stays 2
    err = capsys.readouterr().err
    assert err.startswith("Traceback") and err.endswith(f"error: {error}\n")


def test_missing_file_is_one_line_and_exit_2(tmp_path, capsys):
    missing = tmp_path / "nope.json"

    def fail() -> int:
        missing.read_text()
        return 0

    assert run_command(fail, debug=False) == 2
    assert capsys.readouterr().err == f"error: {missing}: file not found\n"
    assert run_command(fail, debug=True) == 2
    assert "FileNotFoundError" in capsys.readouterr().err


def test_bugs_are_not_swallowed_and_status_passes_through():
    def bug() -> int:
        raise ValueError("a bug, not a user error")

    with pytest.raises(ValueError):
        run_command(bug, debug=False)
    assert run_command(lambda: 3, debug=False) == 3
    assert run_command(lambda: None, debug=False) == 0


def test_debug_flag_adds_the_traceback_and_keeps_exit_2(tmp_path, capsys):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("model: x\nmodel: y\n")
    assert main(["train", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "bad.yaml:2: duplicate key 'model'" in err and err.count("\n") == 1
    assert main(["--debug", "train", str(recipe)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "Traceback (most recent call last):" and "ConfigError" in err[-2]
    assert err[-1].startswith("error: ") and "duplicate key" in err[-1]


@pytest.mark.parametrize("errno_, filename, line", [
    (36, "/out/" + "d" * 251 + ".errors.jsonl", "/out/" + "d" * 251 + ".errors.jsonl: file name too long"),
    (30, "/mnt/ro/out.jsonl", "/mnt/ro/out.jsonl: read-only file system"),
    (28, None, "no space left on device (errno 28)"),  # a write() that filled the disk names no file
    (122, "/quota/x", "/quota/x: disk quota exceeded"),
])
def test_file_system_errors_are_one_line_and_exit_2(errno_, filename, line, capsys):
    import os

    def fail() -> int:
        raise OSError(errno_, os.strerror(errno_), filename)

    assert run_command(fail, debug=False) == 2
    captured = capsys.readouterr()
    assert captured.err == f"error: {line}\n" and captured.out == ""


def test_an_os_error_that_is_a_bug_keeps_its_traceback():
    def fail() -> int:
        raise OSError(22, "Invalid argument")  # EINVAL: the program's fault, not the file system's

    with pytest.raises(OSError):
        run_command(fail, debug=False)


def test_quiet_libraries_reaches_the_loggers_of_bitsandbytes_modules(caplog):
    """bitsandbytes warns from its modules' own loggers (``bitsandbytes.backends.cpu.ops`` on a CPU without
    its optional kernels): while a command runs they are below the threshold; their level is restored
    after."""
    import logging

    from medusa.cli import quiet_libraries

    child = logging.getLogger("bitsandbytes.backends.cpu.ops")
    with caplog.at_level(logging.WARNING), quiet_libraries():
        child.warning("Failed to load CPU gemm_4bit_forward")
        child.error("a real error still shows")
    assert [r.getMessage() for r in caplog.records] == ["a real error still shows"]
    assert logging.getLogger("bitsandbytes").level == logging.NOTSET


def test_every_benchmark_script_runs_under_the_package_error_handling():
    """``python -m benchmarks.X``: a user error is one ``error:`` line and exit 2, as for ``medusa``
    (run_script); the engine workers run inside the engines' own venvs, without medusa's CLI."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "benchmarks"
    workers = {"speculators_worker.py", "vllm_worker.py"}
    scripts = [p for p in sorted(root.glob("*.py"))
               if p.name not in workers and re.search(r'^if __name__ == "__main__":', p.read_text(), re.M)]
    assert scripts
    tail = '__name__ == "__main__"'
    bare = [p.name for p in scripts if "run_script(main)" not in p.read_text().split(tail)[-1]]
    assert bare == []
