"""The ``medusa`` command: an explicit list of subcommands, one module each, thin over the library.

Each module in :data:`COMMANDS` exposes ``register(subparsers)``, which adds its parser and sets ``func``
(called with the parsed args, returns an exit status). This is the one place that turns a user error
(:class:`medusa.errors.MedusaError`) into one ``error: ...`` line and exit status 2; ``--debug`` (or
``MEDUSA_DEBUG=1``) shows the traceback instead. Nothing in the library imports this package.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence

from medusa.errors import MedusaError

# The subcommands, in the order `medusa --help` lists them (module names under medusa/cli/).
COMMANDS = ("info", "heads", "self_distill", "train", "cache_hidden", "calibrate", "export", "import_",
            "generate", "bench", "demo")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="medusa",
        description="Train, calibrate, export and decode with MEDUSA heads on any Hugging Face causal LM.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMANDS:
        importlib.import_module(f"medusa.cli.{name}").register(sub)
    return parser


def run_command(fn: Callable[[], int], debug: bool) -> int:
    """Run ``fn``; a user error becomes one ``error:`` line on stderr and exit status 2."""
    try:
        return int(fn() or 0)
    except MedusaError as exc:
        if debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except FileNotFoundError as exc:
        if debug:
            raise
        print(f"error: {exc.filename or exc}: file not found", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


def wants_debug(argv: Sequence[str]) -> bool:
    return "--debug" in argv or os.environ.get("MEDUSA_DEBUG") == "1"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)

    def call() -> int:
        args = build_parser().parse_args(argv)
        return args.func(args)

    return run_command(call, wants_debug(argv))


if __name__ == "__main__":
    sys.exit(main())
