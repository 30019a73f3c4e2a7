"""``--lookup-tokens``: the context-lookup chain's length L, chosen by replaying the calibration data.

The decode loop can verify, beside the heads' static tree, a chain of L tokens: the ones that followed the
most recent earlier occurrence of the context's longest matching suffix n-gram
(:func:`medusa.decoding.lookup.lookup_chain`), merged into the heads' tree where its first tokens follow a
heads path (:func:`medusa.decoding.lookup.hybrid_tree`). This module replays that on the calibration
examples, on the host, as :func:`medusa.calibrate.calibrate.simulated_tokens_per_step` replays the heads:

- the step at hidden position s has the context ``tokens[0 .. s+1]`` (token s+1 is the step's root) and
  the chain of that context; ``lookup_match`` is how many leading chain tokens equal the true tokens
  ``s+2, s+3, ...`` (to the first mismatch, the chain's end or an unlabelled token);
- the heads alone accept ``a_h`` tokens (the longest tree path the hit ranks follow). The merged tree
  accepts ``max(a_h, min(lookup_match, a_h + L))`` when ``lookup_match >= a_h``, else ``a_h`` (the chain
  then hangs from the heads node at depth a_h: the heads' tree holds every true token the chain's first
  a_h tokens are); lookup alone is ``min(lookup_match, L)``. Plus the bonus token, as for the heads.

The chain of a context depends only on the context's length, so one pass over each example (an n-gram ->
latest start index dict, grown as the context grows) gives every step's ``lookup_match`` for all L at
once; each L's replay is then arithmetic. L is chosen among :data:`LOOKUP_CANDIDATES` by predicted tokens
per step over the relative cost of the step (the real decode step with L chain nodes, timed with
:func:`medusa.calibrate.auto.time_tree_steps`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from medusa.calibrate.auto import time_tree_steps
from medusa.data.tokenize import IGNORE_INDEX
from medusa.decoding.lookup import MAX_NGRAM
from medusa.errors import MedusaError
from medusa.tree.tree import MedusaTree

LOOKUP_CANDIDATES = (0, 2, 4, 6, 8, 12, 16)  # chain lengths tried by --lookup-tokens auto
MAX_LOOKUP_TOKENS = 256  # a sanity bound for a fixed --lookup-tokens N


# ---------------------------------------------------------------------------------------- host lookup
def chain_starts(tokens: Sequence[int], max_ngram: int = MAX_NGRAM) -> list[int]:
    """``starts[e]`` for every context ``tokens[:e]`` (e = 0 .. len): the index of the first chain token
    :func:`medusa.decoding.lookup.lookup_chain` proposes for that context (the token after the most recent
    earlier occurrence of its longest matching suffix, n = ``max_ngram`` .. 1), or -1 without a match."""
    latest: list[dict[tuple[int, ...], int]] = [{} for _ in range(max_ngram + 1)]  # [n]: n-gram -> start
    starts = [-1] * (len(tokens) + 1)
    for e in range(1, len(tokens) + 1):
        for n in range(1, max_ngram + 1):  # windows followed by a token inside the context: i + n <= e - 1
            i = e - 1 - n
            if i >= 0:
                latest[n][tuple(tokens[i:i + n])] = i
        for n in range(min(max_ngram, e), 0, -1):  # the longest suffix with an earlier occurrence wins
            i = latest[n].get(tuple(tokens[e - n:e]), -1)
            if i >= 0:
                starts[e] = i + n
                break
    return starts


def host_lookup_chain(context: Sequence[int], length: int, max_ngram: int = MAX_NGRAM) -> list[int]:
    """The chain :func:`medusa.decoding.lookup.lookup_chain` proposes for ``context`` (its valid tokens:
    at most ``length``, fewer where the context ends; none without a match)."""
    start = chain_starts(context, max_ngram)[len(context)]
    return [] if start < 0 else list(context[start:min(start + length, len(context))])


def lookup_matches(tokens: Sequence[int], labels: Sequence[int], cap: int, max_ngram: int = MAX_NGRAM
                   ) -> list[int]:
    """``match[e]``: how many leading chain tokens of the context ``tokens[:e]`` equal the true tokens
    ``tokens[e], tokens[e+1], ...`` (at most ``cap``; stops at a mismatch, at the chain's end (the context's
    end) and at an unlabelled or missing true token)."""
    starts = chain_starts(tokens, max_ngram)
    match = [0] * (len(tokens) + 1)
    for e, start in enumerate(starts):
        if start < 0:
            continue
        j = 0
        while (j < cap and start + j < e and e + j < len(tokens) and labels[e + j] != IGNORE_INDEX
               and tokens[start + j] == tokens[e + j]):
            j += 1
        match[e] = j
    return match


# ---------------------------------------------------------------------------------------- replay
def _heads_accepted(ranks: Sequence[int], tree: set[tuple[int, ...]]) -> int:
    """a_h: the longest tree path the hit ranks follow (as simulated_tokens_per_step)."""
    path: tuple[int, ...] = ()
    for r in ranks:
        nxt = path + (r,)
        if r < 0 or nxt not in tree:
            break
        path = nxt
    return len(path)


def replay_lookup(choices: Sequence[Sequence[int]], stats: Any, matches: Sequence[Sequence[int]],
                  lookup_tokens: int, lookup_only: bool = False) -> float:
    """Tokens per step of greedy decoding with the heads' tree ``choices`` and a chain of ``lookup_tokens``
    (``lookup_only``: the chain alone, ``tree="lookup"``), replayed on each example of ``stats``
    (:class:`medusa.calibrate.calibrate.HeadStats`) with its :func:`lookup_matches` ``matches``."""
    tree = {tuple(c) for c in choices}
    tokens = steps = 0
    for ranks, start, match in zip(stats.ranks, stats.starts, matches):
        r = ranks.tolist()
        s, end = start - 1, len(r) - 1
        while s + 2 <= end:
            heads = 0 if lookup_only else _heads_accepted(r[s], tree)
            m = match[s + 2]  # the context is tokens[0 .. s+1]
            accepted = max(heads, min(m, heads + lookup_tokens)) if m >= heads else heads
            gained = min(1 + accepted, end - s - 1)
            tokens += gained
            steps += 1
            s += gained
    return tokens / max(steps, 1)


def lookup_predictions(choices: Sequence[Sequence[int]], stats: Any, sequences: Sequence[dict],
                       candidates: Sequence[int]) -> tuple[dict[int, float], dict[int, float]]:
    """Predicted tokens per step with each chain length of ``candidates``: ``(with the heads' tree,
    lookup alone)`` (lookup alone only for L >= 1). ``sequences``: the examples ``stats`` was measured
    on (``input_ids`` / ``labels``), in its order."""
    cap = stats.depth + max(candidates, default=0)
    matches = [lookup_matches(ex["input_ids"], ex["labels"], cap) for ex in sequences]
    hybrid = {n: replay_lookup(choices, stats, matches, n) for n in candidates}
    alone = {n: replay_lookup(choices, stats, matches, n, lookup_only=True) for n in candidates if n > 0}
    return hybrid, alone


# ---------------------------------------------------------------------------------------- choosing
def relative_step_costs(model: Any, choices: Sequence[Sequence[int]], lengths: Sequence[int],
                        prompt: Sequence[int]) -> dict[int, float]:
    """The decode step's time with a chain of each of ``lengths`` over its time without one (the heads'
    tree ``choices``; the real step, timed once per length with :func:`time_tree_steps`)."""
    sizes = sorted({0, *lengths})
    trees = {n: MedusaTree.from_choices(choices, num_heads=model.num_heads, lookup_tokens=n) for n in sizes}
    times = time_tree_steps(model, trees, prompt)
    return {n: times[n] / times[0] for n in sizes}


def choose_lookup(model: Any, choices: Sequence[Sequence[int]], stats: Any, sequences: Sequence[dict],
                  lookup_tokens: int | str, prompt: Sequence[int] | None = None,
                  candidates: Sequence[int] = LOOKUP_CANDIDATES) -> dict[str, Any]:
    """The calibration record's ``lookup`` entry: ``chosen`` (``lookup_tokens``, or with ``"auto"`` the
    candidate maximising predicted tokens per step / relative step cost; only candidates predicted to beat
    the heads alone are timed, on ``prompt``), ``max_ngram``, ``predicted_tokens_per_step``,
    ``lookup_only_tokens_per_step`` and ``relative_step_cost`` (keys: L as strings; no costs when fixed)."""
    auto = lookup_tokens == "auto"
    if not auto and (not isinstance(lookup_tokens, int) or isinstance(lookup_tokens, bool)
                     or not 0 <= lookup_tokens <= MAX_LOOKUP_TOKENS):
        raise MedusaError(f"--lookup-tokens must be 'auto' or an integer in 0..{MAX_LOOKUP_TOKENS}, "
                          f"got {lookup_tokens!r}")
    lengths = sorted({0, *candidates} if auto else {0, lookup_tokens, *candidates})
    hybrid, alone = lookup_predictions(choices, stats, sequences, lengths)
    costs: dict[int, float] = {}
    chosen = lookup_tokens
    if auto:
        better = [n for n in lengths if n > 0 and hybrid[n] > hybrid[0]]
        if better:
            if prompt is None:
                raise MedusaError("--lookup-tokens auto needs a prompt to time decoding steps on")
            costs = relative_step_costs(model, choices, better, prompt)
        chosen = max([0, *better], key=lambda n: (hybrid[n] / costs.get(n, 1.0), -n))
    return {"chosen": chosen, "max_ngram": MAX_NGRAM,
            "predicted_tokens_per_step": {str(n): hybrid[n] for n in lengths},
            "lookup_only_tokens_per_step": {str(n): alone[n] for n in lengths if n > 0},
            "relative_step_cost": {str(n): c for n, c in costs.items()}}


def lookup_summary(record: dict[str, Any]) -> str:
    """The one line ``medusa calibrate`` prints about the lookup chain."""
    chosen = record["chosen"]
    predicted, alone = record["predicted_tokens_per_step"], record["lookup_only_tokens_per_step"]
    heads = predicted["0"]
    if chosen > 0:
        return (f"lookup chain: L={chosen} -> predicted {predicted[str(chosen)]:.2f} tokens/step (heads only "
                f"{heads:.2f}, lookup alone {alone[str(chosen)]:.2f})")
    if not alone:
        return f"lookup chain: off -> predicted {heads:.2f} tokens/step"
    best = max(alone, key=lambda n: (predicted[n], -int(n)))
    return (f"lookup chain: off -> predicted {heads:.2f} tokens/step (L={best} would give "
            f"{predicted[best]:.2f}, lookup alone {alone[best]:.2f})")


__all__ = ["LOOKUP_CANDIDATES", "MAX_LOOKUP_TOKENS", "chain_starts", "choose_lookup", "host_lookup_chain",
           "lookup_matches", "lookup_predictions", "lookup_summary", "relative_step_costs", "replay_lookup"]
