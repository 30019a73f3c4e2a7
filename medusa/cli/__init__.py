"""The ``medusa`` command: an explicit list of subcommands, one module each, thin over the library.

Each module in :data:`COMMANDS` exposes ``register(subparsers)``, which adds its parser and sets ``func``
(called with the parsed args, returns an exit status). This is the one place that turns a user error
(:class:`medusa.errors.MedusaError`, a bad command line, a path of the wrong kind) into one ``error: ...``
line and exit status 2; ``--debug`` (or ``MEDUSA_DEBUG=1``) prints the traceback before it, still exit 2.
Numeric options are :class:`Bounded` and path options :class:`PathKind`, so a value out of range or a
missing input fails while the command line is parsed, before any model loads. Nothing in the library
imports this package. The subcommand modules import the library inside their functions on purpose (the one
exception to top-level imports), so that ``medusa --help`` and argument errors load only the public API
(not transformers, training, demo, export or eval).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import math
import os
import sys
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from medusa.errors import USER_ERRNOS, MedusaError, os_error_line, path_kind

# The subcommands, in the order `medusa --help` lists them (module names under medusa/cli/).
COMMANDS = ("info", "heads", "self_distill", "train", "cache_hidden", "calibrate", "export", "import_",
            "generate", "bench", "demo")
SEED_MAX = 2**32 - 1  # numpy's limit (accelerate's set_seed seeds numpy too)
MAX_NEW_TOKENS = 1 << 20  # a sanity bound; the model's own positions are checked once its config is read
MAX_NODES = 1024  # tree nodes (a static or dynamic tree); a verify pass is [nodes, past + nodes]


class UsageError(MedusaError):
    """A command line argparse refuses (unknown option, missing or out-of-range value)."""


class Parser(argparse.ArgumentParser):
    """argparse, but a bad command line is one ``error:`` line (exit 2) like every other user error."""

    def error(self, message: str) -> Any:
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


class Bounded:
    """An argparse ``type``: an int (``kind=int``) or a float in ``[lo, hi]`` (``(lo, hi]`` with
    ``lo_open``); nan and inf are refused; ``also`` lists extra accepted values (e.g. ``"auto"``)."""

    def __init__(self, kind: type, lo: float, hi: float, lo_open: bool = False, also: tuple = ()) -> None:
        self.kind, self.lo, self.hi, self.lo_open, self.also = kind, lo, hi, lo_open, also
        self.__name__ = kind.__name__

    def allowed(self) -> str:
        lo = f"> {self.lo}" if self.lo_open else f">= {self.lo}"
        words = "".join(f" or {a}" for a in self.also)
        return f"{lo} and <= {self.hi}{words}"

    def __call__(self, text: str) -> Any:
        if text in self.also:
            return text
        try:
            value = self.kind(text)
        except ValueError:
            what = "an integer" if self.kind is int else "a number"
            raise argparse.ArgumentTypeError(f"expected {what} ({self.allowed()}), got {text!r}") from None
        ok = (value > self.lo if self.lo_open else value >= self.lo) and value <= self.hi
        if not ok or (isinstance(value, float) and not math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"{text} is out of range (must be {self.allowed()})")
        return value


def count(hi: float, lo: int = 1) -> Bounded:
    """A whole number in ``[lo, hi]`` (default lo 1)."""
    return Bounded(int, lo, hi)


SEED = Bounded(int, 0, SEED_MAX)
NEW_TOKENS = count(MAX_NEW_TOKENS)
TEMPERATURE = Bounded(float, 1e-4, 100.0)  # below, logits / T overflow to inf and sampling reads NaN
TOP_K = count(1_000_000)
TOP_P = Bounded(float, 0.0, 1.0, lo_open=True)
NODES = count(MAX_NODES)
LOOKUP_TOKENS = count(MAX_NODES, lo=0)  # --lookup-tokens: the lookup chain's length (0: off)
THREADS = count(4096)


class PathKind:
    """An argparse ``type`` for a path argument; ``kind`` says what it must be, and the hostile-input tests
    read it. Inputs are checked here (exists, right kind, readable); outputs are checked by the command
    (:func:`medusa.io.check_output_dir` / ``check_output_file``), which knows ``--overwrite`` and its inputs.

    Kinds: ``file`` / ``dir`` / ``path`` (an existing file / directory / either); ``source`` (a data file or
    directory, or a hub dataset id); ``model`` (a model directory or a hub id); ``tree`` (a tree.json, or
    ``dynamic`` / ``dynamic-raw`` / ``lookup``); ``template`` (Jinja text or a name, or a .jinja / .j2 file);
    ``out_dir`` / ``out_file`` (outputs); ``out_into`` (a directory receiving named files).
    """

    INPUTS = ("file", "dir", "path", "source", "model", "tree", "template")
    OUTPUTS = ("out_dir", "out_file", "out_into")

    def __init__(self, kind: str) -> None:
        assert kind in self.INPUTS + self.OUTPUTS, kind
        self.kind = kind
        self.__name__ = f"path ({kind})"

    def _must(self, path: Path, want: str) -> None:
        if not path.exists():
            raise argparse.ArgumentTypeError(f"{path}: not found")
        if want == "file" and not path.is_file():
            raise argparse.ArgumentTypeError(f"{path}: is {path_kind(path)}, expected a file")
        if want == "dir" and not path.is_dir():
            raise argparse.ArgumentTypeError(f"{path}: is {path_kind(path)}, expected a directory")
        if not (path.is_file() or path.is_dir()):  # /dev/null, a pipe: reads as nothing, or blocks
            raise argparse.ArgumentTypeError(f"{path}: is {path_kind(path)}, expected a file or a directory")
        try:  # really open it: os.access asks about the real, not the effective, user
            if path.is_dir():
                os.listdir(path)
            else:
                open(path, "rb").close()
        except PermissionError:
            raise argparse.ArgumentTypeError(f"{path}: permission denied") from None

    @staticmethod
    def _model_config(path: Path) -> None:
        """A local model directory's config.json must be readable JSON (cheap; read before any load)."""
        import json

        from medusa.io import read_text

        config = path / "config.json"
        if config.is_file():
            try:
                json.loads(read_text(config))
            except (MedusaError, ValueError) as exc:
                raise argparse.ArgumentTypeError(f"{path}: not a model directory ({exc})") from None

    def __call__(self, text: str) -> str:
        path = Path(text).expanduser()
        looks_local = text.startswith((".", "/", "~")) or path.exists()
        data_suffix = path.suffix.lower() in (".json", ".jsonl", ".txt", ".parquet")
        if self.kind in ("file", "dir", "path"):
            self._must(path, self.kind)
        elif self.kind == "source" and (looks_local or data_suffix):
            self._must(path, "file" if data_suffix else "path")
        elif self.kind == "model" and looks_local:
            self._must(path, "path" if path.suffix == ".gguf" else "dir")
            if path.is_dir():
                self._model_config(path)
        elif self.kind == "tree" and text not in ("dynamic", "dynamic-raw", "lookup"):
            self._must(path, "file")
        elif self.kind == "template" and (text.endswith((".jinja", ".j2")) or looks_local):
            self._must(path, "file")
        return text


def add_overwrite(parser: argparse.ArgumentParser, what: str = "the output") -> None:
    parser.add_argument("--overwrite", action="store_true",
                        help=f"replace the files this command writes when {what} exists (other files are "
                             "kept; a folder holding an input is never written into)")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="medusa",
        description="Train, calibrate, export and decode with MEDUSA heads on any Hugging Face causal LM.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMANDS:
        importlib.import_module(f"medusa.cli.{name}").register(sub)
    return parser


def _fail(message: str, debug: bool) -> int:
    if debug:
        traceback.print_exc()
    print(f"error: {message}", file=sys.stderr)
    return 2


def run_command(fn: Callable[[], int], debug: bool,
                echo_user_errors: bool | Callable[[str], bool] = True) -> int:
    """Run ``fn``; a user error becomes one ``error:`` line on stderr and exit status 2 (``debug``: the
    traceback first, still status 2). ``echo_user_errors``: False, or a function of the message answering
    False, makes a :class:`MedusaError` exit 2 silently (a process of a launch where another one printed the
    same line: :func:`medusa.cli.train.first_to_report`)."""
    try:
        return int(fn() or 0)
    except MedusaError as exc:
        echo = echo_user_errors(str(exc)) if callable(echo_user_errors) else echo_user_errors
        if not echo and not debug:
            return 2
        return _fail(str(exc), debug)
    except FileNotFoundError as exc:
        return _fail(f"{exc.filename or exc}: file not found", debug)
    except (IsADirectoryError, NotADirectoryError, PermissionError, FileExistsError) as exc:
        if exc.filename is None:
            raise
        return _fail(f"{exc.filename}: {exc.strerror.lower() if exc.strerror else exc}", debug)
    except OSError as exc:  # the file system's refusals: name too long, read-only, disk full, quota...
        if exc.errno not in USER_ERRNOS:
            raise
        return _fail(os_error_line(exc), debug)
    except RecursionError:  # a reader without its own check: still one line (a file nested too deeply)
        return _fail("an input file is nested too deeply to read (JSON / YAML nesting past Python's "
                     "recursion limit)", debug)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


class _BelowError(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR


# KINETO_LOG_LEVEL: the torch profiler (libkineto, read when the process first profiles: `generate --profile`,
# `bench`'s op counts) prints its trace markers (levels STAGE 4 and USDT 5, above ERROR 3) to stderr on
# every profile; 6 is past its last level
_QUIET_ENV = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error",
              "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1", "KINETO_LOG_LEVEL": "6"}


def _restore_hf(saved_env: dict[str, str | None], before: tuple[bool, int] | None) -> None:
    """Put transformers' bars and verbosity back as they were (or as the user's environment would have set
    them, when the command imported it). huggingface_hub reads its setting once, at import: a hub first
    imported by the command keeps its bars off in this process."""
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        bars_default = saved_env["HF_HUB_DISABLE_PROGRESS_BARS"] in (None, "", "0", "false")
        bar, level = before or (bars_default, None)
        (hf_logging.enable_progress_bar if bar else hf_logging.disable_progress_bar)()
        if level is not None:
            hf_logging.set_verbosity(level)
        elif saved_env["TRANSFORMERS_VERBOSITY"] is None:
            hf_logging.set_verbosity(logging.WARNING)


@contextlib.contextmanager
def quiet_libraries() -> Iterator[None]:
    """Third-party chatter off while a command runs (transformers' loading bar and advisories,
    bitsandbytes' kernel, DeepSpeed's accelerator warnings, the torch profiler's trace markers): what a
    command prints is its own output, its own progress bar and, on a user error, the one ``error:`` line.
    Restored afterwards (in-process callers)."""
    saved_env = {k: os.environ.get(k) for k in _QUIET_ENV}
    before = None
    if "transformers" in sys.modules:  # already imported: its settings were read, set them directly
        from transformers.utils import logging as hf_logging

        before = (hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity())
        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    for key, value in _QUIET_ENV.items():
        os.environ.setdefault(key, value)
    deepspeed = logging.getLogger("DeepSpeed")  # one logger, whose level DeepSpeed sets itself at import
    if not any(isinstance(f, _BelowError) for f in deepspeed.filters):
        deepspeed.addFilter(_BelowError())
    # bitsandbytes logs from its modules' own loggers (bitsandbytes.backends.cpu.ops: the optional CPU kernel
    # it could not fetch), which a filter on their parent never sees; their level is inherited from it
    bnb, bnb_level = logging.getLogger("bitsandbytes"), logging.getLogger("bitsandbytes").level
    bnb.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", module=r"(bitsandbytes|deepspeed)(\.|$)")
            yield
    finally:
        bnb.setLevel(bnb_level)
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        with warnings.catch_warnings():  # huggingface_hub warns that its own bars stay off
            warnings.simplefilter("ignore")
            _restore_hf(saved_env, before)


def wants_debug(argv: Sequence[str]) -> bool:
    return "--debug" in argv or os.environ.get("MEDUSA_DEBUG") == "1"


def run_script(script_main: Callable[[], int | None]) -> int:
    """A script's ``main`` (``python -m benchmarks.X``) under the package's error handling: a user error is
    one ``error:`` line and exit status 2, as for ``medusa`` commands (``--debug`` / ``MEDUSA_DEBUG=1``:
    the traceback too)."""
    return run_command(lambda: int(script_main() or 0), wants_debug(sys.argv[1:]))


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)

    def call() -> int:
        args = build_parser().parse_args(argv)
        return args.func(args)

    with quiet_libraries():
        return run_command(call, wants_debug(argv))


if __name__ == "__main__":
    sys.exit(main())
