"""medusa.data.formats.normalize: every row format to one of the three normalised samples, and the reasons
it rejects a row (the categories ``skip_invalid`` counts)."""

import pytest

from medusa.data.formats import normalize
from medusa.data.readers import RowError

CHAT = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]


@pytest.mark.parametrize("row, fmt, expected", [
    ({"messages": CHAT, "id": 3, "metadata": {}}, "auto", ("chat", CHAT)),
    ({"conversations": [{"from": "HUMAN", "value": "Hi"}, {"from": "gpt", "value": "Hello."}]}, "auto",
     ("chat", CHAT)),
    ({"instruction": "Hi", "input": "", "output": "Hello."}, "auto", ("chat", CHAT)),
    ({"instruction": "Add", "input": "1 2", "output": "3"}, "alpaca",
     ("chat", [{"role": "user", "content": "Add\n\n1 2"}, {"role": "assistant", "content": "3"}])),
    ({"prompt": "", "completion": " the end"}, "auto", ("prompt_completion", ("", " the end"))),
    ({"text": "One story."}, "auto", ("text", "One story.")),
    ({"text": "forced", "prompt": "p"}, "text", ("text", "forced")),  # an explicit format is not detected
])
def test_rows_normalise(row, fmt, expected):
    assert normalize(row, fmt) == expected


@pytest.mark.parametrize("row, reason, message", [
    ({"prompt": "a bare prompt"}, "missing_key", "missing key 'completion'"),  # nothing to train on
    ({"turns": ["q1", "q2"]}, "no_assistant_turn", "no assistant turn"),
    ({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]},
     "no_assistant_turn", "no assistant turn"),
    ({"instruction": "Say hi", "output": "  "}, "empty_content", "'output' is empty"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "bad_role", "unknown role 'robot'"),
    ({"text": 5}, "bad_type", "'text' must be a string"),
    ([1, 2], "not_an_object", "expected a JSON object, got list"),
    ({"question": "q"}, "unknown_format", None),
])
def test_malformed_rows_name_their_reason(row, reason, message):
    with pytest.raises(RowError) as exc:
        normalize(row, "auto")
    assert exc.value.reason == reason
    assert message is None or message in str(exc.value)


def test_a_read_error_row_is_raised_as_is():
    bad = RowError("invalid_json", "d.jsonl:2: invalid JSON")
    with pytest.raises(RowError) as exc:
        normalize(bad, "auto")
    assert exc.value is bad


def test_unknown_explicit_format_is_a_bug_not_a_row_error():
    with pytest.raises(ValueError, match="unknown format 'csv'") as exc:
        normalize({"text": "x"}, "csv")
    assert not isinstance(exc.value, RowError)
