"""One pinned ``llama-server`` process (:mod:`benchmarks.llama_cpp_env`) on 127.0.0.1: started, asked for
greedy completions of token ids, stopped cleanly.

Greedy requests: ``POST /completion`` with the chat-templated prompt as token ids, ``temperature 0``,
``top_k 1``, ``ignore_eos`` (every prompt writes ``n_predict`` tokens, as our benchmarks do),
``cache_prompt false``; the response's ``tokens`` and ``timings`` (``predicted_per_second``, ``draft_n``,
``draft_n_accepted``). The server runs at log verbosity 4, where each finished request logs its acceptance
per draft position (``acc per pos = (...)``) and the drafter's running totals (``#acc rate/pos``); the log
goes to ``log`` and :func:`per_position` reads the last totals back.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.llama_cpp_env import LlamaCppUnavailable, server_binary

TOTALS = re.compile(r"statistics\s+(\S+): #calls\(b,g,a\) = \s*(\d+)\s+(\d+)\s+(\d+)"
                    r".*#acc rate/pos = \(([^)]*)\)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ServerConfig:
    """What one server runs: the target, and speculation (``spec_type`` None: plain decoding)."""

    name: str
    spec_type: str | None = None
    draft: Path | None = None
    draft_n_max: int | None = 3  # None: the mode's own default (n-gram modes)
    p_min: float = 0.0  # llama.cpp stops a chain at the first draft whose probability is below this
    extra: list[str] = field(default_factory=list)


def server_argv(binary: Path, model: Path, cfg: ServerConfig, port: int, threads: int = 1,
                ctx: int = 2048) -> list[str]:
    argv = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
            "-tb", str(threads), "-c", str(ctx), "-np", "1", "--no-warmup", "-lv", "4"]
    if cfg.spec_type is not None:
        argv += ["--spec-type", cfg.spec_type]
        if cfg.draft_n_max is not None:
            argv += ["--spec-draft-n-max", str(cfg.draft_n_max), "--spec-draft-p-min", f"{cfg.p_min:g}"]
        if cfg.draft is not None:
            argv += ["-md", str(cfg.draft), "-td", str(threads), "-tbd", str(threads)]
    return argv + cfg.extra


class LlamaServer:
    """``with LlamaServer(model, cfg, log) as s: s.complete(ids, 64)``; ``cpu``: a taskset core list."""

    def __init__(self, model: Path, cfg: ServerConfig, log: Path, threads: int = 1, cpu: str | None = None,
                 start_timeout: float = 300.0):
        self.port = free_port()
        argv = server_argv(server_binary(), model, cfg, self.port, threads)
        self.argv = (["taskset", "-c", cpu] if cpu else []) + argv
        self.log, self.start_timeout = log, start_timeout
        lib = str(server_binary().parent)  # the ggml libraries beside the binary
        paths = (lib, os.environ.get("LD_LIBRARY_PATH"))
        self.env = {**os.environ, "LD_LIBRARY_PATH": ":".join(p for p in paths if p)}
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> LlamaServer:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("w") as fh:
            self.proc = subprocess.Popen(self.argv, stdout=fh, stderr=subprocess.STDOUT, env=self.env)
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = " | ".join(self.log.read_text(errors="replace").strip().splitlines()[-4:])
                raise LlamaCppUnavailable(f"llama-server exited {self.proc.returncode} ({self.log}): {tail}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.5)
        self.stop()
        raise LlamaCppUnavailable(f"llama-server did not answer /health in {self.start_timeout:.0f} s "
                                  f"({self.log})")

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 20 s; the process is always reaped."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def complete(self, ids: list[int], n_predict: int) -> dict[str, Any]:
        """One greedy completion: ``{"tokens", "seconds", "prompt_seconds", "predicted_per_second", "draft_n",
        "draft_n_accepted"}`` (``seconds``: the server's own decode time; ``prompt_seconds``: its prefill)."""
        body = {"prompt": ids, "n_predict": n_predict, "temperature": 0.0, "top_k": 1, "ignore_eos": True,
                "cache_prompt": False, "return_tokens": True, "stream": False}
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/completion",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=1200) as r:
            out = json.loads(r.read())
        t = out.get("timings", {})
        return {"tokens": list(out["tokens"]), "seconds": t.get("predicted_ms", 0.0) / 1000.0,
                "prompt_seconds": t.get("prompt_ms", 0.0) / 1000.0,
                "predicted_per_second": t.get("predicted_per_second"),
                "draft_n": t.get("draft_n", 0), "draft_n_accepted": t.get("draft_n_accepted", 0)}


def per_position(log_text: str) -> dict[str, Any] | None:
    """The drafter's running totals in the server log (the last ``statistics`` line): verification steps and
    the accepted rate at each draft position (accepted at position i / steps), or None without one."""
    found = TOTALS.findall(log_text)
    if not found:
        return None
    impl, _begin, _draft, accept, rates = found[-1]
    return {"impl": impl, "steps": int(accept),
            "per_position": [float(x) for x in rates.split(",") if x.strip()]}
