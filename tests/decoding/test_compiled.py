"""The compiled static step (CPU inductor): HF greedy equality and no step-to-step recompilation (one
compilation per tree size). The compiled sampling law: tests/decoding/test_sample_law.py."""

import pytest
import torch
from test_static import NEW, fitted_llama

from medusa import MedusaTree


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

