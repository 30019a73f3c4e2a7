"""The dynamic tree: per row, exactly the N nodes of highest path probability, with consistent buffers."""

import itertools

import pytest
import torch

from medusa import MedusaModel
from medusa.decoding.dynamic_tree import TIE_BREAK, build_step_tree, hydra_children, medusa_children
from medusa.errors import MedusaError

from tiny_models import tiny_model


def _paths_of(tree, b):
    """Token paths (root excluded) of row ``b``'s nodes, read through the parents table."""
    out = []
    for i in range(1, tree.num_nodes):
        path, j = [], i
        while j != 0:
            path.append(int(tree.tokens[b, j]))
            j = int(tree.parents[b, j])
        out.append(tuple(reversed(path)))
    return out


def _check_buffers(tree, b):
    n = tree.num_nodes
    for i in range(n):
        anc, j = {i}, i
        while j != 0:
            j = int(tree.parents[b, j])
            anc.add(j)
        allowed = {j for j in range(n) if tree.float_mask[b, i, j] == 0}
        assert allowed == anc
        assert int(tree.depths[b, i]) == len(anc) - 1
        assert int(tree.retrieve[b, i, tree.depths[b, i]]) == i
        if i:
            assert int(tree.parents[b, i]) < i  # parents first
            assert i in tree.children[b, int(tree.parents[b, i])].tolist()


def test_medusa_dynamic_tree_is_the_top_n_paths():
    torch.manual_seed(0)
    k, b, v, n = 3, 3, 6, 14
    logp = torch.log_softmax(torch.randn(k, b, v) * 2, dim=-1)  # [K, B, V]
    root = torch.tensor([1, 3, 4])
    c = min(n - 1, v)
    tree = build_step_tree(root, medusa_children(logp, c), n, k, torch.float32, branch=c)
    assert tree.tokens.shape == (b, n) and tree.float_mask.shape == (b, n, n)
    for row in range(b):
        scored = []
        for d in range(1, k + 1):
            for path in itertools.product(range(v), repeat=d):
                scored.append((sum(float(logp[i, row, t]) for i, t in enumerate(path)) - d * TIE_BREAK, path))
        best = {p for _, p in sorted(scored, reverse=True)[:n - 1]}
        got = _paths_of(tree, row)
        assert len(set(got)) == n - 1 and set(got) == best
        assert int(tree.tokens[row, 0]) == int(root[row])
        _check_buffers(tree, row)


def test_dynamic_tree_is_prefix_closed_when_a_head_is_certain():
    k, b, v, n = 3, 1, 5, 6
    logp = torch.full((k, b, v), -30.0)
    logp[:, :, 2] = 0.0  # probability 1 at every depth: children tie with their parents but for the tie-break
    tree = build_step_tree(torch.tensor([0]), medusa_children(logp, 5), n, k, torch.float32, branch=5)
    assert set(_paths_of(tree, 0)) >= {(2,), (2, 2), (2, 2, 2)}
    _check_buffers(tree, 0)


@pytest.mark.parametrize("gap", [17.0, 20.0, 40.0])
def test_dynamic_tree_keeps_no_child_without_its_parent_when_heads_are_very_sure(gap):
    """Heads sure of one token (log-probability exactly 0.0, the next ``gap`` nats below): a child of a node
    at score -gap ties its parent in float32, where the old ``1e-6`` per-depth tie-break vanished past
    |score| >= 16 and ``topk`` kept children without their parents (orphans hung from the root)."""
    k, v = 3, 6
    logp = torch.full((k, 1, v), -90.0)
    logp[:, :, 2], logp[:, :, 4] = 0.0, -gap
    for n in range(3, 12):
        tree = build_step_tree(torch.tensor([1]), medusa_children(logp, 3), n, k, torch.float32, branch=3)
        _check_buffers(tree, 0)
        paths = _paths_of(tree, 0)
        assert all(p[:-1] in paths for p in paths if len(p) > 1)  # ancestor-closed


def test_dynamic_tree_greedy_equals_hf_with_very_sure_heads():
    """MEDUSA heads made very sure (LM head scaled: log-probabilities of exactly 0.0 and gaps of 17+ nats)
    on a dynamic tree: greedy output is still HF greedy ``generate``'s."""
    base = tiny_model("llama", layers=2, seed=4)
    model = MedusaModel.from_base(base, num_heads=3, num_layers=1, head_type="linear")
    with torch.no_grad():
        for p in model.heads.parameters():
            p.mul_(200.0) if p.dim() == 2 and p.shape[0] == 96 else None
    torch.manual_seed(3)
    prompts = torch.randint(3, 96, (6, 5))
    for n in (4, 6, 9):
        for row in range(6):
            ids = prompts[row:row + 1]
            want = base.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)
            assert torch.equal(model.generate(ids, max_new_tokens=12, tree=f"dynamic:{n}", eos_token_id=[]),
                               want)


def test_hydra_dynamic_tree_is_the_top_n_paths():
    base = tiny_model("llama", vocab_size=12, hidden_size=16)
    model = MedusaModel.from_base(base, num_heads=2, head_type="hydra")
    torch.manual_seed(3)
    with torch.no_grad():
        for p in model.heads.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    hidden = torch.randn(2, 16)
    root = torch.tensor([4, 7])
    n, v = 9, 12
    with torch.no_grad():
        tree = build_step_tree(root, hydra_children(model.heads, hidden, n - 1), n, 2, torch.float32,
                               branch=n - 1)
        for row in range(2):
            wide1 = torch.cat([hidden[row], model.heads.embed(root[row])])
            lp1 = torch.log_softmax(model.heads.head_logits(0, wide1), -1)  # [V]
            firsts = torch.arange(v)
            wide2 = torch.cat([hidden[row].expand(v, 16), model.heads.embed(root[row]).expand(v, 16),
                               model.heads.embed(firsts)], dim=-1)  # [V, 3 * 16]
            lp2 = torch.log_softmax(model.heads.head_logits(1, wide2), -1)  # [V, V]
            scored = [(float(lp1[a]) - TIE_BREAK, (a,)) for a in range(v)]
            scored += [(float(lp1[a] + lp2[a, c]) - 2 * TIE_BREAK, (a, c))
                       for a in range(v) for c in range(v)]
            best = {p for _, p in sorted(scored, reverse=True)[:n - 1]}
            assert set(_paths_of(tree, row)) == best
            _check_buffers(tree, row)


def _static_twin(tree, b):
    """Row ``b`` of a RowTrees as a static MedusaTree (sibling ranks as choices) and its node order."""
    from medusa import MedusaTree

    ranks = {0: ()}
    for i in range(1, tree.num_nodes):
        p = int(tree.parents[b, i])
        ranks[i] = ranks[p] + (tree.children[b, p].tolist().index(i),)
    static = MedusaTree.from_choices([ranks[i] for i in range(1, tree.num_nodes)])
    order = [next(i for i in range(tree.num_nodes) if ranks[i] == path) for path in static.paths]
    return static, order


def test_acceptance_on_per_row_trees_equals_each_row_on_its_static_twin():
    from medusa.decoding.acceptance import greedy_accept, typical_accept
    from medusa.decoding.trees import static_tree

    torch.manual_seed(5)
    k, b, v, n = 3, 4, 7, 10
    logp = torch.log_softmax(torch.randn(k, b, v) * 2, dim=-1)
    tree = build_step_tree(torch.tensor([1, 2, 3, 4]), medusa_children(logp, min(n - 1, v)), n, k,
                           torch.float32, branch=min(n - 1, v))
    logits = torch.randn(b, n, v) * 3  # [B, N, V] verification logits
    logits[:, :, :] += 4 * torch.nn.functional.one_hot(tree.tokens.roll(-1, 1), v)  # some nodes get accepted
    path, n_acc, nxt = greedy_accept(logits, tree.tokens, tree)
    tpath, tn, _ = typical_accept(logits, tree.tokens, tree, None, 1.0, 0.2, 0.3)
    assert n_acc.max() >= 1
    for row in range(b):
        static, order = _static_twin(tree, row)
        dt = static_tree(static, torch.device("cpu"), torch.float32)
        idx = torch.tensor(order)
        s_path, s_n, s_nxt = greedy_accept(logits[row:row + 1, idx], tree.tokens[row:row + 1, idx], dt)
        got = tree.tokens[row, path[row, :int(n_acc[row]) + 1]].tolist()
        want = tree.tokens[row, idx[s_path[0, :int(s_n[0]) + 1]]].tolist()
        assert got == want and int(nxt[row]) == int(s_nxt[0])
        t_path, t_n, _ = typical_accept(logits[row:row + 1, idx], tree.tokens[row:row + 1, idx], dt, None,
                                        1.0, 0.2, 0.3)
        assert int(tn[row]) == int(t_n[0])
        assert tree.tokens[row, tpath[row, :int(tn[row]) + 1]].tolist() == \
            tree.tokens[row, idx[t_path[0, :int(t_n[0]) + 1]]].tolist()


def test_dynamic_tree_spec_errors(stories_medusa):
    ids = torch.tensor([[1, 20, 30]])
    with pytest.raises(MedusaError, match="'dynamic' or 'dynamic:N'"):
        stories_medusa.generate(ids, max_new_tokens=4, tree="dynamic:many")
