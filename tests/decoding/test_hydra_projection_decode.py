"""Hydra heads on the base LM head (``hydra_projection="shared_lm_head"``) and with a draft vocabulary decode
losslessly: greedy == HF greedy ``generate`` (stories260K with fitted heads, a left-padded batch of 3 and
batch 1), on a static tree and a dynamic tree, with long accepted runs."""

import pytest
import torch

from fit_heads import fitted_stories_heads, stories_prompts
from tiny_models import stories_tokenizer

NEW = 96
DRAFT = 160  # of stories260K's 512 ids: the greedy outputs also need ids outside it

SETTINGS = {"shared": ("shared_lm_head", 0), "own-draft": ("own", DRAFT),
            "shared-draft": ("shared_lm_head", DRAFT)}


@pytest.fixture(scope="module", params=list(SETTINGS))
def hydra(request):
    projection, draft = SETTINGS[request.param]
    model = fitted_stories_heads(num_heads=4, num_layers=1, head_type="hydra", hydra_projection=projection,
                                 draft_vocab=draft)
    assert model.config.hydra_projection == projection and model.heads.draft_vocab == draft
    assert (model.heads.lm_heads is None) == (projection == "shared_lm_head")
    return model


def _batch():
    tok = stories_tokenizer()
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.unk_token or tok.eos_token
    enc = tok(stories_prompts(3), return_tensors="pt", padding=True)
    assert (enc["attention_mask"] == 0).any()  # a real left-padded batch
    return enc, tok.pad_token_id


@pytest.mark.parametrize("tree", [None, "dynamic:16"], ids=["static", "dynamic16"])
def test_hydra_projection_greedy_equals_hf(hydra, tree):
    base = hydra.base_model
    enc, pad = _batch()
    ref = base.generate(**enc, do_sample=False, max_new_tokens=NEW, pad_token_id=pad)
    out = hydra.generate(enc["input_ids"], attention_mask=enc["attention_mask"], max_new_tokens=NEW,
                         tree=tree, return_dict_in_generate=True)
    assert torch.equal(out.sequences, ref)
    one = hydra.generate(enc["input_ids"][2:], max_new_tokens=NEW, tree=tree, return_dict_in_generate=True)
    ref1 = base.generate(enc["input_ids"][2:], do_sample=False, max_new_tokens=NEW)
    assert torch.equal(one.sequences, ref1)
    if hydra.heads.token_map is not None:  # the output needs ids the heads cannot propose
        assert not torch.isin(ref[:, enc["input_ids"].shape[1]:], hydra.heads.token_map).all()
    assert max(max(a) for a in out.accept_lengths) >= 4  # long accepted runs: cache compaction exercised
    assert out.tokens_per_step > 1.8 and one.tokens_per_step > 1.8, (out.tokens_per_step, one.tokens_per_step)
