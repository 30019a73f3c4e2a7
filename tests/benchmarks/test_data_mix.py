"""The issue-44 data run: held-out parts first, training parts in passes, resumable, a status count."""

from __future__ import annotations

import dataclasses
import json

import pytest
from selfdistill_helpers import save_chat_model

from benchmarks import data_mix as M
from medusa.errors import DataError

from tiny_models import SHARED, require_shared


def _shared(tmp_path):
    data = tmp_path / "shared" / "data"
    data.mkdir(parents=True)
    alpaca = [{"instruction": f"What is thing {i}?", "input": "",
               "output": " ".join(["Thing", str(i), "is", "a", "good", "thing."] * 8)} for i in range(230)]
    (data / "alpaca_5000.json").write_text(json.dumps(alpaca))
    (data / "tinystories_sample.txt").write_text("\n\n".join(
        " ".join(["Once", "upon", "a", "time", "there", "was", f"cat{i}."] * 4) for i in range(20)))
    (data / "vicuna_bench_questions.jsonl").write_text(
        "".join(json.dumps({"question_id": i, "turns": [f"Question {i}?"]}) + "\n" for i in range(3)))
    return tmp_path / "shared"


def test_vicuna_questions_that_are_benchmark_prompts_are_left_out(tmp_path):
    """A Vicuna question that is an MT-bench or Spec-Bench public prompt never reaches a training part."""
    shared = _shared(tmp_path)
    data = shared / "data"
    (data / "mt_bench_questions.jsonl").write_text(json.dumps({"question_id": 81, "turns": ["Question 1?",
                                                                                            "More."]}) + "\n")
    (data / "spec_bench_public.jsonl").write_text(json.dumps({"category": "writing",
                                                              "turns": ["Question 2?"]}) + "\n")
    assert M.load_sources(shared, False).vicuna == ["Question 0?"]
    (data / "spec_bench_public.jsonl").write_text("{}\n")
    with pytest.raises(DataError, match="spec_bench_public.jsonl:1"):
        M.load_sources(shared, False)


def test_the_real_vicuna_questions_lose_exactly_the_two_mt_bench_ones():
    require_shared(SHARED)
    kept = M.load_sources(SHARED, False).vicuna
    assert len(kept) == 78
    assert not any(q.startswith(("Compose an engaging travel blog post about a recent trip to Hawaii",
                                 "Implement a program to find the common elements in two arrays"))
                   for q in kept)


def test_sources_split_held_out_texts_from_training_ones(tmp_path):
    shared = _shared(tmp_path)
    train, held = M.load_sources(shared, False), M.load_sources(shared, True)
    assert len(train.alpaca) == 30 and len(held.alpaca) == M.HELD_OUT_ALPACA
    assert len(train.stories) == 18 and len(held.stories) == 2
    assert held.vicuna == [] and len(train.vicuna) == 3
    assert not {r["instruction"] for r in train.alpaca} & {r["instruction"] for r in held.alpaca}


def test_run_writes_every_part_and_resumes(tmp_path, monkeypatch):
    require_shared(SHARED)
    shared, model = _shared(tmp_path), save_chat_model(tmp_path / "model")
    # summaries / RAG passages are longer than the tiny model's 512 positions: built, not answered here
    monkeypatch.setattr(M, "COUNTS", {"alpaca": 4, "translate_out": 4, "math": 3, "summarize": 0, "rag": 0,
                                      "multi_turn": 2, "vicuna": 2, "synth": 0})
    opts = M.RunOptions(str(model), tmp_path / "run", dtype="float32", batch_size=4, max_new_tokens=6,
                        held_out_counts={"alpaca": 3, "math": 2, "translate_out": 2})
    monkeypatch.setattr(M, "PART_MAX_NEW", {"translate_out": 3})  # a training part's own reply budget
    M.run(opts, shared)
    found = M.status(opts.out)
    assert found["heldout"]["alpaca"]["rows"] == 3 and found["heldout"]["math"]["rows"] == 2
    for part, n in (("alpaca", 4), ("math", 3), ("multi_turn", 2), ("vicuna", 2)):
        assert found["train"][part]["rows"] == n
    assert found["train_reply_tokens"] > 0

    def budgets(split):
        rows = M.read_rows(opts.out / split / "translate_out.jsonl")
        return {r["metadata"]["sampling"]["max_new_tokens"] for r in rows}

    assert budgets("train") == {3} and budgets("heldout") == {6}
    first = json.loads((opts.out / "train" / "multi_turn.jsonl").read_text().splitlines()[0])
    assert [m["role"] for m in first["messages"]] == ["user", "assistant", "user", "assistant"]
    log = [json.loads(line) for line in (opts.out / "run.log").read_text().splitlines()]
    assert [e["frac"] for e in log if e.get("part") == "math" and e["split"] == "train"] == list(M.PASSES)
    assert log[-1]["event"] == "finished"
    before = (opts.out / "train" / "alpaca.jsonl").read_text()
    M.run(opts, shared)  # a second start answers nothing again
    assert (opts.out / "train" / "alpaca.jsonl").read_text() == before
    assert all(e["written"] == 0 for e in map(json.loads, (opts.out / "run.log").read_text().splitlines()[
        len(log):]) if "written" in e)
    # a larger round that skips rows an earlier run answered: only the rows past them are added
    M.run(dataclasses.replace(opts, scale=2, skip={"alpaca": 6}), shared)
    ids = [r["id"] for r in M.read_rows(opts.out / "train" / "alpaca.jsonl")]
    assert sorted(ids) == [f"alpaca-{i}:0" for i in (0, 1, 2, 3, 6, 7)]


def test_plan_answers_fresh_ids_in_chunks_and_resumes(tmp_path):
    """--plan: each part from its START id, CHUNK rows a turn, translate_in after translate_out; a restart
    answers nothing again; the held-out requests first when asked."""
    require_shared(SHARED)
    shared, model = _shared(tmp_path), save_chat_model(tmp_path / "model")
    opts = M.RunOptions(str(model), tmp_path / "run", dtype="float32", batch_size=4, max_new_tokens=5)
    plan = M.parse_plan("math:100:2,qa:7:1,translate_out:40:2")
    M.run_plan(opts, shared, plan, held_out_rows=1, turns=2)

    def ids(part, split="train"):
        return sorted(r["id"] for r in M.read_rows(opts.out / split / f"{part}.jsonl"))

    assert ids("math") == [f"math-{i}:0" for i in (100, 101, 102, 103)]
    assert ids("qa") == ["qa-7:0", "qa-8:0"]
    assert ids("translate_out") == sorted(f"{r['id']}:0" for r in M.build_part(
        "translate_out", M.load_sources(shared, False), 44, 0)[40:])
    assert (opts.out / "prompts" / "train-math-102.jsonl").is_file()
    assert ids("math", "heldout") == ["math-0:0"] and ids("alpaca", "heldout") == ["alpaca-0:0"]
    before = (opts.out / "train" / "math.jsonl").read_text()
    M.run_plan(opts, shared, plan, turns=2)
    assert (opts.out / "train" / "math.jsonl").read_text() == before
    # a part past its last request (qa: every question x framing once) ends the plan instead of spinning
    last = len(M.build_part("qa", M.load_sources(shared, False), 10 ** 6, 0))
    M.run_plan(opts, shared, M.parse_plan(f"qa:{last - 2}:4"))
    assert ids("qa") == sorted(f"qa-{i}:0" for i in (7, 8, last - 2, last - 1))
    assert json.loads((opts.out / "run.log").read_text().splitlines()[-1])["event"] == "plan exhausted"
    with pytest.raises(DataError, match="--skip"):
        M.main(["--out", str(opts.out), "--plan", "math:0:1", "--skip", "math=3"])


def test_plan_names_parts_starts_and_chunks():
    assert M.parse_plan("math:5:2, rag:0:1") == [M.PlanItem("math", 5, 2), M.PlanItem("rag", 0, 1)]
    for bad, word in (("synth:0:5", "synth"), ("alpaca:4800:8", "alpaca"), ("math:0", "PART:START:CHUNK"),
                      ("math:0:0", "CHUNK > 0"), ("nope:1:1", "nope"), ("", "no part")):
        with pytest.raises(DataError, match=word):
            M.parse_plan(bad)


def test_skip_names_static_parts_only():
    assert M.parse_skip("alpaca=2400, math=16") == {"alpaca": 2400, "math": 16}
    assert M.parse_skip("") == {}
    for bad, word in (("synth=5", "synth"), ("alpaca=x", "PART=ROWS"), ("nope=1", "nope")):
        with pytest.raises(DataError, match=word):
            M.parse_skip(bad)


def test_training_file_holds_the_rows_past_the_skip(tmp_path):
    """One JSONL of every training reply past --skip (translate_in follows its translate_out row), held-out
    replies never; an existing file is refused, untouched."""
    out = tmp_path / "run"
    (out / "train").mkdir(parents=True)
    (out / "heldout").mkdir()

    def rows(ids):
        return "".join(json.dumps({"id": f"{i}:0", "messages": []}) + "\n" for i in ids)

    (out / "train" / "alpaca.jsonl").write_text(rows(["alpaca-0", "alpaca-1", "alpaca-5", "alpaca-12"]))
    (out / "train" / "translate_out.jsonl").write_text(rows(["tr-out-3-de", "tr-out-40-fr"]))
    (out / "train" / "translate_in.jsonl").write_text(rows(["tr-in-3-de", "tr-in-40-fr"]))
    (out / "train" / "synth.jsonl").write_text(rows(["synth-0"]))
    (out / "train" / "alpaca.errors.jsonl").write_text(rows(["alpaca-99"]))
    (out / "heldout" / "alpaca.jsonl").write_text(rows(["alpaca-77"]))
    target = tmp_path / "round.jsonl"
    assert M.main(["--out", str(out), "--skip", "alpaca=5,translate_out=10",
                   "--training-file", str(target)]) == 0
    got = [json.loads(line)["id"] for line in target.read_text().splitlines()]
    assert got == ["alpaca-5:0", "alpaca-12:0", "synth-0:0", "tr-in-40-fr:0", "tr-out-40-fr:0"]
    before = target.read_text()
    with pytest.raises(DataError, match="exists"):
        M.main(["--out", str(out), "--training-file", str(target)])
    assert target.read_text() == before


def test_training_file_leaves_out_an_earlier_rounds_rows(tmp_path):
    """--exclude: ids in an earlier round's training file are left out; a bad file is one clear error."""
    out = tmp_path / "run"
    (out / "train").mkdir(parents=True)
    (out / "train" / "math.jsonl").write_text("".join(
        json.dumps({"id": f"math-{i}:0", "messages": []}) + "\n" for i in (1, 2, 3)))
    earlier = tmp_path / "round7.jsonl"
    earlier.write_text(json.dumps({"id": "math-2:0", "messages": []}) + "\n")
    target = tmp_path / "round8.jsonl"
    assert M.main(["--out", str(out), "--exclude", str(earlier), "--training-file", str(target)]) == 0
    assert [json.loads(line)["id"] for line in target.read_text().splitlines()] == ["math-1:0", "math-3:0"]
    earlier.write_text("{}\n")
    with pytest.raises(DataError, match="round7.jsonl:1"):
        M.main(["--out", str(out), "--exclude", str(earlier), "--training-file", str(tmp_path / "x.jsonl")])
    with pytest.raises(DataError, match="missing.jsonl: not found"):
        M.main(["--out", str(out), "--exclude", str(tmp_path / "missing.jsonl"),
                "--training-file", str(tmp_path / "x.jsonl")])
    assert not (tmp_path / "x.jsonl").exists()
