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
        return run_command(call, debug, echo_user_errors=first_to_report)


def first_to_report(message: str, root: str | None = None, fresh_s: float = 60.0) -> bool:
    """Whether this process prints the user error ``message``: always outside a launch; within an
    ``accelerate launch`` / ``torchrun`` launch, only the first of its processes (on this machine) to meet
    that message -- every process meets the same recipe and file errors (one line for all), while an error
    only one process meets (its own shard) still reaches the user. The first claims the message by creating
    a marker named by the launch and the message in ``root`` (the temp folder) exclusively; a marker older
    than ``fresh_s`` seconds is another run's (a shell that keeps its environment, a reused pid) and is
    claimed anew. Where the launch cannot be told apart (no ``/proc``), the first process (``RANK`` 0)
    reports."""
    import hashlib
    import os
    import tempfile
    import time

    world = os.environ.get("WORLD_SIZE", "1").strip()
    if not world.isdigit() or int(world) <= 1:  # not a launch (or one that sets no usable size)
        return True
    parent = os.getppid()  # the launcher: every local process's parent
    try:
        with open(f"/proc/{parent}/stat", "rb") as stat:
            started = stat.read().rsplit(b")", 1)[1].split()[19].decode()  # its start time (a reused pid)
    except (OSError, IndexError, UnicodeDecodeError):
        return os.environ.get("RANK", "0") == "0"
    launch = "-".join([str(parent), started, os.environ.get("MASTER_PORT", ""),
                       os.environ.get("TORCHELASTIC_RUN_ID", "")])
    digest = hashlib.sha256(f"{launch}\n{message}".encode()).hexdigest()[:24]
    marker = os.path.join(root or tempfile.gettempdir(), "medusa-launch-errors", digest)
    try:
        os.makedirs(os.path.dirname(marker), exist_ok=True)
        if os.path.exists(marker) and time.time() - os.path.getmtime(marker) > fresh_s:
            os.remove(marker)  # another run's (ours: named by the launch and the message)
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        return False  # another process of this launch printed it
    except OSError:
        return os.environ.get("RANK", "0") == "0"  # no marker possible: the first process reports
    return True
