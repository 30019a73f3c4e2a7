"""benchmarks.serve_check without the engine: the configs it runs, vLLM's counters -> acceptance, the rows,
and the README's serving commands being the ones the export prints (the harness runs the same
speculative_config offline)."""

import json
import re
from pathlib import Path

from benchmarks.serve_check import EXPORT, configs, spec_bench_prompts, summarise, vllm_acceptance
from medusa.export.serving import vllm_commands

ROOT = Path(__file__).parents[2]


def _spec(drafts, accepted_per_pos):
    return {"vllm:spec_decode_num_drafts": drafts, "vllm:spec_decode_num_draft_tokens": 3 * drafts,
            "vllm:spec_decode_num_accepted_tokens": sum(accepted_per_pos),
            "vllm:spec_decode_num_accepted_tokens_per_pos": accepted_per_pos}


def test_vllm_acceptance_from_counters():
    acc = vllm_acceptance(_spec(40, [10, 4, 1]))
    assert acc["mean_acceptance_length"] == 1 + 15 / 40
    assert acc["per_position"] == [0.25, 0.1, 0.025]
    assert vllm_acceptance(_spec(0, [])) is None  # plain decoding drafts nothing


def test_configs_cover_plain_every_valid_k_ngram_and_suffix(tmp_path):
    names = [c["name"] for c in configs(tmp_path, 3, ["batch1"])]
    assert names == ["plain", "medusa k=3", "ngram k=3", "suffix", "medusa k=2", "medusa k=1"]
    k2 = configs(tmp_path, 3, ["batch1"])[4]["speculative_config"]
    assert k2 == {"method": "medusa", "model": str(tmp_path), "num_speculative_tokens": 2}
    eagle3 = configs(tmp_path, 3, ["batch1"], "eagle3")
    assert [c["name"] for c in eagle3][:2] == ["plain", "eagle3 k=3"]
    assert eagle3[1]["speculative_config"] == {"method": "eagle3", "model": str(tmp_path),
                                               "num_speculative_tokens": 3}


def test_summarise_counts_outputs_equal_to_plain_batch1():
    run = {"mode": "batch1", "seconds": 2.0, "tokens": [[1, 2], [3, 4]], "spec": _spec(0, [])}
    spec = {"mode": "batch1", "seconds": 1.0, "tokens": [[1, 2], [3, 5]], "spec": _spec(2, [1, 0, 0])}
    out = {"configs": [{"name": "plain", "engine_start_seconds": 1, "runs": [run]},
                       {"name": "medusa k=3", "engine_start_seconds": 1, "runs": [spec]}]}
    rows = summarise(out, [{}, {}])
    assert [r["identical_to_plain"] for r in rows] == [2, 1]
    assert rows[1]["tokens_per_s"] == 4.0 and rows[1]["acceptance"]["per_position"] == [0.5, 0, 0]


def test_spec_bench_prompts_per_category(tmp_path):
    lines = [{"category": c, "turns": [f"{c}{i}", "second"]} for c in ("a", "b") for i in range(3)]
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines))
    assert [p["prompt"] for p in spec_bench_prompts(path, 2)] == ["a0", "a1", "b0", "b1"]


def test_readme_serving_commands_are_the_exports():
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Serving"):]
    section = section[:section.index("\n## ", 1)]
    base = "~/.cache/medusa/models/smollm2-135m-instruct"
    serve, offline = vllm_commands(str(EXPORT), base, base, 3, None)
    spec = re.search(r"--speculative-config '([^']+)'", serve).group(1)
    assert f"--speculative-config '{spec}'" in section
    assert f"speculative_config={offline.split('speculative_config=')[1][:-1]}" in section
