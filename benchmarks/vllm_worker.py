"""Runs inside the vLLM venv (never the project's): vLLM's offline engine on pre-tokenised prompts.

``python vllm_worker.py JOB.json OUT.json``. JOB: ``{"model", "dtype", "max_tokens", "ignore_eos",
"prompts": [[ids]], "engine": {extra LLM(...) kwargs}, "configs": [{"name", "speculative_config" (or
null), "modes": ["batch1", "batched"]}]}``. One engine per config, created and shut down in turn in this
one process. OUT: per config and mode the generated token ids, wall seconds and the spec-decode counters
it added (drafts, draft tokens, accepted tokens, accepted per position), read from ``LLM.get_metrics()``
before and after. Imports nothing from the project (its venv has no ``medusa``).
"""

from __future__ import annotations

import gc
import json
import sys
import time

SPEC_COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens")
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


def spec_counters(llm) -> dict:
    """The engine's spec-decode counters now: totals and accepted-per-position (summed over engines)."""
    out: dict = {name: 0 for name in SPEC_COUNTERS}
    out[PER_POS] = []
    for metric in llm.get_metrics():
        if metric.name in SPEC_COUNTERS:
            out[metric.name] += int(metric.value)
        elif metric.name == PER_POS:
            vals = list(metric.values)
            old = out[PER_POS] + [0] * (len(vals) - len(out[PER_POS]))
            out[PER_POS] = [a + int(b) for a, b in zip(old, vals + [0] * (len(old) - len(vals)))]
    return out


def delta(after: dict, before: dict) -> dict:
    out = {name: after[name] - before[name] for name in SPEC_COUNTERS}
    pos_before = before[PER_POS] + [0] * (len(after[PER_POS]) - len(before[PER_POS]))
    out[PER_POS] = [a - b for a, b in zip(after[PER_POS], pos_before)]
    return out


def run_mode(llm, prompts: list, params, mode: str) -> dict:
    from vllm.inputs import TokensPrompt

    inputs = [TokensPrompt(prompt_token_ids=ids) for ids in prompts]
    before = spec_counters(llm)
    start = time.perf_counter()
    if mode == "batch1":
        outs = [llm.generate([p], params, use_tqdm=False)[0] for p in inputs]
    else:
        outs = llm.generate(inputs, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    return {"mode": mode, "seconds": seconds, "tokens": [list(o.outputs[0].token_ids) for o in outs],
            "texts": [o.outputs[0].text for o in outs], "spec": delta(spec_counters(llm), before)}


def run_config(job: dict, config: dict) -> dict:
    from vllm import LLM, SamplingParams

    start = time.perf_counter()
    llm = LLM(model=job["model"], dtype=job["dtype"], speculative_config=config.get("speculative_config"),
              disable_log_stats=False, seed=0, **job.get("engine", {}))
    started = time.perf_counter() - start
    params = SamplingParams(temperature=0.0, max_tokens=job["max_tokens"],
                            ignore_eos=job.get("ignore_eos", False))
    results = [run_mode(llm, job["prompts"], params, mode) for mode in config["modes"]]
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    return {"name": config["name"], "speculative_config": config.get("speculative_config"),
            "engine_start_seconds": started, "runs": results}


def main(argv: list[str]) -> int:
    job = json.loads(open(argv[1]).read())
    results = []
    for config in job["configs"]:
        try:
            results.append(run_config(job, config))
        except Exception as exc:  # one config the engine refuses must not lose the others
            results.append({"name": config["name"], "speculative_config": config.get("speculative_config"),
                            "error": f"{type(exc).__name__}: {exc}", "runs": []})
        with open(argv[2], "w") as f:  # written after every config: a crash keeps what finished
            json.dump({"configs": results}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
