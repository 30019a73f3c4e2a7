"""Training data: the row formats -> token ids + labels on the assistant / completion tokens only.

``load_tokenized(source, tokenizer, max_length)`` reads a local .json / .jsonl / .parquet / .txt file,
a ``datasets`` directory or a hub dataset id (:mod:`medusa.data.readers`), detects or takes the format
(sharegpt, messages, alpaca, prompt_completion, text; MT-bench rows have no reply to train on),
tokenises with the chat template and returns :class:`TokenizedData`. ``labels`` are NOT shifted:
``labels[t]`` is ``input_ids[t]`` where that token is trained on, else ``IGNORE_INDEX``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from medusa.data.formats import normalize
from medusa.data.readers import RowError, read_rows
from medusa.data.tokenize import (
    IGNORE_INDEX,
    encode_sample,
    has_trainable_target,
    resolve_chat_template,
)
from medusa.errors import DataError

__all__ = ["TokenizedData", "load_tokenized", "collate", "IGNORE_INDEX"]


@dataclass
class TokenizedData:
    examples: list[dict[str, list[int]]]  # each {"input_ids": [...], "labels": [...]}, same length
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> count
    source: str = ""

    def __len__(self) -> int:
        return len(self.examples)

    @property
    def num_label_tokens(self) -> int:
        return sum(sum(1 for x in ex["labels"] if x != IGNORE_INDEX) for ex in self.examples)


def _windows(ids: list[int], labels: list[int], max_length: int) -> list[tuple[list[int], list[int]]]:
    """Plain text longer than ``max_length``: consecutive windows (every token is trained on)."""
    return [(ids[i:i + max_length], labels[i:i + max_length]) for i in range(0, len(ids), max_length)]


def load_tokenized(
    source: str,
    tokenizer: Any,
    max_length: int,
    format: str = "auto",
    chat_template: str | None = None,
    skip_invalid: bool = False,
) -> TokenizedData:
    """Read and tokenise ``source``. A malformed row raises :class:`DataError` naming its file and line,
    or with ``skip_invalid`` is skipped and counted under its reason in ``TokenizedData.skipped``.

    Chat rows are truncated to ``max_length``; plain text is cut into ``max_length`` windows. Examples
    left without a trained token a head can predict (none at position >= 2) are counted as
    ``no_trainable_tokens``.
    """
    has_template = bool(resolve_chat_template(tokenizer, chat_template))
    examples: list[dict[str, list[int]]] = []
    skipped: Counter[str] = Counter()
    for where, row in read_rows(source):
        try:
            kind, payload = normalize(row, format)
            ids, labels = encode_sample(tokenizer, kind, payload, has_template)
        except RowError as exc:
            if skip_invalid:
                skipped[exc.reason] += 1
                continue
            message = str(exc)
            message = message if message.startswith(where) else f"{where}: {message}"
            raise DataError(f"{message} (rows like it are skipped with data.skip_invalid: true, or "
                            "--skip-invalid)") from None
        pieces = (_windows(ids, labels, max_length) if kind == "text"
                  else [(ids[:max_length], labels[:max_length])])
        for piece_ids, piece_labels in pieces:
            if len(piece_ids) < 3 or not has_trainable_target(piece_labels):
                skipped["no_trainable_tokens"] += 1
                continue
            examples.append({"input_ids": piece_ids, "labels": piece_labels})
    if not examples:
        raise DataError(f"{source}: no usable examples"
                        + (f" (skipped: {dict(skipped)})" if skipped else ""))
    return TokenizedData(examples, dict(skipped), source)


def collate(examples: list[dict[str, list[int]]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-pad examples: ``input_ids``, ``labels`` (``IGNORE_INDEX`` on padding), ``attention_mask``."""
    width = max(len(ex["input_ids"]) for ex in examples)
    batch = len(examples)
    input_ids = torch.full((batch, width), pad_token_id, dtype=torch.long)  # [B, T]
    labels = torch.full((batch, width), IGNORE_INDEX, dtype=torch.long)  # [B, T]
    attention_mask = torch.zeros((batch, width), dtype=torch.long)  # [B, T]
    for i, ex in enumerate(examples):
        n = len(ex["input_ids"])
        input_ids[i, :n] = torch.tensor(ex["input_ids"], dtype=torch.long)
        labels[i, :n] = torch.tensor(ex["labels"], dtype=torch.long)
        attention_mask[i, :n] = 1
    return {"input_ids": input_ids, "labels": labels, "attention_mask": attention_mask}
