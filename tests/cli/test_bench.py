"""``medusa bench``: MT-bench prompts with an assistant model through the command, and a bad prompts file
as one ``error:`` line before any model loads."""

from __future__ import annotations

import json

from tiny_models import STORIES

PROMPTS = ["Once upon a time, there was a little dog.", "Tom and Sue went to the park.",
           "The sun was hot and the bird sang."]


def test_cli_bench_mtbench_prompts_and_assistant(stories_medusa, tmp_path, capsys):
    from medusa.cli import main

    heads = tmp_path / "heads"
    stories_medusa.save_pretrained(heads)
    prompts = tmp_path / "q.jsonl"
    prompts.write_text("\n".join(json.dumps({"question_id": i, "turns": [p, "and then?"]})
                                 for i, p in enumerate(PROMPTS[1:])) + "\n")
    out = tmp_path / "bench" / "report.json"
    rc = main(["bench", "--heads", str(heads), "--prompts", str(prompts), "--max-new-tokens", "10",
               "--assistant-model", str(STORIES), "--threads", "1", "--quiet", "--out", str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["prompts"] == 2 and report["greedy_exact_match"] == 1.0
    assert report["assisted"]["greedy_exact_match"] == 1.0  # the base drafting for itself: same tokens
    assert report["rows"][0]["prompt"] == PROMPTS[1]
    assert max(int(k) for k in report["accept_length_histogram"]) >= 3
    assert "speedup (median)" in capsys.readouterr().out


def test_cli_bench_bad_prompts_file_is_one_line_error(tmp_path, capsys):
    from medusa.cli import main

    bad = tmp_path / "p.jsonl"
    bad.write_text('{"prompt": "fine"}\n{"nope": 1}\n')
    # --heads: a directory but no checkpoint: the prompts are read first, before any model loads
    rc = main(["bench", "--heads", str(tmp_path), "--prompts", str(bad), "--out", str(tmp_path / "r.json")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("error:") and f"{bad}:2" in err and "\n" not in err
