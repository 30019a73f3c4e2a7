"""What one verification forward costs on this device: a forward of n new tokens over a cached context, for
the tree sizes decoding uses, with the stock linear layers and with pre-packed ones
(:mod:`medusa.modeling.cpu_linear`), measured side by side in one process.

    python -m benchmarks.forward_cost MODEL_DIR [--dtype bfloat16] [--threads 1] [--repeats 5] [--rounds 3]

Prints a table (milliseconds, each the best of ``repeats`` calls; stock and packed alternate for ``rounds``
rounds and the best of the rounds is kept, so drift in the machine's speed hits both alike) and, above it,
the memory floor of one token: the bytes of the weights a forward streams (every linear weight once) over
this machine's streaming bandwidth, measured here (one pass over a 512 MiB buffer, the best of 3)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any

import torch

from medusa.decoding.hf import cache_kwargs
from medusa.eval.timing import forward_cost_curve
from medusa.modeling.cpu_linear import linear_bytes, pack_linears, packing_supported, unpack_linears

SIZES = (1, 2, 4, 8, 16, 32, 64)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def stream_bandwidth(mib: int = 512, rounds: int = 3) -> float:
    """Bytes per second one thread reads from memory: a sum over a ``mib`` MiB float32 buffer (too large for
    any cache), the best of ``rounds``."""
    buffer = torch.ones(mib * 2**18)  # [mib * 2^18] float32 = mib MiB
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        buffer.sum()
        best = min(best, time.perf_counter() - start)
    return buffer.numel() * 4 / best


def memory_floor(base: Any, bandwidth: float) -> dict[str, float]:
    """``{"weight_bytes", "bandwidth", "seconds"}``: one token's forward streams every linear weight once
    (tied weights once), at best at ``bandwidth`` bytes/s."""
    was_packed = unpack_linears(base) > 0
    weight_bytes = float(linear_bytes(base))
    if was_packed:
        pack_linears(base)
    return {"weight_bytes": weight_bytes, "bandwidth": bandwidth, "seconds": weight_bytes / bandwidth}


def format_floor(floor: dict[str, float], packed_one: float | None, native_one: float | None = None) -> str:
    line = (f"memory floor of one token: {floor['weight_bytes'] / 1e6:.0f} MB of weights / "
            f"{floor['bandwidth'] / 1e9:.1f} GB/s streamed = {floor['seconds'] * 1e3:.1f} ms")
    if packed_one:
        line += f"; the packed 1-token forward is {packed_one / floor['seconds']:.2f}x the floor"
    if native_one:
        line += f", the native body's (the decoder's tree step) {native_one / floor['seconds']:.2f}x"
    return line


def stock_vs_packed(base: Any, sizes: Sequence[int] = SIZES, rounds: int = 3, repeats: int = 5,
                    cache_len: int = 200) -> dict[str, dict[int, float]]:
    """``{"stock": {n: seconds}, "packed": {n: seconds}}`` (packed empty where oneDNN's reorder is missing),
    plus ``"onednn"`` where the packed layers use the native kernel (:mod:`medusa.modeling.bf16_kernel`):
    oneDNN's reorder for the same weights, to compare, and ``"native"`` in bfloat16 there: the native body's
    tree step (:func:`native_curve`), what the decoder runs. ``base`` is left with its linears as it came."""
    was_packed = unpack_linears(base) > 0
    kernel = any(getattr(m, "amx", None) is not None for m in _packed_probe(base))
    names = ("stock", "packed", "onednn") if kernel else ("stock", "packed")
    curves: dict[str, dict[int, float]] = {name: {} for name in names}
    try:
        for _ in range(rounds):
            for name in names:
                if name != "stock" and not pack_linears(base, kernel=name == "packed"):
                    continue
                curve = forward_cost_curve(base, tuple(sizes), cache_len=cache_len, repeats=repeats)
                unpack_linears(base)
                for n, s in curve.items():
                    curves[name][n] = min(curves[name].get(n, float("inf")), s)
            if kernel and base.dtype == torch.bfloat16:  # the decoder's tree step: the native body
                pack_linears(base)
                for n, s in native_curve(base, sizes, repeats, cache_len).items():
                    curves.setdefault("native", {})[n] = min(curves.get("native", {}).get(n, float("inf")), s)
                unpack_linears(base)
    finally:
        if was_packed:
            pack_linears(base)
    return curves


def native_curve(base: Any, sizes: Sequence[int] = SIZES, repeats: int = 5, cache_len: int = 200,
                 seed: int = 0) -> dict[int, float]:
    """Seconds of one forward of ``n`` tokens (a causal chain) over a ``cache_len``-token cache through the
    native body and the LM head, as a tree step runs it (:mod:`medusa.modeling.native_body`; sizes up to its
    :data:`~medusa.modeling.native_body.MAX_ROWS`), the best of ``repeats``; empty where the body cannot run
    natively. ``base`` must be packed (the LM head through the kernel)."""
    from medusa.decoding.kv_cache import KV_PAD, new_cache, padded
    from medusa.eval.timing import timed
    from medusa.modeling import native_body
    from medusa.modeling.base import base_logits, decoder_of, text_config

    body, config = decoder_of(base), text_config(base)
    if native_body.unsupported_reason(body, config):
        return {}
    native = native_body.build(body, config)
    g = torch.Generator().manual_seed(seed)
    cache = new_cache()
    with torch.no_grad():
        base(input_ids=torch.randint(0, config.vocab_size, (1, cache_len), generator=g), use_cache=True,
             **cache_kwargs(cache))
    for layer in cache.layers:
        layer.pad = KV_PAD
    neg, curve = torch.finfo(torch.bfloat16).min, {}
    for n in (n for n in sizes if n <= native_body.MAX_ROWS):
        ids = torch.randint(0, config.vocab_size, (1, n), generator=g)  # [1, n]
        positions = torch.arange(cache_len, cache_len + n).view(1, n)
        mask = torch.full((1, 1, n, padded(cache_len + n)), neg, dtype=torch.bfloat16)  # [1, 1, n, cols]
        mask[..., :cache_len] = 0
        mask[0, 0, :, cache_len:cache_len + n] = torch.full((n, n), neg).triu(1)

        def step() -> torch.Tensor:
            last, _ = native_body.forward(native, ids, mask, positions, cache)
            return base_logits(base, last)

        best = float("inf")
        with torch.no_grad():
            for _ in range(repeats + 1):
                _, seconds = timed(step, torch.device("cpu"))
                cache.crop(-n)
                best = min(best, seconds)
        curve[n] = best
    return curve


def _packed_probe(base: Any) -> list[Any]:
    """The packed layers of ``base`` once packed (then unpacked again): whether the AMX kernel takes them."""
    pack_linears(base)
    layers = [m for m in base.modules() if type(m).__name__ == "PackedLinear"]
    unpack_linears(base)
    return layers


def format_curves(curves: dict[str, dict[int, float]]) -> str:
    stock, packed = curves["stock"], curves["packed"]
    onednn, native = curves.get("onednn"), curves.get("native")
    head = "| tokens in the forward | stock ms | relative | packed ms | relative | packed / stock |"
    rule = "|---:|---:|---:|---:|---:|---:|"
    if onednn:
        head, rule = head + " oneDNN-packed ms | kernel / oneDNN |", rule + "---:|---:|"
    if native:
        head, rule = head + " native body ms | relative |", rule + "---:|---:|"
    lines = [head, rule]
    for n, s in stock.items():
        p = packed.get(n)
        cells = [f"{p * 1e3:.1f}", f"{p / packed[min(packed)]:.2f}", f"{p / s:.2f}"] if p else ["-"] * 3
        if onednn:
            o = onednn.get(n)
            cells += [f"{o * 1e3:.1f}", f"{p / o:.2f}"] if o and p else ["-"] * 2
        if native:
            v = native.get(n)
            cells += [f"{v * 1e3:.1f}", f"{v / native[min(native)]:.2f}"] if v else ["-"] * 2
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
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from medusa.modeling.base import load_base_model

    base = load_base_model(args.model, dtype=DTYPES[args.dtype]).eval()
    floor = memory_floor(base, stream_bandwidth())
    curves = stock_vs_packed(base, rounds=args.rounds, repeats=args.repeats, cache_len=args.cache_len)
    print(f"{args.model}: {args.dtype}, {torch.get_num_threads()} threads, {args.cache_len}-token cache"
          + ("" if packing_supported() else " (no oneDNN weight reorder in this torch: stock only)"))
    print(format_floor(floor, curves["packed"].get(1), curves.get("native", {}).get(1)))
    print(format_curves(curves))
    return 0


if __name__ == "__main__":
    from medusa.cli import run_script

    raise SystemExit(run_script(main))
