"""``medusa train RECIPE.yaml [key=value ...]``, the same as ``accelerate launch -m medusa.train``.

Dotted overrides: ``train.lr=1e-4 heads.num_heads=4 data.train=my.jsonl``. Every config error surfaces
before a model loads.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence

from medusa.cli import Parser, PathKind, quiet_libraries, run_command, wants_debug


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipe", type=PathKind("file"), help="a YAML training recipe (see recipes/)")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="dotted overrides, e.g. train.lr=1e-4 heads.num_heads=4")
    parser.add_argument("--overwrite", action="store_true",
                        help="output_dir holds an earlier run or other files: train from scratch there "
                             "anyway, removing only the earlier run's final/, checkpoints, metrics.jsonl and "
                             "recipe.json (train.resume=auto continues a run instead)")
    parser.add_argument("--resume-changed", action="store_true",
                        help="resume even though the recipe or the data files changed since the checkpoint "
                             "(the changes are recorded in metrics.jsonl)")


def run(recipe_path: str, overrides: Sequence[str], overwrite: bool = False,
        resume_changed: bool = False) -> int:
    import os

    from medusa.config import load_recipe
    from medusa.io import output_lock
    from medusa.training.loop import train

    recipe = load_recipe(recipe_path, list(overrides))  # every config error surfaces before a model loads
    # one run per output_dir: the launch's first process holds the lock (the others follow it)
    lock = output_lock(recipe.output_dir) if os.environ.get("RANK", "0") == "0" else contextlib.nullcontext()
    with lock:
        result = train(recipe, overwrite=overwrite, resume_changed=resume_changed)
    if result.final_dir is not None:
        print(f"final heads: {result.final_dir}")
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    return run(args.recipe, args.overrides, args.overwrite, args.resume_changed)


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("train", help="train MEDUSA heads from a YAML recipe (MEDUSA-1 / MEDUSA-2)")
    add_arguments(parser)
    parser.set_defaults(func=_cmd_train)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m medusa.train`` / ``accelerate launch -m medusa.train``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = wants_debug(argv)
    parser = Parser(prog="medusa.train", description=__doc__.splitlines()[0])
    add_arguments(parser)

    def call() -> int:
        args = parser.parse_args([a for a in argv if a != "--debug"])
        return run(args.recipe, args.overrides, args.overwrite, args.resume_changed)

    with quiet_libraries():
        return run_command(call, debug, echo_user_errors=launch_rank() == 0)


def launch_rank() -> int:
    """This process's rank in an ``accelerate launch`` / ``torchrun`` launch (0 outside one): every process
    meets the same user error (same recipe, files and checks), and only the first reports it."""
    import os

    rank = os.environ.get("RANK", "0")
    return int(rank) if rank.isdigit() else 0
