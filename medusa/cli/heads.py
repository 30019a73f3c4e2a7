"""``medusa heads init``: new (untrained) heads on a base model, saved as a checkpoint."""

from __future__ import annotations

import argparse


def _cmd_heads_init(args: argparse.Namespace) -> int:
    from medusa.modeling import MedusaModel

    model = MedusaModel.from_base(args.base, num_heads=args.num_heads, num_layers=args.num_layers,
                                  head_type=args.head_type, heads_dtype=args.dtype, dtype=args.dtype)
    model.save_pretrained(args.out)
    n = sum(p.numel() for p in model.heads.parameters())
    print(f"wrote {args.out}: {args.num_heads} heads x {args.num_layers} layer(s), {n:,} parameters")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    heads = sub.add_parser("heads", help="create heads checkpoints")
    heads_sub = heads.add_subparsers(dest="heads_command", metavar="ACTION")
    heads_sub.required = True
    init = heads_sub.add_parser("init", help="new heads initialised from the base LM head")
    init.add_argument("--base", required=True, help="base model: local path or hub id")
    init.add_argument("--num-heads", type=int, default=5)
    init.add_argument("--num-layers", type=int, default=1)
    init.add_argument("--head-type", choices=["linear", "shared_lm_head", "hydra"], default="linear")
    init.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 (default: the base's)")
    init.add_argument("--out", required=True, help="output directory")
    init.set_defaults(func=_cmd_heads_init)
