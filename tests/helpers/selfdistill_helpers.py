"""Shared pieces of the self-distill tests: a tiny chat model and a `transformers serve` process."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from tiny_models import STORIES, require_shared, tiny_model

ROOT = Path(__file__).resolve().parents[2]

# A role-tagged template: every turn is "<s>role: content</s>\n"; the generation prompt opens an assistant
# turn.
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ bos_token }}{{ m['role'] }}: {{ m['content'] }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}{{ bos_token }}assistant:{% endif %}"
)


def chat_tokenizer(template: str | None = CHAT_TEMPLATE):
    from transformers import AutoTokenizer

    require_shared(STORIES)
    tok = AutoTokenizer.from_pretrained(STORIES)
    tok.chat_template = template
    return tok


def tiny_chat_model(seed: int = 0):
    """Random-weight Llama over stories260K's 512-token vocabulary (EOS id 2, like the tokenizer)."""
    return tiny_model("llama", seed=seed, vocab_size=512, hidden_size=32, layers=1)


def save_chat_model(path: Path, template: str | None = CHAT_TEMPLATE) -> Path:
    model = tiny_chat_model()
    model.generation_config.eos_token_id = 2
    model.save_pretrained(path)
    chat_tokenizer(template).save_pretrained(path)
    return path


def read_rows(path: Path) -> list[dict]:
    """The JSON rows of a JSONL file."""
    import json

    return [json.loads(line) for line in path.read_text().splitlines()]


def write_prompts(tmp_path: Path, rows: list) -> None:
    """``tmp_path/prompts.jsonl`` with ``rows``."""
    import json

    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def local_config(tmp_path: Path, **kw):
    """A local-backend run over ``tmp_path/prompts.jsonl`` into ``tmp_path/out.jsonl`` (6 sampled tokens a
    reply, truncated replies kept, batch 4); ``kw`` overrides any field."""
    from medusa.selfdistill import Sampling, SelfDistillConfig

    base = dict(model="tiny-chat", prompts=str(tmp_path / "prompts.jsonl"), out=str(tmp_path / "out.jsonl"),
                sampling=Sampling(temperature=0.8, max_new_tokens=6, seed=1), on_length="keep",
                batch_size=4, progress=False)
    base.update(kw)
    return SelfDistillConfig(**base)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli_env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               PYTHONPATH=str(ROOT), HF_HUB_CACHE=str(tmp_path / "hub-cache"), OMP_NUM_THREADS="1",
               TOKENIZERS_PARALLELISM="false")
    (tmp_path / "hub-cache").mkdir(exist_ok=True)
    return env


def run_cli(args: list[str], tmp_path: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "medusa", *args], cwd=ROOT, env=cli_env(tmp_path),
                          capture_output=True, text=True, timeout=timeout)


@contextlib.contextmanager
def transformers_server(model_dir: Path, tmp_path: Path, startup_s: float = 120) -> Iterator[str]:
    """`transformers serve MODEL --host 127.0.0.1 --port P`; yields the /v1 base URL; always killed."""
    port = free_port()
    exe = Path(sys.executable).with_name("transformers")
    log = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen([str(exe), "serve", str(model_dir), "--host", "127.0.0.1", "--port", str(port),
                             "--device", "cpu", "--log-level", "warning"],
                            env=cli_env(tmp_path), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + startup_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"transformers serve exited: "
                                   f"{(tmp_path / 'server.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("transformers serve did not start in time")
                time.sleep(0.5)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.kill()
        proc.wait(timeout=30)
        log.close()
