"""What a verification step costs in llama.cpp: the pinned ``llama-server`` (:mod:`benchmarks.llama_cpp_env`),
one thread, the target at one precision, timed evaluating n new tokens after a cached prefix.

``python -m benchmarks.llama_cpp_cost [--precision bf16] [--rows 1,2,3,4,5,8,16] [--prefix 256] [--repeat 7]
[--target GGUF] [--cpu CORE] [--out DIR]``: converts the packaged SmolLM2 (llama.cpp's converter, as
:mod:`benchmarks.llama_cpp_check`) unless ``--target`` names a GGUF, starts a plain server with prompt
caching, sends a fixed prefix once, then for each n asks for the prefix plus n fresh tokens (1 token
predicted): the server evaluates only the n new rows against the cached prefix, which is what verifying a
chain of n-1 drafts costs (the server's own ``prompt_ms``; verification also computes the logits of every row,
prompt evaluation only of the last). Prints ms per forward by rows and the ratio to one row, writes
``OUT/cost.json``; with ``--accept`` (the accepted rate per draft position, comma-separated) and
``--draft-ms`` (one drafter pass) it also prints the speed a chain of k can reach at most against plain: (1 +
accepted) / (cost(k+1) + k drafter passes) * cost(1).
"""

from __future__ import annotations

import argparse
import json
import statistics
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks.llama_cpp_env import convert_target, ensure_venv
from benchmarks.llama_cpp_server import LlamaServer, ServerConfig


def timed_prompt(port: int, ids: list[int]) -> dict[str, Any]:
    """One request of ``ids`` (1 token predicted, the prompt cache on): the server's prompt timings."""
    body = {"prompt": ids, "n_predict": 1, "temperature": 0.0, "top_k": 1, "cache_prompt": True,
            "stream": False}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        t = json.loads(r.read()).get("timings", {})
    return {"prompt_n": int(t.get("prompt_n", -1)), "prompt_ms": float(t.get("prompt_ms", 0.0))}


def row_costs(port: int, prefix: list[int], rows: list[int], repeat: int, vocab_lo: int = 1000
              ) -> dict[int, dict[str, Any]]:
    """Median ms to evaluate n new tokens after ``prefix`` (cached), for each n in ``rows``. The new
    tokens differ on every request, so only the prefix is ever reused."""
    timed_prompt(port, prefix)  # fills the cache
    out: dict[int, dict[str, Any]] = {}
    fresh = vocab_lo
    for n in rows:
        times = []
        for _ in range(repeat):
            tail = list(range(fresh, fresh + n))
            fresh += n
            t = timed_prompt(port, prefix + tail)
            if t["prompt_n"] != n:
                raise RuntimeError(f"the server evaluated {t['prompt_n']} tokens for {n} new ones: "
                                   f"the prefix was not reused")
            times.append(t["prompt_ms"])
        out[n] = {"ms_median": statistics.median(times), "ms_all": times}
    return out


def chain_bound(costs: dict[int, dict[str, Any]], accept: list[float], draft_ms: float
                ) -> list[dict[str, Any]]:
    """For each k with a measured k+1-row cost: the most a chain of k can gain over plain, given the accepted
    rate at each position (accepted at position i / steps) and one drafter pass of ``draft_ms``."""
    one = costs[1]["ms_median"]
    out = []
    for k in range(1, len(accept) + 1):
        if k + 1 not in costs:
            continue
        step = costs[k + 1]["ms_median"] + k * draft_ms
        out.append({"k": k, "tokens_per_step": 1 + sum(accept[:k]), "step_ms": step,
                    "vs_plain": (1 + sum(accept[:k])) * one / step})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="packaged model converted as the target")
    ap.add_argument("--target", type=Path, default=None, help="a target GGUF instead of converting --model")
    ap.add_argument("--precision", default="bf16", help="converter outtype: f32 / bf16 / f16 / q8_0")
    ap.add_argument("--rows", default="1,2,3,4,5,8,16")
    ap.add_argument("--prefix", type=int, default=256, help="cached tokens before the new ones")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--accept", default=None, help="accepted rate per draft position, e.g. 0.345,0.123,0.052")
    ap.add_argument("--draft-ms", type=float, default=0.0, help="one drafter pass, ms (the server log's dur)")
    ap.add_argument("--cpu", default=None, help="taskset core list for the server")
    ap.add_argument("--out", type=Path, default=Path("out/llama_cpp/cost"))
    args = ap.parse_args(argv)
    from medusa.modeling.packaged_models import fetch_model

    rows = sorted({int(n) for n in args.rows.split(",")} | {1})
    ensure_venv()
    target = args.target or convert_target(fetch_model(args.model), args.precision,
                                           args.out / f"target-{args.precision}.gguf")
    prefix = [(7 * i) % 20000 + 500 for i in range(args.prefix)]
    with LlamaServer(target, ServerConfig("plain"), args.out / "server.log", cpu=args.cpu) as server:
        costs = row_costs(server.port, prefix, rows, args.repeat)
    one = costs[1]["ms_median"]
    report: dict[str, Any] = {"target": str(target), "precision": args.precision, "prefix": args.prefix,
                              "repeat": args.repeat,
                              "rows": {n: {**c, "vs_one_row": c["ms_median"] / one}
                                       for n, c in costs.items()}}
    print(f"| rows | ms (median of {args.repeat}) | vs one row |\n|---:|---:|---:|")
    for n, c in report["rows"].items():
        print(f"| {n} | {c['ms_median']:.2f} | {c['vs_one_row']:.2f}x |")
    if args.accept:
        report["bound"] = chain_bound(costs, [float(a) for a in args.accept.split(",")], args.draft_ms)
        print("\n| k | tokens/step | step ms | at most vs plain |\n|---:|---:|---:|---:|")
        for b in report["bound"]:
            print(f"| {b['k']} | {b['tokens_per_step']:.2f} | {b['step_ms']:.1f} | {b['vs_plain']:.2f}x |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cost.json").write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    from medusa.cli import run_script

    raise SystemExit(run_script(main))
