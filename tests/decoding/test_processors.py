"""Logits processors per tree node: greedy MEDUSA equals HF greedy generate for the model's own
generation_config (processors applied per tree node, static trees on several architectures and per-row
dynamic trees on the eager and static paths), finished rows are padded as HF pads them, unsupported settings
are errors naming them, every node of every row's own tree is processed after its own prefix (against a
naive per-node reference), and lossless sampling keeps HF's processed law (chi-square)."""

import pytest
import torch
from chi_square import chi2_pvalue
from decoding_helpers import (
    SAMPLER_VOCAB,
    exact_joint3,
    left_padded_batch,
    memorise_heads,
    real_rows,
    sampler_model,
    stories_left_padded,
)

from medusa import MedusaModel
from medusa.decoding.dynamic_tree import build_step_tree, medusa_children
from medusa.decoding.processors import apply_processors, process_nodes, resolve_generation
from medusa.errors import MedusaError

from fit_heads import fitted_stories_heads
from tiny_models import tiny_model

V = SAMPLER_VOCAB
NEW = 40
ARCHS = ["llama", "qwen2", "gpt_neox"]


def _plain(base, ids, mask):
    return base.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW)[:, ids.shape[1]:]


def _setting(name, plain):
    """A generation_config setting that changes this model's greedy output (derived from its plain output)."""
    row = plain[0].tolist()
    if name == "repetition_penalty":
        return {"repetition_penalty": 1.4}
    if name == "no_repeat_ngram_size":
        return {"no_repeat_ngram_size": 2}
    if name == "min_new_tokens":  # EOS = the 3rd token HF writes: without min_new_tokens it stops at 3
        return {"eos_token_id": row[2], "min_new_tokens": 12}
    if name == "suppress_tokens":
        return {"suppress_tokens": [row[0], row[3]]}
    if name == "begin_suppress_tokens":
        return {"begin_suppress_tokens": [row[0]]}
    if name == "bad_words_ids":
        return {"bad_words_ids": [[row[1], row[2]], [row[5]]]}
    if name == "sequence_bias":  # a bias on a 2-token sequence depends on each node's own last token
        return {"sequence_bias": {(row[1], row[2]): -50.0, (row[4],): -50.0, (row[0], row[6]): 30.0}}
    raise ValueError(name)


SETTINGS = ["repetition_penalty", "no_repeat_ngram_size", "min_new_tokens", "suppress_tokens",
            "begin_suppress_tokens", "bad_words_ids", "sequence_bias"]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", SETTINGS)
def test_greedy_equals_hf_with_generation_config(arch, name):
    base = tiny_model(arch)
    ids, mask = left_padded_batch(base.config.vocab_size, seed=ARCHS.index(arch))
    plain = _plain(base, ids, mask)
    for key, value in _setting(name, plain).items():
        setattr(base.generation_config, key, value)
    ref = base.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW)
    ref1 = base.generate(ids[:1], do_sample=False, max_new_tokens=NEW)
    assert not torch.equal(ref[:, ids.shape[1]:], plain)  # the setting really changes HF's output
    model = MedusaModel.from_base(base, num_heads=4)
    memorise_heads(model, real_rows(ref, mask))  # deep tree nodes get accepted
    out = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, return_dict_in_generate=True)
    assert torch.equal(out.sequences, ref)
    one = model.generate(ids[:1], max_new_tokens=NEW, return_dict_in_generate=True)
    assert torch.equal(one.sequences, ref1)
    assert max(max(a) for a in out.accept_lengths) >= 3  # decisions at tree depth >= 2 were taken
    if name == "min_new_tokens":
        assert ref1.shape[1] - ids.shape[1] > 3


def test_processors_as_arguments_override_generation_config():
    base = tiny_model("llama")
    ids, mask = left_padded_batch(base.config.vocab_size, seed=4)
    base.generation_config.repetition_penalty = 1.4
    ref = base.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW, repetition_penalty=0.8,
                        no_repeat_ngram_size=3)
    model = MedusaModel.from_base(base, num_heads=3)
    memorise_heads(model, real_rows(ref, mask), steps=150)
    out = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, repetition_penalty=0.8,
                         no_repeat_ngram_size=3, return_dict_in_generate=True)
    assert torch.equal(out.sequences, ref)
    assert max(max(a) for a in out.accept_lengths) >= 3
    with pytest.raises(MedusaError, match="unknown generation setting.*repetiton_penalty"):
        model.generate(ids, repetiton_penalty=1.2)


def test_finished_rows_padded_like_hf():
    """generation_config.pad_token_id unset: HF pads finished rows with the first EOS id."""
    base = tiny_model("qwen2")
    ids, mask = left_padded_batch(base.config.vocab_size, seed=7)
    plain = _plain(base, ids, mask)
    eos = [int(plain[0, 4]), int(plain[1, 8])]
    assert eos[0] != eos[1] and eos[0] != 0
    base.generation_config.eos_token_id = eos
    base.generation_config.pad_token_id = None
    ref = base.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW)
    model = MedusaModel.from_base(base, num_heads=4)
    memorise_heads(model, real_rows(ref, mask), steps=150)
    stopped = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, return_dict_in_generate=True)
    out = stopped.sequences
    assert torch.equal(out, ref)
    assert max(max(a) for a in stopped.accept_lengths) >= 3
    assert (out[0, ids.shape[1] + 5:] == eos[0]).all()  # row 0 finished early and is padded with eos[0]
    base.generation_config.pad_token_id = 7  # an explicit pad id wins
    ref = base.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW)
    assert torch.equal(model.generate(ids, attention_mask=mask, max_new_tokens=NEW), ref)


@pytest.mark.parametrize("key,value", [("forced_eos_token_id", 5),
                                       ("num_beams", 2), ("exponential_decay_length_penalty", (4, 1.5)),
                                       ("encoder_repetition_penalty", 1.2), ("guidance_scale", 2.0)])
def test_unsupported_setting_is_named(key, value):
    base = tiny_model("llama")
    model = MedusaModel.from_base(base, num_heads=2)
    setattr(base.generation_config, key, value)
    with pytest.raises(MedusaError, match=key):
        model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=4)
    setattr(base.generation_config, key, None)
    with pytest.raises(MedusaError, match=key):  # as an argument too
        model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=4, **{key: value})


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
    base, model = sampler_model(seed=3)
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
    assert chi2_pvalue(counts, exact_joint3(base, prompt).reshape(-1) * n) > 1e-3
    base.generation_config.repetition_penalty = 1.0  # control: the test rejects the unpenalised law
    assert chi2_pvalue(counts, exact_joint3(base, prompt).reshape(-1) * n, strict=False) < 1e-6


@pytest.mark.parametrize("temperature", [1e-45, 1e-5, float("nan"), float("inf"), 0.0, -1.0, 1e10])
def test_sampling_temperature_out_of_bounds_is_refused_in_the_python_api(temperature):
    """The CLI's --temperature bounds hold for the library too: below 1e-4, logits / T overflow and torch's
    sampler would fail on inf / NaN probabilities; greedy ignores the temperature (as HF does)."""
    from medusa.cli import TEMPERATURE
    from medusa.decoding.processors import MAX_TEMPERATURE, MIN_TEMPERATURE

    assert (TEMPERATURE.lo, TEMPERATURE.hi) == (MIN_TEMPERATURE, MAX_TEMPERATURE)
    base = tiny_model("llama", vocab_size=16)
    ids, mask = left_padded_batch(16, lengths=(3,), seed=0)
    with pytest.raises(MedusaError, match="out of range when sampling"):
        resolve_generation(base, True, ids, mask, temperature=temperature)
    assert resolve_generation(base, False, ids, mask, temperature=temperature) is not None
    low = resolve_generation(base, True, ids, mask, temperature=MIN_TEMPERATURE)
    assert low.temperature == MIN_TEMPERATURE
