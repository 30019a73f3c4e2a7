"""closed_keys ranks every node strictly below its parent, whatever the float32 ties; pick_tree keeps the best
ancestor-closed set in level order; grow drafts and keeps what a brute-force EAGLE-2 reference says."""

import pytest
import torch

from medusa.decoding.draft_growth import closed_keys, grow, pick_tree, top_children
from medusa.tree.draft_tree import DraftTreeShape


def test_closed_keys_break_float32_ties_below_the_parent():
    raw = torch.tensor([[-17.0, 0.0, -17.0, -17.0, -17.0]])  # levels: [0, 1] [2, 3 of 0; 4 of 1]
    parent = torch.tensor([[-1, -1, 0, 0, 1]])
    key = closed_keys(raw, parent, [2, 3])
    assert key[0, 2] < key[0, 0] and key[0, 3] < key[0, 0]  # tied with their parent in float32: now below it
    assert key[0, 4] == -17.0  # already below its parent: unchanged
    assert key[0, 0] == -17.0 and key[0, 1] == 0.0  # the root's children keep their score


def test_closed_keys_stay_strict_at_minus_infinity():
    raw = torch.tensor([[float("-inf"), float("-inf"), float("-inf")]])
    key = closed_keys(raw, torch.tensor([[-1, 0, 1]]), [1, 1, 1])
    assert key[0, 0] > key[0, 1] > key[0, 2]


def test_pick_tree_keeps_parents_with_their_children():
    raw = torch.tensor([[-17.0, 0.0, -17.0, -17.0, -17.0]])
    parent = torch.tensor([[-1, -1, 0, 0, 1]])
    token = torch.tensor([[10, 11, 12, 13, 14]])
    levels = torch.tensor([1, 1, 2, 2, 2])
    for n in range(2, 7):
        tree, picked = pick_tree(torch.tensor([3]), closed_keys(raw, parent, [2, 3]), token, parent, levels,
                                 n, 2, 3, torch.float32)
        kept = set(picked[0].tolist())
        assert all(int(parent[0, i]) in kept for i in kept if int(parent[0, i]) >= 0)
        assert picked[0].tolist() == sorted(kept) and int(tree.tokens[0, 0]) == 3
        for i in range(1, n):
            assert int(tree.depths[0, i]) == int(tree.depths[0, tree.parents[0, i]]) + 1


# --- grow against a brute-force EAGLE-2 reference ----------------------------------------------------------
# A fake drafter whose draft logits are a fixed function of (the target tokens its entry sees, its position):
# its KV cache holds each entry's token and position, and a drafted entry's output is computed from the
# entries the grower's mask lets it see. A separate reference enumerates every chain under the root up to the
# tree's depth with its exact cumulative log-probability and derives what EAGLE-2 must draft and keep.

TOKEN_MAP = (3, 8, 11, 20, 27)  # draft id -> target id
G_WIDTH = 16  # an output g: [position, number of tokens, tokens...]


def table_logits(tokens: tuple[int, ...], position: int, gap: float | None = None) -> torch.Tensor:
    """The fake drafter's draft logits ``[N]`` after seeing the target ``tokens`` (in order) at ``position``;
    ``gap``: a very sure drafter, its logits ``gap`` nats apart in the same order (log-probabilities exactly
    0, -gap, -2 gap, ... in float32 once gap > 17)."""
    h = sum((i + 1) * t for i, t in enumerate(tokens))
    v = torch.arange(len(TOKEN_MAP), dtype=torch.float64)
    logits = 3.0 * torch.sin(0.9 * v * (position + 1) + 0.37 * h + 0.11 * v * v)
    if gap is not None:
        logits = -gap * logits.argsort(descending=True).argsort().double()
    return logits.float()


def encode(tokens: tuple[int, ...], position: int) -> torch.Tensor:
    g = torch.full((G_WIDTH,), -1.0)
    g[0], g[1] = float(position), float(len(tokens))
    g[2:2 + len(tokens)] = torch.tensor(tokens, dtype=torch.float)
    return g


def decode(g: torch.Tensor) -> tuple[tuple[int, ...], int]:
    return tuple(int(t) for t in g[2:2 + int(g[1])]), int(g[0])


class FakeCache:
    """Each entry's target token and position, ``[B, S]`` each."""

    def __init__(self, tokens: torch.Tensor, positions: torch.Tensor) -> None:
        self.tokens, self.positions = tokens, positions

    def get_seq_length(self) -> int:
        return self.tokens.shape[1]

    def truncate(self, length: int) -> None:
        self.tokens, self.positions = self.tokens[:, :length], self.positions[:, :length]


class FakeDrafter:
    """The :class:`medusa.decoding.drafter.Drafter` surface ``grow`` reads; logs every drafted entry as
    (row, level, tokens seen, position, its parent's tokens as read from ``hidden``)."""

    dtype = torch.float32

    def __init__(self, gap: float | None = None) -> None:
        self.gap, self.log = gap, []

    def logits(self, g: torch.Tensor) -> torch.Tensor:  # [..., G] -> [..., N]
        flat = [table_logits(*decode(row), gap=self.gap) for row in g.reshape(-1, G_WIDTH)]
        return torch.stack(flat).view(*g.shape[:-1], len(TOKEN_MAP))

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return torch.tensor(TOKEN_MAP)[draft_ids]

    def draft_pass(self, hidden, tokens, positions, mask, cache):  # [B, E, G], [B, E], [B, E], [B, 1, E, S+E]
        cache.tokens = torch.cat([cache.tokens, tokens], dim=1)
        cache.positions = torch.cat([cache.positions, positions], dim=1)
        assert mask.shape[-1] == cache.get_seq_length()
        level = len({entry[1] for entry in self.log}) + 2
        out = torch.empty(*tokens.shape, G_WIDTH)
        for b in range(tokens.shape[0]):
            for e in range(tokens.shape[1]):
                seen = tuple(cache.tokens[b][mask[b, 0, e] == 0].tolist())
                out[b, e] = encode(seen, int(positions[b, e]))
                self.log.append((b, level, seen, int(positions[b, e]), decode(hidden[b, e])[0]))
        return out


class FakeContext:
    """Two rows: context tokens (the last one the root; row 1 left-padded), the root at position ``pos``."""

    def __init__(self, rows: list[list[int]], width: int) -> None:
        pad = [[0] * (width - len(r)) + r for r in rows]
        self.cache = FakeCache(torch.tensor(pad), torch.zeros(len(rows), width, dtype=torch.long))
        self.valid = torch.tensor([[False] * (width - len(r)) + [True] * len(r) for r in rows])
        self.pos = torch.tensor([len(r) for r in rows])
        self.g_root = torch.stack([encode(tuple(r), len(r)) for r in rows])


ROWS = [[5, 9, 14, 3], [2, 11]]  # each row's context tokens; the last is the root


def reference(context: tuple[int, ...], pos: int, shape) -> tuple[dict, list]:
    """Brute force: every chain (draft ids) under the root up to ``shape.depth`` with its cumulative
    log-probability; then EAGLE-2's levels from them (with ``shape.min_prob``: only chains that reach it are
    expanded and kept). Returns the kept nodes {chain: score} and each level's expanded nodes [(target
    tokens seen, position)]."""
    import itertools
    import math

    def target(chain):
        return context + tuple(TOKEN_MAP[c] for c in chain)

    score = {(): 0.0}
    for length in range(1, shape.depth + 1):
        for chain in itertools.product(range(len(TOKEN_MAP)), repeat=length):
            logp = torch.log_softmax(table_logits(target(chain[:-1]), pos + length - 1).double(), dim=-1)
            score[chain] = score[chain[:-1]] + float(logp[chain[-1]])
    floor = math.log(shape.min_prob) if shape.min_prob > 0 else -math.inf

    def best(chains, k):
        ranked = sorted(chains, key=lambda c: -score[c])
        assert k >= len(ranked) or score[ranked[k - 1]] - score[ranked[k]] > 1e-4  # no near-tie to guess at
        return ranked[:k]

    def sure(chains):
        assert all(abs(score[c] - floor) > 1e-4 for c in chains)  # none at the floor to guess at
        return [c for c in chains if score[c] >= floor]

    level, pool, expanded = best([(v,) for v in range(len(TOKEN_MAP))], shape.branch), [], []
    for depth in range(2, shape.depth + 1):
        pool += level
        frontier = best(sure(level), shape.expand)
        if not frontier:
            level = []
            break
        expanded.append(sorted((target(f), pos + depth - 1) for f in frontier))
        level = [c for f in frontier for c in best([f + (v,) for v in range(len(TOKEN_MAP))], shape.branch)]
    pool += level
    return {c: score[c] for c in best(sure(pool), shape.num_nodes - 1)}, expanded


SHAPES = [DraftTreeShape(8, 4, 3, 2), DraftTreeShape(12, 3, 2, 3), DraftTreeShape(6, 4, 2, 1),
          DraftTreeShape(4, 1, 3, 2), DraftTreeShape(22, 4, 3, 2)]


def _grow(shape, drafter, rows=ROWS):
    recorded = []
    base = top_children(shape.branch)

    def children(logits, base_score):
        out = base(logits, base_score)
        recorded.append(out[0])
        return out

    context = FakeContext(rows, 4)
    root = torch.tensor([r[-1] for r in rows])
    nodes, picked, _ = grow(drafter, context, root, shape, children, False, torch.float32)
    assert context.cache.get_seq_length() == 4  # the drafted entries dropped again
    return nodes, torch.cat(recorded, dim=1).gather(1, picked)  # [B, N-1] the kept nodes' scores


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_grow_expands_the_best_frontier_at_the_next_position(shape):
    """Each level drafts the ``expand`` best nodes of the last level, each at its parent's position + 1,
    seeing exactly the context and its ancestors, reading its parent's output."""
    drafter = FakeDrafter()
    _grow(shape, drafter)
    for b, row in enumerate(ROWS):
        _, want = reference(tuple(row), len(row), shape)
        for depth, level in enumerate(want, start=2):
            got = sorted((seen, p) for rb, lv, seen, p, _ in drafter.log if rb == b and lv == depth)
            assert got == level, (b, depth)
    assert all(parent == seen[:-1] for _, _, seen, _, parent in drafter.log)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_grow_keeps_the_best_nodes_with_their_exact_scores(shape):
    """The kept nodes are the reference's ``num_nodes - 1`` best (tokens, parents, depths), in level order,
    each with its chain's cumulative log-probability."""
    nodes, scores = _grow(shape, FakeDrafter())
    for b, row in enumerate(ROWS):
        want, _ = reference(tuple(row), len(row), shape)
        chains = [()]
        for i in range(1, shape.num_nodes):
            parent = int(nodes.parents[b, i])
            assert parent < i and int(nodes.depths[b, i]) >= int(nodes.depths[b, i - 1])  # level order
            draft_id = TOKEN_MAP.index(int(nodes.tokens[b, i]))
            chains.append(chains[parent] + (draft_id,))
            assert int(nodes.depths[b, i]) == len(chains[i])
        assert int(nodes.tokens[b, 0]) == row[-1]
        got = {chain: float(s) for chain, s in zip(chains[1:], scores[b].tolist())}
        assert got.keys() == want.keys(), b
        for chain, s in want.items():
            assert abs(got[chain] - s) < 1e-5, (b, chain, got[chain], s)


@pytest.mark.parametrize("gap", [17.0, 40.0])
def test_grow_keeps_no_orphan_with_a_very_sure_drafter(gap):
    """Log-probabilities exactly 0, -gap, -2 gap, ...: a child's score ties with its parent's and with whole
    chains of other nodes, past -16 where a float32 1e-6 tie-break vanishes. At every tree size up to the
    whole pool, every kept node's parent is kept one level up."""
    for depth, branch, expand in ((3, 2, 2), (4, 3, 2), (4, 2, 3)):
        for n in range(2, DraftTreeShape(2, depth, branch, expand).pool_size + 2):
            nodes, _ = _grow(DraftTreeShape(n, depth, branch, expand), FakeDrafter(gap))
            for b in range(len(ROWS)):
                for i in range(1, n):
                    parent = int(nodes.parents[b, i])
                    assert parent < i, (n, b, i)
                    assert int(nodes.depths[b, i]) == int(nodes.depths[b, parent]) + 1, (n, b, i)


PRUNED = [DraftTreeShape(8, 4, 3, 2, min_prob=p) for p in (0.02, 0.1, 0.3, 0.6)] + [
    DraftTreeShape(12, 3, 2, 3, min_prob=0.05), DraftTreeShape(4, 1, 3, 2, min_prob=0.2)]


@pytest.mark.parametrize("shape", PRUNED, ids=str)
def test_min_prob_prunes_what_the_drafter_doubts(shape):
    """With ``min_prob`` (one row at a time: a batch keeps the most any row keeps), a level expands only the
    nodes whose path probability reaches it, no level is drafted where none does, and the kept nodes are
    exactly those that reach it (at most ``num_nodes - 1``) with their exact scores."""
    for row in ROWS:
        drafter = FakeDrafter()
        nodes, scores = _grow(shape, drafter, rows=[row])
        want, levels = reference(tuple(row), len(row), shape)
        for depth, level in enumerate(levels, start=2):
            assert sorted((seen, p) for _, lv, seen, p, _ in drafter.log if lv == depth) == level
        assert {lv for _, lv, *_ in drafter.log} == set(range(2, 2 + len(levels)))
        assert nodes.tokens.shape[1] == 1 + len(want)
        got = sorted(scores[0].tolist(), reverse=True)
        assert got == pytest.approx(sorted(want.values(), reverse=True), abs=1e-5)


def test_min_prob_keeps_every_node_of_a_batch_row_that_reaches_it():
    """Two rows: each keeps its own nodes that reach the floor; the batch's tree has the most of any row."""
    shape = DraftTreeShape(8, 4, 3, 2, min_prob=0.3)
    nodes, scores = _grow(shape, FakeDrafter())
    counts = [len(reference(tuple(r), len(r), shape)[0]) for r in ROWS]
    assert counts == [1, 2] and nodes.tokens.shape[1] == 1 + max(counts)
    for b, row in enumerate(ROWS):
        want, _ = reference(tuple(row), len(row), shape)
        top = sorted(scores[b].tolist(), reverse=True)[:counts[b]]
        assert top == pytest.approx(sorted(want.values(), reverse=True), abs=1e-5)
