"""Readers: prompt lines for generation and benchmarks (text or JSONL)."""

from __future__ import annotations

import json
from pathlib import Path

from medusa.errors import DataError


def read_prompts(path: str | Path) -> list[str]:
    """Prompts from a text file (one per non-empty line) or a JSONL file (``prompt``, ``text``, ``question``
    or the first of ``turns``, as in MT-Bench)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: not found")
    prompts: list[str] = []
    jsonl = path.suffix in (".jsonl", ".json")
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        if not jsonl:
            prompts.append(line)
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{lineno}: invalid JSON ({exc.msg})") from None
        text = None
        if isinstance(row, dict):
            for key in ("prompt", "text", "question"):
                if isinstance(row.get(key), str):
                    text = row[key]
                    break
            turns = row.get("turns")
            if text is None and isinstance(turns, list) and turns and isinstance(turns[0], str):
                text = turns[0]
        if text is None:
            raise DataError(f"{path}:{lineno}: no 'prompt', 'text', 'question' or 'turns' string in the row")
        prompts.append(text)
    if not prompts:
        raise DataError(f"{path}: no prompts")
    return prompts
