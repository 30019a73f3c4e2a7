"""Arithmetic word problems for the issue-44 data mix (grade-school shape: a few quantities, two or three
operations), each filled with random names and numbers; half ask for the working. The model answers them
itself (self-distillation): the point is the shape of the request and of its worked reply, not a key.
Row ``i`` depends only on ``(seed, i)``. Never a Spec-Bench problem."""

from __future__ import annotations

import random
from typing import Any

NAMES = ("Ali", "Maria", "Jen", "Tom", "Priya", "Chen", "Sara", "Omar", "Lena", "Ben", "Yuki", "Carlos",
         "Emma", "Noah", "Fatima", "Ivan")
ITEMS = (("apples", "kg"), ("books", "box"), ("pencils", "pack"), ("eggs", "carton"), ("bricks", "pallet"),
         ("cookies", "tray"), ("bottles of water", "crate"), ("tiles", "box"))
STEPS = ("", " Show your steps.", " Explain your reasoning step by step.", " Think step by step.")
TEMPLATES = (
    "{a} buys {n} {item} at ${p} each and pays with a ${bill} bill. How much change does {a} get?",
    "{a} earns ${p} per hour and works {h} hours a day, {d} days a week. How much does {a} earn in {w} "
    "weeks?",
    "A {unit} holds {n} {item}. {a} needs {m} {item}. How many {unit}es must {a} buy?",
    "{a} has ${bill}. {a} spends {pct}% of it on {item} and ${p} on lunch. How much money is left?",
    "{a} reads {n} pages a day. The book has {m} pages and {a} has already read {k} pages. How many more "
    "days will it take to finish?",
    "A train travels at {v} km per hour for {h} hours, then at {v2} km per hour for {h2} hours. How far "
    "does it travel in total?",
    "{a} is {age} years old. {b} is {k} years older than twice {a}'s age. How old will {b} be in {d} years?",
    "The tickets cost ${p} for adults and ${p2} for children. {a} buys {n} adult and {m} child tickets. "
    "What is the total cost?",
    "{a} had {m} {item}. {a} gave {k} to {b} and then bought {n} more. {b} now has {h} {item}. How many "
    "{item} do they have together?",
    "A shop sells {item} for ${p} each. On Saturday it sells {n}, and on Sunday {pct}% more than on "
    "Saturday. How much money does the shop make over the weekend?",
    "A rectangular garden is {v} meters long and {h} meters wide. Fencing costs ${p} per meter. How much "
    "does it cost to fence the garden?",
    "{a} saves ${p} every week. How many weeks will it take {a} to save ${bill} for a bike that costs "
    "${bill} if {a} already has ${k}?",
)


def word_problem(rng: random.Random) -> str:
    """One problem: a template filled with random names, items and numbers."""
    a, b = rng.sample(NAMES, 2)
    item, unit = rng.choice(ITEMS)
    values = dict(a=a, b=b, item=item, unit=unit, n=rng.randint(3, 40), m=rng.randint(41, 300),
                  k=rng.randint(2, 40), p=rng.randint(2, 60), p2=rng.randint(1, 30),
                  bill=rng.choice((50, 100, 200, 500, 1000)), h=rng.randint(2, 12), d=rng.randint(2, 7),
                  w=rng.randint(2, 8), pct=rng.choice((10, 15, 20, 25, 30, 40, 50, 75)),
                  v=rng.randint(20, 120), v2=rng.randint(20, 120), h2=rng.randint(1, 6),
                  age=rng.randint(5, 40))
    return rng.choice(TEMPLATES).format(**values) + rng.choice(STEPS)


def math_tasks(count: int, seed: int = 0) -> list[dict[str, Any]]:
    """``count`` word problems as ``{"id", "kind", "messages"}`` rows."""
    return [{"id": f"math-{i}", "kind": "math",
             "messages": [{"role": "user", "content": word_problem(random.Random(f"{seed}:math:{i}"))}]}
            for i in range(count)]


__all__ = ["TEMPLATES", "math_tasks", "word_problem"]
