"""Draft vocabulary: the map, heads over N target tokens, save / load, and greedy decoding unchanged."""

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from medusa import CheckpointError, MedusaModel, MedusaTree
from medusa.errors import ConfigError
from medusa.modeling.base import decoder_of, lm_head_of
from medusa.modeling.draft_vocab import (
    DraftVocab,
    build_token_map,
    coverage,
    label_counts,
    most_frequent,
    widen_map,
)

from tiny_models import tiny_model

V = 96


def _map(n=24, seed=0):
    return torch.randperm(V, generator=torch.Generator().manual_seed(seed))[:n]


def test_token_map_most_frequent_labels_ties_and_fill():
    examples = [{"input_ids": [0] * 6, "labels": [-100, 7, 7, 5, 9, 9]},
                {"input_ids": [0] * 3, "labels": [9, 3, -100]}]
    counts = label_counts(examples, 12)
    assert counts.tolist() == [0, 0, 0, 1, 0, 1, 0, 2, 0, 3, 0, 0]
    assert build_token_map(examples, 12, 3).tolist() == [9, 7, 3]  # 3 and 5 tie: lower id first
    # more slots than labelled ids: the lowest unlabelled ids fill the map, N stays exact
    assert most_frequent(counts, 6).tolist() == [9, 7, 3, 5, 0, 1]
    assert build_token_map(examples, 12, 6).dtype == torch.long
    with pytest.raises(ConfigError, match="heads.draft_vocab"):
        most_frequent(counts, 13)
    with pytest.raises(ConfigError, match="heads.draft_vocab"):
        label_counts([{"labels": [12]}], 12)


def test_coverage():
    tm = torch.tensor([4, 2])
    assert coverage(tm, torch.tensor([[2, 4, 5, -100], [1, 2, -100, -100]])) == pytest.approx(3 / 5)
    assert coverage(None, torch.tensor([1, 2])) == 1.0


@pytest.mark.parametrize("head_type", ["linear", "shared_lm_head"])
def test_draft_heads_start_as_lm_head_rows_and_map_back(head_type):
    base = tiny_model("llama")
    tm = _map()
    model = MedusaModel.from_base(base, num_heads=3, num_layers=1, head_type=head_type, token_map=tm)
    assert model.config.draft_vocab == 24 and torch.equal(model.heads.token_map, tm)
    if head_type == "linear":
        assert model.heads.lm_heads[0].weight.shape == (24, base.config.hidden_size)
    hidden = torch.randn(2, 5, base.config.hidden_size)
    ref = lm_head_of(base)(hidden)  # [B, T, V]
    for grad in (True, False):  # per-head path (training) and the batched no-grad path (decoding)
        with torch.set_grad_enabled(grad):
            draft = model.heads.draft_logits(hidden)  # [K, B, T, N]
            full = model.heads(hidden)  # [K, B, T, V]
        assert draft.shape == (3, 2, 5, 24) and full.shape == (3, 2, 5, V)
        for k in range(3):
            torch.testing.assert_close(draft[k], ref[..., tm], rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(full[k][..., tm], ref[..., tm], rtol=1e-6, atol=1e-6)
            outside = torch.ones(V, dtype=torch.bool)
            outside[tm] = False
            assert torch.isneginf(full[k][..., outside]).all()
    top = model.heads.topk(hidden, 4)  # [K, B, T, 4] target ids
    assert torch.equal(top, full.topk(4, dim=-1).indices)
    assert torch.isin(top, tm).all()
    t2d = model.heads.target_to_draft()
    assert torch.equal(model.heads.to_target(t2d[tm]), tm) and int((t2d >= 0).sum()) == 24


@pytest.mark.parametrize("head_type", ["linear", "shared_lm_head"])
def test_draft_vocab_round_trip(tmp_path, head_type):
    base = tiny_model("qwen2")
    tm = _map(30, seed=1)
    model = MedusaModel.from_base(base, num_heads=2, num_layers=1, head_type=head_type, token_map=tm)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.heads.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(tmp_path / "ck")
    state = load_file(tmp_path / "ck" / "medusa_heads.safetensors")
    assert state["token_map"].dtype == torch.int64 and torch.equal(state["token_map"], tm)
    cfg = json.loads((tmp_path / "ck" / "medusa_config.json").read_text())
    assert cfg["draft_vocab"] == 30 and cfg["dtype"] == "float32"
    loaded = MedusaModel.from_pretrained(tmp_path / "ck", base_model=base)
    assert torch.equal(loaded.heads.token_map, tm) and loaded.heads.draft_vocab == 30
    hidden = torch.randn(1, 4, base.config.hidden_size)
    with torch.no_grad():
        torch.testing.assert_close(loaded.heads(hidden), model.heads(hidden), rtol=0, atol=0)
    # a map with a repeated id, or one out of range, is refused naming the file
    for bad in (torch.cat([tm[:-1], tm[:1]]), torch.cat([tm[:-1], torch.tensor([V])])):
        state["token_map"] = bad
        save_file(state, str(tmp_path / "ck" / "medusa_heads.safetensors"))
        with pytest.raises(CheckpointError, match="medusa_heads.safetensors: token_map"):
            MedusaModel.from_pretrained(tmp_path / "ck", base_model=base)


def test_use_draft_vocab_keeps_blocks_and_selects_rows():
    base = tiny_model("llama")
    model = MedusaModel.from_base(base, num_heads=2, num_layers=2)
    with torch.no_grad():
        for p in model.heads.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    hidden = torch.randn(3, base.config.hidden_size)
    before = model.heads(hidden)  # [K, 3, V]
    tm = _map(40, seed=2)
    model.use_draft_vocab(tm)
    assert model.config.draft_vocab == 40
    with torch.no_grad():
        torch.testing.assert_close(model.heads.draft_logits(hidden), before[..., tm], rtol=1e-6, atol=1e-6)
    sub = tm[[7, 3, 0]]  # re-mapped to a subset, reordered: each id keeps its row
    model.use_draft_vocab(sub)
    with torch.no_grad():
        torch.testing.assert_close(model.heads.draft_logits(hidden), before[..., sub], rtol=1e-6, atol=1e-6)


def _fit_draft_heads(model, sequences, steps=300):
    """Fit head k at t to token t+k+2 where that token is in the draft vocabulary (others: no target)."""
    t2d = model.heads.target_to_draft()
    xs, ys = [[] for _ in range(model.num_heads)], [[] for _ in range(model.num_heads)]
    with torch.no_grad():
        for seq in sequences:
            hidden = decoder_of(model.base_model)(input_ids=seq.view(1, -1)).last_hidden_state[0]  # [T, d]
            for k in range(model.num_heads):
                y = t2d[seq[k + 2:]]
                keep = y >= 0
                xs[k].append(hidden[: seq.numel() - k - 2][keep])
                ys[k].append(y[keep])
    xs, ys = [torch.cat(x) for x in xs], [torch.cat(y) for y in ys]
    opt = torch.optim.Adam(model.heads.parameters(), lr=3e-2)
    torch.manual_seed(0)
    for _ in range(steps):
        loss = sum(F.cross_entropy(model.heads.head_logits(k, xs[k]), ys[k]) for k in range(model.num_heads))
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.heads.eval()


@pytest.mark.parametrize("head_type", ["linear", "shared_lm_head"])
def test_greedy_with_draft_vocab_equals_hf(head_type):
    base = tiny_model("llama")
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(3, V, (2, 6), generator=g)
    ref = base.generate(ids, do_sample=False, max_new_tokens=60)
    new = ref[:, 6:]
    counts = torch.bincount(new.reshape(-1), minlength=V)
    n = max(4, int((counts > 0).sum()) // 2)  # about half of the generated ids: many outputs are outside
    tm = most_frequent(counts, n)
    model = MedusaModel.from_base(base, num_heads=3, head_type=head_type, token_map=tm)
    _fit_draft_heads(model, list(ref))
    outside = ~torch.isin(new, tm)
    assert outside.any()  # the output needs tokens the heads cannot propose
    tree = MedusaTree.from_choices([[0], [1], [0, 0], [0, 1], [0, 0, 0]])
    out = model.generate(ids, max_new_tokens=60, tree=tree, return_dict_in_generate=True)
    assert torch.equal(out.sequences, ref)
    for row in range(2):
        one = model.generate(ids[row:row + 1], max_new_tokens=60, tree=tree, return_dict_in_generate=True)
        assert torch.equal(one.sequences, ref[row:row + 1])
    assert out.tokens_per_step > 1.5, out.accept_lengths  # mapped candidates really were accepted


# ------------------------------------------------------------------ choosing N (the Gemma-3 benchmark)
def test_chain_bound_counts_in_vocabulary_runs():
    """Labels a b c d e (c outside the map), depth 2: from a the chain keeps b (then c breaks it), from b
    nothing, from c both d and e: tokens/step (2 + 1 + 3) / 3; the full vocabulary keeps 1 + depth."""
    from medusa.modeling.draft_vocab import chain_bound

    examples = [{"labels": [-100, 10, 11, 12, 13, 14]}, {"labels": [10, 11]}]  # the second is too short
    token_map = torch.tensor([10, 11, 13, 14])
    assert chain_bound(token_map, examples, 2) == pytest.approx(2.0)
    assert chain_bound(None, examples, 2) == pytest.approx(3.0)
    assert chain_bound(token_map, examples[1:], 2) != chain_bound(token_map, examples[1:], 2)  # nan: none


def test_candidate_rows_and_choice():
    from medusa.modeling.draft_vocab import candidate_rows, choose_draft_vocab

    torch.manual_seed(0)
    zipf = 1.0 / torch.arange(1, V + 1).float()  # a Zipf-like label distribution
    sample = lambda n: {"labels": torch.multinomial(zipf, n, replacement=True).tolist()}
    train, held = [sample(400) for _ in range(4)], [sample(200) for _ in range(2)]
    rows = candidate_rows(train, held, V, (8, 32, V), depth=3)
    cov = [r["held_out_coverage"] for r in rows]
    assert cov[0] < cov[1] < cov[2] == 1.0 and rows[2]["chain_lost"] == 0.0
    assert rows[0]["chain_lost"] > rows[1]["chain_lost"] > 0 and rows[0]["train_coverage"] < 1
    assert choose_draft_vocab(rows, cov[1]) == 32  # the smallest reaching the target
    assert choose_draft_vocab(rows, 0.0) == 8
    assert choose_draft_vocab(rows, 1.1) == V  # none reaches it: the best covering
    assert choose_draft_vocab(rows, 1.1, max_n=32) == 32  # within the parameter budget
    with pytest.raises(ConfigError, match="budget"):
        choose_draft_vocab(rows, 0.5, max_n=4)


def test_draft_vocab_maps_and_rebuilds_its_caches_when_the_map_changes():
    vocab = DraftVocab(10, 3)
    tm = vocab.placeholder()
    assert torch.equal(tm, torch.arange(3)) and DraftVocab(10).placeholder() is None
    vocab.set_map(tm, torch.tensor([7, 2, 5]))
    assert vocab.target_to_draft(tm).tolist() == [-1, -1, 1, -1, -1, 2, -1, 0, -1, -1]
    cached = vocab.target_to_draft(tm)
    assert vocab.target_to_draft(tm) is cached
    vocab.set_map(tm, torch.tensor([0, 1, 9]))  # in place: the cache is rebuilt
    assert vocab.target_to_draft(tm).tolist() == [0, 1, -1, -1, -1, -1, -1, -1, -1, 2]
    assert vocab.to_target(tm, torch.tensor([[2, 0]])).tolist() == [[9, 0]]
    logits = torch.tensor([1.0, 2.0, 3.0])
    full = vocab.to_target_logits(tm, logits)
    assert full[[0, 1, 9]].tolist() == [1.0, 2.0, 3.0] and torch.isinf(full[2:9]).all()
    assert vocab.to_target_logits(None, logits) is logits and vocab.target_to_draft(None) is None
    with pytest.raises(ValueError, match="full vocabulary"):
        vocab.set_map(None, tm)
    with pytest.raises(ValueError, match="not distinct"):
        vocab.set_map(tm, torch.tensor([1, 1, 2]))


def test_draft_vocab_shared_rows_cached_until_the_weight_changes():
    vocab = DraftVocab(6, 2)
    head = torch.nn.Linear(4, 6, bias=True)
    tm = torch.tensor([4, 1])
    with torch.no_grad():
        w, b = vocab.shared_rows(head, tm)
        assert torch.equal(w, head.weight[[4, 1]]) and torch.equal(b, head.bias[[4, 1]])
        assert vocab.shared_rows(head, tm)[0] is w
        head.weight.add_(1.0)
        w2, _ = vocab.shared_rows(head, tm)
        assert w2 is not w and torch.equal(w2, head.weight[[4, 1]])
    w3, _ = vocab.shared_rows(head, tm)  # with autograd: gathered in the graph
    assert w3.requires_grad


def test_draft_vocab_restrict_once_keeps_rows():
    vocab = DraftVocab(6)
    heads = torch.nn.ModuleList(torch.nn.Linear(4, 6, bias=False) for _ in range(2))
    new, tm = vocab.restrict(torch.tensor([5, 0]), heads, 4, torch.device("cpu"))
    assert vocab.size == 2 and tm.tolist() == [5, 0]
    for old, head in zip(heads, new):
        assert torch.equal(head.weight, old.weight[[5, 0]])
    with pytest.raises(ValueError, match="already have a draft vocabulary of 2 tokens: pass its token_map"):
        vocab.restrict(torch.tensor([1]), new, 4, torch.device("cpu"))
    shared, tm = DraftVocab(6).restrict(torch.tensor([3]), None, 4, torch.device("cpu"))
    assert shared is None and tm.tolist() == [3]  # heads that share the LM head keep no W2


def test_draft_vocab_remap_keeps_trained_rows_and_takes_new_ids_from_the_base():
    """An existing draft vocabulary [5, 0] re-mapped to [0, 2, 5] (widened, reordered): ids 0 and 5 keep their
    trained rows, id 2 starts as the base LM head's row; narrowing to [5] keeps its row without a base."""
    vocab = DraftVocab(6)
    heads = torch.nn.ModuleList([torch.nn.Linear(4, 6, bias=False)])
    trained, tm = vocab.restrict(torch.tensor([5, 0]), heads, 4, torch.device("cpu"))
    base = torch.randn(6, 4)
    wide, tm2 = vocab.restrict(torch.tensor([0, 2, 5]), trained, 4, torch.device("cpu"), tm, base)
    w, old = wide[0].weight, trained[0].weight
    assert vocab.size == 3 and tm2.tolist() == [0, 2, 5]
    assert torch.equal(w[0], old[1]) and torch.equal(w[2], old[0]) and torch.equal(w[1], base[2])
    assert vocab.target_to_draft(tm2).tolist() == [0, -1, 1, -1, -1, 2]  # no stale inverse map
    narrow, _ = vocab.restrict(torch.tensor([5]), wide, 4, torch.device("cpu"), tm2)
    assert torch.equal(narrow[0].weight[0], old[0])
    with pytest.raises(ValueError, match="1 ids of the new draft vocabulary are not in the current one"):
        DraftVocab(6).restrict(torch.tensor([5, 1]), trained, 4, torch.device("cpu"), torch.tensor([5, 0]))


def test_widen_map_keeps_the_old_ids_first_then_the_most_frequent_new_ones():
    counts = torch.tensor([0, 9, 1, 7, 7, 2])
    assert widen_map(torch.tensor([4, 2]), counts, 5).tolist() == [4, 2, 1, 3, 5]
    assert widen_map(torch.tensor([4, 2]), counts, 2).tolist() == [4, 2]
    with pytest.raises(ConfigError, match="widening a 2-token draft vocabulary needs a size in \\[2, 6\\]"):
        widen_map(torch.tensor([4, 2]), counts, 1)


def test_shared_rows_follow_every_in_place_change_of_the_map():
    """Shared-LM-head draft heads over a draft vocabulary: the cached LM-head rows are those of the current
    map after ``set_token_map``, ``load_state_dict`` and a write through ``.data`` (no stale rows)."""
    base = tiny_model("llama")
    model = MedusaModel.from_base(base, num_heads=2, num_layers=1, head_type="shared_lm_head",
                                  token_map=torch.arange(24))
    hidden = torch.randn(1, 3, base.config.hidden_size)
    ref = lm_head_of(base)(hidden).detach()  # [B, T, V]

    def check(tm):
        with torch.no_grad():
            draft = model.heads.draft_logits(hidden)  # [K, B, T, N]
            top = model.heads.topk(hidden, 1)  # [K, B, T, 1] target ids
        for k in range(2):
            torch.testing.assert_close(draft[k], ref[..., tm], rtol=1e-6, atol=1e-6)
        assert torch.isin(top, tm).all()

    check(torch.arange(24))  # fills the caches with the placeholder map's rows
    new = _map(24, seed=3)
    model.heads.set_token_map(new)
    check(new)
    state = model.heads.state_dict()
    state["token_map"] = _map(24, seed=4)
    model.heads.load_state_dict(state)
    check(state["token_map"])
    model.heads.token_map.data.copy_(_map(24, seed=5))  # bypasses the version counter
    check(_map(24, seed=5))


def test_shared_rows_follow_the_bias_and_a_replaced_weight():
    vocab = DraftVocab(6, 2)
    head = torch.nn.Linear(4, 6, bias=True)
    tm = torch.tensor([4, 1])
    with torch.no_grad():
        vocab.shared_rows(head, tm)
        head.bias.add_(1.0)
        assert torch.equal(vocab.shared_rows(head, tm)[1], head.bias[[4, 1]])
        head.bias.data.mul_(3.0)
        assert torch.equal(vocab.shared_rows(head, tm)[1], head.bias[[4, 1]])
        head.weight.data = torch.randn(6, 4)  # a new tensor behind the same parameter
        assert torch.equal(vocab.shared_rows(head, tm)[0], head.weight[[4, 1]])
        head.load_state_dict({"weight": torch.randn(6, 4), "bias": torch.randn(6)})
        w, b = vocab.shared_rows(head, tm)
        assert torch.equal(w, head.weight[[4, 1]]) and torch.equal(b, head.bias[[4, 1]])
        other = torch.nn.Linear(4, 6, bias=False)  # another LM head: never the first one's rows
        assert torch.equal(vocab.shared_rows(other, tm)[0], other.weight[[4, 1]])
        tm.data[0] = 2
        assert torch.equal(vocab.shared_rows(other, tm)[0], other.weight[[2, 1]])
        assert vocab.target_to_draft(tm)[2] == 0 and vocab.target_to_draft(tm)[4] == -1
