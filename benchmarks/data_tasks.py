"""Prompt templates for the issue-44 data mix, built from texts the project may train on (Alpaca outputs,
TinyStories, the model's own replies): translation both ways, summaries of long passages, answers from
passages (RAG-shaped), arithmetic word problems, a second user turn.

Every builder returns ``{"id", "kind", "messages"}`` rows (the ``messages`` format ``medusa self-distill``
reads). Row ``i`` depends only on ``(seed, kind, i)`` and the source texts, so a larger ``count`` is a
superset of a smaller one: a later session raising a count appends to the same resumable output.
Spec-Bench is never read here.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from typing import Any

from benchmarks.chat_data import FOLLOW_UPS, MIN_DOC_WORDS, _clip

OUT_LANGUAGES = (("German", "de"), ("German", "de"), ("French", "fr"), ("Spanish", "es"))  # German twice
CODES = {code: name for name, code in OUT_LANGUAGES}
TRANSLATE_OUT = ("Translate English to {lang}: {text}", "Translate the following text into {lang}.\n\n{text}",
                 "How would you say this in {lang}?\n{text}")
TRANSLATE_IN = ("Translate {lang} to English: {text}", "Translate this {lang} text into English.\n\n{text}",
                "What does this mean in English? {text}")
SUMMARIZE = ("Summarize: {doc}", "Summarize the following text in a few sentences.\n\n{doc}",
             "{doc}\n\nWrite a short summary of the text above.", "Give me the gist of this article:\n{doc}")
RAG = ("{passages}\n\n{question}", "Answer the question using the passages below.\n\n{passages}\n\nQuestion: "
       "{question}", "Context:\n{passages}\n\nBased only on the context, {question_lower}")
MORE_FOLLOW_UPS = (*FOLLOW_UPS, "Why is that?", "Can you say more about the second point?",
                   "Now write it more formally.", "Summarize your answer in one sentence.",
                   "What would be a common mistake here?", "Translate your answer into German.")
# closed-book questions in other framings than the bare request (which the alpaca part answered): the
# Spec-Bench qa category is short factual questions answered in a paragraph
QA_FRAMES = ("Question: {q}\nAnswer:", "Answer in a few sentences: {q}", "I have a question. {q}",
             "{q} Please explain.", "Quick question: {q}", "Q: {q}\nA:")
QA_MAX_WORDS = 25
QUESTION_START = re.compile(r"^(who|what|when|where|which|why|how|name|is|are|does|do|can|list|explain|"
                            r"describe|identify|give)\b", re.IGNORECASE)


def _rng(seed: int, kind: str, i: int) -> random.Random:
    return random.Random(f"{seed}:{kind}:{i}")


def sentences(text: str) -> list[str]:
    """``text`` split after ``.``, ``!`` or ``?`` followed by white space."""
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", text.strip()) if s.strip()]


def passages(alpaca: Sequence[dict[str, Any]], stories: Sequence[str]) -> list[str]:
    """The prose the templates wrap: Alpaca outputs of at least ``MIN_DOC_WORDS`` words, then the stories."""
    return [r["output"].strip() for r in alpaca if len(r["output"].split()) >= MIN_DOC_WORDS] + list(stories)


def translate_out(texts: Sequence[str], count: int, seed: int = 0) -> list[dict[str, Any]]:
    """English -> German / French / Spanish: 1-3 sentences of a text (German half the time); the
    language's code ends the id (``translate_in`` reads it)."""
    out = []
    for i in range(count):
        rng = _rng(seed, "tr-out", i)
        parts = sentences(texts[rng.randrange(len(texts))])
        start = rng.randrange(len(parts))
        text = _clip(" ".join(parts[start:start + rng.randint(1, 3)]), 400)
        lang, code = rng.choice(OUT_LANGUAGES)
        prompt = rng.choice(TRANSLATE_OUT).format(lang=lang, text=text)
        out.append({"id": f"tr-out-{i}-{code}", "kind": "translate_out",
                    "messages": [{"role": "user", "content": prompt}]})
    return out


def translate_in(rows: Sequence[dict[str, Any]], seed: int = 0) -> list[dict[str, Any]]:
    """X -> English from the model's own translations (the ``translate_out`` rows answered so far): its
    reply becomes the text to translate back. Replies too short, too long or still mostly the English
    source are skipped. Ids follow the source rows' ids (sorted), so the file grows as they do."""
    out = []
    for row in sorted(rows, key=lambda r: r["id"]):
        code = row["id"].rsplit(":", 1)[0].rsplit("-", 1)[-1]
        msgs = row.get("messages") or []
        if code not in CODES or len(msgs) < 2:
            continue
        reply, source = _clip(msgs[1]["content"].split("\n\n")[0], 500), msgs[0]["content"]
        words = reply.split()
        if not 3 <= len(words) <= 120 or sum(w in source for w in words) > 0.6 * len(words):
            continue
        rng = _rng(seed, "tr-in", int(row["id"].split("-")[2]))
        prompt = rng.choice(TRANSLATE_IN).format(lang=CODES[code], text=reply)
        out.append({"id": f"tr-in-{row['id'].split(':')[0][7:]}", "kind": "translate_in",
                    "messages": [{"role": "user", "content": prompt}]})
    return out


def summarize(texts: Sequence[str], count: int, seed: int = 0) -> list[dict[str, Any]]:
    """Summaries of long passages: random texts joined until 800-3,000 characters."""
    out = []
    for i in range(count):
        rng = _rng(seed, "sum", i)
        target, parts = rng.randint(800, 3000), []
        while sum(len(p) for p in parts) < target:
            parts.append(texts[rng.randrange(len(texts))])
        doc = _clip("\n\n".join(parts), target + 300)
        out.append({"id": f"sum-{i}", "kind": "summarize",
                    "messages": [{"role": "user", "content": rng.choice(SUMMARIZE).format(doc=doc)}]})
    return out


def rag(alpaca: Sequence[dict[str, Any]], count: int, seed: int = 0) -> list[dict[str, Any]]:
    """Answers from passages: an Alpaca question whose own output is one of 2-4 passages (the others drawn
    at random), the question after them."""
    docs = [r for r in alpaca if not r.get("input") and len(r["output"].split()) >= 25]
    out = []
    for i in range(count):
        rng = _rng(seed, "rag", i)
        picked = [docs[rng.randrange(len(docs))] for _ in range(rng.randint(2, 4))]
        question = picked[0]["instruction"].strip()
        rng.shuffle(picked)
        numbered = rng.random() < 0.5
        text = "\n\n".join(f"Passage {j + 1}: {_clip(r['output'], 700)}" if numbered
                           else _clip(r["output"], 900) for j, r in enumerate(picked))
        prompt = rng.choice(RAG).format(passages=text, question=question,
                                        question_lower=question[:1].lower() + question[1:])
        out.append({"id": f"rag-{i}", "kind": "rag", "messages": [{"role": "user", "content": prompt}]})
    return out


def multi_turn(requests: Sequence[str], count: int, seed: int = 0) -> list[dict[str, Any]]:
    """Two user turns: a request, then a follow-up (the model answers both; replay mode)."""
    out = []
    for i in range(count):
        rng = _rng(seed, "mt", i)
        first = requests[rng.randrange(len(requests))]
        out.append({"id": f"mt-{i}", "kind": "multi_turn", "messages": [
            {"role": "user", "content": first},
            {"role": "user", "content": rng.choice(MORE_FOLLOW_UPS)}]})
    return out


def alpaca_request(row: dict[str, Any]) -> str:
    """An Alpaca row as one user request (its input, if any, after a blank line)."""
    return row["instruction"].strip() + (f"\n\n{row['input'].strip()}" if row.get("input") else "")


def questions(alpaca: Sequence[dict[str, Any]]) -> list[str]:
    """Alpaca requests that ask a question (short QA-shaped prompts)."""
    return [alpaca_request(r) for r in alpaca if QUESTION_START.match(r["instruction"].strip())]


def qa(requests: Sequence[str], count: int, seed: int = 0) -> list[dict[str, Any]]:
    """Closed-book questions (``questions`` of at most ``QA_MAX_WORDS`` words, one line) in one of
    ``QA_FRAMES``: a prompt the bare-request parts never sent. Every (question, framing) pair once, in an
    order fixed by ``seed`` (a larger count extends the part; past the pairs there are no more rows)."""
    pool = sorted({q for q in requests if len(q.split()) <= QA_MAX_WORDS and "\n" not in q})
    pairs = [(q, frame) for q in pool for frame in QA_FRAMES]
    random.Random(f"{seed}:qa").shuffle(pairs)
    return [{"id": f"qa-{i}", "kind": "qa", "messages": [{"role": "user", "content": frame.format(q=q)}]}
            for i, (q, frame) in enumerate(pairs[:count])]


__all__ = ["alpaca_request", "multi_turn", "passages", "qa", "questions", "rag", "sentences", "summarize",
           "translate_in", "translate_out"]
