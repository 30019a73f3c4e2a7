"""Calibration: measure the heads' top-k accuracy on held-out conversations and build the tree from it.

For every labelled position t of every example, head k (0-based) proposes its top-``topk`` tokens for
position t+k+2 (the base LM head predicts t+1). Hydra heads read the example's own tokens t+1..t+k+1: on
a path that greedy verification accepts those are the draft tokens, so the ranks are the same quantity.
The *hit rank* of head k at t is the rank of the true token among them (-1: not in the top-k; -2: the
target is past the end or not an assistant token).

From the hit ranks ``[T, D]`` of every example we get
- ``accuracy[k][r]``: how often head k's rank-r token is right (a_k^r, over positions with a target);
- ``conditional_accuracy[k][r]``: the same, over positions where heads 0..k-1 were all right (within
  the top-k);
- path frequencies: how often the hit ranks start with a given path. A tree node's frequency is the
  probability that greedy tree verification accepts it at a random position; the tree is built greedily
  on these frequencies (the exact, dependence-aware version of the product of accuracies).
- the expected tokens per step: greedy tree decoding replayed on the examples (start after the prompt,
  accept the longest tree path the hit ranks follow plus the bonus token, jump, repeat). On the model's
  own greedy replies this reproduces the decode loop's tokens/step exactly. Averaging over *all*
  positions instead over-predicts (~20% on stories260K: the loop steps over easy stretches in one go
  and lands on hard positions more often), and so does the independence formula.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from medusa.calibrate.auto import AUTO_SIZES, choose_size, timing_prompt
from medusa.calibrate.lookup import choose_lookup
from medusa.data.tokenize import IGNORE_INDEX
from medusa.errors import DataError, MedusaError
from medusa.io import record_in_manifest
from medusa.modeling.config import TREE_NAME
from medusa.modeling.draft_vocab import draft_vocab_summary
from medusa.tree.build import build_tree_choices, expected_tokens_per_step
from medusa.tree.path_score import fit_path_score, replay_dynamic
from medusa.tree.tree import MedusaTree

MISS, NO_TARGET = -1, -2
METHODS = ("empirical", "conditional", "independent")


@dataclass
class HeadStats:
    """Per-example hit ranks (``ranks[e]: int8 [T_e, D]``) and the first decoded position of each example."""

    ranks: list[torch.Tensor]
    starts: list[int]  # index of the first labelled token of each example (the first one the model writes)
    topk: int
    num_tokens: int
    logp: list[torch.Tensor] | None = None  # per example [T_e, D, topk] float32: the heads' top-k log-probs

    @property
    def depth(self) -> int:
        return self.ranks[0].shape[1] if self.ranks else 0

    def stacked(self) -> torch.Tensor:
        return torch.cat(self.ranks, dim=0) if self.ranks else torch.zeros(0, self.depth, dtype=torch.int8)


# ---------------------------------------------------------------------------------------- measuring
@torch.no_grad()
def collect_hit_ranks(model: Any, examples: Sequence[dict], topk: int = 10, max_depth: int | None = None,
                      batch_size: int = 8, chunk: int = 256, progress: bool = True) -> HeadStats:
    """Run the base model and heads over ``examples`` (``input_ids`` / ``labels`` lists) and record, per
    position, the rank at which each head's top-``topk`` holds the true token."""
    depth = model.num_heads if max_depth is None else min(max_depth, model.num_heads)
    if depth < 1:
        raise MedusaError(f"max depth must be >= 1, got {max_depth}")
    usable = usable_examples(examples)
    if not usable:
        raise DataError("no example has labelled (assistant) tokens to calibrate on")
    order = sorted(range(len(usable)), key=lambda i: len(usable[i]["input_ids"]))
    ranks: list[torch.Tensor | None] = [None] * len(usable)
    logps: list[torch.Tensor | None] = [None] * len(usable)
    device = model.device
    pad = 0
    bar = _progress(len(order), "calibrating", progress)
    model.eval()
    for lo in range(0, len(order), batch_size):
        idx = order[lo:lo + batch_size]
        lens = [len(usable[i]["input_ids"]) for i in idx]
        width = max(lens)
        ids = torch.full((len(idx), width), pad, dtype=torch.long)  # [B, T], right-padded
        labels = torch.full((len(idx), width), IGNORE_INDEX, dtype=torch.long)  # [B, T]
        attn = torch.zeros(len(idx), width, dtype=torch.long)  # [B, T]
        for row, i in enumerate(idx):
            n = lens[row]
            ids[row, :n] = torch.tensor(usable[i]["input_ids"])
            labels[row, :n] = torch.tensor(usable[i]["labels"])
            attn[row, :n] = 1
        out = model(input_ids=ids.to(device), attention_mask=attn.to(device), compute_heads=False)
        hidden = out.hidden_states  # [B, T, d]
        # Hydra: teacher-forced on the true tokens = the accepted path's tokens, [B, T, d * (K+1)]
        hidden = model.heads.teacher_inputs(hidden, ids.to(device))
        batch_ranks, batch_logp = _head_ranks(model, hidden, ids, labels, depth, topk, chunk)
        for row, i in enumerate(idx):
            ranks[i] = batch_ranks[row, :lens[row]].clone()
            logps[i] = batch_logp[row, :lens[row]].clone()
        bar.update(len(idx))
    bar.close()
    starts = [next(j for j in range(1, len(e["labels"])) if e["labels"][j] != IGNORE_INDEX) for e in usable]
    return HeadStats(ranks=[r for r in ranks if r is not None], starts=starts, topk=topk,
                     num_tokens=sum(len(e["input_ids"]) for e in usable),
                     logp=[lp for lp in logps if lp is not None])


def usable_examples(examples: Sequence[dict]) -> list[dict]:
    """The examples hit ranks are measured on, in :class:`HeadStats`' order: >= 2 tokens, one labelled."""
    return [e for e in examples
            if len(e["input_ids"]) >= 2 and any(l != IGNORE_INDEX for l in e["labels"][1:])]


def _head_ranks(model: Any, hidden: torch.Tensor, ids: torch.Tensor, labels: torch.Tensor, depth: int,
                topk: int, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch's hit ranks ``[B, T, D]`` int8 and top-``topk`` log-probabilities ``[B, T, D, topk]``
    float32 (-inf where a draft vocabulary has fewer tokens) from the heads' inputs ``hidden [B, T, .]``."""
    to_target = getattr(model.heads, "to_target", lambda t: t)  # draft ids -> target ids
    b, width = ids.shape
    batch_ranks = torch.full((b, width, depth), NO_TARGET, dtype=torch.int8)  # [B, T, D]
    batch_logp = torch.full((b, width, depth, topk), float("-inf"))  # [B, T, D, topk]
    for k in range(depth):
        shift = k + 2
        if width <= shift:
            continue
        target = ids[:, shift:]  # [B, T - shift]: the token head k should propose at t
        valid = labels[:, shift:] != IGNORE_INDEX  # [B, T - shift]
        for c0 in range(0, width - shift, chunk):
            c1 = min(c0 + chunk, width - shift)
            logits = model.heads.head_logits(k, hidden[:, c0:c1])  # [B, C, V]
            best = torch.log_softmax(logits.float(), dim=-1).topk(min(topk, logits.shape[-1]), dim=-1)
            batch_logp[:, c0:c1, k, :best.values.shape[-1]] = best.values.cpu()  # [B, C, topk]
            top = to_target(best.indices).cpu()  # [B, C, topk] target ids
            hit = top == target[:, c0:c1, None]  # [B, C, topk]
            rank = torch.where(hit.any(-1), hit.int().argmax(-1),
                               torch.full_like(hit[..., 0], MISS, dtype=torch.long))
            rank = torch.where(valid[:, c0:c1], rank, torch.full_like(rank, NO_TARGET))
            batch_ranks[:, c0:c1, k] = rank.to(torch.int8)
    return batch_ranks, batch_logp


def _progress(total: int, desc: str, enabled: bool) -> Any:
    return tqdm(total=total, desc=desc, unit="ex", disable=not enabled)


def accuracy_tables(stats: HeadStats) -> dict[str, Any]:
    """``counts[k][r]``, ``totals[k]``, ``accuracy[k][r]`` and conditional versions (heads 0..k-1 right)."""
    ranks = stats.stacked().long()  # [P, D]
    depth, topk = stats.depth, stats.topk
    counts, totals, ccounts, ctotals = [], [], [], []
    prev_ok = torch.ones(ranks.shape[0], dtype=torch.bool)  # heads 0..k-1 all right
    for k in range(depth):
        col = ranks[:, k]
        valid = col != NO_TARGET
        counts.append([int(((col == r) & valid).sum()) for r in range(topk)])
        totals.append(int(valid.sum()))
        cvalid = valid & prev_ok
        ccounts.append([int(((col == r) & cvalid).sum()) for r in range(topk)])
        ctotals.append(int(cvalid.sum()))
        prev_ok = prev_ok & (col >= 0)
    acc = [[c / t if t else 0.0 for c in row] for row, t in zip(counts, totals)]
    cacc = [[c / t if t else 0.0 for c in row] for row, t in zip(ccounts, ctotals)]
    return {"counts": counts, "totals": totals, "accuracy": acc,
            "conditional_counts": ccounts, "conditional_totals": ctotals, "conditional_accuracy": cacc}


def path_counts(stats: HeadStats) -> tuple[Counter, int]:
    """How many positions (with all D targets present) have hit ranks starting with each path."""
    ranks = stats.stacked()  # [P, D]
    full = ranks[(ranks != NO_TARGET).all(dim=1)].long()  # [P', D]
    counts: Counter = Counter()
    alive = torch.ones(full.shape[0], dtype=torch.bool)
    for d in range(1, stats.depth + 1):
        alive = alive & (full[:, d - 1] >= 0)
        if not alive.any():
            break
        rows, n = torch.unique(full[alive, :d], dim=0, return_counts=True)
        for row, c in zip(rows.tolist(), n.tolist()):
            counts[tuple(row)] = c
    return counts, int(full.shape[0])


# ---------------------------------------------------------------------------------------- building
def empirical_tokens_per_step(choices: Iterable[Sequence[int]], counts: Counter, total: int) -> float:
    """1 + the summed frequency of the tree's paths: the mean accepted length over all positions."""
    return 1.0 + sum(counts.get(tuple(c), 0) for c in choices) / max(total, 1)


def simulated_tokens_per_step(choices: Iterable[Sequence[int]], stats: HeadStats) -> float:
    """Replay greedy tree decoding on each example, as the decode loop runs it.

    The prefill (hidden position ``s = start - 1``) writes token ``start`` and the heads' proposals for
    ``s + 2, s + 3, ...``. A step at hidden position s accepts the longest tree path the hit ranks follow
    (a tokens) plus the base model's bonus token, writing tokens ``s + 2 .. s + a + 2``; the next step runs
    at the last accepted position ``s + a + 1``.
    """
    tree = {tuple(c) for c in choices}
    tokens = steps = 0
    for ranks, start in zip(stats.ranks, stats.starts):
        r = ranks.tolist()
        s, end = start - 1, len(r) - 1
        while s + 2 <= end:
            path: tuple[int, ...] = ()
            for k in range(len(r[s])):
                nxt = path + (r[s][k],)
                if r[s][k] < 0 or nxt not in tree:
                    break
                path = nxt
            gained = min(1 + len(path), end - s - 1)
            tokens += gained
            steps += 1
            s += gained
    return tokens / max(steps, 1)


def build_choices(stats: HeadStats, tables: dict[str, Any], counts: Counter, total: int, num_nodes: int,
                  method: str = "empirical") -> list[tuple[int, ...]]:
    """The tree for ``method``: ``independent`` / ``conditional`` rank nodes by the product of (conditional)
    accuracies; ``empirical`` by measured path frequency, ties broken by the conditional product."""
    if method not in METHODS:
        raise MedusaError(f"unknown tree method {method!r}; choose one of {', '.join(METHODS)}")
    if method == "independent":
        return build_tree_choices(tables["accuracy"], num_nodes, stats.depth)
    if method == "conditional":
        return build_tree_choices(tables["conditional_accuracy"], num_nodes, stats.depth)
    frequencies = {path: c / max(total, 1) for path, c in counts.items()}
    return build_tree_choices(tables["conditional_accuracy"], num_nodes, stats.depth, frequencies=frequencies)


# ---------------------------------------------------------------------------------------- top level
def calibrate(model: Any, examples: Sequence[dict], nodes: int | str = 64, topk: int = 10,
              max_depth: int | None = None, method: str = "empirical", data_name: str = "",
              batch_size: int = 8, progress: bool = True, stats: HeadStats | None = None,
              lookup_tokens: int | str = 0) -> MedusaTree:
    """Measure the heads on ``examples`` and return the accuracy-ranked tree with its calibration record.

    ``nodes="auto"``: the size among :data:`medusa.calibrate.auto.AUTO_SIZES` (<= 64 nodes) maximising
    predicted tokens per second (:func:`medusa.calibrate.auto.choose_size`). ``stats``: hit ranks already
    collected on ``examples`` (then ``topk`` / ``max_depth`` / ``batch_size`` are theirs).
    ``lookup_tokens``: the tree's context-lookup chain length, fixed (0: off) or ``"auto"``
    (:func:`medusa.calibrate.lookup.choose_lookup`); the record's ``lookup`` entry has its predictions.
    """
    if method not in METHODS:
        raise MedusaError(f"unknown tree method {method!r}; choose one of {', '.join(METHODS)}")
    if max_depth is not None and max_depth > model.num_heads:
        raise MedusaError(f"--max-depth {max_depth} is deeper than the checkpoint's {model.num_heads} heads")
    if stats is None:
        stats = collect_hit_ranks(model, examples, topk=topk, max_depth=max_depth, batch_size=batch_size,
                                  progress=progress)
    tables = accuracy_tables(stats)
    counts, total = path_counts(stats)
    if total == 0:
        raise DataError(f"{data_name or 'data'}: no position has {stats.depth} labelled tokens after it; "
                        "use longer replies or a smaller --max-depth")
    timing = None
    if nodes == "auto":
        trees = {n: build_choices(stats, tables, counts, total, n, method) for n in AUTO_SIZES}
        expected = {n: simulated_tokens_per_step(trees[n], stats) for n in trees}
        timing = choose_size(model, trees, expected, timing_prompt(examples))
        choices = trees[timing["chosen"]]
    else:
        if not isinstance(nodes, int) or nodes < 1:
            raise MedusaError(f"--nodes must be a positive integer or 'auto', got {nodes!r}")
        choices = build_choices(stats, tables, counts, total, nodes, method)
    record = calibration_record(choices, stats, tables, counts, total, method, data_name)
    record["auto"] = timing
    if stats.logp is not None:  # the dynamic tree's calibrated path score (medusa.tree.path_score)
        record["path_score"] = score = fit_path_score(stats.logp, stats.ranks)
        record["dynamic_expected_tokens_per_step"] = {  # a dynamic tree of the same size, replayed
            "raw": replay_dynamic(stats.logp, stats.ranks, stats.starts, len(choices) + 1, None),
            "calibrated": replay_dynamic(stats.logp, stats.ranks, stats.starts, len(choices) + 1, score)}
    labels = torch.tensor([t for e in examples for t in e["labels"]], dtype=torch.long)
    record.update(draft_vocab_summary(model.heads, labels))  # share of target tokens the draft covers
    usable = usable_examples(examples)  # in HeadStats' order
    if getattr(model.heads, "token_map", None) is not None:
        record["draft_vocab_loss"] = draft_vocab_loss(choices, stats, usable, model.heads.token_map)
    prompt = timing_prompt(examples) if lookup_tokens == "auto" else None
    record["lookup"] = choose_lookup(model, choices, stats, usable, lookup_tokens, prompt)
    return MedusaTree.from_choices(choices, num_heads=model.num_heads, calibration=record,
                                   lookup_tokens=record["lookup"]["chosen"])


# ---------------------------------------------------------------------------------------- draft vocabulary
# What a draft vocabulary costs these heads, from the hit ranks alone (no full-vocabulary heads to train).
# A head over N target ids never proposes a token outside them: each position where head k's true token is
# out of the vocabulary is a miss whatever the head learned. The *oracle* replay counts each such miss as the
# head's top guess (rank 0) and keeps every other rank as measured. ``1 - measured / oracle`` bounds what
# full-vocabulary heads could gain over these, assuming they rank in-vocabulary tokens no better than the
# draft heads (a full-vocabulary softmax only adds competitors); it credits them with a perfect guess at
# every out-of-vocabulary position. candidate_rows' perfect-chain bound is looser: perfect heads everywhere.
def out_of_vocab(examples: Sequence[dict], token_map: torch.Tensor, depth: int) -> list[torch.Tensor]:
    """Per example ``[T_e, D]`` bool: head k's true token at t (``input_ids[t + k + 2]``, a labelled one)
    lies outside the draft vocabulary ``token_map [N]`` (target ids). ``examples``: in
    :class:`HeadStats`' order (:func:`medusa.calibrate.calibrate.usable_examples`)."""
    inside = torch.zeros(int(token_map.max()) + 1, dtype=torch.bool)
    inside[token_map.cpu().long()] = True
    masks = []
    for ex in examples:
        ids = torch.tensor(ex["input_ids"], dtype=torch.long)  # [T]
        labelled = torch.tensor(ex["labels"], dtype=torch.long) != IGNORE_INDEX  # [T]
        oov = ~inside[ids.clamp(max=inside.numel() - 1)] | (ids >= inside.numel())  # [T]
        mask = torch.zeros(len(ids), depth, dtype=torch.bool)  # [T, D]
        for k in range(depth):
            shift = k + 2
            if len(ids) > shift:
                mask[:-shift, k] = oov[shift:] & labelled[shift:]
        masks.append(mask)
    return masks


def oracle_stats(stats: HeadStats, oov: Sequence[torch.Tensor]) -> HeadStats:
    """``stats`` with every out-of-vocabulary miss counted as a top-1 hit (rank 0)."""
    ranks = [torch.where(m & (r == MISS), torch.zeros_like(r), r) for r, m in zip(stats.ranks, oov)]
    return replace(stats, ranks=ranks)


def draft_vocab_loss(choices: Sequence[Sequence[int]], stats: HeadStats, examples: Sequence[dict],
                     token_map: torch.Tensor) -> dict[str, Any]:
    """The replayed tokens/step of ``choices`` as measured and with the out-of-vocabulary oracle, and the
    bound ``lost_upper_bound = 1 - measured / oracle``; ``oov_share``: the share of (position, head)
    targets outside the vocabulary."""
    masks = out_of_vocab(examples, token_map, stats.depth)
    measured = simulated_tokens_per_step(choices, stats)
    oracle = simulated_tokens_per_step(choices, oracle_stats(stats, masks))
    targets = sum(int((r >= MISS).sum()) for r in stats.ranks)  # hit or miss: a target exists
    oov = sum(int((m & (r >= MISS)).sum()) for r, m in zip(stats.ranks, masks))
    return {"tokens_per_step": measured, "oracle_tokens_per_step": oracle,
            "lost_upper_bound": 1.0 - measured / oracle if oracle > 0 else 0.0,
            "oov_share": oov / targets if targets else 0.0}


def calibration_record(choices: Sequence[Sequence[int]], stats: HeadStats, tables: dict[str, Any],
                       counts: Counter, total: int, method: str, data_name: str) -> dict[str, Any]:
    """The ``calibration`` entry of ``tree.json``: the data, the accuracy tables and the tree's predictions
    (NaN -> None, so that the record is valid JSON)."""
    record = {
        "data": data_name,
        "num_examples": len(stats.ranks),
        "num_tokens": stats.num_tokens,
        "num_positions": total,
        "topk": stats.topk,
        "method": method,
        **tables,
        "top1": [row[0] for row in tables["accuracy"]],
        f"top{stats.topk}": [sum(row) for row in tables["accuracy"]],
        "expected_tokens_per_step": simulated_tokens_per_step(choices, stats),
        "position_mean_tokens_per_step": empirical_tokens_per_step(choices, counts, total),
        "independent_formula_tokens_per_step": expected_tokens_per_step(choices, tables["accuracy"]),
        "conditional_formula_tokens_per_step": expected_tokens_per_step(choices,
                                                                        tables["conditional_accuracy"]),
        "nodes": len(choices) + 1,
    }
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in record.items()}


def write_tree(checkpoint: str | Path, tree: MedusaTree) -> Path:
    """Write ``tree.json`` into the checkpoint (atomically; the heads file is not touched) and record it in
    the checkpoint's manifest (medusa wrote it: a later ``--overwrite`` there may replace it)."""
    path = Path(checkpoint) / TREE_NAME
    tree.to_json(path)
    record_in_manifest(checkpoint, [TREE_NAME], kind="heads")
    return path
