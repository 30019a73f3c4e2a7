"""``medusa cache-hidden RECIPE [key=value ...]``: build a MEDUSA-1 recipe's hidden-state cache
(``train.hidden_cache``) ahead of training; resumable, like the build ``medusa train`` starts with."""

from __future__ import annotations

import argparse

from medusa.cli import PathKind


def _cmd_cache_hidden(args: argparse.Namespace) -> int:
    from medusa.config import load_recipe
    from medusa.training.hidden_cache import cache_for_recipe

    recipe = load_recipe(args.recipe, args.overrides)
    cache = cache_for_recipe(recipe, dtype=args.dtype)
    index = cache.plan.index
    print(f"hidden cache {cache.plan.directory} complete: {len(cache)} examples, "
          f"{index['num_tokens']:,} tokens, {len(cache.plan.shards)} shard(s), {index['dtype']}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cache-hidden",
                       help="write a MEDUSA-1 recipe's backbone hidden states (train.hidden_cache)")
    p.add_argument("recipe", type=PathKind("file"),
                   help="a MEDUSA-1 training recipe (YAML) with train.hidden_cache set")
    p.add_argument("overrides", nargs="*", help="recipe overrides key=value, e.g. train.hidden_cache=cache/")
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default=None,
                   help="storage dtype of the hidden states (default bfloat16; an existing cache keeps its "
                        "own, and a different --dtype is refused)")
    p.set_defaults(func=_cmd_cache_hidden)
