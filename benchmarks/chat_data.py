"""The chat benchmark's data helpers: Spec-Bench public rows per category, and statistics of self-distilled
replies."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from medusa.errors import DataError

MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")


def spec_bench(shared: str | Path, per_category: int | None) -> list[dict[str, Any]]:
    """Spec-Bench public rows ``{"id", "category", "prompt"}`` (the first turn), MT-bench's eight
    categories grouped as ``mt_bench``; the first ``per_category`` of each category."""
    path = Path(shared) / "data" / "spec_bench_public.jsonl"
    if not path.is_file():
        raise DataError(f"{path}: not found (give --shared DIR)")
    rows: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            category = "mt_bench" if row["category"] in MT_BENCH else row["category"]
            prompt = row["turns"][0]
        except (json.JSONDecodeError, KeyError, IndexError, TypeError) as exc:
            raise DataError(f"{path}:{lineno}: not a Spec-Bench row ({type(exc).__name__})") from None
        if per_category is not None and seen.get(category, 0) >= per_category:
            continue
        seen[category] = seen.get(category, 0) + 1
        rows.append({"id": f"{category}-{row.get('question_id', lineno)}", "category": category,
                     "prompt": prompt})
    return rows


def reply_stats(paths: Sequence[Path]) -> dict[str, Any]:
    """Rows, reply tokens and the share of replies cut at the token budget (kept: only their EOS is missing)
    over the self-distilled files, resumed rows included."""
    total = cut = tokens = 0
    for path in paths:
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            if line.strip():
                meta = json.loads(line).get("metadata", {})
                total += 1
                cut += "length" in meta.get("finish_reasons", [])
                tokens += int(meta.get("completion_tokens", 0))
    return {"rows": total, "reply_tokens": tokens, "truncated_share": round(cut / max(total, 1), 4)}


__all__ = ["MT_BENCH", "reply_stats", "spec_bench"]
