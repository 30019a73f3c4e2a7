"""The real chat model (SmolLM2-135M-Instruct, converted from the pinned PyPI wheel): greedy MEDUSA equals
HF greedy through EOS on chat prompts, batch 1 and 2, with heads fitted so that tree paths are accepted.

The converted model is prepared by ``make test`` (``python -m medusa.modeling.packaged_models``); outside CI
the tests skip when it is absent, in CI (MEDUSA_REQUIRE_SHARED=1) its absence fails.
"""

from __future__ import annotations

import pytest
import torch
from decoding_helpers import memorise_heads, real_rows
from real_models import smollm2_dir

from medusa import MedusaModel

PROMPTS = ["What is the capital of France?", "Write a Python function that reverses a string."]


@pytest.fixture(scope="module")
def chat():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = smollm2_dir()
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    messages = [[{"role": "user", "content": p}] for p in PROMPTS]
    batch = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                          return_dict=True, padding=True)
    with torch.no_grad():
        ref = base.generate(**batch, max_new_tokens=40, do_sample=False)  # [2, P + new], EOS-padded rows
    model = MedusaModel.from_base(base, num_heads=3, num_layers=1, head_type="shared_lm_head")
    eos = base.generation_config.eos_token_id
    memorise_heads(model, real_rows(ref, batch["attention_mask"], eos), steps=60)
    return model, tokenizer, batch, ref


def test_model_is_the_chat_model(chat):
    model, tokenizer, _, _ = chat
    assert tokenizer.chat_template and tokenizer.eos_token == "<|im_end|>"
    assert model.base_model.generation_config.eos_token_id == 2
    assert model.base_model.config.vocab_size == 49152


@pytest.mark.parametrize("row", [0, 1])
def test_greedy_equals_hf_through_eos_batch_1(chat, row):
    model, tokenizer, batch, ref = chat
    mask = batch["attention_mask"][row].bool()
    ids = batch["input_ids"][row][mask].view(1, -1)
    expected = real_rows(ref[row: row + 1], batch["attention_mask"][row: row + 1],
                         model.base_model.generation_config.eos_token_id)[0]
    out = model.generate(ids, max_new_tokens=40, return_dict_in_generate=True)
    assert torch.equal(out.sequences[0], expected)
    assert max(out.accept_lengths[0]) >= 3  # the fitted heads were accepted: tree paths, not only the root


def test_greedy_equals_hf_through_eos_batch_2(chat):
    model, _, batch, ref = chat
    out = model.generate(batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=40,
                         return_dict_in_generate=True)
    assert torch.equal(out.sequences, ref)  # left padding, the row that stops at EOS padded like HF's
    assert all(max(a) >= 3 for a in out.accept_lengths)  # tree paths accepted in both rows
