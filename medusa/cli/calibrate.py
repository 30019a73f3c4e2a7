"""``medusa calibrate``: measure the heads on held-out conversations and store the tree in the checkpoint."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from medusa.cli import MAX_NODES, THREADS, Bounded, PathKind, add_overwrite, count

PLOTS = ("calibration_accuracy.png", "tree.png")
MAX_LENGTH = 2048  # --max-length's default, cut to the base model's positions
MAX_LOOKUP_TOKENS = 256  # medusa.calibrate.lookup.MAX_LOOKUP_TOKENS (not imported: the CLI loads no library)


def _check_before_loading(args: argparse.Namespace) -> None:
    """Options against the checkpoint's config, and the files this run writes, before any model loads."""
    from medusa.calibrate.calibrate import METHODS
    from medusa.errors import MedusaError
    from medusa.io import check_output_file
    from medusa.modeling.config import TREE_NAME, MedusaConfig

    if args.method not in METHODS:
        raise MedusaError(f"unknown --method {args.method!r}; choose one of {', '.join(METHODS)}")
    num_heads = MedusaConfig.load(args.heads).num_heads
    if args.max_depth is not None and args.max_depth > num_heads:
        raise MedusaError(f"--max-depth {args.max_depth} must be between 1 and the checkpoint's "
                          f"{num_heads} heads")
    depth = args.max_depth or num_heads
    possible = 1 + sum(args.topk ** d for d in range(1, depth + 1))
    if args.nodes not in ("auto", None) and args.nodes > possible:
        raise MedusaError(f"--nodes {args.nodes}: a tree of --topk {args.topk} ranks and depth {depth} has"
                          f" at most {possible} nodes (allowed: 1..{min(possible, MAX_NODES)} or auto)")
    _fit_max_length(args)
    inputs = [args.data]
    check_output_file(Path(args.heads) / TREE_NAME, args.overwrite, inputs)
    if not args.no_plots:
        folder = Path(args.plots or args.heads)
        if Path(args.data).exists() and Path(args.data).resolve().parent == folder.resolve():
            raise MedusaError(f"{folder}: holds the input {args.data} (--data); the plots would be written "
                              "beside it: give --plots another folder, or --no-plots")
        for name in PLOTS:
            check_output_file(folder / name, args.overwrite, inputs)


def _fit_max_length(args: argparse.Namespace) -> None:
    """``--max-length`` within the base model's positions (read from its config): a larger value is refused
    naming both numbers; the default is the smaller of 2048 and those positions (as its help says)."""
    from medusa.modeling.base import fit_max_length, max_positions
    from medusa.modeling.config import MedusaConfig, base_location

    config = MedusaConfig.load(args.heads)
    limit = max_positions(base_location(args.heads, config, args.base, hint="pass --base"))
    args.max_length, _ = fit_max_length("--max-length", args.max_length, limit, MAX_LENGTH)


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from medusa.calibrate.calibrate import calibrate, write_tree
    from medusa.data import load_tokenized
    from medusa.decoding.drafter import Drafter
    from medusa.modeling import MedusaModel
    from medusa.modeling.base import load_tokenizer
    from medusa.modeling.config import base_location
    from medusa.modeling.cpu_linear import auto_pack
    from medusa.modeling.loading import decoding_heads_dtype

    _check_before_loading(args)
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    # heads in the decoding dtype, as `medusa generate --dtype` loads them: the timed steps are its steps
    model = MedusaModel.from_pretrained(args.heads, base_model=args.base, dtype=args.dtype,
                                        heads_dtype=decoding_heads_dtype(args.dtype), device_map=args.device)
    auto_pack(model)  # --nodes/--lookup-tokens auto time decode steps as `medusa generate` runs them
    tokenizer = load_tokenizer(args.tokenizer or base_location(args.heads, model.config, args.base,
                                                               hint="pass --base"))
    data = load_tokenized(args.data, tokenizer, max_length=args.max_length, format=args.format,
                          chat_template=args.chat_template, skip_invalid=args.skip_invalid)
    examples = data.examples[: args.max_examples] if args.max_examples else data.examples
    if isinstance(model.heads, Drafter):  # a sequential drafter: its tree is timed, not predicted
        return _calibrate_drafter(args, model, examples)
    tree = calibrate(model, examples, nodes=args.nodes or 64, topk=args.topk, max_depth=args.max_depth,
                     method=args.method, data_name=str(args.data), batch_size=args.batch_size,
                     progress=not args.quiet, lookup_tokens=args.lookup_tokens)
    if data.skipped:
        tree.calibration["skipped_rows"] = dict(data.skipped)
    out = Path(args.plots or args.heads)
    new = [] if args.no_plots else [out / n for n in PLOTS if not (out / n).exists()] + \
        ([] if out.exists() else [out])  # what this run creates: removed again if it fails
    try:
        plots = _write_plots(args, tree) if not args.no_plots else []
        path = write_tree(args.heads, tree)  # last: a run that fails before leaves no tree.json behind
    except BaseException:
        _remove_new(new)
        raise
    cal = tree.calibration
    _print_summary(cal, tree, path, args.data)
    for p in plots:
        print(f"wrote {p}")
    return 0


def _remove_new(paths: list[Path]) -> None:
    """A failed run removes the files (then the folder) it created."""
    for path in paths:
        if path.is_dir() and not path.is_symlink():
            if not any(path.iterdir()):
                path.rmdir()
        else:
            path.unlink(missing_ok=True)


def _write_plots(args: argparse.Namespace, tree: Any) -> list[Path]:
    """The accuracy and tree plots, into ``--plots`` or the checkpoint."""
    from medusa.calibrate.plot import plot_accuracy, plot_tree

    cal, out = tree.calibration, Path(args.plots or args.heads)
    out.mkdir(parents=True, exist_ok=True)
    plots = [plot_accuracy(cal["accuracy"], out / PLOTS[0],
                           title=f"head accuracy by rank ({cal['num_positions']:,} positions)")]
    weights = {tuple(c): cal_w for c, cal_w in _path_weights(tree, cal).items()}
    plots.append(plot_tree(tree.choices, out / PLOTS[1], weights=weights,
                           title=f"{len(tree)} nodes, expected {cal['expected_tokens_per_step']:.2f} "
                                 f"tokens/step"))
    return plots


def _print_summary(cal: dict, tree: Any, path: Any, data: str) -> None:
    """What ``medusa calibrate`` measured and wrote (accuracies, auto sizes, the tree, the dynamic replay)."""
    print(f"measured {cal['num_positions']:,} positions in {cal['num_examples']} examples of {data}")
    print("top-1 accuracy per head: " + " / ".join(f"{a:.2f}" for a in cal["top1"]))
    if cal.get("draft_vocab_coverage") is not None:
        print(f"draft vocabulary: {cal['draft_vocab']} tokens cover {cal['draft_vocab_coverage']:.2%} of the "
              "target tokens")
    if cal.get("draft_vocab_loss"):
        loss = cal["draft_vocab_loss"]
        print(f"  tokens/step lost to it: at most {loss['lost_upper_bound']:.2%} "
              f"({loss['tokens_per_step']:.2f} vs {loss['oracle_tokens_per_step']:.2f} with every "
              "out-of-vocabulary target guessed; "
              f"{loss['oov_share']:.2%} of the heads' targets are outside it)")
    if cal["auto"]:
        for n, t, e, s in zip(cal["auto"]["sizes"], cal["auto"]["step_time_s"],
                              cal["auto"]["expected_tokens_per_step"], cal["auto"]["tokens_per_s"]):
            print(f"  {n:4d} nodes: step {t * 1e3:7.2f} ms, {e:.2f} tokens/step, {s:9.1f} tokens/s")
    print(f"wrote {path}: {len(tree)} nodes, depth {tree.depth}, expected "
          f"{cal['expected_tokens_per_step']:.2f} tokens/step (independence formula: "
          f"{cal['independent_formula_tokens_per_step']:.2f})")
    if cal.get("lookup"):
        from medusa.calibrate.lookup import lookup_summary

        print(lookup_summary(cal["lookup"]))
    if cal.get("dynamic_expected_tokens_per_step"):
        dyn = cal["dynamic_expected_tokens_per_step"]
        print(f"a dynamic tree of {len(tree)} nodes (--tree dynamic --nodes {len(tree)}) would give "
              f"{dyn['calibrated']:.2f} tokens/step on this data ({dyn['raw']:.2f} with raw head "
              "probabilities)")


def _calibrate_drafter(args: argparse.Namespace, model: Any, examples: list[dict]) -> int:
    """eagle3 heads: the draft tree (depth, branching, nodes, lookup chain) with the most tokens/s in greedy
    decoding of the held-out conversations' prompts (:mod:`medusa.calibrate.draft_tree`); no plots."""
    import torch

    from medusa.calibrate.draft_tree import LOOKUP_CHOICES, calibrate_draft_tree, candidate_shapes
    from medusa.errors import MedusaError
    from medusa.modeling.config import TREE_NAME

    prompts = []
    for ex in examples[: args.max_examples or 12]:
        labelled = [i for i, y in enumerate(ex["labels"]) if y != -100]
        if labelled and labelled[0] > 0:  # the conversation up to its first reply token
            prompts.append(torch.tensor([ex["input_ids"][: labelled[0]]], dtype=torch.long))
    if not prompts:
        raise MedusaError(f"{args.data}: no conversation with a prompt and a reply to decode")
    lookup = LOOKUP_CHOICES if args.lookup_tokens == "auto" else (args.lookup_tokens,)
    shapes = candidate_shapes(lookup=lookup, nodes=None if args.nodes in (None, "auto") else args.nodes)
    shape = calibrate_draft_tree(model, prompts, shapes=shapes, log=(lambda _: None) if args.quiet else print,
                                 progress=not args.quiet)
    path = Path(args.heads) / TREE_NAME
    shape.to_json(path)
    print(f"wrote {path}: {shape.num_nodes} nodes, depth {shape.depth}, branch {shape.branch}, expand "
          f"{shape.expand}, lookup {shape.lookup_tokens}: "
          f"{shape.calibration['expected_tokens_per_step']:.2f} tokens/step on {len(prompts)} prompts")
    return 0


def _path_weights(tree, cal) -> dict:
    """Acceptance probability of each node for the drawing: product of conditional accuracies."""
    acc = cal["conditional_accuracy"]
    weights = {}
    for path in tree.choices:
        w = 1.0
        for d, r in enumerate(path):
            w *= acc[d][r] if r < len(acc[d]) else 0.0
        weights[path] = w
    return weights


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("calibrate", help="measure head accuracy on held-out data and write tree.json")
    p.add_argument("--heads", required=True, type=PathKind("dir"),
                   help="heads checkpoint directory (tree.json is written into it; an earlier one is "
                        "replaced only with --overwrite)")
    p.add_argument("--data", required=True, type=PathKind("source"),
                   help="held-out conversations (any format medusa.data reads)")
    p.add_argument("--nodes", type=Bounded(int, 1, MAX_NODES, also=("auto",)), default=None,
                   help=f"tree size including the root (1..{MAX_NODES}; default 64, eagle3 heads: the timed "
                        "grid's sizes), or 'auto': the size (8..64) with the most predicted tokens/s, "
                        "decoding steps timed on this device")
    p.add_argument("--lookup-tokens", type=Bounded(int, 0, MAX_LOOKUP_TOKENS, also=("auto",)), default="auto",
                   help="context-lookup chain verified beside the tree (stored in tree.json): 'auto' (the "
                        "length with the most predicted tokens/s, steps timed on this device) or N (0: off)")
    p.add_argument("--max-depth", type=count(64), default=None,
                   help="deepest tree level (default: all heads)")
    p.add_argument("--topk", type=count(1000), default=10, help="ranks measured per head (1..1000)")
    p.add_argument("--method", default="empirical",
                   help="empirical (measured path frequencies) | conditional | independent")
    p.add_argument("--base", default=None, type=PathKind("model"),
                   help="base model (default: the checkpoint's)")
    p.add_argument("--tokenizer", default=None, type=PathKind("model"),
                   help="tokenizer (default: the base model's)")
    p.add_argument("--format", default="auto", help="data format (default: detected)")
    p.add_argument("--chat-template", default=None, type=PathKind("template"),
                   help="chat template file or name")
    p.add_argument("--max-length", type=count(1 << 20, lo=2), default=None,
                   help=f"tokens per held-out conversation (default: {MAX_LENGTH}, or the base model's "
                        "positions when fewer; more than its positions is refused)")
    p.add_argument("--max-examples", type=count(10**9), default=None)
    p.add_argument("--batch-size", type=count(4096), default=8)
    p.add_argument("--skip-invalid", action="store_true", help="skip malformed rows instead of failing")
    p.add_argument("--dtype", default=None, help="base model dtype")
    p.add_argument("--device", default=None, help="device_map for the base model (e.g. cuda)")
    p.add_argument("--plots", default=None, type=PathKind("out_into"),
                   help="directory for the PNGs (default: the checkpoint)")
    p.add_argument("--no-plots", action="store_true")
    add_overwrite(p, "tree.json or a plot")
    p.add_argument("--threads", type=THREADS, default=None,
                   help="torch CPU threads for the run and the timed steps of auto (default: torch's)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_calibrate)
