"""medusa/modeling/native_draft.py: the EAGLE-3 draft layer's bfloat16 pass through the C ops is as close to
the float32 truth as the layer's own bfloat16 code, is taken only where it may be (inference, bf16, a few
rows), and the drafter's cache written in place during decoding holds what the concatenating one (training)
holds."""

import copy

import pytest
import torch

from medusa.modeling import bf16_kernel, native_body, native_draft
from medusa.modeling.cpu_linear import pack_linears
from medusa.modeling.eagle3 import DraftKV
from medusa.modeling.model import MedusaModel

from tiny_models import tiny_model

pytestmark = pytest.mark.skipif(not bf16_kernel.available(),
                                reason=f"AMX kernel unavailable: {bf16_kernel.unavailable_reason()}")

NEG = torch.finfo(torch.bfloat16).min


def _drafter(dtype: torch.dtype):
    torch.manual_seed(0)
    base = tiny_model("llama", hidden_size=128, intermediate_size=256, layers=3)
    heads = MedusaModel.from_base(base, num_heads=2, head_type="eagle3").heads
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(torch.randn_like(p) * 0.05)  # not the identity-like init
    heads = copy.deepcopy(heads).to(dtype)
    if dtype == torch.bfloat16:
        pack_linears(heads)
    return heads


def _pass(heads, cache: DraftKV, at=None):
    """A 12-entry context then a 5-node level attending to the context and a few of its siblings."""
    g = torch.Generator().manual_seed(4)
    dtype = heads.dtype
    d = heads.hidden_size
    embeds = torch.randn(1, 12, d, generator=g).to(dtype)
    hidden = torch.randn(1, 12, d, generator=g).to(dtype)
    neg = torch.finfo(dtype).min
    causal = torch.full((12, 12), neg).triu(1).to(dtype).view(1, 1, 12, 12)
    first = heads.layer(embeds, hidden, torch.arange(12).view(1, 12), causal, cache)
    level = torch.full((1, 1, 5, 17), neg, dtype=dtype)
    level[..., :12] = 0
    for i in range(5):
        level[0, 0, i, 12 + i] = 0
    level[0, 0, 3, 12] = 0  # node 3 also sees node 0
    out = heads.layer(embeds[:, :5], hidden[:, :5], torch.full((1, 5), 12), level, cache, at=at)
    return first, out


def test_as_close_to_float32_as_the_layers_own_bf16_code(monkeypatch):
    f32 = _drafter(torch.float32)
    bf16 = _drafter(torch.bfloat16)
    with torch.no_grad():
        truth = _pass(f32, DraftKV())
        rows = torch.zeros(1, 5, 128, dtype=torch.bfloat16)
        mask = torch.zeros(1, 1, 5, 17, dtype=torch.bfloat16)
        assert native_draft.native_layer_for(bf16, bf16.layers[0], rows, mask) is not None
        ours = _pass(bf16, DraftKV())
        with monkeypatch.context() as m:
            m.setenv(native_body.ENV, "0")
            theirs = _pass(bf16, DraftKV())
        at = _pass(bf16, DraftKV(), at=torch.tensor([3]))[1]
    for mine, model_bf16, exact in zip(ours, theirs, truth):
        their_error = (model_bf16.float() - exact).abs().max().item()
        my_error = (mine.float() - exact).abs().max().item()
        assert my_error <= 2 * their_error + 1e-3, (my_error, their_error)
    assert at.shape == (1, 128) and torch.equal(at, ours[1][:, 3])  # the MLP at one entry: that entry's


@pytest.mark.parametrize("at", [None, torch.tensor([3])])
def test_the_one_call_pass_computes_the_stepwise_bits(monkeypatch, at):
    """Decoding's cache (in-place buffers holding entries) takes the pass in one C call
    (kernels/bf16_layers.c); without it the ops run one by one: the same outputs and cache entries."""
    bf16 = _drafter(torch.bfloat16)
    calls = []
    one_call = native_draft._one_call
    monkeypatch.setattr(native_draft, "_one_call", lambda *a: calls.append(1) or one_call(*a))
    with torch.no_grad():
        fused_cache, stepwise_cache = DraftKV(), DraftKV()
        fused = _pass(bf16, fused_cache, at=at)
        assert calls == [1]  # the context pass fills the cache, the level goes in one call
        monkeypatch.setattr(DraftKV, "append_slots", lambda self, n: None)
        stepwise = _pass(bf16, stepwise_cache, at=at)
    assert calls == [1]
    assert all(torch.equal(a, b) for a, b in zip(fused, stepwise, strict=True))
    assert torch.equal(fused_cache.key, stepwise_cache.key) and torch.equal(fused_cache.value,
                                                                               stepwise_cache.value)


def test_taken_only_for_inference_in_bf16_on_a_few_rows():
    bf16, f32 = _drafter(torch.bfloat16), _drafter(torch.float32)
    mask = torch.zeros(1, 1, 4, 8, dtype=torch.bfloat16)
    rows = torch.zeros(1, 4, 128, dtype=torch.bfloat16)
    with torch.no_grad():
        assert native_draft.native_layer_for(bf16, bf16.layers[0], rows, mask) is not None
        assert native_draft.native_layer_for(f32, f32.layers[0], rows.float(), mask.float()) is None
        many = torch.zeros(1, native_body.MAX_ROWS + 1, 128, dtype=torch.bfloat16)
        assert native_draft.native_layer_for(bf16, bf16.layers[0], many, mask) is None
    assert native_draft.native_layer_for(bf16, bf16.layers[0], rows, mask) is None  # gradients on


def test_the_in_place_cache_holds_what_the_concatenating_one_does():
    g = torch.Generator().manual_seed(0)
    steps = [torch.randn(1, 2, n, 8, generator=g) for n in (5, 3, 4, 2)]
    in_place, concatenated = DraftKV(), DraftKV()
    for i, kv in enumerate(steps):
        a = in_place.update(kv, kv * 2, 0)
        b = concatenated.update(kv.requires_grad_(), kv * 2, 0)
        assert torch.equal(a[0], b[0].detach()) and torch.equal(a[1], b[1].detach())
        if i == 1:
            in_place.truncate(6)
            concatenated.truncate(6)
    assert in_place.get_seq_length() == concatenated.get_seq_length() == 12
    assert in_place._buffer is not None and concatenated._buffer is None  # training keeps autograd's tensors


def _decode_passes(heads, cache: DraftKV, k: int):
    """What decoding asks of the drafter: a context pass over 12 entries (the prompt's: stepwise), a context
    pass over 3 more (at each row's last real entry), the root's top-k, then a 4-node level's top-k."""
    g = torch.Generator().manual_seed(7)
    d, f = heads.hidden_size, heads.fc.in_features
    features = torch.randn(2, 15, f, generator=g).bfloat16()
    tokens = torch.randint(0, heads.vocab_size, (2, 15), generator=g)
    causal = torch.full((15, 15), NEG).triu(1).bfloat16().view(1, 1, 15, 15).expand(2, 1, 15, 15)
    positions = torch.arange(1, 16).view(1, 15).expand(2, 15)
    heads.context_pass(features[:, :12], tokens[:, :12], positions[:, :12],
                       causal[..., :12, :12].contiguous(), cache, torch.tensor([11, 11]))
    g_root = heads.context_pass(features[:, 12:], tokens[:, 12:], positions[:, 12:],
                                causal[..., 12:, :].contiguous(), cache, torch.tensor([2, 1]))
    root_top = heads.top_log_probs(g_root.unsqueeze(1), k)
    level = torch.full((2, 1, 4, 19), NEG, dtype=torch.bfloat16)
    level[..., :15] = 0
    for i in range(4):
        level[:, 0, i, 15 + i] = 0
    level[1, 0, 2, 15] = 0  # row 1's node 2 also sees its node 0
    hidden = torch.randn(2, 4, d, generator=g).bfloat16()
    node_tokens = torch.randint(0, heads.vocab_size, (2, 4), generator=g)
    drafted = heads.draft_top(hidden, node_tokens, torch.full((2, 4), 16), level, cache, k)
    return (g_root, *root_top, *drafted)


@pytest.mark.parametrize("k", [1, 3])
def test_a_drafting_level_in_one_call_computes_the_stepwise_bits(monkeypatch, k):
    """The context pass (fused features, the layer at each row's last entry) and a drafting level (embedding,
    rotary rows, layer, final norm, LM head, top-k log-softmax) in one kernels/bf16_draft_step.c call give
    the bits of the pass followed by the LM head and medusa.native.pick.top_log_softmax, and the same
    cache."""
    bf16 = _drafter(torch.bfloat16)
    bf16._embedding.module = copy.deepcopy(bf16._embedding.module).bfloat16()  # a bf16 base's (decoding)
    taken = []
    step, top = native_draft.step, native_draft.top
    monkeypatch.setattr(native_draft, "step", lambda *a: taken.append("step") or step(*a))
    monkeypatch.setattr(native_draft, "top", lambda *a: taken.append("top") or top(*a))
    with torch.no_grad():
        fused_cache, stepwise_cache = DraftKV(), DraftKV()
        fused = _decode_passes(bf16, fused_cache, k)
        assert taken == ["step", "step", "top", "step"]  # the prompt's pass: no in-place room yet
        monkeypatch.setattr(native_draft, "drafter_for", lambda drafter, k: None)
        stepwise = _decode_passes(bf16, stepwise_cache, k)
        logits = bf16.logits(fused[3])  # the level's draft logits
    shapes = [(2, 128), (2, 1, k), (2, 1, k), (2, 4, 128), (2, 4, k), (2, 4, k)]
    assert [tuple(t.shape) for t in fused] == shapes
    assert all(torch.equal(a, b) for a, b in zip(fused, stepwise, strict=True))
    values, ids = torch.log_softmax(logits.float(), dim=-1).topk(k, dim=-1)  # what the picks stand for
    torch.testing.assert_close(fused[4], values, rtol=0, atol=1e-5)
    assert torch.equal(logits.gather(-1, fused[5]), logits.gather(-1, ids))  # the same ranks (ties: lower id)
    assert torch.equal(fused_cache.key, stepwise_cache.key) and torch.equal(fused_cache.value,
                                                                               stepwise_cache.value)


def test_the_one_call_pass_follows_the_drafters_modules_and_packing():
    """Taken only where the stepwise path runs the same AMX products (fc and the LM head packed), and
    rebuilt when a module it reads is replaced (a new LM head: restrict_vocab) -- never a stale copy."""
    bf16 = _drafter(torch.bfloat16)
    bf16._embedding.module = copy.deepcopy(bf16._embedding.module).bfloat16()
    with torch.no_grad():
        first = native_draft.drafter_for(bf16, 2)
        assert first is not None and first.head is bf16.lm_head.native  # the PackedLinear's own copy
        smaller = torch.nn.Linear(128, 64, bias=False).bfloat16()
        bf16.lm_head = smaller  # not packed: the stepwise path runs F.linear, so must the drafter
        assert native_draft.drafter_for(bf16, 2) is None
        pack_linears(bf16)
        again = native_draft.drafter_for(bf16, 2)
        assert again is not None and again.head is bf16.lm_head.native and again.head.n == 64
        g = torch.randn(3, 128).bfloat16()
        values, ids = native_draft.top(again, g, 2)
        logits = bf16.logits(g)
        assert int(ids.max()) < 64 and torch.equal(logits.gather(-1, ids), logits.topk(2).values)


def test_a_long_context_pass_in_pieces_computes_the_one_pass_bits(monkeypatch):
    """A prompt's context pass longer than one native pass takes goes in pieces (the first through the
    layer's code, which makes the in-place buffer, the rest in one C call each): the same entries and the
    same output as one pass over all of it."""
    bf16 = _drafter(torch.bfloat16)
    bf16._embedding.module = copy.deepcopy(bf16._embedding.module).bfloat16()  # a bf16 base's (decoding)
    taken = []
    step = native_draft.step
    monkeypatch.setattr(native_draft, "step", lambda *a: taken.append(a[1].shape[1]) or step(*a))
    m, d = 40, bf16.hidden_size
    g = torch.Generator().manual_seed(7)
    features = torch.randn(1, m, len(bf16.feature_layers) * d, generator=g).to(torch.bfloat16)
    tokens = torch.randint(3, 96, (1, m), generator=g)
    causal = torch.full((m, m), NEG).triu(1).to(torch.bfloat16).view(1, 1, m, m)
    last = torch.tensor([m - 1])

    def run():
        cache = DraftKV()
        with torch.no_grad():
            out = bf16.context_pass(features, tokens, torch.arange(1, m + 1).view(1, m), causal, cache, last)
        return out, cache

    whole, whole_cache = run()
    with monkeypatch.context() as patch:
        patch.setattr(native_body, "MAX_ROWS", 16)
        assert native_draft.context_pieces((1, m), last) == [(0, 16), (16, 32), (32, 40)]
        assert native_draft.context_pieces((1, m), torch.tensor([20])) is None  # its output in piece 2
        assert native_draft.context_pieces((1, 16), last) is None  # one pass takes it
        taken.clear()
        pieces, pieces_cache = run()
    assert taken == [40, 16, 16, 8]  # the whole pass tried, then the pieces (the first one no in-place room)
    assert torch.equal(pieces, whole)
    assert torch.equal(pieces_cache.key, whole_cache.key)
    assert torch.equal(pieces_cache.value, whole_cache.value)
