"""The ``openai`` backend against a real ``transformers serve`` on a loopback port; its endpoint and option
checks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from selfdistill_helpers import ROOT, cli_env, free_port, save_chat_model, transformers_server

from medusa.errors import ConfigError, MedusaError
from medusa.selfdistill import EndpointUnreachable, Sampling, SelfDistillConfig, self_distill
from medusa.selfdistill.backends.openai import OpenAIBackend, normalize_endpoint

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve")
    model_dir = save_chat_model(tmp / "tiny-chat")
    with transformers_server(model_dir, tmp) as url:
        yield url, str(model_dir)


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _cfg(tmp_path, url, name, **kw):
    base = dict(model=None, prompts=str(tmp_path / "prompts.jsonl"), out=str(tmp_path / "out.jsonl"),
                backend="openai", endpoint=url, served_model=name, concurrency=2, on_length="keep",
                sampling=Sampling(temperature=0.7, max_new_tokens=5), retries=1, retry_backoff_s=0.05,
                timeout_s=60, progress=False)
    base.update(kw)
    return SelfDistillConfig(**base)


def _write_prompts(tmp_path, rows):
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_replay_and_completion_through_the_server(server, tmp_path):
    url, name = server
    rows = [{"question_id": i, "turns": [f"question {i}?", f"follow-up {i}?"]} for i in range(3)]
    _write_prompts(tmp_path, rows)
    s = self_distill(_cfg(tmp_path, url, name, mode="replay"))
    assert s["written"] == 3 and s["errors"] == 0 and s["completion_tokens"] > 0
    for row in _rows(tmp_path / "out.jsonl"):
        msgs = row["messages"]
        i = int(row["metadata"]["source_id"])
        assert [m["role"] for m in msgs] == ["user", "assistant"] * 2
        assert [msgs[0]["content"], msgs[2]["content"]] == rows[i]["turns"]
        assert all(isinstance(m["content"], str) and m["content"] for m in msgs)
        meta = row["metadata"]
        assert meta["backend"] == "openai" and meta["model"] == name and len(meta["finish_reasons"]) == 2
    s = self_distill(_cfg(tmp_path, url, name, mode="completion", out=str(tmp_path / "c.jsonl")))
    assert s["written"] == 3
    assert all(r["prompt"] == f"question {r['metadata']['source_id']}?" and r["completion"]
               for r in _rows(tmp_path / "c.jsonl"))


def test_killed_run_resumes_with_every_prompt_exactly_once(server, tmp_path):
    url, name = server
    n = 40
    _write_prompts(tmp_path, [{"id": f"p{i}", "prompt": f"Once upon a time {i}"} for i in range(n)])
    out = tmp_path / "out.jsonl"
    cmd = [sys.executable, "-m", "medusa", "self-distill", "--backend", "openai", "--endpoint", url,
           "--served-model", name, "--prompts", str(tmp_path / "prompts.jsonl"), "--out", str(out),
           "--mode", "completion", "--max-new-tokens", "16", "--concurrency", "1", "--no-progress"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=cli_env(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if out.exists() and out.read_text().count("\n") >= 3:
                break
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    before = out.read_text().count("\n")
    assert 3 <= before < n, f"the run was not killed half-way ({before} rows)"
    r = subprocess.run(cmd, cwd=ROOT, env=cli_env(tmp_path), capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    ids = [row["metadata"]["source_id"] for row in _rows(out)]
    assert sorted(ids) == sorted(f"p{i}" for i in range(n))  # every prompt exactly once
    assert f"{before} already there" in r.stdout and f"wrote {n - before} rows" in r.stdout


def test_unreachable_endpoint_stops_the_run_and_keeps_rows(tmp_path):
    _write_prompts(tmp_path, [{"prompt": "hello"}, {"prompt": "again"}])
    out = tmp_path / "out.jsonl"
    kept = json.dumps({"id": "x:0", "prompt": "p", "completion": "c",
                       "metadata": {"source_id": "x", "sample": 0, "mode": "completion",
                                    "model": "m"}}) + "\n"
    out.write_text(kept)
    dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(EndpointUnreachable, match="cannot reach"):  # discovering the model name
        self_distill(_cfg(tmp_path, dead, None, mode="completion"))
    with pytest.raises(EndpointUnreachable, match="after 1 retries"):  # mid-run, after retries
        self_distill(_cfg(tmp_path, dead, "m", mode="completion"))
    assert issubclass(EndpointUnreachable, MedusaError) and out.read_text() == kept


def test_server_rejections_become_error_rows(server, tmp_path):
    url, _ = server
    _write_prompts(tmp_path, [{"prompt": f"q{i}"} for i in range(3)])
    with pytest.raises(MedusaError, match="first 3 rows all failed"):
        self_distill(_cfg(tmp_path, url, "no-such-model", mode="replay"))
    errors = _rows(tmp_path / "out.errors.jsonl")
    assert len(errors) == 3 and all("reply to user turn 1" in e["reason"] for e in errors)


@pytest.mark.parametrize("given, endpoint", [
    ("http://127.0.0.1:8000", "http://127.0.0.1:8000/v1"), ("http://host:8000/", "http://host:8000/v1"),
    ("https://api.example.com/v1/", "https://api.example.com/v1"),
    ("http://host/openai/v2", "http://host/openai/v2")])
def test_endpoint_gets_v1_unless_it_has_a_path(given, endpoint):
    assert normalize_endpoint(given) == endpoint


def test_bad_endpoint_and_options_are_config_errors():
    for bad in ("127.0.0.1:8000", "ftp://host/v1", "http://"):
        with pytest.raises(ConfigError, match="is not an http"):
            normalize_endpoint(bad)
    with pytest.raises(ConfigError, match="--api must be chat or completions, got 'embeddings'"):
        OpenAIBackend("http://127.0.0.1:9", model="m", api="embeddings")
    with pytest.raises(ConfigError, match="--concurrency must be >= 1, got 0"):
        OpenAIBackend("http://127.0.0.1:9", model="m", concurrency=0)
    backend = OpenAIBackend("http://127.0.0.1:9", model="m", api="completions")  # named: no request made
    assert (backend.endpoint, backend.model_name) == ("http://127.0.0.1:9/v1", "m")
    assert backend.api == "completions"
