"""``accelerate launch [--config_file configs/accelerate/X.yaml] -m medusa.train RECIPE.yaml [key=value ...]``

The same as ``medusa train RECIPE.yaml [key=value ...]``. Dotted overrides: ``train.lr=1e-4
heads.num_heads=4 data.train=my.jsonl``. User errors print one ``error: ...`` line and exit 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from medusa.errors import MedusaError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipe", help="a YAML training recipe (see recipes/)")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="dotted overrides, e.g. train.lr=1e-4 heads.num_heads=4")


def run(recipe_path: str, overrides: Sequence[str]) -> int:
    from medusa.config import load_recipe
    from medusa.training.train import train

    recipe = load_recipe(recipe_path, list(overrides))  # every config error surfaces before a model loads
    result = train(recipe)
    if result.final_dir is not None:
        print(f"final heads: {result.final_dir}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("MEDUSA_DEBUG") == "1"
    argv = [a for a in argv if a != "--debug"]
    parser = argparse.ArgumentParser(prog="medusa.train", description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args.recipe, args.overrides)
    except MedusaError as exc:
        if debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
