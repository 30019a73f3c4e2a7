"""medusa/decoding/plain.py: ``tree="plain"`` decodes with no drafts -- one token per step, exactly HF
greedy -- whatever the heads, and refuses a lookup chain."""

import pytest
import torch

from medusa import MedusaModel
from medusa.decoding.plain import PlainProposer
from medusa.decoding.tree_option import PLAIN_TREE, resolve_tree, tree_option
from medusa.decoding.trees import root_only_tree
from medusa.errors import MedusaError

from tiny_models import tiny_model


@pytest.mark.parametrize("head_type", ["linear", "hydra"])
def test_plain_is_hf_greedy_one_token_per_step(head_type):
    torch.manual_seed(0)
    model = MedusaModel.from_base(tiny_model("llama"), num_heads=2, head_type=head_type).eval()
    prompt = torch.tensor([[1, 5, 9, 2, 7]])
    with torch.no_grad():
        ref = model.base_model.generate(prompt, max_new_tokens=12, do_sample=False)
    out = model.generate(prompt, max_new_tokens=12, tree="plain", return_dict_in_generate=True)
    assert torch.equal(out.sequences, ref)
    assert out.accept_lengths[0] == [1] * 11 and out.num_steps == 11  # the prefill gave the first token


def test_plain_proposer_proposes_the_root_alone():
    proposer = PlainProposer(root_only_tree(torch.device("cpu"), torch.float32))
    proposal = proposer.propose(torch.tensor([4, 8]), torch.zeros(2, 3))
    assert proposer.num_nodes == 1 and proposer.depth == 0
    assert proposal.tokens.tolist() == [[4], [8]] and proposal.draft_probs is None


def test_plain_takes_no_lookup_chain():
    model = MedusaModel.from_base(tiny_model("llama"), num_heads=2)
    assert resolve_tree(model, PLAIN_TREE, 0).plain
    with pytest.raises(MedusaError, match="no drafts"):
        resolve_tree(model, PLAIN_TREE, 3)
    assert tree_option("plain") == PLAIN_TREE
    with pytest.raises(MedusaError, match="--tree plain"):
        tree_option("plain", lookup_tokens=2)
