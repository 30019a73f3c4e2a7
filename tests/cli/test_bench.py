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
    (tmp_path / "h").mkdir()
    heads = str(tmp_path / "h")
    rc = main(["bench", "--heads", heads, "--prompts", str(bad), "--out", str(tmp_path / "r.json")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("error:") and f"{bad}:2" in err and "\n" not in err


def test_cli_bench_out_inside_the_checkpoint_it_reads_is_refused(tmp_path, capsys):
    from medusa.cli import main

    (tmp_path / "h").mkdir()
    (tmp_path / "p.txt").write_text("Once upon a time\n")
    out = tmp_path / "h" / "report.json"
    heads, prompts = str(tmp_path / "h"), str(tmp_path / "p.txt")
    rc = main(["bench", "--heads", heads, "--prompts", prompts, "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err == f"error: {out}: is part of the input {heads}; write the output to another file"
    assert sorted(p.name for p in (tmp_path / "h").iterdir()) == []


def test_cli_bench_compare_lookup_rows(stories_medusa, tmp_path, capsys):
    from medusa.cli import main

    heads = tmp_path / "heads"
    stories_medusa.save_pretrained(heads)
    prompts = tmp_path / "p.txt"
    prompts.write_text("\n".join(PROMPTS[:2]) + "\n")
    out = tmp_path / "report.json"
    rc = main(["bench", "--heads", str(heads), "--prompts", str(prompts), "--max-new-tokens", "12",
               "--compare-lookup", "3", "--prompt-lookup", "--threads", "1", "--quiet", "--no-plots",
               "--out", str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["config"]["compare_lookup"] == 3 and report["config"]["lookup_tokens"] == 0
    assert report["greedy_exact_match"] == 1.0
    for key in ("lookup_alone", "hybrid", "prompt_lookup"):
        assert report[key]["greedy_exact_match"] == 1.0
    assert report["hybrid"]["tokens_per_step"] >= 1.0 and report["lookup_alone"]["tokens_per_step"] >= 1.0
    printed = capsys.readouterr().out.splitlines()
    assert [line.split("  ")[0] for line in printed if line.startswith(("MEDUSA", "HF prompt"))] == [
        "MEDUSA heads only", "MEDUSA lookup alone", "MEDUSA hybrid", "HF prompt lookup"]
    assert "| MEDUSA hybrid (L=3) |" in out.with_suffix(".md").read_text()


def test_cli_bench_lookup_option_errors_are_one_line(tmp_path, capsys):
    from medusa.cli import main

    prompts = tmp_path / "p.txt"
    prompts.write_text("fine\n")
    (tmp_path / "h").mkdir()
    heads = str(tmp_path / "h")
    base = ["bench", "--heads", heads, "--prompts", str(prompts), "--out", str(tmp_path / "r.json")]
    # --heads: a directory but no checkpoint: every one fails before any model loads
    for extra, words in ((["--tree", "lookup"], "--tree lookup"),
                         (["--tree", "lookup", "--lookup-tokens", "0"], "--lookup-tokens L with L >= 1"),
                         (["--compare-lookup", "0"], "--compare-lookup"),
                         (["--compare-lookup", "4", "--lookup-tokens", "2"], "drop --lookup-tokens"),
                         (["--compare-lookup", "4", "--tree", "dynamic"], "static tree"),
                         (["--compare-lookup", "4", "--tree", "lookup"], "static tree"),
                         (["--lookup-tokens", "-1"], "--lookup-tokens"),
                         (["--lookup-tokens", "2", "--tree", "dynamic"], "static tree")):
        assert main(base + extra) == 2, extra
        err = capsys.readouterr().err.strip()
        assert err.startswith("error:") and words in err and "\n" not in err, (extra, err)
