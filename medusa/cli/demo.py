"""``medusa demo``: self-distil, train, calibrate, export and benchmark MEDUSA heads on the embedded model."""

from __future__ import annotations

import argparse
from pathlib import Path

from medusa.cli import MAX_NODES, NEW_TOKENS, THREADS, Bounded, PathKind, count


def _cmd_demo(args: argparse.Namespace) -> int:
    from medusa.demo.run import DemoSettings, main
    from medusa.demo.stages import marker_path
    from medusa.errors import MedusaError
    from medusa.io import check_output_dir

    out = Path(args.out)
    ours = marker_path(out, "stage").parent.is_dir()  # a demo directory: its finished stages are reused
    if not ours and out.is_dir() and any(out.iterdir()):
        raise MedusaError(f"{out}: exists, is not empty and is not a demo directory (no .stages/); "
                          "give a new or empty --out")
    check_output_dir(out, overwrite=True, inputs=[args.model, args.recipe])
    if args.recipe:  # read now: the stages before training must not run for a recipe that cannot be read
        from medusa.config.parse import read_yaml
        from medusa.errors import ConfigError

        read_yaml(args.recipe, ConfigError)
    s = DemoSettings(out=args.out, threads=args.threads, timing_threads=args.timing_threads, nodes=args.nodes,
                     progress=not args.no_progress,
                     recipe_overrides=tuple(args.set))
    if args.model:
        s.model = args.model
    if args.recipe:
        s.recipe = args.recipe
    for key in ("distill_prompts", "bench_prompts", "max_new_tokens"):
        value = getattr(args, key)
        if value is not None:
            setattr(s, key, value)
    return main(s)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo",
                       help="the whole pipeline on the embedded default model (offline, ~10 min on a CPU)",
                       description=__doc__.splitlines()[0]
                       + " Re-running reuses finished stages; delete --out "
                                                              "to start over.")
    p.add_argument("--model", default=None, type=PathKind("model"),
                   help="a local causal LM directory (default: data/default_model)")
    p.add_argument("--out", default="out/demo", type=PathKind("out_dir"),
                   help="artefacts directory (default: out/demo)")
    p.add_argument("--recipe", default=None, type=PathKind("file"),
                   help="MEDUSA-1 recipe (default: medusa/demo/recipes/default_model_medusa1.yaml)")
    p.add_argument("--set", action="append", default=[], metavar="key=value",
                   help="recipe override (repeatable), e.g. --set train.epochs=1")
    p.add_argument("--nodes", default="auto", type=Bounded(int, 1, MAX_NODES, also=("auto",)),
                   help="tree size or auto (<= 64 nodes, by predicted tokens/s)")
    p.add_argument("--distill-prompts", type=count(10**7), default=None,
                   help="prompts to self-distil (default 2400)")
    p.add_argument("--bench-prompts", type=count(10**5), default=None,
                   help="held-out benchmark prompts (default 8)")
    p.add_argument("--max-new-tokens", type=NEW_TOKENS, default=None,
                   help="tokens per benchmark prompt (default 96)")
    p.add_argument("--threads", type=THREADS, default=None,
                   help="torch CPU threads for self-distillation and training (default: torch's)")
    p.add_argument("--timing-threads", type=THREADS, default=1,
                   help="torch CPU threads while timing: calibration, benchmark, the streamed completion "
                        "(default 1: the embedded model is tiny and a second thread only adds contention)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=_cmd_demo)
