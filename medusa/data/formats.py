"""Rows (from :mod:`medusa.data.readers`) -> normalised training samples.

A normalised sample is one of:
  ``("chat", messages)``             messages: ``[{"role": system|user|assistant|tool, "content": str}]``
  ``("prompt_completion", (prompt, completion))``
  ``("text", text)``
Rows may carry extra keys (``id``, ``metadata``), which are ignored. Conversational rows (sharegpt,
messages, alpaca, mtbench) are read by :func:`medusa.data.readers.conversation`, the same reader prompt
sources use; a training conversation needs an assistant turn, so an MT-bench row (user turns only) is
rejected as ``no_assistant_turn``.
"""

from __future__ import annotations

from typing import Any

from medusa.config.enums import CHAT_FORMATS
from medusa.data.readers import RowError, conversation, row_format, str_field


def _check_conversation(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    if not any(m["role"] == "assistant" for m in messages):
        raise RowError("no_assistant_turn", "the conversation has no assistant turn")
    return messages


def normalize(row: Any, fmt: str) -> tuple[str, Any]:
    """One row -> a normalised sample; raises :class:`RowError` when the row is malformed."""
    fmt = row_format(row, fmt)
    if fmt in ("prompt_completion", "prompt"):  # a bare prompt has nothing to train on: missing 'completion'
        return "prompt_completion", (str_field(row, "prompt", allow_empty=True), str_field(row, "completion"))
    if fmt == "text":
        return "text", str_field(row, "text")
    if fmt not in CHAT_FORMATS:
        raise ValueError(f"unknown format {fmt!r}")
    messages = conversation(row, fmt)
    if fmt == "alpaca":
        str_field(row, "output")  # the reply trained on: present and not blank
    return "chat", _check_conversation(messages)
