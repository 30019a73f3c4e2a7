"""Row formats, assistant-only labels (decoded), file:line errors and skip_invalid counts."""

import json

import pytest

from medusa.data import IGNORE_INDEX, collate, load_tokenized
from medusa.errors import ConfigError, DataError

from tiny_models import SHARED, require_shared, stories_tokenizer

CONVERSATION = [
    {"role": "system", "content": "You tell short stories."},
    {"role": "user", "content": "Who is Lily?"},
    {"role": "assistant", "content": "Lily is a little girl."},
    {"role": "user", "content": "What does she like?"},
    {"role": "assistant", "content": "She likes to play in the park."},
]
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def tok():
    return stories_tokenizer()


def _write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def _label_text(tok, ex):
    return tok.decode([t for t in ex["labels"] if t != IGNORE_INDEX])


def test_labels_cover_exactly_the_assistant_turns(tok, tmp_path):
    src = _write_jsonl(tmp_path / "c.jsonl", [{"id": 1, "messages": CONVERSATION, "metadata": {"x": 1}}])
    data = load_tokenized(src, tok, max_length=512, chat_template=CHATML)
    (ex,) = data.examples
    assert len(ex["input_ids"]) == len(ex["labels"])
    assert all(lab in (IGNORE_INDEX, tid) for lab, tid in zip(ex["labels"], ex["input_ids"]))  # unshifted
    labelled = _label_text(tok, ex)
    assert "Lily is a little girl.<|im_end|>" in labelled
    assert "She likes to play in the park.<|im_end|>" in labelled
    for prompt_text in ("You tell short stories", "Who is Lily", "What does she like", "system", "user"):
        assert prompt_text not in labelled
    # the labelled tokens are two contiguous runs, one per assistant turn
    runs = sum(1 for i, lab in enumerate(ex["labels"])
               if lab != IGNORE_INDEX and (i == 0 or ex["labels"][i - 1] == IGNORE_INDEX))
    assert runs == 2


def test_sharegpt_alpaca_and_messages_agree(tok, tmp_path):
    sharegpt = {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello there."}]}
    messages = {"messages": [{"role": "user", "content": "Hi"},
                             {"role": "assistant", "content": "Hello there."}]}
    alpaca = {"instruction": "Hi", "input": "", "output": "Hello there."}
    outs = [load_tokenized(_write_jsonl(tmp_path / f"{i}.jsonl", [row]), tok, 128,
                           chat_template="chatml").examples
            for i, row in enumerate((sharegpt, messages, alpaca))]
    assert outs[0] == outs[1] == outs[2]


def test_prompt_completion_labels_only_the_completion(tok, tmp_path):
    src = _write_jsonl(tmp_path / "pc.jsonl", [{"id": "a", "prompt": "Once upon a time,",
                                                "completion": " there was a cat named Tom.", "metadata": {}}])
    (ex,) = load_tokenized(src, tok, 128).examples
    assert ex["input_ids"][0] == tok.bos_token_id and ex["labels"][-1] == tok.eos_token_id
    assert _label_text(tok, ex).strip().startswith("there was a cat named Tom.")
    assert "Once" not in _label_text(tok, ex)


def test_text_file_is_windowed_and_fully_labelled(tok):
    require_shared(SHARED)
    data = load_tokenized(str(SHARED / "data" / "tinystories_sample.txt"), tok, max_length=64)
    assert all(len(ex["input_ids"]) <= 64 for ex in data.examples)
    for ex in data.examples:  # every token is trained on except the BOS a document starts with
        expected = [IGNORE_INDEX if t == tok.bos_token_id else t for t in ex["input_ids"]]
        assert ex["labels"] == expected
    assert len(data.examples) > 1000


def test_sharegpt_shared_file_loads(tok):
    require_shared(SHARED)
    data = load_tokenized(str(SHARED / "data" / "sharegpt_dummy_conversation.json"), tok, 256,
                          chat_template="vicuna")
    assert len(data.examples) > 400 and data.num_label_tokens > 0


def test_malformed_row_names_file_and_line(tok, tmp_path):
    good = {"messages": CONVERSATION}
    src = _write_jsonl(tmp_path / "bad.jsonl", [good, good, {"messages": [{"role": "robot",
                                                                           "content": "x"}]}])
    with pytest.raises(DataError, match=r"bad\.jsonl:3: .*unknown role 'robot'"):
        load_tokenized(src, tok, 256, chat_template="chatml")
    src = _write_jsonl(tmp_path / "badjson.jsonl", [good, "{not json"])
    with pytest.raises(DataError, match=r"badjson\.jsonl:2: invalid JSON"):
        load_tokenized(src, tok, 256, chat_template="chatml")
    arr = tmp_path / "arr.json"
    arr.write_text('[\n  {"prompt": "a", "completion": " b c d e"},\n  {"prompt": "a"}\n]\n')
    with pytest.raises(DataError, match=r"arr\.json: row 1 \(line 3\): missing key 'completion' \(rows like "
                                         r"it are skipped with data.skip_invalid: true"):
        load_tokenized(str(arr), tok, 256, format="prompt_completion")


def test_skip_invalid_counts_reasons(tok, tmp_path):
    rows = [{"messages": CONVERSATION}, "{oops", {"messages": [{"role": "user", "content": "no answer"}]},
            {"conversations": [{"from": "alien", "value": "x"}]}, "[1, 2]", {"foo": 1}]
    data = load_tokenized(_write_jsonl(tmp_path / "m.jsonl", rows), tok, 256, chat_template="chatml",
                          skip_invalid=True)
    assert len(data.examples) == 1
    assert data.skipped == {"invalid_json": 1, "no_assistant_turn": 1, "bad_role": 1, "not_an_object": 1,
                            "unknown_format": 1}


def test_chat_data_without_template_is_a_config_error(tok, tmp_path):
    src = _write_jsonl(tmp_path / "c.jsonl", [{"messages": CONVERSATION}])
    tok.chat_template = None
    with pytest.raises(ConfigError, match="data.chat_template"):
        load_tokenized(src, tok, 256)
    with pytest.raises(DataError, match="file not found"):
        load_tokenized(str(tmp_path / "missing.jsonl"), tok, 256)


def test_collate_pads_right():
    batch = collate([{"input_ids": [5, 6, 7], "labels": [-100, 6, 7]}, {"input_ids": [8], "labels": [8]}], 0)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["labels"].tolist() == [[-100, 6, 7], [8, -100, -100]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
