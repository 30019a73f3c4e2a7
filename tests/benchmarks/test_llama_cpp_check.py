"""benchmarks.llama_cpp_check without a server: the configs served, one row per config from per-prompt
results (median and total tokens/s, share of drafts accepted, greedy text equal to plain), the gap to our
chain per draft position, the calibrated depth read from tree.json."""

import json

import pytest

from benchmarks.llama_cpp_check import (
    agreement,
    calibrated_depth,
    draft_precision_for,
    main,
    markdown,
    p_min_list,
    server_configs,
    summarise,
)


def _run(tokens, seconds, tps, drafted=0, accepted=0):
    return {"tokens": tokens, "seconds": seconds, "predicted_per_second": tps, "draft_n": drafted,
            "draft_n_accepted": accepted}


def test_server_configs_plain_ngram_then_ours(tmp_path):
    cfgs = server_configs(tmp_path / "d.gguf", [4, 3])
    assert [c.name for c in cfgs] == ["plain", "ngram-mod", "ngram-simple", "eagle3 k=4", "eagle3 k=3"]
    assert cfgs[0].spec_type is None and cfgs[1].draft_n_max is None
    assert cfgs[3].spec_type == "draft-eagle3" and cfgs[3].draft_n_max == 4
    assert cfgs[3].draft == tmp_path / "d.gguf"


def test_server_configs_each_k_with_each_p_min(tmp_path):
    cfgs = server_configs(tmp_path / "d.gguf", [2, 4], [0.0, 0.5])
    assert [c.name for c in cfgs][3:] == ["eagle3 k=2", "eagle3 k=2 p=0.5", "eagle3 k=4", "eagle3 k=4 p=0.5"]
    assert [c.p_min for c in cfgs[3:]] == [0.0, 0.5, 0.0, 0.5]
    assert [c.draft_n_max for c in cfgs[3:]] == [2, 2, 4, 4]


def test_p_min_list_refuses_what_is_not_a_probability(capsys):
    assert p_min_list("0,0.5") == [0.0, 0.5]
    for bad in ("x", "0,1.5", "-0.1"):
        with pytest.raises(SystemExit) as exc:
            main(["--p-min", bad])
        assert exc.value.code == 2 and "--p-min" in capsys.readouterr().err


def test_summarise_counts_equal_text_and_acceptance():
    plain = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    totals = {"impl": "draft-eagle3", "steps": 5, "per_position": [0.4, 0.2]}
    result = {"name": "eagle3 k=2", "totals": totals,
              "runs": [_run([1, 2, 3], 1.0, 3.0, 4, 2), _run([4, 5, 0], 2.0, 1.5, 4, 1),
                       _run([7, 8, 9], 1.0, 3.0, 2, 0)]}
    row = summarise(result, plain)
    assert row["identical_to_plain"] == 2 and row["tokens"] == 9 and row["tokens_per_s_total"] == 9 / 4
    assert row["tokens_per_s_median"] == 3.0 and row["accept_share"] == pytest.approx(3 / 10)
    assert row["per_position"] == [0.4, 0.2] and row["steps"] == 5
    assert row["tokens_per_s_end_to_end"] == 9 / 4  # no prefill timings: decode only
    prefilled = summarise({**result, "runs": [{**r, "prompt_seconds": 0.5} for r in result["runs"]]}, plain)
    assert prefilled["tokens_per_s_end_to_end"] == pytest.approx(9 / 5.5)
    none = summarise({"name": "plain", "totals": None, "runs": [_run([1], 1.0, 1.0)]}, None)
    assert none["accept_share"] is None and none["identical_to_plain"] is None
    assert none["per_position"] is None
    text = markdown({"f32": [row]}, {})
    assert "| f32 | eagle3 k=2 | 3.0 | - | 2.2 | 0.300 | 0.400 / 0.200 | 2/3 |" in text
    plain_row = summarise({"name": "plain", "totals": None, "runs": [_run([1], 1.0, 6.0)]}, None)
    text = markdown({"bf16": [plain_row, row]}, {})
    assert "| bf16 | eagle3 k=2 | 3.0 | 0.50x | 2.2 |" in text


def test_agreement_is_the_largest_gap_per_position():
    rows = [{"config": "eagle3 k=3", "per_position": [0.30, 0.10]}]  # llama.cpp never accepted a 3rd draft
    ours = {"per_position": [0.32, 0.05, 0.01]}
    assert agreement(rows, ours, 3) == pytest.approx(0.05)
    assert agreement(rows, ours, 4) is None


def test_calibrated_depth(tmp_path):
    assert calibrated_depth(tmp_path) is None
    (tmp_path / "tree.json").write_text(json.dumps({"depth": 4, "num_nodes": 8}))
    assert calibrated_depth(tmp_path) == 4


def test_the_drafter_is_bf16_beside_bf16_and_quantised_targets_f32_beside_f32():
    assert draft_precision_for("f32") == "f32"  # the acceptance check against our float32 chain
    assert draft_precision_for("bf16") == "bf16" and draft_precision_for("q4_1") == "bf16"
