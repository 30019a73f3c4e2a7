"""Unmodified vLLM (CPU build, its own pinned venv in ~/.cache/medusa, built here when missing) loads our
``--format vllm`` export of the shipped SmolLM2 MEDUSA-1 heads (a draft vocabulary: full-vocabulary rows)
and our ``--format speculators`` export of the shipped eagle3 drafter and, on 2 short chat prompts, writes
exactly the greedy text of plain decoding with each; their per-position acceptance matches our decoder's
chain mode on the same prompts. One worker process runs the three engines. Skipped only where vLLM cannot
be installed (pip failure, no network)."""

from pathlib import Path

import pytest

from benchmarks.serve_check import (
    HEADS,
    chat_ids,
    eagle3_spec,
    export_heads,
    medusa_spec,
    our_chain_acceptance,
    run_vllm,
    vllm_acceptance,
)
from benchmarks.vllm_env import VllmUnavailable, ensure_venv

# vLLM's engine, three configs in one worker process, then our chains: run first (tests/conftest.py)
pytestmark = pytest.mark.heavy(800)

PROMPTS = ["Name three primary colors.", "Write one sentence about the sea."]
EAGLE3 = Path(HEADS).parent / "eagle3"
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    try:
        ensure_venv()
    except VllmUnavailable as exc:
        pytest.skip(f"vLLM cannot be installed here: {exc}")
    work = tmp_path_factory.mktemp("vllm")
    root = Path(__file__).parents[2]
    summary = export_heads(root / HEADS, work / "export")
    export_heads(root / EAGLE3, work / "eagle3", "speculators")
    ids = chat_ids(summary["backbone"], PROMPTS)
    job = {"model": summary["backbone"], "dtype": "float32", "max_tokens": MAX_TOKENS, "prompts": ids,
           "ignore_eos": True,
           "engine": {"enforce_eager": True, "max_model_len": 1024, "max_num_seqs": 2},
           "configs": [{"name": "plain", "speculative_config": None, "modes": ["batch1"]},
                       {"name": "medusa", "speculative_config": medusa_spec(work / "export", 3),
                        "modes": ["batch1"]},
                       {"name": "eagle3", "speculative_config": eagle3_spec(work / "eagle3", 3),
                        "modes": ["batch1"]}]}
    out = run_vllm(job, work)
    return summary, ids, {c["name"]: c["runs"][0] for c in out["configs"]}


def test_vllm_loads_the_draft_vocab_export_and_keeps_greedy_text(served):
    _, _, runs = served
    assert [len(t) for t in runs["plain"]["tokens"]] == [MAX_TOKENS] * 2  # ignore_eos
    assert runs["medusa"]["tokens"] == runs["plain"]["tokens"]
    assert runs["eagle3"]["tokens"] == runs["plain"]["tokens"]
    assert runs["plain"]["spec"]["vllm:spec_decode_num_drafts"] == 0


def _check_acceptance(served, name: str, heads: Path) -> None:
    """vLLM's per-position acceptance of config ``name`` equals our decoder's chain of 3 within 0.03, or one
    draft's share where there are fewer than ~34 drafts (a near-tie the two engines' kernels decide apart)."""
    summary, ids, runs = served
    theirs = vllm_acceptance(runs[name]["spec"])
    assert theirs is not None and len(theirs["per_position"]) == 3
    print(f"vLLM {name}: mean acceptance length {theirs['mean_acceptance_length']:.3f}, per position "
          f"{[round(p, 3) for p in theirs['per_position']]}")
    ours = our_chain_acceptance(Path(__file__).parents[2] / heads, summary["backbone"], ids, MAX_TOKENS)
    assert ours["tokens"] == runs["plain"]["tokens"]
    tolerance = max(0.03, 1.01 / theirs["drafts"])  # one near-tie decided the other way (32 drafts here)
    for a, b in zip(theirs["per_position"], ours["per_position"]):
        assert abs(a - b) <= tolerance, (theirs, ours)


def test_vllm_acceptance_matches_our_chain(served):
    _check_acceptance(served, "medusa", HEADS)


def test_vllm_eagle3_acceptance_matches_our_drafted_chain(served):
    _check_acceptance(served, "eagle3", EAGLE3)
