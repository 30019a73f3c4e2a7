"""Dynamic trees with generation_config logits processors: every node of every row's own tree is processed
after its own prefix (against a naive per-node reference), greedy == HF greedy on the eager and static
paths, and lossless sampling keeps HF's processed law (chi-square)."""

import pytest
import torch
from chi_square import chi2_pvalue
from decoding_helpers import left_padded_batch, memorise_heads, real_rows, stories_left_padded
from test_acceptance import V, _exact_joint3, _sampler_model
from test_fidelity import NEW, SETTINGS, _plain, _setting

from medusa import MedusaModel
from medusa.decoding.dynamic_tree import build_step_tree, medusa_children
from medusa.decoding.processors import apply_processors, process_nodes, resolve_generation

from fit_heads import fitted_stories_heads
from tiny_models import tiny_model

PATHS = [{}, {"cache_implementation": "static"}]
PATH_IDS = ["eager", "static"]


def test_per_row_tree_nodes_see_their_own_prefix():
    torch.manual_seed(0)
    k, b, v, n = 3, 3, 9, 12
    base = tiny_model("llama", vocab_size=v)
    ids, mask = left_padded_batch(v, lengths=(5, 3, 4), seed=2)
    gen = resolve_generation(base, False, ids, mask, generation_config=None, repetition_penalty=1.7,
                             no_repeat_ngram_size=2, sequence_bias={(4, 5): -9.0, (6,): 3.0})
    history = torch.cat([ids, torch.tensor([[4], [6], [5]])], dim=1)  # each row's root last
    logp = torch.log_softmax(torch.randn(k, b, v) * 2, dim=-1)
    tree = build_step_tree(history[:, -1], medusa_children(logp, 6), n, k, torch.float32, branch=6)
    logits = torch.randn(b, n, v)
    lengths, active = [history.shape[1]] * b, [True, False, True]
    got = process_nodes(gen, history, lengths, active, tree.tokens, logits, tree)
    for row in range(b):
        for node in range(n):
            if not active[row]:
                assert torch.equal(got[row, node], logits[row, node])  # finished rows keep raw logits
                continue
            depth = int(tree.depths[row, node])
            path = tree.tokens[row, tree.ancestors[row, node, 1:depth + 1]]
            prefix = torch.cat([history[row], path]).view(1, -1)
            want = apply_processors(gen, prefix, logits[row, node].view(1, v).clone(), torch.tensor([row]))
            torch.testing.assert_close(got[row, node], want[0])
    assert int(tree.depths.max()) >= 2 and not torch.equal(got[0], logits[0])  # deep nodes, real processing


@pytest.mark.parametrize("path", PATHS, ids=PATH_IDS)
@pytest.mark.parametrize("name", SETTINGS)
def test_dynamic_greedy_equals_hf_with_generation_config(name, path):
    base = tiny_model("llama")
    ids, mask = left_padded_batch(base.config.vocab_size, seed=0)
    plain = _plain(base, ids, mask)
    for key, value in _setting(name, plain).items():
        setattr(base.generation_config, key, value)
    ref = base.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW)
    ref1 = base.generate(ids[:1], do_sample=False, max_new_tokens=NEW)
    assert not torch.equal(ref[:, ids.shape[1]:], plain)  # the setting really changes HF's output
    model = MedusaModel.from_base(base, num_heads=4)
    memorise_heads(model, real_rows(ref, mask))  # deep tree nodes get accepted
    out = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, tree="dynamic:16",
                         return_dict_in_generate=True, **path)
    assert torch.equal(out.sequences, ref)
    one = model.generate(ids[:1], max_new_tokens=NEW, tree="dynamic:16", return_dict_in_generate=True, **path)
    assert torch.equal(one.sequences, ref1)
    assert max(max(a) for a in out.accept_lengths) >= 3  # decisions at tree depth >= 2 were taken


@pytest.mark.parametrize("path", PATHS + [pytest.param({"compile": True}, marks=pytest.mark.slow)],
                         ids=PATH_IDS + ["compiled"])
def test_hydra_dynamic_greedy_with_repetition_penalty(path):
    model = fitted_stories_heads(num_heads=4, num_layers=1, head_type="hydra")
    enc, pad = stories_left_padded()
    setting = {"repetition_penalty": 1.3, "no_repeat_ngram_size": 4}
    ref = model.base_model.generate(**enc, do_sample=False, max_new_tokens=48, pad_token_id=pad, **setting)
    out = model.generate(enc["input_ids"], attention_mask=enc["attention_mask"], max_new_tokens=48,
                         tree="dynamic:16", return_dict_in_generate=True, **setting, **path)
    assert torch.equal(out.sequences, ref)
    one = model.generate(enc["input_ids"][:1], max_new_tokens=48, tree="dynamic:16", **setting, **path)
    ref1 = model.base_model.generate(enc["input_ids"][:1], do_sample=False, max_new_tokens=48, **setting)
    assert torch.equal(one, ref1)
    assert max(max(a) for a in out.accept_lengths) >= 3


STATIC_SLOW = pytest.param({"cache_implementation": "static"}, marks=pytest.mark.slow)  # ~20 s per run


@pytest.mark.parametrize("path", [{}, STATIC_SLOW], ids=PATH_IDS)
def test_dynamic_sample_with_repetition_penalty_chi_square(path):
    """The law of the first three new tokens under a repetition penalty (from the generation_config), the
    3rd often decided at depth 2 of the first step's per-row tree."""
    base, model = _sampler_model(seed=3)
    base.generation_config.top_k = None
    for key, value in {"repetition_penalty": 0.5, "top_p": 0.9, "top_k": 0}.items():
        setattr(base.generation_config, key, value)
    prompt = torch.tensor([[3, 5, 4, 6]])
    n = 20000
    out = model.generate(prompt.repeat(n, 1), max_new_tokens=4, acceptance="sample", eos_token_id=[],
                         tree="dynamic:40", generator=torch.Generator().manual_seed(99),
                         return_dict_in_generate=True, **path)
    first_step = torch.tensor([a[0] for a in out.accept_lengths])
    assert (first_step == 3).float().mean() > 0.3, first_step.bincount()  # depth-2 decisions taken often
    x = out.sequences[:, 4:7]  # [n, 3]
    cells = (x[:, 0] * V + x[:, 1]) * V + x[:, 2]
    counts = torch.zeros(V ** 3, dtype=torch.float64).index_add_(0, cells, torch.ones(n, dtype=torch.float64))
    assert chi2_pvalue(counts, _exact_joint3(base, prompt).reshape(-1) * n) > 1e-3
    base.generation_config.repetition_penalty = 1.0  # control: the test rejects the unpenalised law
    assert chi2_pvalue(counts, _exact_joint3(base, prompt).reshape(-1) * n, strict=False) < 1e-6
