"""``medusa generate``: decode prompts with MEDUSA heads; prints the text and tokens/step."""

from __future__ import annotations

import argparse
import sys

from medusa.cli import SEED, Bounded, PathKind
from medusa.cli.decode_args import (
    add_checkpoint_args,
    add_output_length_args,
    add_sampling_args,
    add_tree_args,
)
from medusa.config.enums import ACCEPTANCE
from medusa.errors import MedusaError


def _cmd_generate(args: argparse.Namespace) -> int:
    import torch

    from medusa.decoding.tree_option import tree_option

    if args.prompt is None and args.prompts is None:
        raise MedusaError("give --prompt TEXT or --prompts FILE")
    from medusa.data.readers import read_prompts
    from medusa.modeling.loading import check_positions, check_tree_fits, encode_prompt, load_for_generation

    prompts = [args.prompt] if args.prompt is not None else read_prompts(args.prompts)
    tree = tree_option(args.tree, args.nodes, args.lookup_tokens)  # before the model loads
    if args.profile and (args.lookup_tokens or tree == "lookup"):
        raise MedusaError("--profile measures the heads' tree only; drop --lookup-tokens / --tree lookup")
    model, tokenizer = load_for_generation(args.heads, args.base, args.dtype)
    check_positions(model, tokenizer, prompts, args.max_new_tokens, args.chat)
    check_tree_fits(model, tree)
    if args.profile:
        from medusa.eval.profile import format_profile, profile_decoding

        print(format_profile(profile_decoding(model, tokenizer, prompts, args.max_new_tokens, tree=tree,
                                              chat=args.chat)))
        return 0
    generator = torch.Generator(device=model.device).manual_seed(args.seed) if args.seed is not None else None
    total_tokens = total_steps = 0
    for prompt in prompts:
        ids = encode_prompt(tokenizer, prompt, args.chat).to(model.device)
        streamer = None
        if args.stream:
            from transformers import TextStreamer

            streamer = TextStreamer(tokenizer, skip_prompt=False, skip_special_tokens=True)
        out = model.generate(ids, max_new_tokens=args.max_new_tokens, acceptance=args.acceptance,
                             temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                             posterior_threshold=args.posterior_threshold,
                             posterior_alpha=args.posterior_alpha,
                             tree=tree, return_dict_in_generate=True, streamer=streamer, generator=generator,
                             compile=args.compile, lookup_tokens=args.lookup_tokens)
        new = out.sequences.shape[1] - ids.shape[1]
        if not args.stream:
            print(tokenizer.decode(out.sequences[0], skip_special_tokens=True))
        seconds = out.prefill_time_s + out.decode_time_s
        compiled = f", compile {out.compile_time_s:.1f} s apart" if args.compile else ""
        print(f"[{new} tokens, {out.num_steps} steps, {out.tokens_per_step:.2f} tokens/step, "
              f"{new / seconds:.0f} tokens/s{compiled}]", file=sys.stderr if args.quiet_stats else sys.stdout)
        total_tokens += sum(sum(a) for a in out.accept_lengths)
        total_steps += out.num_steps
    if len(prompts) > 1 and total_steps:
        print(f"[all prompts: {total_tokens / total_steps:.2f} tokens/step]")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="decode with MEDUSA heads (prints text and tokens/step)")
    add_checkpoint_args(p, "a MEDUSA heads checkpoint directory")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", default=None, help="one prompt")
    src.add_argument("--prompts", default=None, type=PathKind("file"),
                     help="a .txt (one per line) or .jsonl file of prompts")
    p.add_argument("--acceptance", choices=list(ACCEPTANCE), default="greedy",
                   help="greedy and sample are lossless; typical is faster at high temperature but lossy")
    add_output_length_args(p)
    add_sampling_args(p)
    p.add_argument("--posterior-threshold", type=Bounded(float, 0.0, 1.0), default=0.09,
                   help="typical acceptance epsilon, in [0, 1]")
    p.add_argument("--posterior-alpha", type=Bounded(float, 0.0, 1.0), default=0.3,
                   help="typical acceptance delta, in [0, 1]")
    add_tree_args(p)
    p.add_argument("--seed", type=SEED, default=None)
    p.add_argument("--compile", action="store_true",
                   help="static cache + torch.compile of the step (compiled once per shapes; time "
                        "shown apart)")
    p.add_argument("--stream", action="store_true", help="print tokens as they are accepted")
    p.add_argument("--chat", action="store_true", help="wrap each prompt in the tokenizer's chat template")
    p.add_argument("--profile", action="store_true",
                   help="measure MEDUSA vs plain decoding (overhead, tokens/step, tokens/s vs HF generate)")
    p.add_argument("--quiet-stats", action="store_true", help="print the per-prompt statistics on stderr")
    p.set_defaults(func=_cmd_generate)
