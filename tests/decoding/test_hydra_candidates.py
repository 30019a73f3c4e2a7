"""Hydra candidates: the growth plan of a small static tree (value by value), the placement of each head's
top-k under its parent's path (stub heads whose ranking is a known function of the path), and Hydra heads on
the base LM head (``hydra_projection="shared_lm_head"``) and with a draft vocabulary decoding losslessly:
greedy == HF greedy ``generate`` (stories260K with fitted heads, a left-padded batch of 3 and batch 1), on a
static tree and a dynamic tree, with long accepted runs."""

import pytest
import torch
from decoding_helpers import check_stories_greedy

from medusa import MedusaTree
from medusa.decoding.hydra_candidates import hydra_levels, hydra_propose
from medusa.decoding.trees import static_tree

from fit_heads import fitted_stories_heads

# nodes (sorted by depth, then path): 0 (), 1 (0), 2 (1), 3 (2), 4 (0,0), 5 (0,1), 6 (1,1), 7 (0,0,0)
CHOICES = [[0], [1], [2], [0, 0], [0, 1], [1, 1], [0, 0, 0]]


def _levels(level):
    return (level.expand.tolist(), level.paths.tolist(), level.topk, level.children.tolist(),
            level.source.tolist())


def test_hydra_levels_of_a_small_tree():
    dt = static_tree(MedusaTree.from_choices(CHOICES), torch.device("cpu"), torch.float32)
    levels = hydra_levels(dt)
    assert [_levels(level) for level in levels] == [
        # depth 1: the root expanded, ranks 0..2 -> nodes 1, 2, 3
        ([0], [[0]], 3, [1, 2, 3], [0, 1, 2]),
        # depth 2: nodes 1 and 2 expanded (top-2 each); node 6 is node 2's rank 1: entry 1 * 2 + 1
        ([1, 2], [[0, 1], [0, 2]], 2, [4, 5, 6], [0, 1, 3]),
        # depth 3: node 4 expanded along its path (root, 1, 4), its rank 0 -> node 7
        ([4], [[0, 1, 4]], 1, [7], [0]),
    ]
    assert hydra_levels(dt) is levels and not hasattr(dt, "hydra_levels")  # built once, kept by its user


class _PathSumHeads:
    """Stub Hydra heads (d_model 1, a token embeds as its own value): head k's rank-r token on the input
    ``[h, e(x_0), ..., e(x_{k})]`` is ``h + 10 * sum(x) + 1000 * k + r``."""

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return tokens.unsqueeze(-1).float()  # [..., 1]

    def head_topk(self, k: int, wide: torch.Tensor, n: int) -> torch.Tensor:
        assert wide.shape[-1] == k + 2  # h, the root and the k tokens after it
        top = wide[..., 0] + 10 * wide[..., 1:].sum(-1) + 1000 * k  # [...]
        return top.long().unsqueeze(-1) + torch.arange(n)  # [..., n]


def test_hydra_propose_grows_each_node_from_its_own_path():
    tree = MedusaTree.from_choices(CHOICES)
    dt = static_tree(tree, torch.device("cpu"), torch.float32)
    root, hidden = torch.tensor([1, 2]), torch.tensor([[0.0], [5.0]])
    got = hydra_propose(_PathSumHeads(), root, hidden, dt)  # [B, N]
    for b in range(2):
        want = [int(root[b])]
        for path in tree.paths[1:]:
            chain = [want[tree.paths.index(path[:d])] for d in range(len(path))]  # root .. parent
            want.append(int(hidden[b, 0]) + 10 * sum(chain) + 1000 * (len(path) - 1) + path[-1])
        assert got[b].tolist() == want
    assert got[0].tolist() == [1, 10, 11, 12, 1110, 1111, 1121, 13210]  # e.g. (1,1): 10 * (1 + 11) + 1000 + 1

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
