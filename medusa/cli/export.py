"""``medusa export``: heads -> vLLM / TensorRT-LLM / TGI / official MEDUSA."""

from __future__ import annotations

import argparse

from medusa.cli import PathKind, add_overwrite


def _cmd_export(args: argparse.Namespace) -> int:
    from medusa.errors import MedusaError
    from medusa.export import export_checkpoint
    from medusa.io import check_output_dir

    if args.base_precision is not None and not args.with_base:
        raise MedusaError("--base-precision applies with --with-base only")
    check_output_dir(args.out, args.overwrite, inputs=[args.src, args.tree, args.base])
    summary = export_checkpoint(args.src, args.out, args.format, tree=args.tree, base=args.base,
                                with_backbone=args.with_backbone, overwrite=args.overwrite,
                                embed_tokens=not args.no_embed_tokens,
                                base_precision=(args.base_precision or "f32") if args.with_base else None,
                                draft_precision=args.draft_precision)
    note = ", W2 materialised from the base LM head" if summary["materialised_lm_head"] else ""
    if summary["materialised_lm_head"] and summary["lm_head_copies"] == 1:
        note += " once (original_lm_head: one lm_head.weight shared by all heads)"
    if summary["layout"] == "medusa-v2":
        note = ", MEDUSA v2 layout (the heads reuse the base LM head)"
    tree = f", tree of {summary['tree_nodes']} nodes" if summary["tree_nodes"] else ""
    print(f"wrote {summary['out']} ({args.format}): {summary['num_heads']} heads x "
          f"{summary['num_layers']} layer(s){tree}{note}")
    tokenizer = summary["tokenizer"] or "none found"
    print(f"backbone: {summary['backbone'] or '(none recorded)'} ({summary['backbone_description']}; "
          f"tokenizer: {tokenizer})")
    for line in summary["notes"]:
        print(f"note: {line}")
    print("load it with:")
    for command in summary["commands"]:
        print(f"  {command}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    exp = sub.add_parser("export", help="write heads in a serving engine's format",
                         description="Formats: vllm, medusa-v1, tensorrt-llm, tgi (MEDUSA heads); "
                                     "speculators, gguf (eagle3 heads; gguf: llama.cpp).")
    # Not argparse `choices`: an unknown format must give a one-line `error:` (exit 2) like other user errors.
    exp.add_argument("--format", required=True, metavar="F",
                     help="vllm | medusa-v1 | tensorrt-llm | tgi | speculators | gguf")
    exp.add_argument("--tree", default=None, type=PathKind("file"),
                     help="tree.json for tensorrt-llm / medusa-v1 (default: the checkpoint's)")
    exp.add_argument("--base", default=None, type=PathKind("model"),
                     help="the backbone to record, and where shared_lm_head heads find the LM head (default: "
                          "a MEDUSA-2 checkpoint's merged backbone, else the config's base)")
    exp.add_argument("--with-backbone", action="store_true",
                     help="copy a MEDUSA-2 checkpoint's merged backbone into OUT/base_model and record that")
    exp.add_argument("--with-base", action="store_true",
                     help="gguf: also write the base as the GGUF llama-server loads (OUT/base-PREC.gguf)")
    exp.add_argument("--base-precision", default=None, metavar="P",
                     help="with --with-base: f32 (default) | bf16 | q4_1 (llama-quantize's Q4_1 mix)")
    exp.add_argument("--draft-precision", default=None, metavar="P",
                     help="gguf: the drafter's matrices, f32 (default) | bf16 (half the bytes per drafting "
                          "pass; for a bf16 or quantised target) | q8_0 (a quarter)")
    exp.add_argument("--no-embed-tokens", action="store_true",
                     help="speculators: leave the base's input embeddings out of the export (V x d smaller; "
                          "vLLM shares the target's, the speculators package does not load it)")
    exp.add_argument("src", type=PathKind("dir"), help="a heads checkpoint (this project's format)")
    exp.add_argument("out", type=PathKind("out_dir"), help="output directory (new or empty; see --overwrite)")
    add_overwrite(exp, "OUT")
    exp.set_defaults(func=_cmd_export)
