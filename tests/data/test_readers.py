"""data.readers: the one detect_format on real rows of every format, and the one conversation reader that
training (formats.normalize) and prompt sources (selfdistill.prompts) share."""

import json
from itertools import islice

import pytest

from medusa.data.formats import normalize
from medusa.data.readers import RowError, conversation, detect_format, read_prompts, read_rows, user_side
from medusa.errors import DataError
from medusa.selfdistill.prompts import load_prompts

from tiny_models import SHARED, require_shared

DATA = SHARED / "data"


def _first(name: str):
    (where, row), = islice(read_rows(DATA / name), 1)
    return where, row


def test_detect_format_on_a_real_row_of_each_format():
    require_shared(DATA)
    _, sharegpt = _first("sharegpt_dummy_conversation.json")
    _, alpaca = _first("alpaca_5000.json")
    _, mtbench = _first("mt_bench_questions.jsonl")
    _, spec = _first("spec_bench_public.jsonl")
    _, text = _first("tinystories_sample.txt")
    roles = {"human": "user", "gpt": "assistant"}
    messages = {"messages": [{"role": roles[t["from"]], "content": t["value"]}
                             for t in sharegpt["conversations"]]}
    prompt = {"question_id": spec["question_id"], "prompt": spec["turns"][0]}
    completion = {"prompt": alpaca["instruction"], "completion": alpaca["output"]}
    got = {name: detect_format(row) for name, row in (
        ("sharegpt", sharegpt), ("messages", messages), ("alpaca", alpaca), ("mtbench", mtbench),
        ("spec_bench", spec), ("prompt", prompt), ("prompt_completion", completion), ("text", text))}
    assert got == {"sharegpt": "sharegpt", "messages": "messages", "alpaca": "alpaca", "mtbench": "mtbench",
                   "spec_bench": "mtbench", "prompt": "prompt", "prompt_completion": "prompt_completion",
                   "text": "text"}
    # the ShareGPT and OpenAI-messages readings of the same conversation are the same messages
    assert conversation(sharegpt, "sharegpt") == conversation(messages, "messages") == messages["messages"]
    with pytest.raises(RowError) as exc:
        detect_format({"question": "q", "category": "x"})
    assert exc.value.reason == "unknown_format"


def test_alpaca_row_is_one_turn_each_for_training_and_prompts():
    require_shared(DATA)
    rows = json.loads((DATA / "alpaca_5000.json").read_text())
    with_input = next(r for r in rows if r["input"].strip())
    without = next(r for r in rows if not r["input"].strip())
    user = f"{with_input['instruction']}\n\n{with_input['input']}"
    assert normalize(with_input, "auto") == ("chat", [{"role": "user", "content": user},
                                                      {"role": "assistant", "content": with_input["output"]}])
    assert user_side(with_input) == [{"role": "user", "content": user}]  # the output is the reply: dropped
    assert normalize(without, "alpaca")[1][0] == {"role": "user", "content": without["instruction"]}
    assert user_side({**without, "input": "  \n"}) == [{"role": "user", "content": without["instruction"]}]
    with pytest.raises(RowError, match="missing key 'output'"):  # training needs the reply; prompts do not
        normalize({"instruction": "Say hi"}, "auto")
    assert user_side({"instruction": "Say hi"}) == [{"role": "user", "content": "Say hi"}]


def test_mtbench_turns_are_user_turns_and_not_training_data():
    require_shared(DATA)
    where, row = _first("spec_bench_public.jsonl")
    assert where.endswith("spec_bench_public.jsonl:1")
    assert user_side(row) == [{"role": "user", "content": t} for t in row["turns"]]
    with pytest.raises(RowError) as exc:
        normalize(row, "auto")
    assert exc.value.reason == "no_assistant_turn"
    spec = load_prompts(DATA / "spec_bench_public.jsonl")
    assert len(spec) == 280 and spec[0].source_format == "mtbench"
    assert read_prompts(DATA / "spec_bench_public.jsonl")[0] == row["turns"][0]


def test_read_prompts_first_user_turn_and_errors(tmp_path):
    path = tmp_path / "p.jsonl"
    rows = [{"prompt": "a"}, {"text": "b"}, {"question": "c"}, {"turns": ["d", "e"]},
            {"conversations": [{"from": "system", "value": "s"}, {"from": "human", "value": "f"}]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert read_prompts(path) == ["a", "b", "c", "d", "f"]
    path.write_text('{"prompt": "a"}\n{"answer": "x"}\n')
    with pytest.raises(DataError, match=r"p\.jsonl:2: no 'prompt', 'text', 'question' or 'turns'"):
        read_prompts(path)
    path.write_text('{"prompt": "a"}\n{oops\n')
    with pytest.raises(DataError, match=r"p\.jsonl:2: invalid JSON"):
        read_prompts(path)
    lines = tmp_path / "p.txt"
    lines.write_text("one prompt\n\ntwo prompt\n")
    assert read_prompts(lines) == ["one prompt", "two prompt"]


def test_read_rows_json_shapes_and_missing(tmp_path):
    obj = tmp_path / "o.json"
    obj.write_text(json.dumps({"data": [{"prompt": "x"}, {"prompt": "y"}]}, indent=2))
    assert [row for _, row in read_rows(obj)] == [{"prompt": "x"}, {"prompt": "y"}]
    arr = tmp_path / "a.json"
    arr.write_text('[\n  {"prompt": "x"},\n  {"prompt": "y"}\n]\n')
    assert [where.rsplit(":", 1)[1] for where, _ in read_rows(arr)] == [" row 0 (line 2)", " row 1 (line 3)"]
    with pytest.raises(DataError, match="file not found"):
        list(read_rows(tmp_path / "missing.jsonl"))
