"""``medusa self-distill``: user errors exit 2 with one ``error:`` line; invalid prompt rows go to the errors
file while the valid ones are written; a re-run adds nothing."""

from __future__ import annotations

from selfdistill_helpers import read_rows as _rows
from selfdistill_helpers import run_cli
from selfdistill_helpers import write_prompts as _write_prompts

from tiny_models import STORIES, require_shared


def test_cli_errors_exit_2_and_keep_written_rows(tmp_path):
    require_shared(STORIES)
    out = tmp_path / "out.jsonl"
    out.write_text("")
    _write_prompts(tmp_path, [{"prompt": "hi"}])
    r = run_cli(["self-distill", "--model", str(STORIES), "--prompts", str(tmp_path / "prompts.jsonl"),
                 "--out", str(out), "--mode", "replay", "--no-progress"], tmp_path)
    assert r.returncode == 2 and "error:" in r.stderr and "no chat template" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    (tmp_path / "bad.jsonl").write_text('{"prompt": "fine"}\n{"turns": "not a list"}\n')
    args = ["self-distill", "--model", str(STORIES), "--prompts", str(tmp_path / "bad.jsonl"),
            "--out", str(out), "--mode", "completion", "--max-new-tokens", "4", "--no-progress"]
    r = run_cli(args, tmp_path)
    assert r.returncode == 0, r.stderr
    assert "wrote 1 rows" in r.stdout and "1 invalid prompts" in r.stdout
    (err,) = _rows(tmp_path / "out.errors.jsonl")
    assert err["location"].endswith("bad.jsonl:2") and "'turns' must be a list" in err["reason"]
    r = run_cli(args, tmp_path)  # the same command again: nothing new, nothing duplicated
    assert r.returncode == 0 and "wrote 0 rows" in r.stdout and "1 already there" in r.stdout
    assert len(_rows(out)) == 1 and len(_rows(tmp_path / "out.errors.jsonl")) == 1
