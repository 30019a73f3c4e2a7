"""``medusa info CHECKPOINT``: summarise a heads checkpoint."""

from __future__ import annotations

import argparse
import json

from medusa.cli import PathKind


def _cmd_info(args: argparse.Namespace) -> int:
    from medusa.modeling.summary import summarize

    summary = summarize(args.checkpoint)
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    print(f"checkpoint   {summary['path']}")
    print(f"base model   {summary['base_model'] or '(unnamed)'} ({summary['base_model_type']}, "
          f"hidden {summary['hidden_size']}, vocab {summary['vocab_size']})"
          + ("  [merged backbone inside]" if summary["merged_backbone"] else ""))
    projection = summary.get("hydra_projection")
    layers = summary.get("feature_layers")
    kind = (f"eagle3 drafter: 1 decoder layer over base layers {layers}, {summary['num_heads']} draft steps"
            if layers is not None else
            f"{summary['num_heads']} x {summary['num_layers']} ResBlock(s), {summary['head_type']}")
    print(f"heads        {kind}" + (f" (projection: {projection})" if projection else "")
          + (f", draft vocab {summary['draft_vocab']}" if summary["draft_vocab"] else "")
          + f", {summary['dtype']}")
    print(f"parameters   {summary['parameters']:,}")
    if summary["trained_with"]:
        print(f"trained with {summary['trained_with']}")
    tree = summary["tree"]
    if tree is None:
        print("tree         none (decoding uses the built-in default; run `medusa calibrate`)")
    else:
        expected = tree["expected_tokens_per_step"]
        grown = (f" (grown per step: branch {tree['branch']}, expand {tree['expand']}, lookup "
                 f"{tree['lookup_tokens']})" if "branch" in tree else "")
        print(f"tree         {tree['nodes']} nodes, depth {tree['depth']}{grown}"
              + (f", expected {expected:.2f} tokens/step" if expected else ""))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    info = sub.add_parser("info", help="summarise a heads checkpoint")
    info.add_argument("checkpoint", type=PathKind("dir"), help="a MEDUSA heads directory")
    info.add_argument("--json", action="store_true", help="print the summary as JSON")
    info.set_defaults(func=_cmd_info)
