"""Word problems: every template fills, rows are stable per index, half-ish ask for the working."""

from __future__ import annotations

import random

from benchmarks.math_problems import TEMPLATES, math_tasks, word_problem


def test_every_template_fills_and_rows_are_stable():
    openings = set()
    for i in range(400):
        text = word_problem(random.Random(i))
        assert "{" not in text and "?" in text
        openings.add(text.split()[1])
    assert len(openings) >= len(TEMPLATES) // 2  # many templates drawn, all filled
    rows = math_tasks(50)
    assert rows[:10] == math_tasks(10) and len({r["messages"][0]["content"] for r in rows}) == 50
    assert math_tasks(5, seed=1) != math_tasks(5)
    assert 0.5 < sum("step" in r["messages"][0]["content"] for r in math_tasks(200)) / 200 < 0.95
