"""Greedy MEDUSA equals HF greedy generate for the model's own generation_config (logits processors applied
per tree node), finished rows are padded as HF pads them, and unsupported settings are errors."""

import pytest
import torch
from decoding_helpers import left_padded_batch, memorise_heads, real_rows

from medusa import MedusaModel
from medusa.errors import MedusaError

from tiny_models import tiny_model

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
