"""The issue-44 prompt templates: stable rows (a larger count extends a smaller one), the kinds they ask
for, translation back into English from the model's own translations."""

from __future__ import annotations

from benchmarks import data_tasks as T

TEXTS = ["The cat sat on the mat. It was warm. The sun was out. Birds sang in the trees.",
         "Solar power is clean. Wind power is cheap! Why not use both? Many countries already do."] * 3
ALPACA = [{"instruction": f"What is item {i}?", "input": "",
           "output": " ".join(f"word{i}-{j}" for j in range(30)) + "."} for i in range(6)]


def _content(rows):
    return [r["messages"][0]["content"] for r in rows]


def test_a_larger_count_extends_a_smaller_one():
    for build in (lambda n: T.translate_out(TEXTS, n), lambda n: T.summarize(TEXTS, n),
                  lambda n: T.rag(ALPACA, n), lambda n: T.multi_turn(["Hi?", "Why?"], n)):
        small, large = build(4), build(9)
        assert large[:4] == small and len({r["id"] for r in large}) == 9


def test_translate_out_names_its_language_in_prompt_and_id():
    for row in T.translate_out(TEXTS, 20):
        code = row["id"].rsplit("-", 1)[1]
        assert T.CODES[code] in row["messages"][0]["content"]
        assert row["kind"] == "translate_out"


def test_summaries_are_long_and_rag_holds_its_question_and_answer():
    assert all(800 <= len(c) for c in _content(T.summarize(TEXTS, 10)))
    for row in T.rag(ALPACA, 10):
        text = row["messages"][0]["content"]
        asked = [a for a in ALPACA if a["instruction"] in text or a["instruction"][1:] in text]
        assert asked and asked[0]["output"][:40] in text


def test_translate_in_reads_the_model_replies_back_into_english():
    def row(rid, source, reply):
        return {"id": rid, "messages": [{"role": "user", "content": source},
                                        {"role": "assistant", "content": reply}]}

    rows = [row("tr-out-3-fr:0", "Translate English to French: The cat sat.", "Le chat était assis."),
            row("tr-out-1-de:0", "Translate English to German: The cat sat.", "Die Katze saß dort."),
            row("tr-out-2-de:0", "Translate English to German: The cat sat on the mat.", "The cat sat on"),
            row("tr-out-4-de:0", "Translate English to German: Hi.", "Hallo")]
    out = T.translate_in(rows)
    assert [r["id"] for r in out] == ["tr-in-1-de", "tr-in-3-fr"]  # an echo and a 1-word reply skipped
    assert "German" in out[0]["messages"][0]["content"] and "Die Katze saß dort." in out[0]["messages"][0][
        "content"]
    assert "English" in out[1]["messages"][0]["content"]


def test_multi_turn_has_two_user_turns_and_questions_pick_questions():
    row = T.multi_turn(["Name a fruit."], 1)[0]
    assert [m["role"] for m in row["messages"]] == ["user", "user"]
    assert row["messages"][1]["content"] in T.MORE_FOLLOW_UPS
    rows = [{"instruction": "Who wrote Hamlet?", "input": ""},
            {"instruction": "Sort this list.", "input": "3 1"}]
    assert T.questions(rows) == ["Who wrote Hamlet?"]
    assert T.alpaca_request(rows[1]) == "Sort this list.\n\n3 1"
    assert T.sentences("A b. C d? E!") == ["A b.", "C d?", "E!"]


def test_qa_frames_short_questions_and_never_sends_the_bare_request():
    pool = ["Who wrote Hamlet?", "What is the capital of France?", "Explain\nthis.", " ".join(["word"] * 30)]
    rows = T.qa(pool, 40, seed=3)
    assert [r["id"] for r in rows[:2]] == ["qa-0", "qa-1"] and {r["kind"] for r in rows} == {"qa"}
    prompts = [r["messages"][0]["content"] for r in rows]
    assert all(any(q in p for q in pool[:2]) for p in prompts)  # the multi-line and the long one left out
    assert not set(prompts) & set(pool)
    assert len(prompts) == len(set(prompts)) == 2 * len(T.QA_FRAMES)  # every pair once, then no more rows
    assert T.qa(pool, 5, seed=3) == rows[:5]  # a larger count extends the part
    assert T.qa([], 5) == []
