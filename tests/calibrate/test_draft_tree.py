"""Draft-tree calibration: every candidate is decoded for real, the fastest one is kept with the record."""

import torch

from medusa import MedusaModel
from medusa.calibrate.draft_tree import calibrate_draft_tree, candidate_shapes, measure_shape, measure_shapes
from medusa.tree import DraftTreeShape

from tiny_models import tiny_model


def test_measure_and_choose():
    base = tiny_model("llama", layers=4)
    model = MedusaModel.from_base(base, num_heads=3, head_type="eagle3").eval()
    prompts = [torch.randint(3, 96, (1, 6)), torch.randint(3, 96, (1, 4))]
    figures = measure_shape(model, prompts, DraftTreeShape(4, 3, 1, 1), 8)
    assert figures["tokens_per_step"] >= 1.0 and figures["step_ms"] > 0
    shapes = [DraftTreeShape(4, 3, 1, 1), DraftTreeShape(6, 3, 2, 2, lookup_tokens=2)]
    lines = []
    best = calibrate_draft_tree(model, prompts, max_new_tokens=8, shapes=shapes, log=lines.append,
                                min_probs=())
    record = best.calibration
    assert len(record["candidates"]) == 2 and len(lines) == 2
    fastest = max(record["candidates"], key=lambda c: c["tokens_per_s"])
    assert (best.num_nodes, best.lookup_tokens) == (fastest["num_nodes"], fastest["lookup_tokens"])
    assert record["expected_tokens_per_step"] == fastest["tokens_per_step"]
    assert record["dtype"] == "float32"  # timed in the dtype it will decode in
    assert best.min_prob == 0.0


def test_the_fastest_shape_is_tried_again_cut_at_each_min_prob():
    """A second round: the grid's fastest shape beside itself cut at each ``min_probs``, all timed in turn;
    the fastest of that round is kept, its figures the record's expected ones."""
    base = tiny_model("llama", layers=4)
    model = MedusaModel.from_base(base, num_heads=3, head_type="eagle3").eval()
    prompts = [torch.randint(3, 96, (1, 6)), torch.randint(3, 96, (1, 4))]
    shapes = [DraftTreeShape(4, 3, 1, 1), DraftTreeShape(6, 3, 2, 2, lookup_tokens=2)]
    lines = []
    best = calibrate_draft_tree(model, prompts, max_new_tokens=8, shapes=shapes, log=lines.append,
                                min_probs=(0.05, 0.3))
    rows = best.calibration["candidates"]
    assert len(rows) == len(lines) == 5 and [r["min_prob"] for r in rows[2:]] == [0.0, 0.05, 0.3]
    first = max(rows[:2], key=lambda c: c["tokens_per_s"])
    assert all(r["num_nodes"] == first["num_nodes"] and r["lookup_tokens"] == first["lookup_tokens"]
               for r in rows[2:])
    second = max(rows[2:], key=lambda c: c["tokens_per_s"])
    assert best.min_prob == second["min_prob"] and best.num_nodes == first["num_nodes"]
    assert best.calibration["expected_tokens_per_step"] == second["tokens_per_step"]
    assert "min_prob 0.3" in lines[-1]


def test_candidates_are_valid_shapes():
    shapes = candidate_shapes()
    keys = {(s.num_nodes, s.depth, s.branch, s.expand, s.lookup_tokens) for s in shapes}
    assert len(shapes) == len(keys)
    assert all(s.num_nodes <= 16 for s in shapes)


def test_nodes_and_lookup_tokens_are_honoured():
    """``medusa calibrate --nodes N --lookup-tokens L`` on eagle3 heads: every shape tried has N nodes and
    an L-token lookup chain; N past the grid gets a wider shape that can draft it; N < 2 is refused."""
    import pytest

    from medusa.errors import MedusaError

    for nodes in (6, 12, 200):
        shapes = candidate_shapes(lookup=(3,), nodes=nodes)
        assert shapes and all(s.num_nodes == nodes and s.lookup_tokens == 3 for s in shapes)
    assert len(candidate_shapes(nodes=12)) < len(candidate_shapes())  # shapes that cannot hold 12 dropped
    with pytest.raises(MedusaError, match="--nodes 1: an eagle3 draft tree"):
        candidate_shapes(nodes=1)


def test_the_fastest_shape_wins_not_the_one_of_most_tokens_per_step():
    """Rows that rank one way by tokens/step and the other by tokens/s: the choice follows tokens/s (a
    bigger tree that accepts more per step but costs more per step loses)."""
    from medusa.calibrate.draft_tree import fastest

    rows = [{"tokens_per_step": 3.1, "step_ms": 30.0, "tokens_per_s": 103.3},
            {"tokens_per_step": 2.4, "step_ms": 15.0, "tokens_per_s": 160.0},
            {"tokens_per_step": 2.9, "step_ms": 22.0, "tokens_per_s": 131.8}]
    assert fastest(rows) == 1
    assert fastest(list(reversed(rows))) == 1
    assert fastest([rows[1], dict(rows[1])]) == 0  # equals: the first (the smaller shape in the grid's order)


def test_shapes_timed_prompt_by_prompt_give_each_shape_its_own_figures():
    """All candidates decode each prompt in turn (a slow minute falls on all alike): each shape's tokens and
    steps are what it gives alone."""
    base = tiny_model("llama", layers=4)
    model = MedusaModel.from_base(base, num_heads=3, head_type="eagle3").eval()
    prompts = [torch.randint(3, 96, (1, 6)), torch.randint(3, 96, (1, 4)), torch.randint(3, 96, (1, 5))]
    shapes = [DraftTreeShape(4, 3, 1, 1), DraftTreeShape(6, 3, 2, 2, lookup_tokens=2),
              DraftTreeShape(2, 1, 1, 1)]
    together = measure_shapes(model, prompts, shapes, 8)
    for shape, figures in zip(shapes, together, strict=True):
        alone = measure_shape(model, prompts, shape, 8)
        assert figures["tokens_per_step"] == alone["tokens_per_step"] and figures["step_ms"] > 0
