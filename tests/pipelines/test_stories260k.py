"""``make bench`` (medusa.pipelines.stories260k) without running it: the printed summary with its head-type
table, the command line, the story prompts and the targets. (End to end:
tests/integration/test_stories260k_pipeline.py.)"""

from __future__ import annotations

from pipeline_helpers import fixed_summary


def test_format_summary_prints_the_head_type_table():
    from medusa.pipelines.stories260k import format_summary

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
    from medusa.pipelines.smollm2 import parse_settings as chat_settings
    from medusa.pipelines.stories260k import parse_settings

    assert parse_settings([])[0].hydra is True
    assert parse_settings(["--no-hydra"])[0].hydra is False
    assert chat_settings([])[0].hydra is True
    assert chat_settings(["--no-hydra", "--set", "train.epochs=1"])[0].hydra is False
