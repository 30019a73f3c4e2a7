"""Hydra heads: the documented initialisation, the wide input, strict round trips, the per-node growth; the
projection (own W2 or the base LM head) x draft vocabulary: the fresh-head property, what is trained and
saved, exact round trips, old checkpoints, and draft ids mapped back on the tree."""

import json

import pytest
import torch
from safetensors.torch import load_file

from medusa import CheckpointError, MedusaModel, MedusaTree
from medusa.decoding.dynamic_tree import hydra_children
from medusa.decoding.hydra_candidates import hydra_propose
from medusa.decoding.trees import static_tree
from medusa.modeling.base import lm_head_of
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
        got = hydra_propose(model.heads, root, hidden, static_tree(tree, torch.device("cpu"), torch.float32))
        for b in range(2):
            assert got[b].tolist() == _naive_propose(model.heads, root[b], hidden[b], tree)


# ------------------------------------------------------------------ projection x draft vocabulary
V, D = 96, 32
COMBOS = [("own", 0), ("own", 24), ("shared_lm_head", 0), ("shared_lm_head", 24)]
IDS = [f"{p}-draft{n}" for p, n in COMBOS]


def _map(n, seed=0):
    return torch.randperm(V, generator=torch.Generator().manual_seed(seed))[:n]


def _hydra(base, projection, draft, num_heads=3, num_layers=2, seed=1, scale=0.0):
    tm = _map(draft) if draft else None
    model = MedusaModel.from_base(base, num_heads=num_heads, num_layers=num_layers, head_type="hydra",
                                  hydra_projection=projection, token_map=tm)
    if scale:
        torch.manual_seed(seed)
        with torch.no_grad():
            for p in model.heads.parameters():
                p.add_(torch.randn_like(p) * scale)
    return model


@pytest.mark.parametrize("projection,draft", COMBOS, ids=IDS)
def test_fresh_hydra_head_is_the_base_lm_head_on_h_t_per_projection(projection, draft):
    base = tiny_model("llama")
    model = _hydra(base, projection, draft)
    ids = torch.randint(3, V, (2, 7))
    with torch.no_grad():
        out = model(input_ids=ids)
        wide = model.heads.teacher_inputs(out.hidden_states, ids)  # [B, T, d * (K+1)]
        other = model.heads.teacher_inputs(out.hidden_states, torch.randint(3, V, (2, 7)))
        full = model.heads(wide)  # [K, B, T, V] target ids
        want = out.logits if not draft else out.logits[..., model.heads.token_map]  # [B, T, N]
        for k in range(3):  # whatever the draft tokens, every head starts as the base LM head on h_t
            torch.testing.assert_close(model.heads.head_logits(k, wide), want, rtol=0, atol=1e-5)
            torch.testing.assert_close(model.heads.head_logits(k, other), want, rtol=0, atol=1e-5)
            if draft:  # target logits: the LM head's inside the draft vocabulary, -inf outside
                inside = torch.zeros(V, dtype=torch.bool)
                inside[model.heads.token_map] = True
                torch.testing.assert_close(full[k][..., inside], out.logits[..., inside], rtol=0, atol=1e-5)
                assert torch.isneginf(full[k][..., ~inside]).all()
            else:
                torch.testing.assert_close(full[k], out.logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize("projection,draft", COMBOS, ids=IDS)
def test_trained_and_saved_tensors(projection, draft):
    base = tiny_model("qwen2")
    heads = _hydra(base, projection, draft).heads
    names = set(heads.state_dict())
    lm_head = lm_head_of(base)
    trainable = {id(p) for p in heads.parameters()}
    assert id(lm_head.weight) not in trainable and id(base.get_input_embeddings().weight) not in trainable
    assert ("token_map" in names) == bool(draft)
    if projection == "shared_lm_head":
        assert heads.lm_heads is None and heads.shared_lm_head is lm_head
        assert not any(n.startswith("lm_heads") for n in names)
    else:
        assert heads.shared_lm_head is None
        shapes = [tuple(heads.state_dict()[f"lm_heads.{k}.weight"].shape) for k in range(3)]
        assert shapes == [(draft or V, D)] * 3


@pytest.mark.parametrize("projection,draft", COMBOS, ids=IDS)
def test_round_trip_exact_per_projection(tmp_path, projection, draft):
    base = tiny_model("llama")
    model = _hydra(base, projection, draft, scale=0.1)
    model.tree = MedusaTree.from_choices([[0], [1], [0, 0], [0, 0, 1]])
    model.save_pretrained(tmp_path / "ck")
    cfg = json.loads((tmp_path / "ck" / "medusa_config.json").read_text())
    assert (cfg["hydra_projection"], cfg["draft_vocab"], cfg["head_type"]) == (projection, draft, "hydra")
    state = load_file(tmp_path / "ck" / "medusa_heads.safetensors")
    assert any(k.startswith("lm_heads.") for k in state) == (projection == "own")
    if draft:
        assert state["token_map"].dtype == torch.int64 and torch.equal(state["token_map"], _map(draft))
    loaded = MedusaModel.from_pretrained(tmp_path / "ck", base_model=base)
    assert isinstance(loaded.heads, HydraHeads) and loaded.tree == model.tree
    assert loaded.config.to_dict() == model.config.to_dict()
    assert loaded.heads.projection == projection and loaded.heads.draft_vocab == draft
    s1, s2 = model.heads.state_dict(), loaded.heads.state_dict()
    assert list(s1) == list(s2) and all(torch.equal(s1[k], s2[k]) for k in s1)
    ids = torch.randint(3, V, (1, 6))
    with torch.no_grad():
        h = model(input_ids=ids).hidden_states
        torch.testing.assert_close(loaded.heads(loaded.heads.teacher_inputs(h, ids)),
                                   model.heads(model.heads.teacher_inputs(h, ids)), rtol=0, atol=0)
    loaded.save_pretrained(tmp_path / "again")  # and a second save writes the same config
    assert json.loads((tmp_path / "again" / "medusa_config.json").read_text()) == cfg


def test_old_hydra_checkpoint_loads_as_own_and_medusa_configs_lack_the_key(tmp_path):
    base = tiny_model("llama")
    model = _hydra(base, "own", 0, scale=0.1)
    model.save_pretrained(tmp_path / "old")
    path = tmp_path / "old" / "medusa_config.json"
    cfg = json.loads(path.read_text())
    del cfg["hydra_projection"]  # written before the key existed
    path.write_text(json.dumps(cfg))
    loaded = MedusaModel.from_pretrained(tmp_path / "old", base_model=base)
    assert loaded.config.hydra_projection == "own" and loaded.heads.lm_heads is not None
    s1, s2 = model.heads.state_dict(), loaded.heads.state_dict()
    assert all(torch.equal(s1[k], s2[k]) for k in s1)
    MedusaModel.from_base(base, num_heads=2, head_type="shared_lm_head").save_pretrained(tmp_path / "m")
    assert "hydra_projection" not in json.loads((tmp_path / "m" / "medusa_config.json").read_text())


def test_bad_projection_is_refused(tmp_path):
    base = tiny_model("llama")
    with pytest.raises(ValueError, match="hydra_projection"):
        MedusaModel.from_base(base, num_heads=2, head_type="linear", hydra_projection="shared_lm_head")
    with pytest.raises(ValueError, match="projection"):
        MedusaModel.from_base(base, num_heads=2, head_type="hydra", hydra_projection="tied")
    MedusaModel.from_base(base, num_heads=2).save_pretrained(tmp_path / "lin")
    _hydra(base, "own", 0).save_pretrained(tmp_path / "hy")
    for name, value, match in (("lin", "own", "only hydra heads"), ("hy", "tied", "must be one of")):
        path = tmp_path / name / "medusa_config.json"
        cfg = json.loads(path.read_text())
        cfg["hydra_projection"] = value
        path.write_text(json.dumps(cfg))
        with pytest.raises(CheckpointError, match=f"medusa_config.json: .*{match}"):
            MedusaModel.from_pretrained(tmp_path / name, base_model=base)
    path = tmp_path / "hy" / "medusa_config.json"  # own heads' file read as shared: extra tensors named
    cfg = json.loads(path.read_text())
    cfg["hydra_projection"] = "shared_lm_head"
    path.write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="unexpected tensor.*lm_heads"):
        MedusaModel.from_pretrained(tmp_path / "hy", base_model=base)


@pytest.mark.parametrize("projection", ["own", "shared_lm_head"])
def test_use_draft_vocab_keeps_blocks_and_selects_rows(projection):
    base = tiny_model("llama")
    model = _hydra(base, projection, 0, scale=0.1)
    wide = torch.randn(3, D * 4)
    with torch.no_grad():
        before = model.heads(wide)  # [K, 3, V]
    tm = _map(40, seed=2)
    model.use_draft_vocab(tm)
    assert model.config.draft_vocab == 40 and torch.equal(model.heads.token_map, tm)
    with torch.no_grad():
        torch.testing.assert_close(model.heads.draft_logits(wide), before[..., tm], rtol=1e-6, atol=1e-6)
    t2d = model.heads.target_to_draft()
    assert torch.equal(t2d[tm], torch.arange(40)) and int((t2d >= 0).sum()) == 40
    assert torch.equal(model.heads.to_target(torch.tensor([0, 39])), tm[[0, 39]])
    sub = tm[[5, 2]]  # re-mapped to a subset: each id keeps its row, the inverse map follows
    model.use_draft_vocab(sub)
    with torch.no_grad():
        torch.testing.assert_close(model.heads.draft_logits(wide), before[..., sub], rtol=1e-6, atol=1e-6)
    assert torch.equal(model.heads.target_to_draft()[sub], torch.arange(2))


def test_head_topk_maps_draft_ids_and_falls_back_past_the_draft_vocab():
    model = _hydra(tiny_model("llama"), "own", 6, scale=0.3)
    wide = torch.randn(2, D * 4)
    with torch.no_grad():
        full = model.heads(wide)[1]  # [2, V], -inf outside the draft vocabulary
        assert torch.equal(model.heads.head_topk(1, wide, 4), full.topk(4, dim=-1).indices)
        wider = model.heads.head_topk(1, wide, 9)  # 9 > 6 draft ids
    assert torch.equal(wider[:, :6].sort(-1).values, model.heads.token_map.sort().values.expand(2, 6))


def _naive_propose_target_ids(heads, root, hidden, tree):
    """Node by node, in target ids: head d on [h, e(path tokens)], the node's rank among its top-k."""
    tokens = [int(root)]
    for path in tree.paths[1:]:
        chain, j = [], tree.paths.index(path[:-1])
        while j != 0:
            chain.append(tokens[j])
            j = tree.parents[j]
        chain = [int(root)] + chain[::-1]
        wide = torch.cat([hidden, heads.embed(torch.tensor(chain)).reshape(-1)])
        draft = heads.head_logits(len(path) - 1, wide).topk(path[-1] + 1).indices[-1]
        tokens.append(int(heads.token_map[draft]))
    return tokens


@pytest.mark.parametrize("projection", ["own", "shared_lm_head"])
def test_hydra_candidates_embed_target_ids(projection):
    model = _hydra(tiny_model("llama"), projection, 24, scale=0.3)
    heads = model.heads
    tree = MedusaTree.from_choices([[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 1, 2], [1, 0, 0]])
    root, hidden = torch.tensor([5, 17]), torch.randn(2, D)
    with torch.no_grad():
        got = hydra_propose(heads, root, hidden, static_tree(tree, torch.device("cpu"), torch.float32))
        for b in range(2):
            assert got[b].tolist() == _naive_propose_target_ids(heads, root[b], hidden[b], tree)
        assert torch.isin(got[:, 1:], heads.token_map).all()
        paths = torch.tensor([[[5, int(heads.token_map[3])], [5, int(heads.token_map[7])]]] * 2)  # [B, W, 2]
        logp, tok = hydra_children(heads, hidden, 30)(2, paths)  # 30 > 24 draft ids: 24 children each
    assert tok.shape == (2, 2, 24) and torch.isin(tok, heads.token_map).all()
    wide = torch.cat([hidden.view(2, 1, D).expand(2, 2, D), heads.embed(paths).view(2, 2, 2 * D)], dim=-1)
    ref = torch.log_softmax(heads.to_target_logits(heads.head_logits(1, wide)).float(), dim=-1)  # [B, W, V]
    torch.testing.assert_close(logp, ref.gather(-1, tok))
    assert torch.equal(tok[..., 0], ref.argmax(-1))


@pytest.mark.parametrize("projection,draft", COMBOS[1:], ids=IDS[1:])
def test_exports_still_refuse_hydra_heads(tmp_path, projection, draft):
    from medusa.export import export_checkpoint

    _hydra(tiny_model("llama"), projection, draft).save_pretrained(tmp_path / "ck")
    with pytest.raises(CheckpointError, match="head_type 'hydra' cannot be exported to vllm"):
        export_checkpoint(tmp_path / "ck", tmp_path / "out", format="vllm")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("projection", ["own", "shared_lm_head"])
def test_bind_base_reads_the_new_base_and_hidden_logits_is_none(projection):
    base = tiny_model("llama")
    heads = _hydra(base, projection, 0).heads
    assert heads.hidden_logits(torch.randn(1, 2, D)) is None
    other = tiny_model("llama", seed=1)
    heads.bind_base(other)
    assert heads.embedding is other.get_input_embeddings()
    assert heads.shared_lm_head is (lm_head_of(other) if projection == "shared_lm_head" else None)
    keys = set(heads.state_dict())
    assert not any("embed" in k or "_shared" in k for k in keys)
    assert any(k.startswith("lm_heads.") for k in keys) == (projection == "own")
