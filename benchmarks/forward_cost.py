"""What one verification forward costs on this device: a forward of n new tokens over a cached context, for
the tree sizes decoding uses, with the stock linear layers and with pre-packed ones
(:mod:`medusa.modeling.cpu_linear`), measured side by side in one process.

    python -m benchmarks.forward_cost MODEL_DIR [--threads 1] [--repeats 5] [--rounds 3]

Prints a table (milliseconds, each the best of ``repeats`` calls; stock and packed alternate for ``rounds``
rounds and the best of the rounds is kept, so drift in the machine's speed hits both alike)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import torch

from medusa.eval.timing import forward_cost_curve
from medusa.modeling.cpu_linear import pack_linears, packing_supported, unpack_linears

SIZES = (1, 2, 4, 8, 16, 24, 32, 64)


def stock_vs_packed(base: Any, sizes: Sequence[int] = SIZES, rounds: int = 3, repeats: int = 5,
                    cache_len: int = 200) -> dict[str, dict[int, float]]:
    """``{"stock": {n: seconds}, "packed": {n: seconds}}`` (packed empty where oneDNN's reorder is missing);
    ``base`` is left with its linears as it came (packed or not)."""
    was_packed = unpack_linears(base) > 0
    curves: dict[str, dict[int, float]] = {"stock": {}, "packed": {}}
    try:
        for _ in range(rounds):
            for name in ("stock", "packed"):
                if name == "packed" and not pack_linears(base):
                    continue
                curve = forward_cost_curve(base, tuple(sizes), cache_len=cache_len, repeats=repeats)
                unpack_linears(base)
                for n, s in curve.items():
                    curves[name][n] = min(curves[name].get(n, float("inf")), s)
    finally:
        if was_packed:
            pack_linears(base)
    return curves


def format_curves(curves: dict[str, dict[int, float]]) -> str:
    stock, packed = curves["stock"], curves["packed"]
    lines = ["| tokens in the forward | stock ms | relative | packed ms | relative | packed / stock |",
             "|---:|---:|---:|---:|---:|---:|"]
    for n, s in stock.items():
        p = packed.get(n)
        cells = [f"{p * 1e3:.1f}", f"{p / packed[min(packed)]:.2f}", f"{p / s:.2f}"] if p else ["-"] * 3
        lines.append(f"| {n} | {s * 1e3:.1f} | {s / stock[min(stock)]:.2f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.forward_cost",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a Hugging Face causal LM directory")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cache-len", type=int, default=200)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from medusa.modeling.base import load_base_model

    base = load_base_model(args.model, dtype=torch.float32).eval()
    curves = stock_vs_packed(base, rounds=args.rounds, repeats=args.repeats, cache_len=args.cache_len)
    print(f"{args.model}: float32, {torch.get_num_threads()} threads, {args.cache_len}-token cache"
          + ("" if packing_supported() else " (no oneDNN weight reorder in this torch: stock only)"))
    print(format_curves(curves))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
