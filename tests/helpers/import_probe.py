"""Each package module imported alone in a fresh interpreter, without paying for torch and transformers once
per module: one server process imports the third-party libraries (never a ``medusa`` module), then forks a
child per request, and the child runs the import. A child starts with no ``medusa`` module loaded, as a
fresh interpreter would; only the libraries' import cost is shared.

``python tests/helpers/import_probe.py`` is the server: one line of Python per request on stdin, one JSON
line ``{"ok": bool, "error": str}`` per reply on stdout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
from pathlib import Path

# Imported once by the server: what the package's modules pull in at import time.
PRELOAD = ("numpy", "torch", "torch.nn.functional", "safetensors.torch", "yaml", "tokenizers", "transformers",
           "transformers.modeling_utils", "transformers.models.llama.modeling_llama", "accelerate")


class ImportProbe:
    """The client: :meth:`run` one line of Python in a fresh child of the server; :meth:`close` ends it."""

    def __init__(self, root: Path) -> None:
        env = dict(os.environ, PYTHONPATH=str(root))
        self.proc = subprocess.Popen([sys.executable, __file__], cwd=root, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)

    def run(self, code: str) -> tuple[bool, str]:
        assert "\n" not in code
        self.proc.stdin.write(code + "\n")
        self.proc.stdin.flush()
        reply = json.loads(self.proc.stdout.readline())
        return reply["ok"], reply["error"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def _child(code: str, write_fd: int) -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # the reply channel is the server's stdout: the import's prints go nowhere
    status, error = 0, ""
    try:
        exec(compile(code, "<import-probe>", "exec"), {"__name__": "__probe__"})
    except SystemExit as exc:  # medusa.__main__ --help exits 0
        status = 0 if exc.code in (0, None) else 1
        error = "" if status == 0 else f"SystemExit({exc.code!r})"
    except BaseException:  # noqa: BLE001 - any failure of the import is the reply
        status, error = 1, traceback.format_exc()
    os.write(write_fd, error.encode()[-3000:])
    os._exit(status)


def _serve() -> None:
    for name in PRELOAD:
        try:
            __import__(name)
        except ImportError:
            pass
    for line in sys.stdin:
        assert not [m for m in sys.modules if m == "medusa" or m.startswith("medusa.")]
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            _child(line.rstrip("\n"), write_fd)
        os.close(write_fd)
        chunks = []
        while chunk := os.read(read_fd, 65536):
            chunks.append(chunk)
        os.close(read_fd)
        _, status = os.waitpid(pid, 0)
        ok = os.waitstatus_to_exitcode(status) == 0
        error = b"".join(chunks).decode(errors="replace") or ("" if ok else f"exit status {status}")
        sys.stdout.write(json.dumps({"ok": ok, "error": error}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    _serve()
