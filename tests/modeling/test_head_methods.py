"""The methods every head family shares (medusa/modeling/head_methods.py), on both families."""

import pytest
import torch

from medusa.modeling import head_methods
from medusa.modeling.heads import MedusaHeads
from medusa.modeling.hydra import HydraHeads


def _families():
    torch.manual_seed(0)
    return [MedusaHeads(8, 20, 2, 1), HydraHeads(8, 20, 2, 1, embedding=torch.nn.Embedding(20, 8))]


@pytest.mark.parametrize("index", [0, 1], ids=["medusa", "hydra"])
def test_shared_methods_are_the_one_implementation(index):
    heads = _families()[index]
    for name in ("set_token_map", "target_to_draft", "to_target", "to_target_logits", "head_logits",
                 "head_topk"):
        assert getattr(type(heads), name) is getattr(head_methods, name)
    assert heads.draft_vocab == 0 and heads.target_to_draft() is None
    ids = torch.tensor([[3, 7]])
    assert torch.equal(heads.to_target(ids), ids)  # full vocabulary: identity


@pytest.mark.parametrize("index", [0, 1], ids=["medusa", "hydra"])
def test_head_topk_with_a_draft_vocabulary_maps_back_to_target_ids(index):
    heads = _families()[index]
    token_map = torch.tensor([2, 5, 11, 17])
    heads.restrict_vocab(token_map)
    width = heads.hidden_size * 2 if index else heads.hidden_size  # Hydra head 0 reads [h, e(root)]
    x = torch.randn(3, width)
    draft = heads.head_logits(0, x)  # [3, 4] over the draft vocabulary
    assert draft.shape == (3, 4)
    top = heads.head_topk(0, x, 2)  # [3, 2] target ids
    assert torch.equal(top, token_map[draft.topk(2, dim=-1).indices])
    full = heads.to_target_logits(draft)  # [3, 20]: -inf outside the draft vocabulary
    assert torch.isinf(full[:, 0]).all() and torch.equal(full[:, token_map], draft)
    assert heads.target_to_draft()[token_map].tolist() == [0, 1, 2, 3]
    # n > N falls back to the -inf-filled target logits
    assert heads.head_topk(0, x, 6).shape == (3, 6)
