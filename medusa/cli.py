"""The ``medusa`` command. Every subcommand is a thin layer over a library function.

Subcommands live next to the code they drive; each module exposes ``register(subparsers)`` which adds
its parser and sets ``func`` (called with the parsed args, returns an exit status). User errors
(:class:`medusa.errors.MedusaError`) print one ``error: ...`` line and exit 2; ``--debug`` shows the
traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from typing import Sequence

from medusa.errors import MedusaError


def command_modules() -> list[str]:
    """Every ``medusa/cli_*.py`` module provides subcommands through ``register(subparsers)``."""
    import pkgutil

    import medusa

    return sorted(f"medusa.{m.name}" for m in pkgutil.iter_modules(medusa.__path__) if m.name.startswith("cli_"))


def _cmd_info(args: argparse.Namespace) -> int:
    from medusa.modeling.model import summarize

    summary = summarize(args.checkpoint)
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    print(f"checkpoint   {summary['path']}")
    print(f"base model   {summary['base_model'] or '(unnamed)'} ({summary['base_model_type']}, "
          f"hidden {summary['hidden_size']}, vocab {summary['vocab_size']})"
          + ("  [merged backbone inside]" if summary["merged_backbone"] else ""))
    print(f"heads        {summary['num_heads']} x {summary['num_layers']} ResBlock(s), "
          f"{summary['head_type']}, {summary['dtype']}")
    print(f"parameters   {summary['parameters']:,}")
    if summary["trained_with"]:
        print(f"trained with {summary['trained_with']}")
    tree = summary["tree"]
    if tree is None:
        print("tree         none (decoding uses the built-in default; run `medusa calibrate`)")
    else:
        expected = tree["expected_tokens_per_step"]
        print(f"tree         {tree['nodes']} nodes, depth {tree['depth']}"
              + (f", expected {expected:.2f} tokens/step" if expected else ""))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="medusa", description="Train, calibrate, export and decode with MEDUSA heads on any Hugging Face causal LM.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    info = sub.add_parser("info", help="summarise a heads checkpoint")
    info.add_argument("checkpoint", help="a MEDUSA heads directory")
    info.add_argument("--json", action="store_true", help="print the summary as JSON")
    info.set_defaults(func=_cmd_info)
    for name in command_modules():
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("MEDUSA_DEBUG") == "1"
    try:
        args = build_parser().parse_args(argv)
        return int(args.func(args) or 0)
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


if __name__ == "__main__":
    sys.exit(main())
