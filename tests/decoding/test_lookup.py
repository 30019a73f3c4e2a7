"""Lookup drafts and the hybrid tree (medusa.decoding.lookup): the device lookup on hand-made contexts, the
merge of the chain into the heads' tree, greedy == HF ``generate`` (torch.equal) with the hybrid tree and
with the lookup chain alone (batch 1 and a left-padded batch of 3, on eager / static / compiled paths), the
sampling law with a lookup branch (chi-square over 3 tokens, with a lossy control that it rejects) and one
compilation per (batch, nodes, L, cache bucket)."""

import pytest
import torch
from chi_square import chi2_pvalue
from decoding_helpers import FITTED_NEW, SAMPLER_VOCAB, exact_joint3, fitted_llama, sampler_model
from sampling_law import patch_sample_accept, sample_accept_variant

from medusa import MedusaModel, MedusaTree
from medusa.decoding.lookup import hybrid_tree, lookup_chain, merge_point, new_context, observe
from medusa.decoding.trees import static_tree
from medusa.errors import MedusaError

from tiny_models import tiny_model

CPU = torch.device("cpu")
V = SAMPLER_VOCAB


def _context(rows, room=16):
    """A LookupContext from right-aligned token lists (the last token of each list is the root)."""
    p = max(len(r) for r in rows) - 1
    ids = torch.zeros(len(rows), p, dtype=torch.long)
    mask = torch.zeros(len(rows), p, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, p - len(r) + 1:] = torch.tensor(r[:-1])
        mask[i, p - len(r) + 1:] = 1
    return new_context(ids, mask, torch.tensor([r[-1] for r in rows]), room)


def test_lookup_chain_longest_most_recent_match():
    ctx = _context([
        [5, 6, 7, 1, 5, 6, 8, 2, 6, 7, 3, 5, 6],  # "5 6": latest earlier occurrence at 4 -> 8 2 6 7 3
        [1, 2, 3, 9, 2, 3, 4, 1, 2, 3],  # "1 2 3" (n = 3) beats the later "2 3" -> 9 2 3 4 1
        [4, 5, 6, 7],  # no earlier occurrence of anything: no chain
        [7, 8, 7],  # a 1-gram: "7" at 0 -> 8 7 (then the context ends)
    ])
    chain, valid = lookup_chain(ctx, 5)
    assert chain[0].tolist() == [8, 2, 6, 7, 3] and valid[0].all()
    assert chain[1].tolist() == [9, 2, 3, 4, 1] and valid[1].all()
    assert not valid[2].any() and chain[2].tolist() == [0] * 5
    assert valid[3].tolist() == [True, True, False, False, False] and chain[3, :2].tolist() == [8, 7]


def test_observe_appends_the_kept_tokens_and_the_next_root():
    ctx = _context([[1, 2, 3], [4, 5, 6]])
    kept = torch.tensor([[3, 7, 8, 9], [6, 1, 1, 1]])  # path tokens, root first
    observe(ctx, kept, torch.tensor([3, 1]), torch.tensor([10, 11]))
    assert ctx.end.tolist() == [6, 4]
    assert ctx.tokens[0, :6].tolist() == [1, 2, 3, 7, 8, 10]
    assert ctx.tokens[1, :4].tolist() == [4, 5, 6, 11] and ctx.tokens[1, 4].item() == -1


def test_chain_merges_into_the_heads_path_it_follows():
    tree = MedusaTree.from_choices([[0], [1], [0, 0], [0, 1]])  # root, a, b, a-a, a-b
    heads = static_tree(tree, CPU, torch.float32)
    head_tokens = torch.tensor([[9, 20, 21, 30, 31], [9, 20, 21, 30, 31]])  # node tokens (root 9)
    chain = torch.tensor([[20, 31, 40, 41, 42], [50, 51, 52, 53, 54]])  # row 0 follows a then a-b
    valid = torch.ones(2, 5, dtype=torch.bool)
    node, m = merge_point(head_tokens, heads, chain, valid)
    assert node.tolist() == [4, 0] and m.tolist() == [2, 0]
    step = hybrid_tree(head_tokens, heads, chain, valid, 3)
    assert step.tokens[0, 5:].tolist() == [40, 41, 42] and step.tokens[1, 5:].tolist() == [50, 51, 52]
    assert step.parents[0, 5:].tolist() == [4, 5, 6] and step.depths[0, 5:].tolist() == [3, 4, 5]
    assert step.parents[1, 5:].tolist() == [0, 5, 6] and step.depths[1, 5:].tolist() == [1, 2, 3]
    assert step.children[0, 4].tolist()[:1] == [5]  # the chain hangs from a-b (it had no children)
    allowed = step.float_mask[0] == 0  # [N, N]: node 7 sees root, a, a-b and the chain above it
    assert allowed[7].nonzero().view(-1).tolist() == [0, 1, 4, 5, 6, 7]
    # trim (the eager CPU path): the chain cut to the rows' longest valid one; None when no row has one
    cut = valid.clone()
    cut[0, 4:] = False  # row 0: chain tokens 2..3 (after the merged 2) valid, so 2 nodes
    cut[1, 1:] = False  # row 1: 1 node
    trimmed = hybrid_tree(head_tokens, heads, chain, cut, 3, trim=True)
    assert trimmed.num_nodes == 7 and trimmed.tokens[0, 5:].tolist() == [40, 41]
    assert hybrid_tree(head_tokens, heads, chain, torch.zeros_like(valid), 3, trim=True) is None
    # An invalid chain node is in no candidate path and no node's child.
    valid[1, 1:] = False
    step = hybrid_tree(head_tokens, heads, chain, valid, 3)
    assert step.children[1, 5].tolist() == [-1] * 3  # node 6 (invalid) is not node 5's child
    assert step.retrieve_valid[1, 6].tolist() == [True, False, False, False, False]  # its path stops at 5


@pytest.fixture(scope="module")
def fitted():
    return fitted_llama()


@pytest.mark.parametrize("path", [{}, {"cache_implementation": "static"}], ids=["dynamic-cache", "static"])
@pytest.mark.parametrize("tree,lookup", [(None, 4), ("lookup", 6)], ids=["hybrid", "lookup-alone"])
def test_greedy_equals_hf_generate(fitted, path, tree, lookup):
    model, ids, mask, ref, ref1 = fitted
    out = model.generate(ids, attention_mask=mask, max_new_tokens=FITTED_NEW, tree=tree, lookup_tokens=lookup,
                         return_dict_in_generate=True, **path)
    assert torch.equal(out.sequences, ref)
    one = model.generate(ids[:1], max_new_tokens=FITTED_NEW, tree=tree, lookup_tokens=lookup,
                         return_dict_in_generate=True, **path)
    assert torch.equal(one.sequences, ref1)
    assert one.tokens_per_step > 1.5, one.accept_lengths


def test_hybrid_beats_heads_alone_where_the_context_repeats(fitted):
    """A prompt that repeats itself: the lookup chain is accepted from the first step, and the hybrid
    gains more per step than the heads alone on the same rows."""
    model = fitted[0]
    base = model.base_model
    g = torch.Generator().manual_seed(3)
    rows = [torch.randint(3, base.config.vocab_size, (k,), generator=g).repeat(3) for k in (8, 5, 7)]
    width = max(len(r) for r in rows)
    ids = torch.zeros(3, width, dtype=torch.long)  # left-padded
    mask = torch.zeros(3, width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = r
        mask[i, width - len(r):] = 1
    ref = base.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=32)
    heads = model.generate(ids, attention_mask=mask, max_new_tokens=32, lookup_tokens=0,
                           return_dict_in_generate=True)
    hybrid = model.generate(ids, attention_mask=mask, max_new_tokens=32, lookup_tokens=6,
                            return_dict_in_generate=True)
    alone = model.generate(ids, attention_mask=mask, max_new_tokens=32, lookup_tokens=6, tree="lookup",
                           return_dict_in_generate=True)
    for out in (heads, hybrid, alone):
        assert torch.equal(out.sequences, ref)
    assert alone.tokens_per_step > 1.5 and hybrid.tokens_per_step >= heads.tokens_per_step


def test_lookup_alone_with_random_heads():
    """Heads that are never right: lookup alone and the hybrid still return HF's greedy tokens."""
    base = tiny_model("llama")
    model = MedusaModel.from_base(base, num_heads=3)
    g = torch.Generator().manual_seed(5)
    prompt = torch.randint(3, base.config.vocab_size, (1, 12), generator=g).repeat(1, 3)
    ref = base.generate(prompt, do_sample=False, max_new_tokens=40)
    for kw in ({"tree": "lookup", "lookup_tokens": 5}, {"lookup_tokens": 3}):
        out = model.generate(prompt, max_new_tokens=40, return_dict_in_generate=True, **kw)
        assert torch.equal(out.sequences, ref)
    assert out.tokens_per_step > 1.0


def test_lookup_settings_errors(fitted):
    model, ids = fitted[0], fitted[1]
    with pytest.raises(MedusaError, match="lookup_tokens >= 1"):
        model.generate(ids[:1], max_new_tokens=4, tree="lookup")
    with pytest.raises(MedusaError, match="integer >= 0"):
        model.generate(ids[:1], max_new_tokens=4, lookup_tokens=-1)
    with pytest.raises(MedusaError, match="static tree"):
        model.generate(ids[:1], max_new_tokens=4, lookup_tokens=2, tree="dynamic:8")


def test_tree_json_lookup_tokens_is_the_default(fitted, tmp_path):
    model, ids, _, _, ref1 = fitted
    tree = MedusaTree.from_choices([[0], [1], [0, 0], [0, 0, 0]], lookup_tokens=5)
    tree.to_json(tmp_path / "tree.json")
    loaded = MedusaTree.from_json(tmp_path / "tree.json")
    assert loaded.lookup_tokens == 5
    out = model.generate(ids[:1], max_new_tokens=FITTED_NEW, tree=loaded, return_dict_in_generate=True)
    assert torch.equal(out.sequences, ref1)
    assert out.num_steps < model.generate(ids[:1], max_new_tokens=FITTED_NEW, tree=loaded, lookup_tokens=0,
                                          return_dict_in_generate=True).num_steps + 1


# ------------------------------------------------------------------------------------ the sampling law
PROMPT = torch.tensor([[3, 5, 4, 6, 3, 5, 4, 6, 3, 5]])  # repeats itself: the chain proposes "4 6 3 ..."
PARTIAL = MedusaTree.from_choices([[0], [1], [0, 0]])
N_SAMPLES = 12000
OVER_ACCEPT = ("u * p.sum(dim=-1) < p_tok", "u * p.sum(dim=-1) < 2 * p_tok")  # a lossy acceptance ratio


@pytest.fixture(scope="module")
def sampler():
    base, model = sampler_model(seed=3)
    base.generation_config.temperature = 0.3  # sharper: the chain's tokens are accepted more often
    return base, model, exact_joint3(base, PROMPT).reshape(-1) * N_SAMPLES


def _joint3_counts(model, seed, **kw):
    g = torch.Generator().manual_seed(seed)
    out = model.generate(PROMPT.repeat(N_SAMPLES, 1), max_new_tokens=4, acceptance="sample", eos_token_id=[],
                         generator=g, return_dict_in_generate=True, **kw)
    x = out.sequences[:, PROMPT.shape[1]:PROMPT.shape[1] + 3]  # [n, 3]
    cells = (x[:, 0] * V + x[:, 1]) * V + x[:, 2]
    counts = torch.zeros(V ** 3, dtype=torch.float64).index_add_(0, cells,
                                                                 torch.ones(N_SAMPLES, dtype=torch.float64))
    return counts, torch.tensor([a[0] for a in out.accept_lengths])


@pytest.mark.parametrize("tree", ["lookup", PARTIAL], ids=["lookup-alone", "hybrid"])
def test_sample_with_a_lookup_branch_is_lossless(sampler, tree):
    """The law of the first 3 new tokens (the 2nd and 3rd decided by the first step's tree, which holds a
    lookup chain of 3) equals HF's sampling law."""
    _, model, expected = sampler
    counts, first_step = _joint3_counts(model, 7, tree=tree, lookup_tokens=3)
    assert (first_step >= 2).float().mean() > 0.08  # drafts (lookup tokens included) are accepted often
    assert chi2_pvalue(counts, expected) > 1e-3


def test_the_law_rejects_a_lossy_sampler_with_a_lookup_branch(sampler, monkeypatch):
    """Control: the lookup chain alone, its drafts accepted twice as often as recursive rejection sampling
    accepts them (a lossy rule): the same statistic rejects it."""
    _, model, expected = sampler
    assert patch_sample_accept(monkeypatch, sample_accept_variant(*OVER_ACCEPT)) >= 1
    counts, _ = _joint3_counts(model, 7, tree="lookup", lookup_tokens=3)
    assert chi2_pvalue(counts, expected, strict=False) < 1e-6


# ------------------------------------------------------------------------------------ compiled
def _graphs() -> int:
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


@pytest.mark.slow  # two tree shapes x three compiled functions (~60 s on 2 shared cores)
def test_compiled_once_per_tree_shape(fitted):
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    try:
        model, ids, mask, ref, ref1 = fitted
        first = model.generate(ids, attention_mask=mask, max_new_tokens=FITTED_NEW, compile=True,
                               lookup_tokens=4, return_dict_in_generate=True)
        per_shape = _graphs()
        assert torch.equal(first.sequences, ref) and first.num_steps > 5
        assert torch._dynamo.utils.counters["graph_break"] == {}
        again = model.generate(ids, attention_mask=mask, max_new_tokens=FITTED_NEW, compile=True,
                               lookup_tokens=4, return_dict_in_generate=True)
        assert _graphs() == per_shape and torch.equal(again.sequences, ref)  # same shapes: reused
        other = model.generate(ids, attention_mask=mask, max_new_tokens=FITTED_NEW, compile=True,
                               tree="lookup", lookup_tokens=4, return_dict_in_generate=True)
        assert _graphs() == 2 * per_shape and torch.equal(other.sequences, ref)  # new (nodes, L): once
    finally:
        torch._dynamo.reset()


class _Unbuilt:
    """A grower's nodes whose tables must not be built (the wrapper builds the merged tree once)."""

    def __init__(self, nodes):
        self.tokens, self.parents, self.depths = nodes.tokens, nodes.parents, nodes.depths
        self.depth, self.kmax, self.dtype = nodes.depth, nodes.kmax, nodes.dtype

    def build(self):
        raise AssertionError("the inner proposal's tree was built: the step's tree is built twice")


class _RowGrower:
    """An inner proposer with a per-row tree (root -> 11 -> 12, root -> 13), as a drafter returns it."""

    num_nodes, depth = 4, 2

    def prefill(self, *args):
        pass

    def observe(self, *args):
        pass

    def propose(self, root, hidden):
        from medusa.decoding.trees import Proposal, TreeNodes

        b = root.shape[0]
        tokens = torch.cat([root.view(b, 1), torch.tensor([[11, 13, 12]]).expand(b, 3)], dim=1)
        nodes = TreeNodes(tokens, torch.tensor([[0, 0, 0, 1]]).expand(b, 4),
                          torch.tensor([[0, 1, 1, 2]]).expand(b, 4), 2, 2, torch.float32)
        return Proposal(tokens, None, None, nodes=_Unbuilt(nodes))


def test_lookup_proposer_merges_into_a_growers_nodes_and_builds_once():
    """LookupProposer around a per-row grower: the chain (11 12 7 8 after "5 11 12 7 8 ... 5") merges at the
    grower's node 12 (path 11 -> 12) and hangs its rest from there; the inner tree is never built."""
    from medusa.decoding.lookup import LookupProposer

    proposer = LookupProposer(_RowGrower(), lookup_tokens=2, room=8)
    ids = torch.tensor([[5, 11, 12, 7, 8, 9]])
    proposer.prefill(ids, torch.ones_like(ids), torch.zeros(1, 6, 4), torch.tensor([5]))
    proposal = proposer.propose(torch.tensor([5]), torch.zeros(1, 4))
    tree = proposal.tree
    assert proposal.tokens[0].tolist() == [5, 11, 13, 12, 7, 8]
    assert tree.parents[0].tolist() == [0, 0, 0, 1, 3, 4] and tree.depths[0].tolist() == [0, 1, 1, 2, 3, 4]
    assert (proposer.num_nodes, proposer.depth) == (6, 4)
