"""``medusa heads init``: new (untrained) heads on a base model, saved as a checkpoint; ``medusa heads
draft-vocab``: a trained checkpoint narrowed to the first N ids of its draft vocabulary."""

from __future__ import annotations

import argparse

from medusa.cli import PathKind, add_overwrite, count
from medusa.config.enums import HEAD_TYPES, HYDRA_PROJECTIONS


def _projection(args: argparse.Namespace) -> str:
    """``--hydra-projection``, checked against ``--head-type``; unset: the recipe default
    (``heads.hydra_projection``)."""
    from medusa.config import HeadsConfig
    from medusa.errors import MedusaError

    if args.hydra_projection is None:
        return HeadsConfig.hydra_projection
    if args.head_type != "hydra":
        raise MedusaError(f"--hydra-projection {args.hydra_projection} only applies to --head-type hydra "
                          f"(got --head-type {args.head_type})")
    return args.hydra_projection


def _cmd_heads_init(args: argparse.Namespace) -> int:
    from medusa.config.validate import check_head_fields
    from medusa.decoding.drafter import Drafter
    from medusa.io import check_output_dir
    from medusa.modeling import MedusaModel

    projection = _projection(args)
    check_head_fields(args.num_heads, args.num_layers, args.head_type, 0, projection,
                      prefix="--")  # each family's rules, before the base model loads
    check_output_dir(args.out, args.overwrite, inputs=[args.base])  # before the base model loads
    model = MedusaModel.from_base(args.base, num_heads=args.num_heads, num_layers=args.num_layers,
                                  head_type=args.head_type, heads_dtype=args.dtype, dtype=args.dtype,
                                  hydra_projection=projection)
    model.save_pretrained(args.out, overwrite=args.overwrite, inputs=[args.base])
    n = sum(p.numel() for p in model.heads.parameters())
    kind = f" (hydra, projection: {projection})" if args.head_type == "hydra" else ""
    if isinstance(model.heads, Drafter):
        kind = f" ({args.head_type} drafter over base layers {list(model.heads.feature_layers)})"
    print(f"wrote {args.out}: {args.num_heads} heads x {args.num_layers} layer(s){kind}, {n:,} parameters")
    return 0


def _cmd_heads_draft_vocab(args: argparse.Namespace) -> int:
    """Keep draft ids ``0..N-1`` (a trained map lists its ids most frequent first), each with its trained
    row: one trained drafter gives every smaller vocabulary, to pick by tokens/s. The tree is kept."""
    from medusa.errors import MedusaError
    from medusa.io import check_output_dir
    from medusa.modeling import MedusaModel

    check_output_dir(args.out, args.overwrite, inputs=[args.heads])
    model = MedusaModel.from_pretrained(args.heads)
    have = int(model.config.draft_vocab or 0)
    if not 0 < args.size <= have:
        raise MedusaError(f"--size {args.size}: {args.heads} has "
                          f"{f'a draft vocabulary of {have} tokens' if have else 'the full vocabulary'}; "
                          f"give a size in [1, {have or 'its draft vocabulary'}]")
    model.use_draft_vocab(model.heads.token_map[: args.size].clone())
    model.save_pretrained(args.out, overwrite=args.overwrite, inputs=[args.heads])
    print(f"wrote {args.out}: draft vocabulary {have} -> {args.size} tokens (ids 0..{args.size - 1} of "
          f"{args.heads})")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    heads = sub.add_parser("heads", help="create heads checkpoints")
    heads_sub = heads.add_subparsers(dest="heads_command", metavar="ACTION")
    heads_sub.required = True
    init = heads_sub.add_parser("init", help="new heads initialised from the base LM head")
    init.add_argument("--base", required=True, type=PathKind("model"),
                      help="base model: local path or hub id")
    init.add_argument("--num-heads", type=count(64), default=5,
                      help="1..64 (default 5); eagle3: the draft steps it is trained for")
    init.add_argument("--num-layers", type=count(16, lo=0), default=1,
                      help="ResBlocks per head, 0..16 (default 1)")
    init.add_argument("--head-type", choices=list(HEAD_TYPES), default="linear")
    init.add_argument("--hydra-projection", choices=list(HYDRA_PROJECTIONS), default=None,
                      help="hydra heads' W2: their own, or the base LM head (default: as the recipe key "
                           "heads.hydra_projection, own); --head-type hydra only")
    init.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 (default: the base's)")
    init.add_argument("--out", required=True, type=PathKind("out_dir"),
                      help="output directory (new or empty; see --overwrite)")
    add_overwrite(init, "--out")
    init.set_defaults(func=_cmd_heads_init)
    vocab = heads_sub.add_parser("draft-vocab", help="narrow trained heads to their first N draft ids")
    vocab.add_argument("heads", type=PathKind("dir"), help="a heads checkpoint with a draft vocabulary")
    vocab.add_argument("--size", required=True, type=count(1 << 20), help="N, at most the current size")
    vocab.add_argument("--out", required=True, type=PathKind("out_dir"),
                       help="output directory (new or empty; see --overwrite)")
    add_overwrite(vocab, "--out")
    vocab.set_defaults(func=_cmd_heads_draft_vocab)
