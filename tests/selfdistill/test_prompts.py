"""Prompt sources: every format, malformed rows, ids."""

from __future__ import annotations

import json

import pytest

from medusa.errors import DataError
from medusa.selfdistill.prompts import PromptOptions, first_sentences, load_prompts

from tiny_models import SHARED, require_shared


def test_shared_formats_parse_to_user_turns():
    require_shared()
    share = load_prompts(SHARED / "data" / "sharegpt_dummy_conversation.json")
    raw = json.loads((SHARED / "data" / "sharegpt_dummy_conversation.json").read_text())
    assert len(share) == len(raw) and share[0].id == "identity_0"
    humans = [t["value"] for t in raw[0]["conversations"] if t["from"] == "human"]
    assert share[0].user_turns == humans and all(m["role"] != "assistant" for m in share[0].messages)
    mt = load_prompts(SHARED / "data" / "mt_bench_questions.jsonl")
    assert len(mt) == 80 and mt[0].id == "81" and len(mt[0].user_turns) == 2
    alpaca = load_prompts(SHARED / "data" / "alpaca_5000.json", limit=50)
    assert len(alpaca) == 50
    row = json.loads((SHARED / "data" / "alpaca_5000.json").read_text())[0]
    assert alpaca[0].user_turns == [f"{row['instruction']}\n\n{row['input']}"]


def test_text_documents_first_sentence_chars_and_tokens(tmp_path):
    from tiny_models import stories_tokenizer

    path = tmp_path / "docs.txt"
    path.write_text("One day, Tom ran. He was fast! Then he slept.\n\nThe cat sat on the mat. It "
                    "purred.\n\n\n")
    prompts = load_prompts(path)
    assert [p.text for p in prompts] == ["One day, Tom ran.", "The cat sat on the mat."]
    assert load_prompts(path,
                        opts=PromptOptions(prompt_sentences=2))[0].text == "One day, Tom ran. He was fast!"
    assert load_prompts(path, opts=PromptOptions(prompt_chars=12))[0].text == "One day, Tom"
    tok = stories_tokenizer()
    by_tokens = load_prompts(path, opts=PromptOptions(prompt_tokens=3, tokenizer=tok))[0].text
    assert len(tok(by_tokens,
                   add_special_tokens=False)["input_ids"]) == 3 and "One day".startswith(by_tokens[:3])
    with pytest.raises(DataError, match="tokenizer"):
        load_prompts(path, opts=PromptOptions(prompt_tokens=3))
    assert first_sentences('He said "Hi." Then left.') == 'He said "Hi."'


def test_messages_prompt_and_parquet(tmp_path):
    rows = [{"id": "a", "messages": [{"role": "system", "content": "Be brief."},
                                      {"role": "user", "content": "Hi"},
                                      {"role": "assistant", "content": "old reply"},
                                      {"role": "user", "content": "More"}]},
            {"prompt": "Tell a story", "completion": "ignored"},
            {"text": "A doc. Second sentence."}]
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = load_prompts(jsonl)
    assert [m["role"] for m in got[0].messages] == ["system", "user", "user"] and got[0].system == "Be brief."
    assert got[1].id == "p-1" and got[1].text == "Tell a story"
    assert got[2].source_format == "text" and got[2].text == "A doc."
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([{"question_id": 7, "turns": ["q1", "q2"]}]), tmp_path / "p.parquet")
    (pq_prompt,) = load_prompts(tmp_path / "p.parquet")
    assert pq_prompt.id == "7" and pq_prompt.user_turns == ["q1", "q2"]


def test_datasets_directory(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "ds").mkdir()
    pq.write_table(pa.Table.from_pylist([{"prompt": f"p{i}"} for i in range(3)]),
                   tmp_path / "ds" / "train.parquet")
    assert [p.text for p in load_prompts(tmp_path / "ds")] == ["p0", "p1", "p2"]
    with pytest.raises(DataError, match="nobody/nothing"):
        load_prompts("nobody/nothing")


def test_malformed_rows_name_the_line_or_go_to_the_callback(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "ok"}\n{"prompt": 3}\nnot json\n{"messages": [{"role": "gpt", '
                    '"content": "x"}]}\n{"conversations": [{"from": "gpt", "value": "only '
                    'assistant"}]}\n{"foo": 1}\n')
    with pytest.raises(DataError, match=r"bad\.jsonl:2: 'prompt' must be a string"):
        load_prompts(path)
    seen = []
    good = load_prompts(path, on_invalid=lambda rid, loc, why: seen.append((rid, loc, why)))
    assert [p.text for p in good] == ["ok"]
    assert [loc.rsplit(":", 1)[1] for _, loc, _ in seen] == ["2", "3", "4", "5", "6"]
    assert ("invalid JSON" in seen[1][2] and "unknown role" in seen[2][2]
            and "no non-empty user turn" in seen[3][2])
    with pytest.raises(DataError, match="not found"):
        load_prompts(tmp_path / "missing.jsonl")


def test_repeated_ids_are_made_unique(tmp_path):
    path = tmp_path / "dup.jsonl"
    path.write_text("".join(json.dumps({"id": "x", "prompt": f"p{i}"}) + "\n" for i in range(3)))
    assert [p.id for p in load_prompts(path)] == ["x", "x#2", "x#3"]


def test_a_text_rule_given_for_rows_that_are_not_text_documents_is_an_error(tmp_path):
    """--prompt-chars / --prompt-sentences / --prompt-tokens cut text documents only: given for a prompt row,
    they would silently not apply, so the row is named instead; text rows are cut."""
    path = tmp_path / "p.jsonl"
    path.write_text('{"text": "One day, Tom ran. He was fast!"}\n{"prompt": "Once upon a time"}\n')
    with pytest.raises(DataError, match=r"p\.jsonl:2: --prompt-chars cuts text documents .* 'prompt' row"):
        load_prompts(path, opts=PromptOptions(prompt_chars=8))
    assert load_prompts(path, opts=PromptOptions())[1].text == "Once upon a time"  # no rule given: whole
    path.write_text('{"text": "One day, Tom ran. He was fast!"}\n')
    assert load_prompts(path, opts=PromptOptions(prompt_chars=8))[0].text == "One day,"
