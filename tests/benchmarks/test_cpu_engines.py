"""benchmarks.cpu_engines without running either engine: rows from medusa bench's report and from
llama_cpp_check's rows, and the table ranked by tokens/s against HF generate and llama.cpp plain."""

import pytest

from benchmarks.cpu_engines import llama_rows, main, markdown, our_rows

REPORT = {"baseline_tokens_per_s": 10.0, "medusa_tokens_per_s": 25.0,
          "own_plain": {"tokens_per_s": 20.0}, "hybrid": {"tokens_per_s": 35.0},
          "lookup_alone": {"tokens_per_s": 30.0}}  # no prompt_lookup: its row is left out


def test_our_rows_one_per_method_measured():
    rows = our_rows(REPORT)
    assert [r["method"] for r in rows] == ["HF generate", "our plain decode", "our EAGLE-3 drafter",
                                           "our EAGLE-3 + lookup chain", "our lookup chain alone"]
    assert [r["tokens_per_s"] for r in rows] == [10.0, 20.0, 25.0, 35.0, 30.0]
    assert rows[0]["engine"] == "transformers" and rows[1]["engine"] == "medusa"


def test_table_ranks_by_tokens_per_s_against_hf_and_llama_plain():
    lc = [{"config": "plain", "tokens_per_s_end_to_end": 28.0, "tokens_per_s_total": 32.0,
           "identical_to_plain": 13},
          {"config": "ngram-mod", "tokens_per_s_end_to_end": 27.0, "tokens_per_s_total": 31.0,
           "identical_to_plain": 13}]
    text = markdown(our_rows(REPORT) + llama_rows(lc))
    lines = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert lines[0] == "| medusa | our EAGLE-3 + lookup chain | 35.0 | 3.50x | 1.25x | - |"
    assert "| llama.cpp | plain | 28.0 | 2.80x | 1.00x | 32.0 |" in lines
    assert lines[-1].startswith("| transformers | HF generate | 10.0 | 1.00x |")
    assert [float(line.split("|")[3]) for line in lines] == sorted(
        (float(line.split("|")[3]) for line in lines), reverse=True)


def test_table_without_llama_rows_says_so():
    assert "| medusa | our plain decode | 20.0 | 2.00x | - | - |" in markdown(our_rows(REPORT))


def test_a_bad_draft_precision_is_refused_before_anything_runs(tmp_path):
    from medusa.errors import MedusaError

    with pytest.raises(MedusaError, match="--draft-precision 'f16': choose one of f32, bf16"):
        main(["--draft-precision", "f16", "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("configs", ["eagle3 k=x", "eagle3 k=2 p=", "eagle3 k=9 p=0.5 extra", "ngram-huge"])
def test_bad_llama_configs_refused_before_anything_runs(tmp_path, configs):
    from medusa.errors import MedusaError

    with pytest.raises(MedusaError, match="--llama-configs"):
        main(["--llama-configs", configs, "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()
