"""Prompts the model writes itself ("Magpie", Xu et al. 2024): sample from the chat template's user header.

A chat model trained on its template has learned what a user turn looks like. Feeding it the template up to
the start of a user turn (system turn included, if the template adds one) and sampling until the end of the
turn gives a user request drawn from the model's own idea of its users. Requests are kept when they are
new (case- and space-insensitive), ended by the turn's end (not cut by the token limit) and within the
length bounds. ``medusa self-distill --synthesize-prompts N`` writes them to a JSONL of ``{"id", "prompt"}``
rows (resumable: rows already there count) and then answers them like any other prompt file.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from medusa.errors import ConfigError, DataError

SENTINEL = "\u2063MEDUSA_USER_TURN\u2063"  # an invisible separator pair no template emits on its own


@dataclass(frozen=True)
class SynthesisOptions:
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 96  # a request longer than this is dropped (it did not end)
    min_chars: int = 12
    max_rounds: int = 6  # sampling rounds before giving up on reaching N distinct requests
    seed: int = 0


def user_header(tokenizer: Any) -> list[int]:
    """Token ids of the chat template rendered up to where a user turn's text starts."""
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError("--synthesize-prompts needs a chat model (its tokenizer has no chat template)")
    text = tokenizer.apply_chat_template([{"role": "user", "content": SENTINEL}], tokenize=False,
                                         add_generation_prompt=False)
    if SENTINEL not in text:
        raise ConfigError("--synthesize-prompts: the chat template does not place the user's text verbatim")
    return tokenizer(text[:text.index(SENTINEL)], add_special_tokens=False)["input_ids"]


def normalise(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().lower()


def keep_request(text: str, reason: str, opts: SynthesisOptions, special: Sequence[str]) -> bool:
    """A request is kept when the turn ended by itself, is long enough and holds no template token."""
    text = text.strip()
    return reason == "stop" and len(text) >= opts.min_chars and not any(s and s in text for s in special)


def synthesize(generate: Callable[[list[list[int]], int], list[tuple[list[int], str]]], tokenizer: Any,
               n: int, opts: SynthesisOptions, seen: set[str] | None = None,
               on_round: Callable[[int, int], None] | None = None) -> list[str]:
    """Up to ``n`` distinct new user requests.

    ``generate(prompts, seed) -> [(tokens, "stop" | "length")]`` samples one continuation per prompt (the
    local backend's sampler); ``seen`` holds normalised requests to avoid (those already written).
    """
    header = user_header(tokenizer)
    seen = set(seen or ())
    special = [t for t in getattr(tokenizer, "all_special_tokens", []) if t]
    out: list[str] = []
    for round_ in range(opts.max_rounds):
        want = n - len(out)
        if want <= 0:
            break
        batch = max(8, int(want * 1.5))  # oversample: duplicates and cut requests are dropped
        for tokens, reason in generate([header] * batch, opts.seed + 7919 * round_ + len(seen)):
            text = tokenizer.decode(tokens, skip_special_tokens=True).strip()
            key = normalise(text)
            if key in seen or not keep_request(text, reason, opts, special):
                continue
            seen.add(key)
            out.append(text)
            if len(out) >= n:
                break
        if on_round is not None:
            on_round(round_, len(out))
    return out


def read_synthesized(path: Path) -> list[str]:
    """The requests already written to ``path`` (``{"id", "prompt"}`` rows), in order."""
    if not path.is_file():
        return []
    rows = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(str(json.loads(line)["prompt"]))
        except (json.JSONDecodeError, KeyError, TypeError):
            raise DataError(f"{path}:{lineno}: not a synthesized prompt row "
                            '({"id", "prompt"})') from None
    return rows


def append_synthesized(path: Path, prompts: Sequence[str], start: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as fh:
        for i, text in enumerate(prompts, start=start):
            fh.write(json.dumps({"id": f"synth-{i}", "prompt": text}, ensure_ascii=False) + "\n")
