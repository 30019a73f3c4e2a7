"""Acceptance rules against hand-computed cases, and lossless sampling by chi-square tests."""

import math

import pytest
import torch
from chi_square import chi2_pvalue, exact_joint
from decoding_helpers import FULL_TREE, SAMPLER_VOCAB, exact_joint3, sampler_model

from medusa import MedusaTree
from medusa.decoding.acceptance import first_max, greedy_accept, sample_accept, typical_accept
from medusa.decoding.processors import warp_logits
from medusa.decoding.trees import static_tree

CPU = torch.device("cpu")


def _logits_from_probs(rows):
    return torch.log(torch.tensor(rows, dtype=torch.float32)).unsqueeze(0)  # [1, N, V]


def test_greedy_accept_longest_matching_path():
    tree = MedusaTree.from_choices([[0], [1], [0, 0], [1, 0]])  # nodes (), (0), (1), (0,0), (1,0)
    dt = static_tree(tree, CPU, torch.float32)
    v = 6
    argmax = [2, 4, 1, 5, 0]  # base argmax at each node
    logits = torch.nn.functional.one_hot(torch.tensor([argmax]), v).float()  # [1, N, V]
    tokens = torch.tensor([[9 % v, 3, 2, 4, 1]])  # node (1) carries 2 == argmax at root; (1,0) carries 1
    path, n, nxt = greedy_accept(logits, tokens, dt)
    assert n.tolist() == [2] and path[0, :3].tolist() == [0, 2, 4] and nxt.tolist() == [argmax[4]]
    tokens = torch.tensor([[0, 3, 5, 4, 1]])  # nothing matches: only the root is kept
    path, n, nxt = greedy_accept(logits, tokens, dt)
    assert n.tolist() == [0] and nxt.tolist() == [2]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_first_max_is_argmax_ties_and_nan_included(dtype):
    gen = torch.Generator().manual_seed(0)
    for vocab in (2, 7, 1000, 49152):
        x = torch.randint(-2, 3, (3, 4, vocab), generator=gen).to(dtype)  # many ties: the first one counts
        x[0, 1, vocab // 2] = float("nan")  # argmax takes a NaN as the maximum
        x[2, 3] = 1.0  # a row of equal values: index 0
        assert torch.equal(first_max(x), x.argmax(dim=-1))
    assert first_max(torch.tensor([[1.0, 3.0, 3.0]])).tolist() == [1]


def test_typical_accept_hand_computed():
    # nodes: 0 (), 1 (0), 2 (1), 3 (0,0); vocab 4
    tree = MedusaTree.from_choices([[0], [1], [0, 0]])
    dt = static_tree(tree, CPU, torch.float32)
    p_root = [0.7, 0.2, 0.05, 0.05]
    # root: H = 0.871 nats, 0.3 * exp(-H) = 0.1256, threshold = min(0.09, 0.1256) = 0.09
    h = -sum(p * math.log(p) for p in p_root)
    assert min(0.09, 0.3 * math.exp(-h)) == 0.09
    p_node1 = [0.25, 0.25, 0.25, 0.25]  # H = ln 4, threshold = min(0.09, 0.3 / 4) = 0.075
    p_leaf = [1e-6, 1e-6, 1 - 2e-6 - 1e-6, 1e-6]  # the next token is (almost surely) 2
    logits = _logits_from_probs([p_root, p_node1, [0.25] * 4, p_leaf])
    # node1 token 1: p=0.2 > 0.09 accepted; node2 token 2: 0.05 < 0.09 rejected; node3 token 3: 0.25 > 0.075
    tokens = torch.tensor([[0, 1, 2, 3]])
    g = torch.Generator().manual_seed(0)
    path, n, nxt = typical_accept(logits, tokens, dt, warp_logits(), 1.0, 0.09, 0.3, generator=g)
    assert n.tolist() == [2] and path[0].tolist() == [0, 1, 3] and nxt.tolist() == [2]
    # Node 3 with p = 0.07 < 0.075 is rejected: only node 1 is kept.
    logits = _logits_from_probs([p_root, [0.31, 0.31, 0.31, 0.07], [0.25] * 4, p_leaf])
    path, n, _ = typical_accept(logits, tokens, dt, warp_logits(), 1.0, 0.09, 0.3, generator=g)
    assert n.tolist() == [1] and path[0, :2].tolist() == [0, 1]


def test_typical_ties_go_to_higher_likelihood():
    tree = MedusaTree.from_choices([[0], [1]])  # two depth-1 siblings
    dt = static_tree(tree, CPU, torch.float32)
    logits = _logits_from_probs([[0.1, 0.4, 0.45, 0.05], [0.25] * 4, [0.25] * 4])
    tokens = torch.tensor([[0, 1, 2]])  # both accepted (0.4 and 0.45 > 0.09); rank 1 is likelier
    path, n, _ = typical_accept(logits, tokens, dt, warp_logits(), 1.0, 0.09, 0.3)
    assert n.tolist() == [1] and path[0, 1].item() == 2


V = SAMPLER_VOCAB
PARTIAL_TREE = [[0], [1], [2], [0, 0], [0, 1], [1, 0]]  # leaves most of the vocabulary to the residual
SETTINGS = [{"temperature": 1.0, "top_k": 0}, {"temperature": 0.7, "top_k": 4},
            {"temperature": 1.3, "top_p": 0.8, "top_k": 0}]


@pytest.mark.parametrize("setting", SETTINGS, ids=["t1", "t0.7-topk4", "t1.3-topp0.8"])
@pytest.mark.parametrize("choices", [FULL_TREE, PARTIAL_TREE], ids=["covering", "partial"])
def test_sample_is_lossless_chi_square(setting, choices):
    base, model = sampler_model()
    prompt = torch.tensor([[3, 5, 4, 6]])
    n = 6000
    g = torch.Generator().manual_seed(1234)
    out = model.generate(prompt.repeat(n, 1), max_new_tokens=2, acceptance="sample", eos_token_id=[],
                         tree=MedusaTree.from_choices(choices), generator=g, **setting)
    x1, x2 = out[:, 4], out[:, 5]
    counts = torch.zeros(V * V, dtype=torch.float64).index_add_(0, x1 * V + x2,
                                                                torch.ones(n, dtype=torch.float64))
    expected = exact_joint(base, prompt, warp_logits(**setting)).view(-1) * n
    assert chi2_pvalue(counts, expected) > 1e-3


def test_chi_square_catches_a_lossy_rule():
    """The same test rejects typical acceptance, which is not lossless: the chi-square has teeth."""
    base, model = sampler_model()
    prompt = torch.tensor([[3, 5, 4, 6]])
    n = 6000
    g = torch.Generator().manual_seed(1234)
    out = model.generate(prompt.repeat(n, 1), max_new_tokens=2, acceptance="typical",
                         eos_token_id=[], top_k=0,
                         tree=MedusaTree.from_choices(FULL_TREE), generator=g, posterior_threshold=0.01)
    x1, x2 = out[:, 4], out[:, 5]
    counts = torch.zeros(V * V, dtype=torch.float64).index_add_(0, x1 * V + x2,
                                                                torch.ones(n, dtype=torch.float64))
    expected = exact_joint(base, prompt, warp_logits(top_k=0)).view(-1) * n
    assert chi2_pvalue(counts, expected) < 1e-6


def test_sample_accept_recursive_rejection_single_node():
    """One node, two proposed siblings: exact probabilities of each outcome by enumeration."""
    tree = MedusaTree.from_choices([[0], [1]])
    dt = static_tree(tree, CPU, torch.float32)
    p = torch.tensor([0.5, 0.3, 0.2])
    logits = torch.log(p).view(1, 1, 3).repeat(20000, 3, 1)  # [B, N, V]
    tokens = torch.tensor([[0, 1, 2]]).repeat(20000, 1)  # proposals: token 1 then token 2
    g = torch.Generator().manual_seed(0)
    path, n, nxt = sample_accept(logits, tokens, dt, warp_logits(top_k=0), generator=g)
    first = torch.where(n == 1, tokens.gather(1, path[:, 1:2]).view(-1), nxt)
    # P(accept 1) = 0.3; then P(accept 2 | rejected 1) = 0.2 / 0.7; else residual is token 0.
    freq = torch.bincount(first, minlength=3).double() / 20000
    torch.testing.assert_close(freq, p.double(), atol=0.015, rtol=0)
    accepted_2 = ((n == 1) & (path[:, 1] == 2)).double().mean()
    assert abs(float(accepted_2) - 0.7 * 0.2 / 0.7) < 0.015


# Depth 2 covers the vocabulary under the 3 likeliest depth-1 proposals, 3 siblings (then the residual)
# elsewhere.
DEEP_TREE = [[a] for a in range(V)] + [[a, b] for a in range(V) for b in range(V) if a < 3 or b < 3]
DEEP_SETTINGS = [{"temperature": 0.7, "top_k": 4}, {"repetition_penalty": 0.5, "top_p": 0.9, "top_k": 0}]


@pytest.mark.parametrize("setting", DEEP_SETTINGS, ids=["t0.7-topk4", "rep0.5-topp0.9"])
def test_sample_deep_decisions_chi_square(setting):
    """The law of the first three new tokens, the 3rd being (often) the depth-2 decision of the first step's
    tree. Sampling settings come from the model's generation_config only (none passed as arguments)."""
    base, model = sampler_model(seed=3)
    base.generation_config.top_k = None  # let HF's default (50) or the setting below decide
    for key, value in setting.items():
        setattr(base.generation_config, key, value)
    prompt = torch.tensor([[3, 5, 4, 6]])
    n = 20000
    g = torch.Generator().manual_seed(99)
    out = model.generate(prompt.repeat(n, 1), max_new_tokens=4, acceptance="sample", eos_token_id=[],
                         tree=MedusaTree.from_choices(DEEP_TREE), generator=g, return_dict_in_generate=True)
    first_step = torch.tensor([a[0] for a in out.accept_lengths])
    assert (first_step == 3).float().mean() > 0.5  # depth-1 and depth-2 nodes accepted (+ bonus token) often
    x = out.sequences[:, 4:7]  # [n, 3]
    cells = (x[:, 0] * V + x[:, 1]) * V + x[:, 2]
    counts = torch.zeros(V ** 3, dtype=torch.float64).index_add_(0, cells, torch.ones(n, dtype=torch.float64))
    expected = exact_joint3(base, prompt).reshape(-1) * n
    assert chi2_pvalue(counts, expected) > 1e-3
    # Control: the same statistic rejects the law without the repetition penalty (it has teeth).
    if "repetition_penalty" in setting:
        base.generation_config.repetition_penalty = 1.0
        assert chi2_pvalue(counts, exact_joint3(base, prompt).reshape(-1) * n, strict=False) < 1e-6


def test_sample_accept_with_draft_probs_keeps_the_law():
    """Sampled drafts, hand-built: the root's children are 2 tokens drawn from q without replacement (node 2
    carries q_r: q without node 1's token) and a point mass (node 3), node 1 has a child drawn from q at it.
    The law of the first two emitted tokens is p's over 200,000 rows (a lone first token's second one drawn
    from p afterwards); using q for node 2 or leaving the point-mass residual after a sampled child fails."""
    from medusa.decoding.trees import tree_structure

    v, n = 4, 200_000
    p_root, q_root = torch.tensor([0.05, 0.6, 0.05, 0.3]), torch.tensor([0.3, 0.45, 0.2, 0.05])
    p_next = torch.tensor([[0.4, 0.3, 0.2, 0.1], [0.05, 0.15, 0.3, 0.5], [0.25] * 4, [0.6, 0.1, 0.1, 0.2]])
    q_next = torch.tensor([[0.1, 0.1, 0.1, 0.7], [0.5, 0.3, 0.1, 0.1], [0.25] * 4, [0.2, 0.5, 0.2, 0.1]])
    g = torch.Generator().manual_seed(0)
    first = torch.multinomial(q_root.expand(n, v), 2, replacement=False, generator=g)  # [n, 2] in draw order
    y = torch.multinomial(q_next[first[:, 0]], 1, generator=g).view(n)
    tokens = torch.cat([torch.zeros(n, 1, dtype=torch.long), first, torch.ones(n, 1, dtype=torch.long),
                        y.view(n, 1)], dim=1)  # [n, 5]: root, x1, x2, the point mass 1, y under x1
    tree = tree_structure(tokens, torch.tensor([0, 0, 0, 0, 1]).expand(n, 5),
                          torch.tensor([0, 1, 1, 1, 2]).expand(n, 5), 2, 3, torch.float32)
    q2 = q_root.expand(n, v).scatter(1, first[:, :1], 0.0)
    point = torch.nn.functional.one_hot(tokens[:, 3], v).float()
    draft_probs = torch.stack([torch.zeros(n, v), q_root.expand(n, v), q2 / q2.sum(1, keepdim=True), point,
                               q_next[first[:, 0]]], dim=1)  # [n, 5, V]
    logits = torch.cat([p_root.log().expand(n, 1, v), p_next[tokens[:, 1:]].log()], dim=1)  # [n, 5, V]
    path, k, nxt = sample_accept(logits, tokens, tree, generator=g, draft_probs=draft_probs)
    assert 0.7 < (k >= 1).float().mean() < 0.85 and (k == 2).float().mean() > 0.2  # every branch is taken
    t1 = torch.where(k >= 1, tokens.gather(1, path[:, 1:2]).view(n), nxt)
    fresh = torch.multinomial(p_next[t1], 1, generator=g).view(n)
    t2 = torch.where(k >= 2, tokens.gather(1, path[:, 2:3]).view(n), torch.where(k == 1, nxt, fresh))
    ones = torch.ones(n, dtype=torch.float64)
    counts = torch.zeros(v * v, dtype=torch.float64).index_add_(0, t1 * v + t2, ones)
    assert chi2_pvalue(counts, (p_root.view(v, 1) * p_next).reshape(-1).double() * n) > 1e-3


def test_draw_refuses_probabilities_that_are_not_finite():
    """NaN / inf weights give NaN probabilities: one MedusaError, not torch's 'probability tensor contains
    either inf, nan or element < 0'; finite rows are sampled as torch.multinomial samples them."""
    from medusa.decoding.acceptance import draw
    from medusa.errors import MedusaError

    probs = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    assert draw(probs, torch.Generator().manual_seed(0)).view(-1).tolist() == [1, 2]
    for bad in (float("nan"), float("inf")):
        with pytest.raises(MedusaError, match="not finite"):
            draw(torch.tensor([[0.5, bad, 0.5]]), None)


def test_sampling_with_an_infinite_base_weight_is_one_error():
    """A base whose LM head holds inf: sample and typical acceptance refuse in one MedusaError (they read
    NaN probabilities); greedy decodes (argmax is defined), as HF's greedy does."""
    from medusa.errors import MedusaError

    _, model = sampler_model()
    with torch.no_grad():
        model.base_model.get_output_embeddings().weight[3].fill_(float("inf"))
    ids = torch.tensor([[1, 2, 3]])
    for acceptance in ("sample", "typical"):
        with pytest.raises(MedusaError, match="not finite"):
            model.generate(ids, max_new_tokens=4, acceptance=acceptance, temperature=1.0,
                           generator=torch.Generator().manual_seed(0))
    assert model.generate(ids, max_new_tokens=4).shape[1] > 3


def test_sampled_siblings_rejected_leave_a_residual_of_several_tokens_in_law():
    """Two sampled siblings under the root (drawn from q without replacement), both often rejected: the
    residual then holds several tokens, and the first emitted token must still follow p (chi-square, 200,000
    rows). Catches a residual left unnormalised before the second subtraction (max(p_res - q2, 0) instead
    of max(p_res / sum(p_res) - q2, 0)), which a residual of one token cannot show."""
    from medusa.decoding.trees import tree_structure

    v, n = 5, 200_000
    p, q = torch.tensor([0.3, 0.25, 0.2, 0.15, 0.1]), torch.tensor([0.05, 0.1, 0.15, 0.3, 0.4])
    g = torch.Generator().manual_seed(1)
    drafts = torch.multinomial(q.expand(n, v), 2, replacement=False, generator=g)  # [n, 2] in draw order
    tokens = torch.cat([torch.zeros(n, 1, dtype=torch.long), drafts], dim=1)  # [n, 3]: root, x1, x2
    tree = tree_structure(tokens, torch.tensor([0, 0, 0]).expand(n, 3), torch.tensor([0, 1, 1]).expand(n, 3),
                          1, 2, torch.float32)
    q2 = q.expand(n, v).scatter(1, drafts[:, :1], 0.0)
    draft_probs = torch.stack([torch.zeros(n, v), q.expand(n, v), q2 / q2.sum(1, keepdim=True)], dim=1)
    logits = torch.cat([p.log().expand(n, 1, v), torch.zeros(n, 2, v)], dim=1)  # [n, 3, V]
    path, k, nxt = sample_accept(logits, tokens, tree, generator=g, draft_probs=draft_probs)
    assert 0.2 < (k == 0).float().mean() < 0.7  # both rejected often: the several-token residual is sampled
    first = torch.where(k >= 1, tokens.gather(1, path[:, 1:2]).view(n), nxt)
    counts = torch.zeros(v, dtype=torch.float64).index_add_(0, first, torch.ones(n, dtype=torch.float64))
    assert chi2_pvalue(counts, p.double() * n) > 1e-3
