"""Hydra heads: the documented initialisation, the wide input, strict round trips, the per-node growth."""

import json

import pytest
import torch

from medusa import CheckpointError, MedusaModel, MedusaTree
from medusa.decoding.candidates import decode_tree
from medusa.decoding.hydra_candidates import hydra_propose
from medusa.modeling.hydra import HydraHeads

from tiny_models import tiny_model


def _perturbed(model, seed=1, scale=0.1):
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.heads.parameters():
            p.add_(torch.randn_like(p) * scale)
    return model


def test_fresh_hydra_head_is_the_base_lm_head_on_h_t():
    base = tiny_model("llama")
    model = MedusaModel.from_base(base, num_heads=3, num_layers=2, head_type="hydra")
    assert isinstance(model.heads, HydraHeads)
    ids = torch.randint(3, 90, (2, 7))
    with torch.no_grad():
        out = model(input_ids=ids)
        assert out.head_logits is None  # hydra heads need draft tokens: the caller builds their input
        wide = model.heads.teacher_inputs(out.hidden_states, ids)  # [B, T, d * (K+1)]
        assert wide.shape == (2, 7, 32 * 4)
        logits = model.heads(wide)  # [K, B, T, V]
        other = model.heads.teacher_inputs(out.hidden_states, torch.randint(3, 90, (2, 7)))
        for k in range(3):  # whatever the draft tokens, every head starts as the base LM head on h_t
            torch.testing.assert_close(logits[k], out.logits, rtol=0, atol=1e-5)
            torch.testing.assert_close(model.heads.head_logits(k, other), out.logits, rtol=0, atol=1e-5)


def test_teacher_inputs_are_h_t_then_the_next_tokens_embeddings():
    base = tiny_model("qwen2")
    heads = MedusaModel.from_base(base, num_heads=2, head_type="hydra").heads
    ids = torch.randint(3, 90, (1, 5))
    hidden = torch.randn(1, 5, 32)
    wide = heads.teacher_inputs(hidden, ids)
    emb = base.get_input_embeddings()(ids)
    torch.testing.assert_close(wide[0, 1, :32], hidden[0, 1])
    torch.testing.assert_close(wide[0, 1, 32:64], emb[0, 2])  # e(x_{t+1})
    torch.testing.assert_close(wide[0, 1, 64:], emb[0, 3])  # e(x_{t+2})
    assert torch.equal(wide[0, 4, 32:], torch.zeros(64))  # past the end: zeros


def test_hydra_heads_read_the_draft_tokens_once_trained():
    base = tiny_model("llama")
    model = _perturbed(MedusaModel.from_base(base, num_heads=2, head_type="hydra"))
    hidden = torch.randn(1, 4, 32)
    a = model.heads.teacher_inputs(hidden, torch.tensor([[5, 6, 7, 8]]))
    b = model.heads.teacher_inputs(hidden, torch.tensor([[5, 9, 7, 8]]))
    with torch.no_grad():
        assert not torch.allclose(model.heads.head_logits(0, a)[0, 0], model.heads.head_logits(0, b)[0, 0])
        torch.testing.assert_close(model.heads.head_logits(0, a)[0, 1], model.heads.head_logits(0, b)[0, 1])


def test_separate_weights_per_layer_and_head():
    heads = MedusaModel.from_base(tiny_model("llama"), num_heads=2, num_layers=3, head_type="hydra").heads
    names = set(heads.state_dict())
    assert "blocks.1.0.res.weight" in names and "blocks.1.2.linear.weight" in names
    assert heads.blocks[0][0].res.weight.shape == (32, 64) and heads.blocks[1][0].res.weight.shape == (32, 96)
    ptrs = [p.data_ptr() for p in heads.parameters()]
    assert len(ptrs) == len(set(ptrs))


def test_round_trip_exact(tmp_path):
    base = tiny_model("llama")
    model = _perturbed(MedusaModel.from_base(base, num_heads=3, num_layers=2, head_type="hydra"))
    model.tree = MedusaTree.from_choices([[0], [1], [0, 0], [0, 0, 1]])
    model.save_pretrained(tmp_path / "ck")
    assert json.loads((tmp_path / "ck" / "medusa_config.json").read_text())["head_type"] == "hydra"
    loaded = MedusaModel.from_pretrained(tmp_path / "ck", base_model=base)
    assert isinstance(loaded.heads, HydraHeads) and loaded.tree == model.tree
    s1, s2 = model.heads.state_dict(), loaded.heads.state_dict()
    assert list(s1) == list(s2) and all(torch.equal(s1[k], s2[k]) for k in s1)
    ids = torch.randint(3, 90, (1, 6))
    with torch.no_grad():
        h = model(input_ids=ids).hidden_states
        torch.testing.assert_close(loaded.heads(loaded.heads.teacher_inputs(h, ids)),
                                   model.heads(model.heads.teacher_inputs(h, ids)), rtol=0, atol=0)


def test_round_trip_rejects_medusa_layout(tmp_path):
    base = tiny_model("llama")
    MedusaModel.from_base(base, num_heads=2).save_pretrained(tmp_path / "ck")
    cfg_path = tmp_path / "ck" / "medusa_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["head_type"] = "hydra"
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="missing tensor"):
        MedusaModel.from_pretrained(tmp_path / "ck", base_model=base)


def _naive_propose(heads, root, hidden, tree):
    """Node by node: head d on [h, e(path tokens)], the node's rank among its parent's top-k."""
    tokens = [int(root)]
    for path in tree.paths[1:]:
        parent = tree.paths.index(path[:-1])
        chain, j = [], parent
        while j != 0:
            chain.append(tokens[j])
            j = tree.parents[j]
        chain = [int(root)] + chain[::-1]
        emb = heads.embed(torch.tensor(chain)).reshape(-1)
        wide = torch.cat([hidden, emb])
        tokens.append(int(heads.head_logits(len(path) - 1, wide).topk(path[-1] + 1).indices[-1]))
    return tokens


def test_hydra_propose_matches_node_by_node_reference():
    base = tiny_model("llama")
    model = _perturbed(MedusaModel.from_base(base, num_heads=3, head_type="hydra"), scale=0.3)
    tree = MedusaTree.from_choices([[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 1, 2], [1, 0, 0]])
    root = torch.tensor([5, 17])
    hidden = torch.randn(2, 32)
    with torch.no_grad():
        got = hydra_propose(model.heads, root, hidden, decode_tree(tree, torch.device("cpu"), torch.float32))
        for b in range(2):
            assert got[b].tolist() == _naive_propose(model.heads, root[b], hidden[b], tree)
