"""``medusa generate`` (medusa/cli/generate.py) on stories260K with untrained heads: the text is HF greedy's,
the statistics line is on stdout or, with --quiet-stats, on stderr; no prompt is a user error before any
model loads. (Fitted heads, --prompts files, --stream and the user errors:
tests/integration/test_stories260k_decoding.py.)"""

from __future__ import annotations

import re

import pytest

from medusa import MedusaModel
from medusa.cli import main

from tiny_models import STORIES, require_shared, stories_tokenizer

PROMPT = "Once upon a time, there was a little dog."


@pytest.fixture(scope="module")
def heads(tmp_path_factory):
    require_shared(STORIES)
    path = tmp_path_factory.mktemp("gen") / "heads"
    MedusaModel.from_base(str(STORIES), num_heads=2, num_layers=1).save_pretrained(path)
    return path


def test_text_on_stdout_statistics_on_stderr_with_quiet_stats(heads, capsys):
    model = MedusaModel.from_pretrained(heads)
    tok = stories_tokenizer()
    ids = tok(PROMPT, return_tensors="pt").input_ids
    expected = tok.decode(model.base_model.generate(ids, max_new_tokens=8, do_sample=False)[0],
                          skip_special_tokens=True)
    capsys.readouterr()
    assert main(["generate", "--heads", str(heads), "--prompt", PROMPT, "--max-new-tokens", "8",
                 "--quiet-stats"]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines() == [expected]
    stats = re.fullmatch(r"\[8 tokens, (\d+) steps, ([0-9.]+) tokens/step, \d+ tokens/s\]\n", captured.err)
    assert stats and 1 <= int(stats.group(1)) <= 8 and float(stats.group(2)) >= 1.0, captured.err
    assert main(["generate", "--heads", str(heads), "--prompt", PROMPT, "--max-new-tokens", "8"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == expected and lines[1].startswith("[8 tokens, ")


def test_no_prompt_is_a_user_error(tmp_path, capsys):
    # --heads names a directory that is no checkpoint: the missing prompt is reported before it is read
    assert main(["generate", "--heads", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: give --prompt TEXT or --prompts FILE"]


def test_lookup_options_reach_generate(heads, capsys, monkeypatch):
    """--lookup-tokens L (the hybrid) and --tree lookup reach model.generate; greedy, the text stays HF's."""
    seen = []
    original = MedusaModel.generate

    def recording(self, *args, **kwargs):
        seen.append((kwargs.get("tree"), kwargs.get("lookup_tokens")))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(MedusaModel, "generate", recording)
    tok = stories_tokenizer()
    ids = tok(PROMPT, return_tensors="pt").input_ids
    expected = tok.decode(MedusaModel.from_pretrained(heads).base_model.generate(
        ids, max_new_tokens=8, do_sample=False)[0], skip_special_tokens=True)
    for extra in (["--lookup-tokens", "3"], ["--tree", "lookup", "--lookup-tokens", "2"],
                  ["--lookup-tokens", "0"], []):
        capsys.readouterr()
        assert main(["generate", "--heads", str(heads), "--prompt", PROMPT, "--max-new-tokens", "8",
                     *extra]) == 0
        lines = capsys.readouterr().out.splitlines()
        stats = r"\[8 tokens, \d+ steps, [0-9.]+ tokens/step, .*\]"
        assert lines[0] == expected and re.fullmatch(stats, lines[1]), lines
    assert seen == [(None, 3), ("lookup", 2), (None, 0), (None, None)]


def test_lookup_option_errors_are_one_line(tmp_path, capsys):
    # --heads names a directory that is no checkpoint: the options are refused before it is read
    needs = "needs --lookup-tokens L with L >= 1"
    for extra, words in ((["--tree", "lookup"], needs), (["--tree", "lookup", "--lookup-tokens", "0"], needs),
                         (["--lookup-tokens", "x"], "--lookup-tokens"),
                         (["--lookup-tokens", "2", "--tree", "dynamic"], "static tree"),
                         (["--lookup-tokens", "2", "--profile"], "--profile")):
        assert main(["generate", "--heads", str(tmp_path), "--prompt", PROMPT, *extra]) == 2, extra
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error:") and words in err[0], (extra, err)
