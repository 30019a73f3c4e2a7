"""The step-cost measures: op counting and the verification-forward floor. (Printed by ``medusa generate
--profile``: tests/eval/test_profile.py.)"""


import torch

from medusa.eval.step_cost import compute_ops, step_op_counts, verify_floor
from medusa.tree import default_tree

from fit_heads import fitted_stories_heads, stories_prompts
from tiny_models import stories_tokenizer


def test_compute_ops_counts_kernels_not_views():
    x = torch.ones(4, 3)
    total, ops = compute_ops(lambda: (x.t().reshape(-1) + 1).mul_(2)[:5].sum())
    assert ops == {"aten::add": 1, "aten::mul_": 1, "aten::sum": 1}
    assert float(total) == 20.0  # fn's own result comes back


def test_verify_floor_times_the_tree_forward_against_one_token():
    model = fitted_stories_heads(4, 1)
    ids = stories_tokenizer()(stories_prompts(1)[0], return_tensors="pt").input_ids
    tree = default_tree(model.num_heads, 16)
    r = verify_floor(model, ids, tree, repeats=3)
    assert r["tree_nodes"] == 16
    assert r["plain_forward_ms"] > 0 and r["verify_forward_ms"] > 0
    assert abs(r["floor"] - r["verify_forward_ms"] / r["plain_forward_ms"]) < 1e-9


def test_op_counts_see_the_heads_and_the_compaction():
    model = fitted_stories_heads(4, 1)
    ids = stories_tokenizer()(stories_prompts(1)[0], return_tensors="pt").input_ids
    r = step_op_counts(model, ids, max_new_tokens=24)
    added = r["added_ops"]
    # every MEDUSA step takes its heads' top-k and gathers the kept path's hidden state / tokens
    assert added.get("aten::topk", 0) >= 0.99 and added.get("aten::gather", 0) >= 2
    assert r["medusa_ops_per_step"] > r["hf_ops_per_token"] > 0
