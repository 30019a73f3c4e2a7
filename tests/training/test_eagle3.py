"""The eagle3 training-time-test loss against a naive reference that drafts each chain one token at a time
through the KV cache (as decoding does), the unroll mask, and a whole `medusa train` run on stories260K:
drafter changed, per-step accuracy in the metrics, a checkpoint that loads."""

import json

import torch
import torch.nn.functional as F

from medusa import MedusaModel
from medusa.modeling.eagle3 import DraftKV, base_features, base_states
from medusa.training.eagle3 import shifted_tokens, ttt_loss, unroll_mask
from medusa.training.losses import Teacher, head_weights
from medusa.training.medusa1 import draft_teacher_logits

from tiny_models import require_shared, tiny_model


def _perturbed(model, scale=0.3, seed=0):
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.heads.parameters():
            p.add_(scale * torch.randn_like(p))
    return model


def _chain_logits(heads, feats, ids, i, j):
    """Step j's logits at position i, drafting the chain one entry at a time over a causal prefix."""
    cache = DraftKV()
    n = i + 1
    allowed = torch.ones(n, n, dtype=torch.bool).tril()
    mask = torch.zeros(1, 1, n, n).masked_fill(~allowed, torch.finfo(torch.float32).min)
    pos = torch.arange(1, n + 1).view(1, n)
    g = heads.layer(heads.embed(ids[:, 1:n + 1]), heads.fuse(feats[:, :n]), pos, mask, cache)[:, -1:]
    for s in range(1, j + 1):
        open_mask = torch.zeros(1, 1, 1, cache.get_seq_length() + 1)
        g = heads.layer(heads.embed(ids[:, i + 1 + s:i + 2 + s]), g, torch.tensor([[i + 1 + s]]), open_mask,
                        cache)
    return heads.logits(g[:, 0])  # [1, N]


def _naive_loss(heads, feats, ids, labels, steps, term):
    """sum_j decay^(j+1) * mean over step j's in-vocabulary targets of ``term(logits [1, N], draft y, i, j)``,
    each target's logits drafted chain by chain."""
    t2d = heads.target_to_draft()
    want = 0.0
    for j, weight in enumerate(head_weights(steps, 0.8)):
        terms = []
        for i in range(ids.shape[1] - j - 2):
            y = int(labels[0, i + 2 + j])
            if y != -100 and int(t2d[y]) >= 0:
                terms.append(term(_chain_logits(heads, feats, ids, i, j), int(t2d[y]), i, j))
        if terms:
            want += weight * torch.stack(terms).mean()
    return want


def test_ttt_loss_equals_chain_by_chain_drafting():
    base = tiny_model("llama", layers=4)
    model = _perturbed(MedusaModel.from_base(base, num_heads=3, head_type="eagle3",
                                             token_map=torch.arange(10, 70)))
    torch.manual_seed(3)
    ids = torch.randint(3, 96, (1, 11))
    labels = ids.clone()
    labels[:, :3] = -100
    feats = base_features(base, ids, None, model.heads.feature_layers)
    with torch.no_grad():
        out = ttt_loss(model.heads, feats, ids, labels, None, decay=0.8)
        want = _naive_loss(model.heads, feats, ids, labels, 3,
                           lambda logits, y, i, j: F.cross_entropy(logits, torch.tensor([y])))
    torch.testing.assert_close(out.loss, torch.as_tensor(want, dtype=out.loss.dtype), atol=1e-4, rtol=1e-4)
    assert out.count.tolist() == [8.0, 8.0, 7.0]  # labelled targets per step (positions 3..10)


def test_ttt_loss_teacher_kl_equals_the_naive_mix():
    """With teacher weight w each step is (1 - w) CE + w KL(p_base || p_draft) over the draft vocabulary, the
    base's distribution read where it predicts the target (its LM head's draft rows at i + 1 + j)."""
    base = tiny_model("llama", layers=4)
    model = _perturbed(MedusaModel.from_base(base, num_heads=2, head_type="eagle3",
                                             token_map=torch.arange(10, 70)))
    torch.manual_seed(5)
    ids = torch.randint(3, 96, (1, 9))
    labels = ids.clone()
    labels[:, :2] = -100
    feats, last = base_states(base, ids, None, model.heads.feature_layers)
    lm_rows = base.lm_head.weight[model.heads.token_map]  # [N, d]
    w = 0.5
    teacher = Teacher(last, draft_teacher_logits(base.lm_head, model.heads), w)
    with torch.no_grad():
        out = ttt_loss(model.heads, feats, ids, labels, None, decay=0.8, teacher=teacher)
        plain = ttt_loss(model.heads, feats, ids, labels, None, decay=0.8)

        def mixed(logits, y, i, j):  # logits [1, N]
            p_base = torch.softmax(last[0, i + 1 + j] @ lm_rows.T, -1)  # [N]
            kl = (p_base * (p_base.log() - torch.log_softmax(logits[0], -1))).sum()
            return (1 - w) * F.cross_entropy(logits, torch.tensor([y])) + w * kl

        want = _naive_loss(model.heads, feats, ids, labels, 2, mixed)
    torch.testing.assert_close(out.loss, torch.as_tensor(want, dtype=out.loss.dtype), atol=1e-4, rtol=1e-4)
    assert not torch.allclose(out.loss, plain.loss)  # the KL term changes the loss
    torch.testing.assert_close(out.correct1, plain.correct1)  # the statistics stay the CE's


def test_unroll_mask_blocks():
    valid = torch.tensor([[True, True, False]])
    allowed = unroll_mask(valid, 2, torch.float32)[0, 0] == 0  # [3, 9]
    assert allowed[:, :3].tolist() == [[True, False, False], [True, True, False], [True, True, False]]
    assert allowed[:, 3:6].tolist() == torch.eye(3, dtype=torch.bool).tolist()
    assert allowed[:, 6:].tolist() == torch.eye(3, dtype=torch.bool).tolist()
    assert shifted_tokens(torch.tensor([[5, 6, 7]]), 2).tolist() == [[7, 0, 0]]


def test_gradients_reach_the_drafter_only():
    base = tiny_model("llama", layers=4)
    model = MedusaModel.from_base(base, num_heads=2, head_type="eagle3")
    model.freeze_base()
    ids = torch.randint(3, 96, (2, 10))
    feats = base_features(base, ids, None, model.heads.feature_layers)
    ttt_loss(model.heads, feats, ids, ids, torch.ones_like(ids), decay=0.8).loss.backward()
    assert all(p.grad is None for p in base.parameters())
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.heads.parameters())


def test_no_target_inside_the_draft_vocabulary_is_a_zero_loss_on_the_graph():
    """A micro-batch whose every target lies outside the draft vocabulary: loss 0, and backward() gives
    every trainable drafter parameter a (zero) gradient, as DDP's all-reduce needs on every rank."""
    base = tiny_model("llama", layers=4)
    model = MedusaModel.from_base(base, num_heads=2, head_type="eagle3", token_map=torch.arange(10, 70))
    model.freeze_base()
    ids = torch.randint(70, 96, (2, 10))  # every label outside [10, 70)
    feats = base_features(base, ids, None, model.heads.feature_layers)
    out = ttt_loss(model.heads, feats, ids, ids, torch.ones_like(ids), decay=0.8)
    assert out.loss.requires_grad and float(out.loss.detach()) == 0.0
    out.loss.backward()
    trained = [p for p in model.heads.parameters() if p.requires_grad]
    assert trained and all(p.grad is not None and not p.grad.any() for p in trained)
    assert out.missed.tolist() == out.count.tolist() == [16.0, 14.0]


def test_medusa_train_eagle3_on_stories(tmp_path):
    from medusa.config import load_recipe
    from medusa.training.loop import train

    require_shared()
    recipe = load_recipe("recipes/tiny/eagle3.yaml", [f"output_dir={tmp_path / 'run'}", "train.max_steps=12",
                                                      "train.eval_steps=0", "train.logging_steps=6",
                                                      "heads.teacher_loss=0.5"])
    result = train(recipe, progress=False)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "head3_top1" in r]
    assert train_rows and all(0.0 <= r["head1_top1"] <= 1.0 for r in train_rows)
    trained = MedusaModel.from_pretrained(result.final_dir)
    fresh = MedusaModel.from_base(trained.base_model, num_heads=3, head_type="eagle3")
    assert trained.config.head_type == "eagle3" and trained.heads.feature_layers == (1, 2, 4)
    fresh_state = fresh.heads.state_dict()  # deterministic parts of a fresh drafter: LM head rows, norms
    for name in ("lm_head.weight", "layers.0.hidden_norm.weight", "norm.weight"):
        assert not torch.equal(trained.heads.state_dict()[name], fresh_state[name]), name
