"""``medusa import``: official MEDUSA (v0.1 .pt, v2 safetensors) or vLLM heads -> this project's format."""

from __future__ import annotations

import argparse

from medusa.cli import PathKind, add_overwrite


def _cmd_import(args: argparse.Namespace) -> int:
    from medusa.export import import_checkpoint
    from medusa.io import check_output_dir

    check_output_dir(args.out, args.overwrite, inputs=[args.src, args.base])
    summary = import_checkpoint(args.src, args.out, base=args.base, format=args.format,
                                overwrite=args.overwrite)
    tree = f", tree of {summary['tree_nodes']} nodes" if summary["tree_nodes"] else ""
    print(f"wrote {summary['out']} (from {summary['format']}): {summary['num_heads']} heads x "
          f"{summary['num_layers']} layer(s) on {summary['base_model']}{tree}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    imp = sub.add_parser("import", help="convert official MEDUSA or vLLM heads into this project's format")
    imp.add_argument("--base", default=None, type=PathKind("model"),
                     help="base model (default: base_model_name_or_path of the source)")
    imp.add_argument("--format", default="auto", metavar="F", help="auto | medusa-v1 | vllm")
    imp.add_argument("src", type=PathKind("path"),
                     help="a directory with medusa_lm_head.safetensors / .pt, or a vLLM Medusa dir")
    imp.add_argument("out", type=PathKind("out_dir"), help="output directory (new or empty; see --overwrite)")
    add_overwrite(imp, "OUT")
    imp.set_defaults(func=_cmd_import)
