"""``make bench`` (benchmarks.stories260k) without running it: the printed summary with its head-type
table, the command line, the story prompts and the targets. (End to end:
tests/integration/test_stories260k_pipeline.py.)"""

from __future__ import annotations

import pytest
from pipeline_helpers import fixed_summary

from benchmarks import stories260k
from medusa.errors import DataError


def test_format_summary_prints_the_head_type_table():
    from benchmarks.stories260k import format_summary

    summary = fixed_summary()
    lines = format_summary(summary).splitlines()
    start = lines.index("head types at the same node budget (8 nodes):")
    assert lines[start + 1:] == [
        "heads    tree     nodes tokens/step  speedup overhead  exact",
        "medusa1  static       8        2.00    1.50x     1.20   1.00",
        "hydra    static       8        2.80    1.90x     1.20   1.00",
        "medusa1  dynamic      8        2.10    1.20x     1.20   1.00",
        "hydra    dynamic      8        3.50    1.70x     1.40   1.00",
        "hydra_over_medusa1_tokens_per_step (static): 1.40 (target >= 1.3, met)",
        "hydra_over_medusa1_tokens_per_step (dynamic): 1.67 (target >= 1.3, met)",
        "dynamic_over_static_tokens_per_step (medusa1): 1.05 (target >= 1.1, missed)",
        "dynamic_over_static_tokens_per_step (hydra): 1.25 (target >= 1.1, met)",
        "best wall-clock speedup: hydra heads, static tree (8 nodes), 1.90x",
    ]
    del summary["head_types"]
    assert "head types" not in format_summary(summary)


def test_no_hydra_flag_turns_the_rows_off():
    from benchmarks.smollm2 import parse_settings as chat_settings
    from benchmarks.stories260k import parse_settings

    assert parse_settings([])[0].hydra is True
    assert parse_settings(["--no-hydra"])[0].hydra is False
    assert chat_settings([])[0].hydra is True
    assert chat_settings(["--no-hydra", "--set", "train.epochs=1"])[0].hydra is False


def test_sentence_prefixes():
    story = 'Tom ran. "Stop!" said Mom. He stopped? Yes\nhe did'
    assert stories260k.sentence_prefixes(story, 2) == ["Tom ran.", 'Tom ran. "Stop!"']
    assert stories260k.sentence_prefixes(story, 9) == [
        "Tom ran.", 'Tom ran. "Stop!"', 'Tom ran. "Stop!" said Mom.',
        'Tom ran. "Stop!" said Mom. He stopped?']
    assert stories260k.sentence_prefixes("no end in sight", 3) == []  # the whole story is never a prompt


def _shared(tmp_path, n):
    (tmp_path / "data").mkdir(parents=True)
    text = "\n\n".join(f"Story {i} starts here. Then {i} more things happen to the dog and the cat. "
                       f"The end {i}." for i in range(n))
    (tmp_path / "data" / "tinystories_sample.txt").write_text(text + "\n\nToo short to count.\n")
    return tmp_path


def test_split_prompts_hold_out_calibration_and_benchmark_stories(tmp_path):
    s = stories260k.Settings(shared=str(_shared(tmp_path, 40)), held_out=5, calib_stories=4,
                             train_stories=3, max_sentences=2, bench_prompts=2)
    rows = stories260k.split_prompts(s)
    two = "Story {i} starts here. Then {i} more things happen to the dog and the cat."
    assert [r["prompt"] for r in rows["train"]] == [
        p for i in range(3) for p in (f"Story {i} starts here.", two.format(i=i))]
    assert [r["prompt"] for r in rows["sample"]] == [f"Story {i} starts here." for i in range(3)]
    assert [r["prompt"] for r in rows["calib"]] == [f"Story {i} starts here." for i in range(31, 35)]
    assert [r["prompt"] for r in rows["bench"]] == ["Story 35 starts here.", "Story 36 starts here."]
    assert len({r["id"] for split in rows.values() for r in split}) == sum(len(v) for v in rows.values())
    small = _shared(tmp_path / "small", 10)
    with pytest.raises(DataError, match="only 10 stories"):
        stories260k.split_prompts(stories260k.Settings(shared=str(small), held_out=5))
    with pytest.raises(DataError, match="tinystories_sample.txt: not found"):
        stories260k.stories(tmp_path / "nowhere")


def test_targets_take_the_better_tree_and_the_worse_exactness():
    benched = {"tokens_per_step": 2.5, "speedup": 2.1, "greedy_exact_match": 1.0}
    deepest = {"tokens_per_step": 3.2, "speedup": 1.4, "greedy_exact_match": 0.75}
    assert stories260k.targets(benched, deepest) == {
        "tokens_per_step": {"target": 3.0, "measured": 3.2, "met": True},
        "speedup": {"target": 2.0, "measured": 2.1, "met": True},
        "greedy_exact_match": {"target": 1.0, "measured": 0.75, "met": False}}
