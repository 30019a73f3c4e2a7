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
    w = ResumableWriter(out, retry_errors=True)
    assert not w.skip(("b", 0)) and errors_path(out).read_text() == ""
    w.close()
    out.write_text('{"something": "else"}\n')
    with pytest.raises(DataError, match=r"out\.jsonl:1"):
        ResumableWriter(out)
