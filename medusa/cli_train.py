"""``medusa train RECIPE.yaml [key=value ...]``: the same as ``accelerate launch -m medusa.train``."""

from __future__ import annotations

import argparse


def _cmd_train(args: argparse.Namespace) -> int:
    from medusa.train import run

    return run(args.recipe, args.overrides)


def register(sub: argparse._SubParsersAction) -> None:
    from medusa.train import add_arguments

    parser = sub.add_parser("train", help="train MEDUSA heads from a YAML recipe (MEDUSA-1 / MEDUSA-2)")
    add_arguments(parser)
    parser.set_defaults(func=_cmd_train)
