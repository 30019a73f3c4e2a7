"""Measurements for the training note (not tests: nothing here asserts a speed or a size).

``python -m benchmarks.training memory [--vocab 128000 --seq 2048 --heads 5 --hidden 256]``
    Peak memory of one forward + backward of the head loss, chunked vs naive. Each variant runs in a
    fresh subprocess; the figure is the process's peak RSS (``ru_maxrss``) minus its RSS once the
    weights, inputs and weight gradients already exist, i.e. what the loss itself adds.
``python -m benchmarks.training throughput [RECIPE] [key=value ...] [--steps 30 --warmup 2]``
    Training tokens/s of the recipe's MEDUSA-1 step (backbone forward without autograd + chunked head
    loss forward/backward + clipping + AdamW) vs the backbone forward alone, on the same batches, and
    the step's time split into backbone forward / heads forward / heads backward / optimizer.
``python -m benchmarks.training cache-speedup [RECIPE] [key=value ...] [--steps N --cache-dir DIR]``
    Writes the hidden-state cache of the recipe's training examples (timed apart), then times one epoch
    (or its first N steps) online vs from the cache. See :mod:`benchmarks.training_speed`.
``python -m benchmarks.training heads-size [--hidden 4096 --vocab 128256 --heads 5 --draft-vocab 32768]``
    Parameters of the heads with the full vocabulary and with a draft vocabulary (built on the meta device:
    nothing is allocated).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import torch

from benchmarks import training_speed
from medusa.modeling.heads import MedusaHeads
from medusa.training.losses import medusa_head_loss, naive_head_loss


def _rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def loss_memory_child(variant: str, vocab: int, seq: int, heads: int, hidden: int, chunk: int) -> dict:
    """Runs inside a fresh process: peak RSS added by one loss forward + backward."""

    torch.manual_seed(0)
    module = MedusaHeads(hidden, vocab, heads, 1)
    h = torch.randn(1, seq, hidden)  # [B, T, d]
    labels = torch.randint(0, vocab, (1, seq))  # [B, T]
    for p in module.parameters():  # gradients allocated up front: they are not the loss's cost
        p.grad = torch.zeros_like(p)
    baseline = _rss_bytes()
    t0 = time.perf_counter()
    if variant == "naive":
        out = naive_head_loss(h, labels, module.head_logits, heads)
    else:
        out = medusa_head_loss(h, labels, module.head_logits, heads, chunk_size=chunk)
    out.loss.backward()
    seconds = time.perf_counter() - t0
    return {"variant": variant, "vocab": vocab, "seq": seq, "heads": heads, "hidden": hidden, "chunk": chunk,
            "baseline_rss_gib": baseline / 2**30, "peak_rss_gib": _peak_rss_bytes() / 2**30,
            "added_gib": (_peak_rss_bytes() - baseline) / 2**30, "seconds": seconds,
            "loss": float(out.loss)}


def measure_memory(args: argparse.Namespace) -> list[dict]:
    results = []
    for variant, heads in [("chunked", args.heads)] + [("naive", k) for k in args.naive_heads]:
        cmd = [sys.executable, "-m", "benchmarks.training", "_memory_child", variant, str(args.vocab),
               str(args.seq), str(heads), str(args.hidden), str(args.chunk)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            results.append({"variant": variant, "heads": heads,
                            "error": proc.stderr.strip().splitlines()[-1:]})
        else:
            results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(json.dumps(results[-1]), flush=True)
    return results


def format_table(result: dict) -> str:
    """A two-column markdown table of a result (floats with 4 significant digits)."""
    rows = ["| quantity | value |", "|---|---|"]
    for key, value in result.items():
        rows.append(f"| {key} | {f'{value:.4g}' if isinstance(value, float) else value} |")
    return "\n".join(rows)


def heads_size(args: argparse.Namespace) -> dict:
    """Head parameters, full vocabulary vs ``--draft-vocab``, and their ratio (meta tensors, no memory)."""

    with torch.device("meta"):
        sizes = {name: sum(p.numel() for p in MedusaHeads(args.hidden, args.vocab, args.heads, args.layers,
                                                          "linear", draft_vocab=n).parameters())
                 for name, n in (("full", 0), ("draft", args.draft_vocab))}
    result = {**vars(args), "full_parameters": sizes["full"], "draft_parameters": sizes["draft"],
              "ratio": sizes["full"] / sizes["draft"]}
    print(json.dumps(result))
    return result


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "_memory_child":
        variant, vocab, seq, heads, hidden, chunk = argv[1:7]
        print(json.dumps(loss_memory_child(variant, int(vocab), int(seq), int(heads),
                                           int(hidden), int(chunk))))
        return 0
    parser = argparse.ArgumentParser(prog="python -m benchmarks.training")
    sub = parser.add_subparsers(dest="what", required=True)
    mem = sub.add_parser("memory")
    mem.add_argument("--vocab", type=int, default=128_000)
    mem.add_argument("--seq", type=int, default=2048)
    mem.add_argument("--heads", type=int, default=5)
    mem.add_argument("--hidden", type=int, default=256)
    mem.add_argument("--chunk", type=int, default=1024)
    mem.add_argument("--naive-heads", type=int, nargs="*", default=[1, 2],
                     help="head counts for the naive loss (5 needs ~20 GB of RAM on this size)")
    thr = sub.add_parser("throughput")
    thr.add_argument("recipe", nargs="?", default="recipes/tiny/medusa1.yaml")
    thr.add_argument("overrides", nargs="*", help="recipe key=value overrides")
    thr.add_argument("--steps", type=int, default=30, help="timed micro-batches")
    thr.add_argument("--warmup", type=int, default=2, help="untimed micro-batches first")
    cache = sub.add_parser("cache-speedup")
    cache.add_argument("recipe", nargs="?", default="recipes/tiny/medusa1.yaml")
    cache.add_argument("overrides", nargs="*", help="recipe key=value overrides")
    cache.add_argument("--steps", type=int, default=0, help="the epoch's first N steps (0: all of it)")
    cache.add_argument("--cache-dir", default=None, help="where the temporary cache goes (default: $TMPDIR)")
    cache.add_argument("--cache-dtype", default="bfloat16", choices=["bfloat16", "float32"])
    for p in (thr, cache):
        p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    size = sub.add_parser("heads-size")
    size.add_argument("--hidden", type=int, default=4096)
    size.add_argument("--vocab", type=int, default=128_256)
    size.add_argument("--heads", type=int, default=5)
    size.add_argument("--layers", type=int, default=1)
    size.add_argument("--draft-vocab", type=int, default=32_768)
    args = parser.parse_args(argv)
    if args.what in ("throughput", "cache-speedup"):

        if args.threads:
            torch.set_num_threads(args.threads)
        result = (training_speed.measure_throughput(args) if args.what == "throughput"
                  else training_speed.measure_cache_speedup(args))
        print(format_table(result))
        print(json.dumps(result), flush=True)
        return 0
    {"memory": measure_memory, "heads-size": heads_size}[args.what](args)
    return 0


if __name__ == "__main__":
    from medusa.cli import run_script

    sys.exit(run_script(main))
