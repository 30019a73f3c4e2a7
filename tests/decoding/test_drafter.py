"""The sequential drafter's proposer (EAGLE-3 heads) through ``model.generate``: greedy output equals HF
greedy ``generate`` (batch 1 and a left-padded batch, with and without the lookup chain) while a fitted
drafter gets several tokens per step; the per-row trees are the best-scored, ancestor-closed node sets;
"sample" acceptance keeps the model's own law with drafts sampled from the drafter (chi-square on tokens 1-3,
which span the first step's tree)."""

import pytest
import torch
from chi_square import chi2_pvalue
from decoding_helpers import SAMPLER_VOCAB, exact_joint3, left_padded_batch

from medusa import MedusaModel
from medusa.modeling.eagle3 import base_features
from medusa.training.eagle3 import ttt_loss
from medusa.tree import DraftTreeShape

from tiny_models import tiny_model


def _fit_drafter(model, sequences: torch.Tensor, steps: int = 200, lr: float = 3e-3) -> MedusaModel:
    """Train the eagle3 heads on ``sequences [R, T]`` (the base's own greedy text) until they predict it."""
    feats = base_features(model.base_model, sequences, None, model.heads.feature_layers)
    opt = torch.optim.Adam(model.heads.parameters(), lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        ttt_loss(model.heads, feats, sequences, sequences, None, decay=0.8).loss.backward()
        opt.step()
    return model.eval()


@pytest.fixture(scope="module")
def fitted():
    """A tiny llama, 4-step eagle3 heads fitted to its greedy continuations of 6 prompts, and the prompts."""
    base = tiny_model("llama", layers=4, seed=2)
    torch.manual_seed(0)
    prompts = torch.randint(3, 96, (6, 5))
    seqs = base.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=40, do_sample=False,
                         eos_token_id=None, pad_token_id=0)
    model = MedusaModel.from_base(base, num_heads=4, head_type="eagle3")
    return _fit_drafter(model, seqs), prompts


@pytest.mark.parametrize("shape", [DraftTreeShape(8, 4, 2, 2), DraftTreeShape(12, 5, 3, 3, lookup_tokens=4),
                                   DraftTreeShape(8, 4, 2, 2, min_prob=0.3),
                                   DraftTreeShape(12, 5, 3, 3, lookup_tokens=4, min_prob=0.3)],
                         ids=["alone", "with-lookup", "pruned", "pruned-with-lookup"])
def test_greedy_equals_hf_batch1_and_accepts(fitted, shape):
    model, prompts = fitted
    base = model.base_model
    gained = []
    for row in range(3):
        ids = prompts[row:row + 1]
        want = base.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
        out = model.generate(ids, max_new_tokens=32, tree=shape, eos_token_id=[],
                             return_dict_in_generate=True)
        assert torch.equal(out.sequences, want)
        gained += list(out.accept_lengths[0])
    assert sum(gained) / len(gained) > 2.0  # the fitted drafter's drafts are accepted, several per step


@pytest.mark.parametrize("min_prob", [0.0, 0.3])
def test_greedy_equals_hf_left_padded_batch(fitted, min_prob):
    model, _ = fitted
    base = model.base_model
    ids, mask = left_padded_batch(96, lengths=(9, 6, 4), seed=5)
    want = base.generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=False, eos_token_id=None,
                         pad_token_id=0)
    got = model.generate(ids, attention_mask=mask, max_new_tokens=24,
                         tree=DraftTreeShape(8, 4, 2, 2, min_prob=min_prob), eos_token_id=[])
    assert torch.equal(got, want)


def test_drafted_tree_is_the_best_closed_set(fitted):
    """Row by row, the drafted nodes' parents precede them, masks are ancestor sets, and no node outside the
    tree scores above the worst node inside it (the pool is what the expansion produced)."""
    from medusa.decoding.drafter import DrafterProposer

    model, prompts = fitted
    shape = DraftTreeShape(10, 4, 3, 2)
    proposer = DrafterProposer(model.heads, shape, torch.float32)
    ids = prompts[:2]
    feats = base_features(model.base_model, ids, None, model.heads.feature_layers)
    root = torch.tensor([7, 9])
    proposer.prefill(ids, torch.ones_like(ids), feats, root)
    length = proposer.context.cache.get_seq_length()
    proposal = proposer.propose(root, feats[:, -1])
    assert proposer.context.cache.get_seq_length() == length  # the drafted entries are dropped again
    tree = proposal.tree
    for b in range(2):
        assert int(proposal.tokens[b, 0]) == int(root[b])
        for i in range(1, shape.num_nodes):
            p = int(tree.parents[b, i])
            assert p < i and int(tree.depths[b, i]) == int(tree.depths[b, p]) + 1
            allowed = {j for j in range(shape.num_nodes) if tree.float_mask[b, i, j] == 0}
            anc, j = {i}, i
            while j:
                j = int(tree.parents[b, j])
                anc.add(j)
            assert allowed == anc
        assert int(tree.depths[b].max()) <= shape.depth


@pytest.mark.parametrize("lookup", [0, 2], ids=["alone", "with-lookup"])
def test_sample_keeps_the_models_law(lookup):
    """20,000 rows sampled with a random (unfitted) drafter: the law of the first three new tokens (the first
    step's tree reaches depth 2, so tokens 2-3 are decided by the tree's acceptance) is the model's own. The
    drafts are sampled from the drafter (a pool of 15 cut to 5 nodes) and accepted with their q; a tree cut
    by the nodes' own sampled scores (not their parents') fails this test; the lookup chain's nodes are
    point masses among them."""
    base = tiny_model("llama", vocab_size=SAMPLER_VOCAB, layers=4, seed=3)
    with torch.no_grad():
        base.lm_head.weight.mul_(0.3)
    base.generation_config.top_k = None
    base.generation_config.temperature = 0.8
    model = MedusaModel.from_base(base, num_heads=3, head_type="eagle3")
    torch.manual_seed(4)
    with torch.no_grad():
        for p in model.heads.parameters():
            p.add_(0.5 * torch.randn_like(p))
    prompt = torch.tensor([[3, 5, 4, 6]])
    n = 20000
    g = torch.Generator().manual_seed(7)
    out = model.generate(prompt.repeat(n, 1), max_new_tokens=4, acceptance="sample", eos_token_id=[],
                         tree=DraftTreeShape(6, 3, 3, 2, lookup_tokens=lookup), generator=g,
                         return_dict_in_generate=True)
    first_step = torch.tensor([a[0] for a in out.accept_lengths])
    assert (first_step >= 2).float().mean() > 0.2  # drafted nodes are accepted in the first step
    x = out.sequences[:, 4:7]
    v = SAMPLER_VOCAB
    cells = (x[:, 0] * v + x[:, 1]) * v + x[:, 2]
    counts = torch.zeros(v ** 3, dtype=torch.float64).index_add_(0, cells, torch.ones(n, dtype=torch.float64))
    assert chi2_pvalue(counts, exact_joint3(base, prompt).reshape(-1) * n) > 1e-3


def test_static_cache_equals_and_compile_refused(fitted):
    from medusa.errors import MedusaError

    model, prompts = fitted
    ids = prompts[3:4]
    want = model.base_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16,
                                     do_sample=False, eos_token_id=None, pad_token_id=0)
    got = model.generate(ids, max_new_tokens=16, tree=DraftTreeShape(8, 4, 2, 2), eos_token_id=[],
                         cache_implementation="static")
    assert torch.equal(got, want)
    with pytest.raises(MedusaError, match="compile=True: not available for eagle3"):
        model.generate(ids, max_new_tokens=4, compile=True)
    with pytest.raises(MedusaError, match="draft their own tree"):
        model.generate(ids, max_new_tokens=4, tree="dynamic")


def test_sampled_drafts_q_r_stay_finite_when_q_underflows_to_one_hot(fitted):
    """At a low temperature the fitted drafter's q is one-hot in float32 (every other token's probability
    underflows): each later child's q_r (q without the earlier siblings) is still a distribution, zero on
    those siblings (renormalising the underflowed q gave 0 / 0 = NaN and "sample" decoding crashed)."""
    from medusa.decoding.draft_sampling import DraftSampling
    from medusa.decoding.drafter import DrafterProposer

    model, prompts = fitted
    shape = DraftTreeShape(8, 3, 3, 2)
    proposer = DrafterProposer(model.heads, shape, torch.float32,
                              sampling=DraftSampling(0.005, torch.Generator().manual_seed(0)))
    ids = prompts[:2]
    feats = base_features(model.base_model, ids, None, model.heads.feature_layers)
    root = ids[:, -1]
    proposer.prefill(ids, torch.ones_like(ids), feats, root)
    proposal = proposer.propose(root)
    q, tree = proposal.draft_probs, proposal.tree  # [B, N, V]
    assert torch.isfinite(q).all() and torch.allclose(q[:, 1:].sum(-1), torch.ones(2, shape.num_nodes - 1))
    for b in range(2):
        for node in range(shape.num_nodes):
            kids = [int(k) for k in tree.children[b, node] if k >= 0]
            for r, kid in enumerate(kids):
                assert all(float(q[b, kid, proposal.tokens[b, k]]) == 0.0 for k in kids[:r])


def _very_sure(base, a: int, b: int, gap: float) -> MedusaModel:
    """Eagle3 heads whose draft logits are the same at every node: token ``a`` at log-probability exactly
    0.0, ``b`` ``gap`` nats below, every other token 60 nats below (the layer's output is the attention's
    output bias, a constant; the LM head reads its normed direction)."""
    model = MedusaModel.from_base(base, num_heads=4, head_type="eagle3")
    heads, layer = model.heads, model.heads.layers[0]
    with torch.no_grad():
        for w in (heads.fc.weight, layer.self_attn.o_proj.weight, layer.mlp.down_proj.weight):
            w.zero_()
        c = torch.randn(heads.hidden_size, generator=torch.Generator().manual_seed(1))
        layer.self_attn.o_proj.bias.copy_(c)
        u = heads.norm(c.view(1, -1)).view(-1)  # the normed output's direction, whatever g's scale
        heads.lm_head.weight.zero_()
        heads.lm_head.weight[a] = u * 60.0 / u.dot(u)
        heads.lm_head.weight[b] = u * (60.0 - gap) / u.dot(u)
    return model.eval()


SURE_SHAPES = [DraftTreeShape(4, 2, 2, 2), DraftTreeShape(4, 2, 3, 2), DraftTreeShape(5, 3, 2, 2),
               DraftTreeShape(8, 4, 2, 2)]


@pytest.mark.parametrize("gap", [16.5, 17.0, 20.0])
def test_very_sure_drafter_keeps_no_child_without_its_parent(gap):
    """A drafter sure of its token (log-probability exactly 0.0): a child's score equals its parent's, and the
    old float32 ``score - 1e-6 * level`` rank lost the tie-break past |score| >= 16, so ``topk`` kept a child
    whose parent it dropped (an orphan hung from the root at the wrong depth)."""
    from medusa.decoding.drafter import DrafterProposer

    base = tiny_model("llama", layers=4, seed=2, attention_bias=True)
    model = _very_sure(base, 44, 45, gap)
    ids = torch.tensor([[5, 17, 44, 9, 30]])
    feats = base_features(base, ids, None, model.heads.feature_layers)
    for shape in SURE_SHAPES:
        proposer = DrafterProposer(model.heads, shape, torch.float32)
        root = torch.tensor([44])
        proposer.prefill(ids, torch.ones_like(ids), feats, root)
        tree = proposer.propose(root).tree
        for i in range(1, shape.num_nodes):
            assert int(tree.depths[0, i]) == int(tree.depths[0, tree.parents[0, i]]) + 1, (shape, i)


def test_very_sure_drafter_greedy_equals_hf():
    """Greedy output with a drafter sure of the tokens the base emits (gap 17 nats) is HF greedy's."""
    base = tiny_model("llama", layers=4, seed=2, attention_bias=True)
    torch.manual_seed(0)
    prompts = torch.randint(3, 96, (4, 5))
    want = base.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=10, do_sample=False,
                         eos_token_id=None, pad_token_id=0)
    for row in range(4):
        for a in want[row, 7:9].tolist():
            model = _very_sure(base, a, (a + 1) % 96, 17.0)
            for shape in SURE_SHAPES[:3]:
                got = model.generate(prompts[row:row + 1], max_new_tokens=10, tree=shape, eos_token_id=[])
                assert torch.equal(got, want[row:row + 1]), (row, a, shape)


@pytest.mark.parametrize("depth, branch, expand", [(2, 2, 2), (3, 3, 2), (3, 2, 3)])
def test_greedy_at_the_largest_tree_the_pool_allows(fitted, depth, branch, expand):
    """num_nodes = every drafted candidate + the root (the shape's exact bound): decodes, equal to HF."""
    model, prompts = fitted
    ids = prompts[:1]
    pool = DraftTreeShape(2, depth, branch, expand).pool_size  # (3, 2, 3): 12, not 2 + 2*3*2
    want = model.base_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12,
                                     do_sample=False, eos_token_id=None, pad_token_id=0)
    got = model.generate(ids, max_new_tokens=12, tree=DraftTreeShape(pool + 1, depth, branch, expand),
                         eos_token_id=[])
    assert torch.equal(got, want)
