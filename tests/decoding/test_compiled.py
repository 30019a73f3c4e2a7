"""The compiled static step (CPU inductor): HF greedy equality (a tiny llama; Hydra heads and dynamic trees on
stories260K with fitted heads) and no step-to-step recompilation (one compilation per tree size). The
compiled sampling law: tests/integration/test_lossless_sampling.py."""

import pytest
import torch
from decoding_helpers import COMBO_IDS, COMBOS, FITTED_NEW, SCORE, check_stories_greedy, fitted_llama

from medusa import MedusaTree
from medusa.decoding.tree_option import DynamicTreeOption

from fit_heads import fitted_stories_heads

# CPU inductor compiles: run first (tests/conftest.py)
pytestmark = pytest.mark.heavy(200)

NEW = FITTED_NEW
STORIES_NEW = 96


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test counts its own compilations (and stays under dynamo's per-function recompile limit)."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    torch._dynamo.reset()


def _graphs() -> int:
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


@pytest.mark.parametrize("gen", [{}, {"repetition_penalty": 1.3}], ids=["plain", "rep-penalty"])
def test_compiled_greedy_equals_hf(gen):
    model, ids, mask, ref, ref1 = fitted_llama(**gen)
    out = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, compile=True,
                         return_dict_in_generate=True)
    assert torch.equal(out.sequences, ref)
    assert out.compile_time_s > 0
    one = model.generate(ids[:1], max_new_tokens=NEW, compile=True, return_dict_in_generate=True)
    assert torch.equal(one.sequences, ref1)
    assert one.tokens_per_step > 2.0, one.accept_lengths
    assert torch._dynamo.utils.counters["graph_break"] == {}  # whole functions compiled, no fallbacks


def test_compiled_greedy_on_packed_cpu_linears():
    """A model loaded for generation has pre-packed CPU linears (medusa.modeling.cpu_linear): the compiled
    functions trace the stock F.linear, the eager prefill uses the packed weights."""
    from medusa.modeling.cpu_linear import pack_linears, unpack_linears

    model, ids, mask, ref, _ = fitted_llama()
    try:
        pack_linears(model)
        out = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, compile=True,
                             return_dict_in_generate=True)
    finally:
        unpack_linears(model)
    assert torch.equal(out.sequences, ref)
    assert torch._dynamo.utils.counters["graph_break"] == {}


@pytest.mark.slow  # two tree sizes x three compiled functions (~60 s on 2 shared cores)
def test_recompiles_once_per_tree_size():
    small = MedusaTree.from_choices([[0], [1], [0, 0], [0, 1], [0, 0, 0]])
    large = MedusaTree.from_choices([[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0],
                                     [0, 0, 1], [0, 0, 0, 0]])
    model, ids, mask, ref, _ = fitted_llama()
    first = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, compile=True, tree=small,
                           return_dict_in_generate=True)
    per_shape = _graphs()
    assert per_shape == 3  # verify, finish, greedy acceptance: once each, however many steps ran
    assert first.num_steps > 10 and torch.equal(first.sequences, ref)
    again = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, compile=True, tree=small,
                           return_dict_in_generate=True)
    assert _graphs() == per_shape and again.compile_time_s < first.compile_time_s  # same shapes: reused
    other = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, compile=True, tree=large,
                           return_dict_in_generate=True)
    assert _graphs() == 2 * per_shape  # a new node count recompiles once, not at every step
    assert other.num_steps > 5 and torch.equal(other.sequences, ref)


@pytest.mark.slow  # CPU inductor: ~1-2 min per combination on 2 shared cores
@pytest.mark.parametrize("head_type,tree", COMBOS[:3], ids=COMBO_IDS[:3])
def test_compiled_hydra_and_dynamic_greedy_equals_hf(head_type, tree):
    model = fitted_stories_heads(num_heads=4, num_layers=1, head_type=head_type)
    out = check_stories_greedy(model, tree, STORIES_NEW, compile=True)[0]
    assert out.compile_time_s > 0
    assert torch._dynamo.utils.counters["graph_break"] == {}  # whole functions compiled, no fallbacks
    # verify, finish_propose and greedy acceptance, once per batch size (3 and 1), however many steps ran
    assert _graphs() == 6 and out.num_steps > 10


@pytest.mark.slow  # two tree sizes x three compiled functions
def test_dynamic_tree_recompiles_once_per_tree_size():
    model, ids, mask, ref, _ = fitted_llama()

    def run(tree):
        return model.generate(ids, attention_mask=mask, max_new_tokens=NEW, compile=True, tree=tree,
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
    calibrated = run(DynamicTreeOption(num_nodes=16, score=SCORE))
    assert _graphs() == 2 * per_shape + 1  # the calibrated score: finish_propose once more, nothing else
    assert calibrated.num_steps >= 8 and torch.equal(calibrated.sequences, ref)
