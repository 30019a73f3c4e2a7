"""medusa.data.tokenize: the chat template a recipe names, the character spans of assistant turns, and
labels on exactly the tokens that overlap them (on stories260K's tokenizer)."""

from types import SimpleNamespace

import pytest

from medusa.data.readers import RowError
from medusa.data.tokenize import (
    BUILTIN_TEMPLATES,
    IGNORE_INDEX,
    chat_spans,
    encode_sample,
    encode_spans,
    has_trainable_target,
    resolve_chat_template,
)
from medusa.errors import ConfigError

from tiny_models import stories_tokenizer

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Who is Lily?"},
            {"role": "assistant", "content": "Lily is a girl."}, {"role": "user", "content": "And Tom?"},
            {"role": "assistant", "content": "Her brother."}]


@pytest.fixture(scope="module")
def tok():
    tok = stories_tokenizer()
    resolve_chat_template(tok, "chatml")
    return tok


def test_resolve_chat_template_names_files_and_text(tmp_path):
    tok = SimpleNamespace(chat_template=None)
    assert resolve_chat_template(tok, None) is None  # neither the recipe nor the tokenizer has one
    assert resolve_chat_template(tok, "vicuna") == BUILTIN_TEMPLATES["vicuna"] == tok.chat_template
    (tmp_path / "t.jinja").write_text("{{ messages[0]['content'] }}")
    assert resolve_chat_template(tok, str(tmp_path / "t.jinja")) == "{{ messages[0]['content'] }}"
    assert resolve_chat_template(tok, "{% for m in messages %}x{% endfor %}") == tok.chat_template
    assert resolve_chat_template(tok, None) == "{% for m in messages %}x{% endfor %}"  # the installed one
    with pytest.raises(ConfigError, match=r"data.chat_template: .*missing\.jinja does not exist"):
        resolve_chat_template(tok, str(tmp_path / "missing.jinja"))
    with pytest.raises(ConfigError, match="'llama9' is not a built-in template"):
        resolve_chat_template(tok, "llama9")


def test_chat_spans_are_the_assistant_turns_with_their_end_marker(tok):
    full, spans = chat_spans(tok, MESSAGES)
    assert full == tok.apply_chat_template(MESSAGES, tokenize=False)
    assert [full[a:b] for a, b in spans] == ["Lily is a girl.<|im_end|>\n", "Her brother.<|im_end|>\n"]


def test_a_template_that_rewrites_earlier_turns_is_refused(tok):
    counting = SimpleNamespace(apply_chat_template=lambda messages, tokenize, add_generation_prompt: (
        f"{len(messages)} turns: " + " | ".join(m["content"] for m in messages)))
    with pytest.raises(RowError) as exc:
        chat_spans(counting, MESSAGES[1:3])
    assert exc.value.reason == "template_not_prefix_stable"


def test_encode_spans_labels_overlapping_tokens_and_the_eos(tok):
    text = "Once upon a time"
    ids, labels = encode_spans(tok, text, [(text.index("a time"), len(text))], add_special_tokens=True,
                               append_eos=True)
    assert ids[0] == tok.bos_token_id and ids[-1] == labels[-1] == tok.eos_token_id
    assert len(ids) == len(labels) and all(lab in (IGNORE_INDEX, i) for lab, i in zip(labels, ids))
    assert tok.decode([lab for lab in labels if lab != IGNORE_INDEX]) == "a time</s>"
    bare, none = encode_spans(tok, text, [], add_special_tokens=False, append_eos=False)
    assert bare == ids[1:-1] and set(none) == {IGNORE_INDEX}


def test_encode_sample_per_kind(tok):
    ids, labels = encode_sample(tok, "chat", MESSAGES, has_template=True)
    assert tok.decode([lab for lab in labels if lab != IGNORE_INDEX]) == (
        "Lily is a girl.<|im_end|>\nHer brother.<|im_end|>\n")
    ids, labels = encode_sample(tok, "prompt_completion", ("Once upon", " a time"), has_template=False)
    assert labels[:3] == [IGNORE_INDEX] * 3 and labels[3:] == ids[3:] and ids[-1] == tok.eos_token_id
    ids, labels = encode_sample(tok, "text", "Once upon a time", has_template=False)
    assert labels[1:] == ids[1:] and labels[0] == IGNORE_INDEX  # only the BOS is not trained on
    with pytest.raises(ConfigError, match="no chat template .* set data.chat_template"):
        encode_sample(tok, "chat", MESSAGES, has_template=False)
    with pytest.raises(ValueError, match="parquet"):
        encode_sample(tok, "parquet", "x", has_template=False)


@pytest.mark.parametrize("labels, min_offset, expected", [
    ([IGNORE_INDEX, IGNORE_INDEX, 7], 2, True), ([5, 6, IGNORE_INDEX, IGNORE_INDEX], 2, False),
    ([5, 6], 2, False), ([IGNORE_INDEX, 4], 1, True), ([], 0, False)])
def test_has_trainable_target(labels, min_offset, expected):
    assert has_trainable_target(labels, min_offset) is expected
