"""``medusa bench``: MEDUSA vs HF generate (optional assisted / prompt-lookup baselines) on a prompts file."""

from __future__ import annotations

import argparse
from pathlib import Path

from medusa.cli import (
    MAX_NODES,
    SEED,
    THREADS,
    PathKind,
    add_overwrite,
    count,
)
from medusa.cli.decode_args import (
    add_checkpoint_args,
    add_output_length_args,
    add_sampling_args,
    add_tree_args,
)
from medusa.config.enums import ACCEPTANCE


def _cmd_bench(args: argparse.Namespace) -> int:
    import torch

    from medusa.data.readers import read_prompts
    from medusa.decoding.tree_option import tree_option
    from medusa.eval.bench import bench, check_lookup
    from medusa.eval.report import format_summary, report_paths, write_report
    from medusa.io import check_output_file
    from medusa.modeling.loading import check_positions, load_for_generation

    for path in report_paths(args.out, plots=not args.no_plots):
        check_output_file(path, args.overwrite, inputs=[args.prompts, args.heads, args.tree])
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    prompts = read_prompts(args.prompts)  # before any model loads: a bad file fails fast
    if args.limit is not None:
        prompts = prompts[: args.limit]
    check_lookup(args.tree, args.lookup_tokens, args.compare_lookup)  # before any model loads
    tree = tree_option(args.tree, args.nodes, args.lookup_tokens)
    model, tokenizer = load_for_generation(args.heads, args.base, args.dtype)
    check_positions(model, tokenizer, prompts, args.max_new_tokens, args.chat)
    assistant, assistant_tok = None, None
    if args.assistant_model:
        from medusa.modeling.base import load_base_model, load_tokenizer

        dtype = next(model.base_model.parameters()).dtype
        assistant = load_base_model(args.assistant_model, dtype=dtype).to(model.device).eval()
        assistant_tok = load_tokenizer(args.assistant_model)
        if assistant_tok.get_vocab() == tokenizer.get_vocab():
            assistant_tok = None  # same tokenizer: plain assisted generation
    report = bench(model, tokenizer, prompts, max_new_tokens=args.max_new_tokens, acceptance=args.acceptance,
                   temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, tree=tree,
                   assistant_model=assistant, assistant_tokenizer=assistant_tok,
                   prompt_lookup=args.prompt_lookup,
                   prompt_lookup_num_tokens=args.prompt_lookup_num_tokens, repeats=args.repeats,
                   ignore_eos=not args.stop_at_eos, seed=args.seed, progress=not args.quiet, chat=args.chat,
                   compile=args.compile, lookup_tokens=args.lookup_tokens,
                   compare_lookup=args.compare_lookup)
    report["config"]["heads"] = str(Path(args.heads).resolve())
    report["config"]["prompts_file"] = str(args.prompts)
    print(format_summary(report))
    if args.compile:
        from medusa.eval.bench import format_compiled

        print(format_compiled(report["compiled"]))
    for path in write_report(report, args.out, plots=not args.no_plots):
        print(f"wrote {path}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="measure MEDUSA against HF generate: speedup, tokens/step, overhead",
                       description=__doc__.splitlines()[0])
    add_checkpoint_args(p, "a MEDUSA heads checkpoint directory (its tree.json is used)")
    p.add_argument("--prompts", required=True, type=PathKind("file"),
                   help="JSONL with 'prompt' (or MT-bench 'turns': the first turn) per row, or a "
                        "text file, one prompt per line")
    p.add_argument("--limit", type=count(10**9), default=None, help="only the first N prompts (N >= 1)")
    add_output_length_args(p, "tokens every method writes per prompt")
    p.add_argument("--acceptance", choices=list(ACCEPTANCE), default="greedy",
                   help="greedy compares with generate(do_sample=False); the others with do_sample=True")
    add_sampling_args(p)
    add_tree_args(p)
    p.add_argument("--assistant-model", default=None, type=PathKind("model"),
                   help="also measure HF assisted generation with this draft model (speculative decoding)")
    p.add_argument("--prompt-lookup", action="store_true", help="also measure HF prompt-lookup decoding")
    p.add_argument("--prompt-lookup-num-tokens", type=count(1000), default=10)
    p.add_argument("--compare-lookup", type=count(MAX_NODES), default=0, metavar="L",
                   help="(L >= 1) MEDUSA with heads only (lookup_tokens=0), and beside it our lookup chain "
                        "of L tokens alone (--tree lookup) and with the heads (hybrid), each against the "
                        "same HF run")
    p.add_argument("--repeats", type=count(1000), default=1,
                   help="runs per method and prompt; the fastest counts")
    p.add_argument("--stop-at-eos", action="store_true",
                   help="stop every method at EOS (default: ignore EOS so all write exactly "
                        "--max-new-tokens)")
    p.add_argument("--chat", action="store_true",
                   help="wrap each prompt in the tokenizer's chat template as a user turn (as medusa "
                        "generate --chat)")
    p.add_argument("--threads", type=THREADS, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--compile", action="store_true",
                   help="also compiled MEDUSA (static cache, torch.compile) vs HF static-cache "
                        "compiled generate")
    p.add_argument("--seed", type=SEED, default=0)
    p.add_argument("--out", default="bench_report.json", type=PathKind("out_file"),
                   help="report JSON; the markdown table and PNG plots go beside it (existing ones are "
                        "replaced only with --overwrite)")
    add_overwrite(p, "the report or a plot")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_bench)
