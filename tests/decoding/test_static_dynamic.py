"""Hydra heads and dynamic trees on the static-cache path, eager and compiled (CPU inductor): greedy == HF
greedy (stories260K with fitted heads, batch 1 and a left-padded batch of 3), the same decisions as the
eager path, the sampling law (chi-square; compiled: tests/decoding/test_sample_law.py), and no step-to-step
recompilation."""

import pytest
import torch
from chi_square import chi2_pvalue, exact_joint
from decoding_helpers import check_stories_greedy, stories_left_padded
from test_hydra_dynamic import FULL_TREE, NEW, V, _sampler
from test_static import NEW as LLAMA_NEW
from test_static import fitted_llama

from medusa import MedusaTree
from medusa.decoding.acceptance import warp_logits
from medusa.decoding.dynamic_tree import DynamicTree

from fit_heads import fitted_stories_heads

# A calibrated path score (medusa.tree.path_score's record; depth 4 scored raw).
SCORE = {"weight": [2.0, 1.5, 1.2, 1.0], "bias": [1.0, 0.5, 0.2, 0.0], "positions": [99] * 4, "raw": [3]}
COMBOS = [("hydra", None), ("hydra", "dynamic:16"), ("linear", "dynamic:16"),
          ("linear", DynamicTree(num_nodes=48, branch=8)), ("hydra", DynamicTree(num_nodes=16, score=SCORE))]
IDS = ["hydra-static", "hydra-dynamic16", "medusa-dynamic16", "medusa-dynamic48-branch8",
       "hydra-calibrated16"]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test counts its own compilations (and stays under dynamo's per-function recompile limit)."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    torch._dynamo.reset()


def _graphs() -> int:
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def _check_greedy(model, tree, **path):
    """Greedy on the static path (``path``: cache_implementation / compile) == HF greedy, batch of 3 and 1;
    returns the batch-of-3 output."""
    return check_stories_greedy(model, tree, NEW, **path)[0]


@pytest.mark.parametrize("head_type,tree", COMBOS, ids=IDS)
def test_static_cache_greedy_equals_hf(head_type, tree):
    model = fitted_stories_heads(num_heads=4, num_layers=1, head_type=head_type)
    out = _check_greedy(model, tree, cache_implementation="static")
    enc, _ = stories_left_padded()
    eager = model.generate(enc["input_ids"], attention_mask=enc["attention_mask"], max_new_tokens=NEW,
                           tree=tree, return_dict_in_generate=True)
    assert eager.accept_lengths == out.accept_lengths  # the same trees and decisions as the eager path
    assert out.compile_time_s == 0.0


@pytest.mark.slow  # CPU inductor: ~1-2 min per combination on 2 shared cores
@pytest.mark.parametrize("head_type,tree", COMBOS[:3], ids=IDS[:3])
def test_compiled_greedy_equals_hf(head_type, tree):
    model = fitted_stories_heads(num_heads=4, num_layers=1, head_type=head_type)
    out = _check_greedy(model, tree, compile=True)
    assert out.compile_time_s > 0
    assert torch._dynamo.utils.counters["graph_break"] == {}  # whole functions compiled, no fallbacks
    # verify, finish_propose and greedy acceptance, once per batch size (3 and 1), however many steps ran
    assert _graphs() == 6 and out.num_steps > 10


@pytest.mark.slow  # two tree sizes x three compiled functions
def test_dynamic_tree_recompiles_once_per_tree_size():
    model, ids, mask, ref, _ = fitted_llama()

    def run(tree):
        return model.generate(ids, attention_mask=mask, max_new_tokens=LLAMA_NEW, compile=True, tree=tree,
                              return_dict_in_generate=True)

    first = run("dynamic:16")
    per_shape = _graphs()
    assert per_shape == 3  # verify, finish_propose, greedy acceptance: once each, however many steps ran
    assert first.num_steps >= 8 and torch.equal(first.sequences, ref)
    again = run("dynamic:16")
    assert _graphs() == per_shape and again.compile_time_s < first.compile_time_s  # same shapes: reused
    other = run("dynamic:6")
    assert _graphs() == 2 * per_shape  # a new node count recompiles once, not at every step
    assert other.num_steps >= 8 and torch.equal(other.sequences, ref)
    calibrated = run(DynamicTree(num_nodes=16, score=SCORE))
    assert _graphs() == 2 * per_shape + 1  # the calibrated score: finish_propose once more, nothing else
    assert calibrated.num_steps >= 8 and torch.equal(calibrated.sequences, ref)


def _joint_counts(out, n):
    x1, x2 = out[:, 4], out[:, 5]
    ones = torch.ones(n, dtype=torch.float64)
    return torch.zeros(V * V, dtype=torch.float64).index_add_(0, x1 * V + x2, ones)


def _sample_check(head_type, tree, **path):
    base, model = _sampler(head_type)
    prompt = torch.tensor([[3, 5, 4, 6]])
    n = 6000
    setting = {"temperature": 0.7, "top_k": 4}
    out = model.generate(prompt.repeat(n, 1), max_new_tokens=2, acceptance="sample", eos_token_id=[],
                         tree=tree, generator=torch.Generator().manual_seed(1234), **setting, **path)
    expected = exact_joint(base, prompt, warp_logits(**setting)).view(-1) * n
    assert chi2_pvalue(_joint_counts(out, n), expected) > 1e-3


@pytest.mark.parametrize("head_type,tree", [("linear", "dynamic:12"), ("hydra", "dynamic:12"),
                                            ("linear", "dynamic:5"), ("hydra", "full")])
def test_static_sample_is_lossless_chi_square(head_type, tree):
    tree = MedusaTree.from_choices(FULL_TREE) if tree == "full" else tree  # Hydra on a static tree
    _sample_check(head_type, tree, cache_implementation="static")

