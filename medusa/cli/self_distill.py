"""``medusa self-distill``: the model answers prompts; its own replies become training data."""

from __future__ import annotations

import argparse
import json

from medusa.cli import NEW_TOKENS, SEED, TOP_K, TOP_P, Bounded, PathKind, count
from medusa.config.enums import PROMPT_FORMATS


def _cmd_self_distill(args: argparse.Namespace) -> int:
    from medusa.io import check_output_file
    from medusa.selfdistill import Sampling, SelfDistillConfig, self_distill

    # --out is appended to (a re-run resumes), so an existing file is fine; a folder or an input is not
    check_output_file(args.out, overwrite=True, inputs=[args.prompts, args.model, args.chat_template])
    sampling = Sampling(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                        max_new_tokens=args.max_new_tokens, seed=args.seed)
    cfg = SelfDistillConfig(
        model=args.model, prompts=args.prompts, out=args.out, mode=args.mode, backend=args.backend,
        prompt_format=args.format, split=args.split, limit=args.limit, prompt_sentences=args.prompt_sentences,
        prompt_chars=args.prompt_chars, prompt_tokens=args.prompt_tokens, turns=args.turns,
        synthesize_prompts=args.synthesize_prompts,
        sampling=sampling, num_samples=args.num_samples, on_length=args.on_length,
        retry_errors=args.retry_errors, chat_template=args.chat_template, tokenizer=args.tokenizer,
        batch_size=args.batch_size, dtype=args.dtype, device=args.device, load_in_4bit=args.load_in_4bit,
        endpoint=args.endpoint, served_model=args.served_model, api=args.api, api_key=args.api_key,
        concurrency=args.concurrency, timeout_s=args.timeout, retries=args.retries,
        retry_backoff_s=args.retry_backoff, progress=not args.no_progress)
    if args.user_prompt is not None:
        cfg.user_prompt = args.user_prompt
    s = self_distill(cfg)
    if args.json:
        print(json.dumps(s, indent=2))
        return 0
    print(f"wrote {s['written']} rows to {s['out']} ({s['already_done']} already there, "
          f"{s['errors']} errors + {s['invalid_prompts']} invalid prompts -> {s['errors_file']}"
          + (f", {s['skipped_failed_before']} failed before: --retry-errors"
             if s["skipped_failed_before"] else "")
          + ")")
    if s.get("generation_s"):
        print(f"{s['completion_tokens']:,} tokens in {s['generation_s']:.1f}s: "
              f"{s['rows_per_s']:.2f} rows/s, {s['tokens_per_s']:.1f} tokens/s")
    return 0


def _openai_options(op: argparse._ArgumentGroup) -> None:
    op.add_argument("--endpoint", help="server base URL, e.g. http://127.0.0.1:8000/v1")
    op.add_argument("--served-model", help="model name to request (default: the first in /v1/models)")
    op.add_argument("--api", choices=["chat", "completions"], help="default: chat, or completions in "
                                                                   "completion mode")
    op.add_argument("--api-key", help="default: $OPENAI_API_KEY")
    op.add_argument("--concurrency", type=count(1024), default=16, help="requests in flight")
    op.add_argument("--timeout", type=Bounded(float, 0.0, 86400.0, lo_open=True), default=600.0,
                    help="seconds per request")
    op.add_argument("--retries", type=count(100, lo=0), default=5)
    op.add_argument("--retry-backoff", type=Bounded(float, 0.0, 3600.0), default=1.0,
                    help="first backoff in seconds (doubles)")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("self-distill", help="generate training data from the model's own replies",
                       description=__doc__.splitlines()[0])
    p.add_argument("--model", type=PathKind("model"),
                   help="local backend: model path or hub id (also the name in the metadata); "
                        "openai backend: unused, see --served-model")
    p.add_argument("--prompts", type=PathKind("source"),
                   help=".json/.jsonl/.parquet/.txt file, a datasets directory, or a hub dataset id")
    p.add_argument("--out", required=True, type=PathKind("out_file"),
                   help="output JSONL (appended to; re-running resumes)")
    p.add_argument("--mode", choices=["replay", "self-talk", "completion"], default="replay")
    p.add_argument("--backend", choices=["local", "openai"], default="local")
    g = p.add_argument_group("prompts")
    g.add_argument("--format", default="auto",
                   choices=list(PROMPT_FORMATS))
    g.add_argument("--split", default="train", help="dataset split (directories and hub datasets)")
    g.add_argument("--limit", type=count(10**9), help="use only the first N prompts (N >= 1)")
    g.add_argument("--synthesize-prompts", type=count(10**7, lo=0), default=0, metavar="N",
                   help="no prompt set needed: the model writes N user requests itself (sampled from "
                        "its chat template's user header, deduplicated; kept in <out>.prompts.jsonl), "
                        "then answers them")
    g.add_argument("--prompt-sentences", type=count(1000), default=None,
                   help="text documents: first N sentences (the default rule: 1); a rule given for rows "
                        "that are not text documents is an error")
    g.add_argument("--prompt-chars", type=count(10**7),
                   help="text documents: first N characters (word boundary)")
    g.add_argument("--prompt-tokens", type=count(10**6), help="text documents: first N tokens")
    g.add_argument("--turns", type=count(100),
                   help="replay: answer at most N user turns; self-talk: N assistant replies (default 3)")
    g.add_argument("--user-prompt", help="self-talk: the instruction the model gets when playing the user")
    g.add_argument("--chat-template", type=PathKind("template"),
                   help="a Jinja chat template (file or string) replacing the tokenizer's")
    g.add_argument("--tokenizer", type=PathKind("model"),
                   help="tokenizer for --prompt-tokens (default: --model)")
    s = p.add_argument_group("sampling")
    s.add_argument("--temperature", type=Bounded(float, 0.0, 100.0), default=0.7, help="0 = greedy")
    s.add_argument("--top-p", type=TOP_P, default=1.0, help="in (0, 1]")
    s.add_argument("--top-k", type=TOP_K, default=None)
    s.add_argument("--max-new-tokens", type=NEW_TOKENS, default=512)
    s.add_argument("--num-samples", "-n", type=count(1000), default=1, help="samples per prompt")
    s.add_argument("--seed", type=SEED, default=0)
    s.add_argument("--on-length", choices=["error", "keep"],
                   help="a reply cut at --max-new-tokens: errors file (default in chat modes) or keep "
                        "(default in completion mode)")
    s.add_argument("--retry-errors", action="store_true", help="attempt rows in <out>.errors.jsonl again")
    lo = p.add_argument_group("local backend")
    lo.add_argument("--batch-size", type=count(4096), default=16)
    lo.add_argument("--dtype", help="default: bfloat16 on GPU, float32 on CPU")
    lo.add_argument("--device", help="default: cuda if available")
    lo.add_argument("--load-in-4bit", action="store_true", help="bitsandbytes NF4")
    _openai_options(p.add_argument_group("openai backend"))
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=_cmd_self_distill)
