"""The resumable writer: rows and errors files, a partial last line repaired, errors retried on request."""

from __future__ import annotations

import json

import pytest

from medusa.errors import DataError
from medusa.selfdistill.writer import ResumableWriter, errors_path


def _row(sid, sample):
    return {"id": f"{sid}:{sample}", "prompt": "p", "completion": "c",
            "metadata": {"source_id": sid, "sample": sample}}


def test_writer_resumes_after_a_partial_line_and_retries_errors(tmp_path):
    out = tmp_path / "out.jsonl"
    with ResumableWriter(out) as w:
        w.write(_row("a", 0))
        w.write_error("b", 0, "boom")
    with open(out, "a") as fh:  # a kill in the middle of a write
        fh.write(json.dumps(_row("c", 0))[:20])
    w = ResumableWriter(out)
    assert w.done == {("a", 0)} and w.skip(("b", 0)) and not w.skip(("c", 0))
    w.write(_row("c", 0))
    w.close()
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["a:0", "c:0"]
    errors_before = errors_path(out).read_bytes()
    w = ResumableWriter(out, retry_errors=True)
    assert not w.skip(("b", 0)) and errors_path(out).read_bytes() == errors_before  # until a row is written
    with w:
        pass
    assert errors_path(out).read_text() == ""
    out.write_text('{"something": "else"}\n')
    with pytest.raises(DataError, match=r"out\.jsonl:1"):
        ResumableWriter(out)


@pytest.mark.parametrize("text", ['{not json, a note of the user\'s', '{"a": 1}\n{"id": "x:0", "prompt"',
                                  '{"note": "the user\'s"}\n{"half'])
def test_a_file_that_is_not_a_self_distillation_output_is_never_cut(tmp_path, text):
    out = tmp_path / "notes.jsonl"
    out.write_text(text)
    with pytest.raises(DataError, match=r"notes\.jsonl:\d+: not"):
        ResumableWriter(out)
    assert out.read_text() == text


def test_a_cut_line_is_repaired_only_when_the_first_row_is_written(tmp_path):
    out = tmp_path / "out.jsonl"
    with ResumableWriter(out) as w:
        w.write(_row("a", 0))
    with open(out, "a") as fh:
        fh.write('{"id": "b:0", "prom')
    before = out.read_bytes()
    w = ResumableWriter(out)
    assert w.done == {("a", 0)} and out.read_bytes() == before  # a refused run would leave it so
    w.close()
    assert out.read_bytes() == before
    with ResumableWriter(out) as w:
        w.write(_row("b", 0))
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["a:0", "b:0"]
