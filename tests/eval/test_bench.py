"""medusa.eval.bench: report keys, exact greedy equality with HF generate, EOS handled alike, the report
files, the draft vocabulary's coverage. (The command: tests/cli/test_bench.py; the stories260K pipeline:
tests/integration.)"""

from __future__ import annotations

import json
import os
import statistics

import pytest
import torch
from pipeline_helpers import REPORT_KEYS

from medusa.modeling.draft_vocab import coverage

from fit_heads import fitted_stories_heads
from tiny_models import STORIES, require_shared, stories_model, stories_tokenizer

os.environ.setdefault("HF_HUB_OFFLINE", "1")

PROMPTS = ["Once upon a time, there was a little dog.", "Tom and Sue went to the park.",
           "The sun was hot and the bird sang."]


def test_bench_greedy_matches_hf_generate_and_writes_files(stories_medusa, tmp_path):
    from medusa.eval.bench import bench
    from medusa.eval.report import write_report

    report = bench(stories_medusa, stories_tokenizer(), PROMPTS, max_new_tokens=20, prompt_lookup=True,
                   progress=False)
    assert REPORT_KEYS <= set(report)
    assert report["greedy_exact_match"] == 1.0
    assert report["prompt_lookup"]["greedy_exact_match"] == 1.0
    assert len(report["rows"]) == len(PROMPTS)
    for row in report["rows"]:  # EOS ignored: every method writes exactly the budget
        assert row["new_tokens"] == row["baseline_new_tokens"] == 20
        assert row["exact_match"] is True
        assert row["steps"] >= 1 and row["tokens_per_step"] >= 1.0
    hist = {int(k): v for k, v in report["accept_length_histogram"].items()}
    assert max(hist) >= 3 and report["tokens_per_step"] > 1.5, hist  # accepted runs, exact all the same
    # every token after the prefill's first came from a verification step
    assert sum(k * v for k, v in hist.items()) == sum(r["new_tokens"] - 1 for r in report["rows"])
    rows = report["rows"]
    assert sum(hist.values()) == sum(r["steps"] for r in rows)  # one histogram entry per verification step
    assert report["tokens_per_step"] == pytest.approx(sum(r["new_tokens"] - 1 for r in rows)
                                                      / sum(r["steps"] for r in rows))
    for r in rows:  # the derived figures agree with the raw counts and seconds they come from
        assert r["tokens_per_step"] == pytest.approx((r["new_tokens"] - 1) / r["steps"])
        assert r["hf_step_ms"] == pytest.approx(1e3 * r["baseline_s"] / 20)
        assert 0 < r["medusa_step_ms"] * r["steps"] <= 1e3 * r["medusa_s"]  # the decode loop is in the call
    speedups = [(r["new_tokens"] / r["medusa_s"]) / (r["baseline_new_tokens"] / r["baseline_s"])
                for r in rows]
    assert report["speedup"] == pytest.approx(statistics.median(speedups))
    assert report["medusa_tokens_per_s"] == pytest.approx(60 / sum(r["medusa_s"] for r in rows))
    assert report["baseline_tokens_per_s"] == pytest.approx(60 / sum(r["baseline_s"] for r in rows))
    assert report["overhead"] == pytest.approx(statistics.fmean(r["medusa_step_ms"] for r in rows)
                                               / statistics.fmean(r["plain_step_ms"] for r in rows))
    files = write_report(report, tmp_path / "r" / "report.json")
    assert [f.name for f in files] == ["report.json", "report.md", "report_accept_lengths.png",
                                       "report_speedup.png"]
    assert json.loads(files[0].read_text())["greedy_exact_match"] == 1.0
    assert "| MEDUSA |" in files[1].read_text() and "| HF prompt lookup |" in files[1].read_text()
    assert all(f.stat().st_size > 1000 for f in files[2:])


def test_bench_stops_both_at_eos_alike(stories_medusa):
    """With ignore_eos=False both methods stop at the model's EOS: an early base token is the EOS."""
    from medusa.eval.bench import bench

    tok = stories_tokenizer()
    base = stories_medusa.base_model
    ids = tok(PROMPTS[1], return_tensors="pt").input_ids
    ref = base.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=None)[0, ids.shape[1]:].tolist()
    stop = ref[6]
    first = ref.index(stop)
    old = base.generation_config.eos_token_id
    base.generation_config.eos_token_id = stop
    try:
        report = bench(stories_medusa, tok, PROMPTS[1:2], max_new_tokens=12, ignore_eos=False, progress=False)
    finally:
        base.generation_config.eos_token_id = old
    row = report["rows"][0]
    assert row["new_tokens"] == row["baseline_new_tokens"] == first + 1
    assert report["greedy_exact_match"] == 1.0
    assert max(int(k) for k in report["accept_length_histogram"]) >= 3  # accepted runs before the EOS


def test_bench_sampling_has_no_exact_match(stories_medusa):
    from medusa.eval.bench import bench

    report = bench(stories_medusa, stories_tokenizer(), PROMPTS[:1], max_new_tokens=8, acceptance="typical",
                   temperature=0.7, progress=False)
    assert report["greedy_exact_match"] is None
    assert report["rows"][0]["new_tokens"] == 8
    assert report["config"]["acceptance"] == "typical"


def test_bench_reports_draft_vocab_coverage_of_generated_tokens():
    from medusa.eval.bench import bench

    require_shared(STORIES)
    prompt = "Once upon a time, there was a little dog."
    tok = stories_tokenizer()
    ids = tok(prompt, return_tensors="pt").input_ids
    ref = stories_model().generate(ids, do_sample=False, max_new_tokens=16, min_new_tokens=16)
    new = ref[0, ids.shape[1]:]
    # 200 of 512 ids: every generated id but the last new one, so the coverage is neither 0 nor 1
    seen = list(dict.fromkeys(new.tolist()))
    tm = torch.tensor(sorted(seen[:-1] + [t for t in range(3, 512) if t not in seen][:201 - len(seen)]))
    model = fitted_stories_heads(4, 1)  # fitted full-vocabulary heads restricted to the draft ids
    model.use_draft_vocab(tm)
    report = bench(model, tok, [prompt], max_new_tokens=16, progress=False)
    assert report["greedy_exact_match"] == 1.0
    assert max(int(k) for k in report["accept_length_histogram"]) >= 3  # accepted runs through draft ids
    assert report["draft_vocab"] == 200
    assert report["draft_vocab_coverage"] == pytest.approx(coverage(tm, new))
    assert 0 < report["draft_vocab_coverage"] < 1


def test_bench_compare_lookup_rows_are_exact_and_reported_per_category(stories_medusa):
    """compare_lookup=L: MEDUSA heads only, the lookup chain alone and the hybrid, each against the same HF
    run; greedy, all three equal HF's tokens, and the summary and per-category table show them."""
    from medusa.eval.bench import bench
    from medusa.eval.report import category_table, format_summary, markdown_table

    report = bench(stories_medusa, stories_tokenizer(), PROMPTS[:2], max_new_tokens=16, prompt_lookup=True,
                   compare_lookup=4, categories=["a", "b"], progress=False)
    assert report["config"]["compare_lookup"] == 4 and report["config"]["lookup_tokens"] == 0
    assert report["greedy_exact_match"] == 1.0
    for key in ("lookup_alone", "hybrid"):
        assert report[key]["greedy_exact_match"] == 1.0
        assert report[key]["tokens_per_step"] >= 1.0 and report[key]["speedup"] > 0
        assert report["categories"]["a"][key]["greedy_exact_match"] == 1.0
        for row in report["rows"]:
            assert row[f"{key}_new_tokens"] == 16 and row[f"{key}_exact_match"] is True
            assert row[f"{key}_tokens_per_step"] == pytest.approx((16 - 1) / row[f"{key}_steps"])
    summary = format_summary(report).splitlines()
    assert [line.split(maxsplit=2)[1] for line in summary if line.startswith("MEDUSA ")] == [
        "heads", "lookup", "hybrid"]
    assert summary[-3].startswith("HF prompt lookup") and summary[-4].startswith("our plain decode")
    assert summary[-2].startswith("drafts over our plain decode (") and ", hybrid " in summary[-2]
    assert summary[-1] == ("greedy identity per prompt: MEDUSA = our plain 1.00; MEDUSA = HF 1.00; "
                           "our plain = HF 1.00")
    assert report["own_plain"]["greedy_exact_match"] == 1.0 and report["own_plain"]["tokens_per_step"] == 1.0
    assert report["fidelity"]["vs_own_plain"] == {"identical": 1.0, "divergences": 0, "max_margin": None,
                                                  "median_margin": None}
    table = category_table(report).splitlines()
    assert table[0].endswith("| lookup alone tokens/step | lookup alone speedup | lookup alone exact match "
                             "| hybrid tokens/step | hybrid speedup | hybrid exact match "
                             "| prompt lookup speedup | lookup exact match |")
    assert all(len(line.split("|")) == len(table[0].split("|")) for line in table)
    assert [line.split("|")[1].strip() for line in table[2:]] == ["a", "b", "overall"]
    md = markdown_table(report)
    assert all(f"| MEDUSA {m} |" in md for m in ("heads only", "lookup alone (L=4)", "hybrid (L=4)"))


def test_bench_lookup_arguments_are_checked_before_measuring(stories_medusa):
    from medusa.errors import MedusaError
    from medusa.eval.bench import bench

    tok = stories_tokenizer()
    for kwargs, words in ((dict(tree="lookup"), "--tree lookup"),
                          (dict(compare_lookup=4, lookup_tokens=2), "drop --lookup-tokens"),
                          (dict(compare_lookup=4, tree="dynamic"), "static tree"),
                          (dict(compare_lookup=-1), "integer >= 0")):
        with pytest.raises(MedusaError, match=words):
            bench(stories_medusa, tok, PROMPTS[:1], max_new_tokens=4, progress=False, **kwargs)
