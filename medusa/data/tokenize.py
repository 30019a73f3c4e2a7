"""Normalised samples -> ``input_ids`` + ``labels`` (labels = the token id on trained tokens,
else ``IGNORE_INDEX``).

Chat samples are rendered with the chat template; the character span of every assistant turn is
found by rendering the conversation up to that turn with and without the generation prompt, and the
tokens whose character offsets overlap an assistant span are the labelled ones. So the labels cover
exactly the assistant's text plus the template's end-of-turn marker, whatever the template.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from medusa.data.readers import RowError
from medusa.errors import ConfigError
from medusa.io import read_text

IGNORE_INDEX = -100

BUILTIN_TEMPLATES = {
    "chatml": (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    ),
    "vicuna": (
        "{{ bos_token }}{% for m in messages %}"
        "{% if m['role'] == 'system' %}{{ m['content'] }}\n\n"
        "{% elif m['role'] == 'user' %}USER: {{ m['content'] }}\n"
        "{% else %}ASSISTANT: {{ m['content'] }}{{ eos_token }}\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
    ),
}


def resolve_chat_template(tokenizer: Any, template: str | None) -> str | None:
    """Install the recipe's template (a built-in name, a .jinja file or Jinja text) on ``tokenizer``.

    Returns the template in effect (None when neither the recipe nor the tokenizer has one).
    """
    if template:
        if template in BUILTIN_TEMPLATES:
            text = BUILTIN_TEMPLATES[template]
        elif template.endswith((".jinja", ".j2")):
            path = Path(template).expanduser()
            if not path.is_file():
                raise ConfigError(f"data.chat_template: {template} does not exist")
            text = read_text(path, ConfigError)
        elif "{%" in template or "{{" in template:
            text = template
        else:
            raise ConfigError(f"data.chat_template: {template!r} is not a built-in template "
                              f"({', '.join(BUILTIN_TEMPLATES)}), a .jinja file or Jinja text")
        tokenizer.chat_template = text
    return getattr(tokenizer, "chat_template", None)


def _render(tokenizer: Any, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False,
                                         add_generation_prompt=add_generation_prompt)


def chat_spans(tokenizer: Any, messages: list[dict[str, str]]) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character spans ``[start, end)`` of its assistant turns."""
    full = _render(tokenizer, messages, add_generation_prompt=False)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = _render(tokenizer, messages[:i], add_generation_prompt=True) if i else ""
        upto = _render(tokenizer, messages[: i + 1], add_generation_prompt=False)
        if not (full.startswith(before) and full.startswith(upto) and upto.startswith(before)):
            raise RowError("template_not_prefix_stable",
                           "the chat template renders earlier turns differently once later turns exist "
                           "(not prefix-stable); set data.chat_template to one that is")
        if len(upto) > len(before):
            spans.append((len(before), len(upto)))
    return full, spans


def encode_spans(tokenizer: Any, text: str, spans: list[tuple[int, int]], add_special_tokens: bool,
                 append_eos: bool) -> tuple[list[int], list[int]]:
    """Tokenise ``text``; a token is labelled when its characters overlap one of ``spans``."""
    enc = tokenizer(text, add_special_tokens=add_special_tokens, return_offsets_mapping=True)
    ids = list(enc["input_ids"])
    labels = [IGNORE_INDEX] * len(ids)
    for i, (start, end) in enumerate(enc["offset_mapping"]):
        if end > start and any(start < s_end and end > s_start for s_start, s_end in spans):
            labels[i] = ids[i]
    if append_eos and tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
        labels.append(tokenizer.eos_token_id)
    return ids, labels


def encode_sample(tokenizer: Any, kind: str, payload: Any, has_template: bool) -> tuple[list[int], list[int]]:
    """A normalised sample -> ``(input_ids, labels)``, untruncated."""
    if kind == "chat":
        if not has_template:
            raise ConfigError("the tokenizer has no chat template and this data is conversational; set "
                              "data.chat_template (chatml, vicuna, a .jinja file or Jinja text)")
        text, spans = chat_spans(tokenizer, payload)
        return encode_spans(tokenizer, text, spans, add_special_tokens=False, append_eos=False)
    if kind == "prompt_completion":
        prompt, completion = payload
        text = prompt + completion
        return encode_spans(tokenizer, text, [(len(prompt), len(text))], add_special_tokens=True,
                            append_eos=True)
    if kind == "text":
        return encode_spans(tokenizer, payload, [(0, len(payload))], add_special_tokens=True, append_eos=True)
    raise ValueError(kind)


def has_trainable_target(labels: list[int], min_offset: int = 2) -> bool:
    """True when some labelled token sits at position >= ``min_offset`` (head 1 predicts t + 2)."""
    return any(label != IGNORE_INDEX for label in labels[min_offset:])
