"""Hydra heads on the base LM head (``hydra_projection="shared_lm_head"``) and with a draft vocabulary decode
losslessly: greedy == HF greedy ``generate`` (stories260K with fitted heads, a left-padded batch of 3 and
batch 1), on a static tree and a dynamic tree, with long accepted runs."""

import pytest
import torch
from decoding_helpers import check_stories_greedy

from fit_heads import fitted_stories_heads

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


@pytest.mark.parametrize("tree", [None, "dynamic:16"], ids=["static", "dynamic16"])
def test_hydra_projection_greedy_equals_hf(hydra, tree):
    out, ref, enc = check_stories_greedy(hydra, tree, NEW)
    if hydra.heads.token_map is not None:  # the output needs ids the heads cannot propose
        assert not torch.isin(ref[:, enc["input_ids"].shape[1]:], hydra.heads.token_map).all()
