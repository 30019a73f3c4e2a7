"""One decode step: the step's host result read by hand (new tokens, how far the cache advances), the hidden
state the next proposal reads, and one ``step`` after a prefill equal to the first verification step of
``generate`` (and to HF greedy) on a tiny llama with fitted heads."""

import torch
from decoding_helpers import left_padded_batch, memorise_heads, real_rows

from medusa import MedusaModel
from medusa.decoding.acceptance import greedy_accept
from medusa.decoding.generate import prefill
from medusa.decoding.proposals import StaticProposer, choose_proposer, medusa_tokens
from medusa.decoding.step import StepResult, path_features, step
from medusa.decoding.tree_option import TreeChoice
from medusa.tree import default_tree

from tiny_models import tiny_model


def _greedy(logits, tokens, tree, draft_probs=None):
    """A scorer: the greedy rule (the step hands every scorer the proposal's draft_probs)."""
    return greedy_accept(logits, tokens, tree)


def test_step_result_new_tokens_and_max_kept():
    result = StepResult(tokens=torch.tensor([[7, 8, 9, 3], [5, 1, 2, 3]]),  # [B, D+1], root first
                        kept=torch.tensor([3, 1]),  # row 0: root + 2 accepted; row 1: the root only
                        next_root=torch.tensor([4, 6]),
                        path=torch.tensor([[0, 1, 4, 0], [0, 2, 0, 0]]))
    assert result.new_tokens(0) == [8, 9, 4]  # the accepted nodes after the root, then the next root
    assert result.new_tokens(1) == [6]  # nothing accepted: the next root only
    assert result.max_kept == 3


def test_last_hidden_is_each_rows_last_kept_node():
    hidden = torch.arange(2 * 5 * 3, dtype=torch.float32).view(2, 5, 3)  # [B, N, d]
    path = torch.tensor([[0, 2, 4], [0, 1, 3]])  # [B, D+1]
    on_path, got = path_features(hidden, path, torch.tensor([2, 0]))  # row 0 kept 2 nodes past the root
    assert torch.equal(got, torch.stack([hidden[0, 4], hidden[1, 0]]))
    assert torch.equal(on_path, torch.stack([hidden[0, [0, 2, 4]], hidden[1, [0, 1, 3]]]))  # [B, D+1, d]


def test_one_step_equals_the_first_step_of_generate():
    base = tiny_model("llama")
    ids, mask = left_padded_batch(base.config.vocab_size, seed=11)
    ref = base.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=30, eos_token_id=None)
    model = MedusaModel.from_base(base, num_heads=4)
    memorise_heads(model, real_rows(ref, mask)[:2], steps=30)  # row 2 unknown to the heads
    tree = default_tree(4, 64)
    p = ids.shape[1]
    with torch.no_grad():
        proposer = choose_proposer(model.heads, TreeChoice(static=tree), torch.device("cpu"), torch.float32)
        state = prefill(model, ids, mask, proposer)
        assert isinstance(state.proposer, StaticProposer) and state.proposer.grow is medusa_tokens
        root = state.root.tolist()
        assert root == ref[:, p].tolist()  # the prefill's token: HF's first greedy token
        result = step(model, state, _greedy)
    out = model.generate(ids, attention_mask=mask, max_new_tokens=30, eos_token_id=[], tree=tree,
                         return_dict_in_generate=True)
    assert result.path[:, 0].tolist() == [0, 0, 0] and result.tokens[:, 0].tolist() == root
    for row in range(3):
        new = result.new_tokens(row)
        assert out.accept_lengths[row][0] == len(new) == int(result.kept[row])
        assert out.sequences[row, p:p + 1 + len(new)].tolist() == [root[row]] + new
        assert ref[row, p:p + 1 + len(new)].tolist() == [root[row]] + new  # greedy tokens
    assert result.max_kept >= 3  # deep tree paths accepted in this one step
    assert state.n_valid.tolist() == (mask.sum(-1) + result.kept).tolist()  # the cache advanced by kept
    assert state.root.tolist() == [int(t) for t in result.next_root]
