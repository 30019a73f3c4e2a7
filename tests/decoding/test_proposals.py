"""Proposers: :func:`choose_proposer` picks the proposer (and a static tree's grow function) by head family
and tree kind; each proposal's tokens ``[B, N]`` start with the root, sit in a tree of N nodes and hold the
heads' ranked tokens (MEDUSA: head d's rank at the last kept position; Hydra: conditioned on the path;
dynamic: each row's best paths). Every proposer decodes losslessly: greedy == HF greedy (stories260K with
fitted heads, batch 1 and a left-padded batch of 3; tiny models) and ``acceptance="sample"`` passes the
chi-square test."""

import pytest
import torch
from chi_square import chi2_pvalue, exact_joint
from decoding_helpers import (
    FULL_TREE,
    SAMPLER_VOCAB,
    check_stories_greedy,
    left_padded_batch,
    memorise_heads,
    real_rows,
    sampler_heads,
)

from medusa import MedusaModel, MedusaTree
from medusa.decoding.hydra_candidates import hydra_levels, hydra_propose
from medusa.decoding.processors import warp_logits
from medusa.decoding.proposals import DynamicProposer, StaticProposer, choose_proposer, medusa_tokens
from medusa.decoding.tree_option import DynamicTreeOption, TreeChoice, resolve_dynamic
from medusa.decoding.trees import RowTrees, StaticTree, static_tree

from fit_heads import fitted_stories_heads
from tiny_models import tiny_model

CPU = torch.device("cpu")
# nodes (sorted by depth, then path): 0 (), 1 (0), 2 (1), 3 (2), 4 (0,0), 5 (0,1), 6 (1,0), 7 (0,0,0)
CHOICES = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]]
ROOT = torch.tensor([5, 17])  # [B]
NEW = 96
V = SAMPLER_VOCAB
PARTIAL_TREE = [[0], [1], [2], [0, 0], [0, 1], [1, 0]]


def _model(head_type: str) -> MedusaModel:
    """A tiny llama (vocabulary 96, d 32) with 3 heads whose layers are random (not the LM head's copies)."""
    model = MedusaModel.from_base(tiny_model("llama"), num_heads=3, head_type=head_type)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in model.heads.parameters():
            if p.dim() == 2 and p.shape[0] != model.heads.vocab_size:  # ResBlocks / Hydra input layers
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return model.eval()


def _hidden() -> torch.Tensor:
    return torch.randn(2, 32, generator=torch.Generator().manual_seed(3))  # [B, d]


def _tree(kind: str) -> TreeChoice:
    """A fresh tree choice of ``kind``: static, or dynamic of 10 nodes, depth 3."""
    if kind == "static":
        return TreeChoice(static=MedusaTree.from_choices(CHOICES))
    return TreeChoice(dynamic=resolve_dynamic("dynamic:10", 3))


def _choose(heads, choice, dtype=torch.float32):
    if isinstance(choice, DynamicTreeOption):
        choice = TreeChoice(dynamic=choice)
    return choose_proposer(heads, choice, CPU, dtype)


@pytest.mark.parametrize("kind", ["static", "dynamic"])
@pytest.mark.parametrize("head_type", ["linear", "hydra"])
def test_choose_proposer_by_heads_and_tree(head_type, kind):
    model = _model(head_type)
    choice = _tree(kind)
    proposer = _choose(model.heads, choice)
    assert type(proposer) is (StaticProposer if kind == "static" else DynamicProposer)
    assert proposer.heads is model.heads
    dt = proposer.tree if kind == "static" else proposer.option
    assert dt is (static_tree(choice.static, CPU, torch.float32) if kind == "static" else choice.dynamic)
    if kind == "static":  # MEDUSA top-k or Hydra growth (its plan built once, here: outside compiled code)
        if head_type == "hydra":
            assert proposer.grow.func is hydra_propose
            assert proposer.grow.keywords["levels"] is hydra_levels(dt)
        else:
            assert proposer.grow is medusa_tokens
    with torch.no_grad():
        proposal = proposer.propose(ROOT, _hidden())
    assert proposal.tokens.shape == (2, dt.num_nodes) and proposal.tokens[:, 0].tolist() == ROOT.tolist()
    assert proposal.tree.num_nodes == dt.num_nodes and proposal.draft_probs is None
    mask_shape = (dt.num_nodes,) * 2 if kind == "static" else (2, dt.num_nodes, dt.num_nodes)
    assert tuple(proposal.tree.float_mask.shape) == mask_shape


def test_dynamic_branch_defaults_to_n_minus_1_capped_by_the_vocabulary():
    heads = _model("linear").heads
    assert _choose(heads, _tree("dynamic")).branch == 9
    assert _choose(heads, DynamicTreeOption(num_nodes=10, depth=3, branch=4)).branch == 4
    assert _choose(heads, DynamicTreeOption(num_nodes=200, depth=3)).branch == 96  # the vocabulary


def test_proposer_trees_static_buffers_or_dynamic_settings():
    tree = MedusaTree.from_choices(CHOICES)
    heads = _model("linear").heads
    dt = _choose(heads, TreeChoice(static=tree), torch.bfloat16).tree
    assert isinstance(dt, StaticTree) and dt is static_tree(tree, CPU, torch.bfloat16)
    assert dt.float_mask.dtype == torch.bfloat16 and dt.num_nodes == 8
    dyn = _choose(heads, DynamicTreeOption(num_nodes=12, depth=3), torch.bfloat16)
    assert dyn.option == DynamicTreeOption(num_nodes=12, depth=3) and dyn.dtype == torch.bfloat16


def test_medusa_proposal_holds_each_heads_ranks():
    model, hidden = _model("linear"), _hidden()
    tree = MedusaTree.from_choices(CHOICES)
    proposer = _choose(model.heads, TreeChoice(static=tree))
    with torch.no_grad():
        tokens = proposer.propose(ROOT, hidden).tokens  # [B, N]
        ranked = model.heads(hidden.unsqueeze(1))[:, :, 0].topk(3, dim=-1).indices  # [K, B, 3]
    for i, path in enumerate(tree.paths[1:], start=1):  # node (r1..rd): head d's rank-rd token
        assert tokens[:, i].tolist() == ranked[len(path) - 1, :, path[-1]].tolist(), path
    assert not torch.equal(ranked[0], ranked[1])  # the heads differ: the placement is really checked


def test_hydra_proposal_conditions_each_node_on_its_path():
    model, hidden = _model("hydra"), _hidden()
    heads = model.heads
    tree = MedusaTree.from_choices(CHOICES)
    proposer = _choose(heads, TreeChoice(static=tree))
    with torch.no_grad():
        tokens = proposer.propose(ROOT, hidden).tokens  # [B, N]
        for b in range(2):
            for i, path in enumerate(tree.paths[1:], start=1):
                chain = [int(tokens[b, tree.paths.index(path[:d])]) for d in range(len(path))]  # root..parent
                wide = torch.cat([hidden[b], heads.embed(torch.tensor(chain)).reshape(-1)])
                want = heads.head_logits(len(path) - 1, wide).topk(path[-1] + 1).indices[-1]
                assert int(tokens[b, i]) == int(want), (b, path)


@pytest.mark.parametrize("head_type", ["linear", "hydra"])
def test_dynamic_proposal_is_a_tree_of_n_nodes_per_row(head_type):
    model, hidden = _model(head_type), _hidden()
    heads = model.heads
    with torch.no_grad():
        proposal = _choose(heads, _tree("dynamic")).propose(ROOT, hidden)
        if head_type == "linear":  # the likeliest single token: head 1's argmax at the last kept position
            best = heads(hidden.unsqueeze(1))[0, :, 0].argmax(-1)  # [B]
        else:  # Hydra head 1 on [h, e(root)]
            best = heads.head_logits(0, torch.cat([hidden, heads.embed(ROOT)], dim=-1)).argmax(-1)
    tree, tokens = proposal.tree, proposal.tokens
    assert isinstance(tree, RowTrees) and tree.tokens is tokens and tokens.shape == (2, 10)
    assert tree.depths.shape == tree.parents.shape == (2, 10)
    assert tree.depths[:, 0].tolist() == [0, 0] and bool((tree.depths[:, 1:] >= 1).all())
    assert int(tree.depths.max()) <= 3
    parent_depth = tree.depths.gather(1, tree.parents)  # [B, N]
    assert torch.equal(parent_depth[:, 1:], tree.depths[:, 1:] - 1)  # each node one below its parent
    for b in range(2):
        depth1 = tokens[b][tree.depths[b] == 1].tolist()
        assert int(best[b]) in depth1 and len(set(depth1)) == len(depth1)  # distinct siblings, best among


@pytest.fixture(scope="module")
def hydra():
    return fitted_stories_heads(num_heads=4, num_layers=1, head_type="hydra")


@pytest.fixture(scope="module")
def medusa():
    return fitted_stories_heads(num_heads=4, num_layers=1)


def _check_greedy(model, tree, min_tokens_per_step):
    return check_stories_greedy(model, tree, NEW, min_tokens_per_step)[0].tokens_per_step


@pytest.mark.parametrize("tree", [None, "dynamic:16", DynamicTreeOption(num_nodes=48, branch=8)],
                         ids=["static", "dynamic16", "dynamic48-branch8"])
def test_hydra_greedy_equals_hf(hydra, tree):
    _check_greedy(hydra, tree, 1.8)


@pytest.mark.parametrize("nodes", [8, 32])
def test_medusa_dynamic_tree_greedy_equals_hf(medusa, nodes):
    _check_greedy(medusa, f"dynamic:{nodes}", 1.8)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gemma2"])
@pytest.mark.parametrize("head_type", ["linear", "hydra"])
def test_greedy_tiny_models_static_and_dynamic(arch, head_type):
    base = tiny_model(arch)
    ids, mask = left_padded_batch(base.config.vocab_size, seed=3)
    ref = base.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=40)
    model = MedusaModel.from_base(base, num_heads=3, head_type=head_type)
    # heads fitted to rows 0 and 1 only: those accept whole depth-3 paths, row 2 little (uneven compaction)
    memorise_heads(model, real_rows(ref, mask, base.generation_config.eos_token_id)[:2], steps=150)
    small = MedusaTree.from_choices([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]])
    for tree in (small, "dynamic:10"):
        out = model.generate(ids, attention_mask=mask, max_new_tokens=40, tree=tree,
                             return_dict_in_generate=True)
        assert torch.equal(out.sequences, ref), (head_type, tree)
        assert max(max(a) for a in out.accept_lengths) == 4, out.accept_lengths  # depth-3 paths accepted
        assert out.tokens_per_step > 1.8, out.accept_lengths


@pytest.mark.parametrize("setting", [{"temperature": 1.0, "top_k": 0}, {"temperature": 0.7, "top_k": 4}],
                         ids=["t1", "t0.7-topk4"])
@pytest.mark.parametrize("head_type,tree", [("hydra", FULL_TREE), ("hydra", PARTIAL_TREE),
                                            ("hydra", "dynamic:12"), ("linear", "dynamic:12"),
                                            ("linear", "dynamic:5")])
def test_sample_is_lossless_chi_square(head_type, tree, setting):
    base, model = sampler_heads(head_type)
    prompt = torch.tensor([[3, 5, 4, 6]])
    n = 6000
    g = torch.Generator().manual_seed(1234)
    tree = MedusaTree.from_choices(tree) if isinstance(tree, list) else tree
    out = model.generate(prompt.repeat(n, 1), max_new_tokens=2, acceptance="sample", eos_token_id=[],
                         tree=tree, generator=g, **setting)
    x1, x2 = out[:, 4], out[:, 5]
    counts = torch.zeros(V * V, dtype=torch.float64).index_add_(0, x1 * V + x2,
                                                                torch.ones(n, dtype=torch.float64))
    expected = exact_joint(base, prompt, warp_logits(**setting)).view(-1) * n
    assert chi2_pvalue(counts, expected) > 1e-3


class _Recording:
    """A proposer around ``inner`` that records what the step hands its hooks."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []
        self.num_nodes, self.depth = inner.num_nodes, inner.depth

    def prefill(self, input_ids, attention_mask, features, root):
        self.calls.append(("prefill", input_ids, attention_mask, features, root))
        self.inner.prefill(input_ids, attention_mask, features, root)

    def propose(self, root, hidden):
        return self.inner.propose(root, hidden)

    def observe(self, kept, keep, next_root, features):
        self.calls.append(("observe", kept, keep, next_root, features))
        self.inner.observe(kept, keep, next_root, features)


def test_prefill_and_observe_hooks_get_the_prompt_and_the_kept_paths_features():
    from medusa.decoding.acceptance import greedy_accept
    from medusa.decoding.generate import prefill
    from medusa.decoding.step import step
    from medusa.modeling.base import decoder_of

    model = _model("linear")
    ids, mask = left_padded_batch(V, lengths=(9, 6), seed=4)
    proposer = _Recording(_choose(model.heads, TreeChoice(static=MedusaTree.from_choices(CHOICES))))
    with torch.no_grad():
        state = prefill(model, ids, mask, proposer)
        results = [step(model, state, lambda lg, tk, tr, q=None: greedy_accept(lg, tk, tr)) for _ in range(3)]
    name, got_ids, got_mask, features, root = proposer.calls[0]
    assert name == "prefill" and torch.equal(got_ids, ids) and torch.equal(got_mask, mask.long())
    assert features.shape == (2, ids.shape[1], 32)  # [B, T, F]: every prompt position
    with torch.no_grad():
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        ref = decoder_of(model.base_model)(input_ids=ids, attention_mask=mask,
                                           position_ids=pos).last_hidden_state  # [B, T, d]
    real = mask.bool()
    torch.testing.assert_close(features[real], ref[real])
    assert root.tolist() == results[0].tokens[:, 0].tolist()  # the first step's root
    observed = [c for c in proposer.calls if c[0] == "observe"]
    assert len(observed) == 3 and [c[0] for c in proposer.calls] == ["prefill"] + ["observe"] * 3
    seqs = [ids[b][mask[b].bool()].tolist() for b in range(2)]
    for (_, kept, keep, next_root, feats), result in zip(observed, results):
        assert feats.shape == (2, kept.shape[1], 32)  # [B, D+1, F]
        assert torch.equal(kept.cpu(), result.tokens) and keep.tolist() == result.kept.tolist()
        assert next_root.tolist() == result.next_root.tolist()
        for b in range(2):  # each kept node's features: the base's hidden state after its own prefix
            for j in range(int(keep[b])):
                seqs[b].append(int(kept[b, j]))
                with torch.no_grad():
                    body = decoder_of(model.base_model)
                    h = body(input_ids=torch.tensor([seqs[b]])).last_hidden_state[0, -1]  # [d]
                torch.testing.assert_close(feats[b, j], h, rtol=1e-4, atol=1e-5)


def test_lookup_proposer_records_the_prompt_at_prefill():
    from medusa.decoding.lookup import new_context

    heads = _model("linear").heads
    ids, mask = left_padded_batch(V, lengths=(9, 6), seed=5)
    root = torch.tensor([7, 8])
    proposer = choose_proposer(heads, TreeChoice(static=MedusaTree.from_choices(CHOICES), lookup_tokens=3),
                               CPU, torch.float32, room=20)
    assert proposer.context is None and (proposer.num_nodes, proposer.depth) == (8 + 3, 3 + 3)
    proposer.prefill(ids, mask, torch.zeros(2, ids.shape[1], 32), root)
    want = new_context(ids, mask, root, 20)
    assert torch.equal(proposer.context.tokens, want.tokens) and torch.equal(proposer.context.end, want.end)


@pytest.mark.parametrize("head_type", ["linear", "hydra", "eagle3"])
def test_lookup_wraps_every_family(head_type):
    """A lookup chain is one wrapper (LookupProposer) around whichever proposer the family gets: MEDUSA and
    Hydra heads' static proposer, the sequential drafter's; without a chain the inner proposer is returned."""
    from medusa.decoding.drafter import Drafter, DrafterProposer
    from medusa.decoding.lookup import LookupProposer
    from medusa.tree import DraftTreeShape

    heads = MedusaModel.from_base(tiny_model("llama", layers=4), num_heads=3, head_type=head_type).heads
    drafter = head_type == "eagle3"
    assert isinstance(heads, Drafter) is drafter
    for lookup in (0, 3):
        choice = (TreeChoice(draft=DraftTreeShape(8, 3, 2, 2, lookup_tokens=lookup), lookup_tokens=lookup)
                  if drafter else TreeChoice(static=MedusaTree.from_choices(CHOICES), lookup_tokens=lookup))
        proposer = choose_proposer(heads, choice, CPU, torch.float32, room=20)
        inner = proposer.inner if lookup else proposer
        assert type(proposer) is (LookupProposer if lookup else type(inner))
        assert type(inner) is (DrafterProposer if drafter else StaticProposer)
        assert proposer.num_nodes == inner.num_nodes + lookup and proposer.depth == inner.depth + lookup
