"""Sliding-window layers under a custom 4-D tree mask (medusa/decoding/attention.py).

The window is applied by position (the keys a query sees, counted back from itself), never by cache column:
a tiny random Gemma-3 with a window of 16 decodes greedily exactly as HF ``generate`` over many steps across
the window, alone and in a left-padded batch whose rows accept unevenly (holes in the cache); the 4-D mask
gives the body the logits its own 2-D mask gives, for mixed (Gemma-3, Qwen2) and all-sliding (Mistral)
layouts, and, without the window, different ones (so these checks can fail).
"""

from __future__ import annotations

import pytest
import torch
from decoding_helpers import memorise_heads, real_rows

from medusa import MedusaModel
from medusa.decoding.attention import FULL, SLIDING, body_mask, window_layout, window_mask
from medusa.errors import MedusaError
from medusa.modeling.base import decoder_of

WINDOW = 16
NEW = 64


def tiny_gemma3(window: int = WINDOW, seed: int = 0) -> torch.nn.Module:
    """A random 6-layer Gemma-3 (sliding, sliding, full, ...; window ``window``), LM head scaled up so greedy
    choices are decisive."""
    import transformers as tf

    torch.manual_seed(seed)
    cfg = tf.Gemma3TextConfig(vocab_size=96, hidden_size=32, num_hidden_layers=6, num_attention_heads=4,
                              num_key_value_heads=2, head_dim=8, intermediate_size=64,
                              max_position_embeddings=512, sliding_window=window, bos_token_id=1,
                              eos_token_id=2, pad_token_id=0,
                              layer_types=[SLIDING, SLIDING, FULL, SLIDING, SLIDING, FULL])
    base = tf.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    with torch.no_grad():
        for p in base.parameters():
            p.mul_(4.0) if p.dim() == 2 and p.shape[0] == cfg.vocab_size else None
    return base.eval()


def causal_float_mask(mask2d: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` padding -> the additive causal mask ``[B, 1, T, T]`` a tree step would pass."""
    t = mask2d.shape[1]
    keep = torch.ones(t, t, dtype=torch.bool).tril().view(1, 1, t, t) & mask2d.bool().view(-1, 1, 1, t)
    return torch.where(keep, 0.0, torch.finfo(torch.float32).min)


def _reference_window(allowed: torch.Tensor, positions: torch.Tensor, window: int) -> torch.Tensor:
    """Naive: query i keeps key j iff allowed and pos[i] - pos[j] < window (positions of the keys)."""
    q = positions.view(-1, 1)
    return allowed & (q - positions.view(1, -1) < window)


def test_window_mask_counts_positions_not_columns():
    """A cache with a hole (column 3) and a two-branch tree (columns 6..8): each node keeps its last
    ``window`` visible keys by position, as the naive position rule says."""
    # columns: 0..5 past (3 is a hole), 6 = root, 7 = child A, 8 = child B (siblings)
    key_pos = torch.tensor([0, 1, 2, -1, 3, 4, 5, 6, 6])
    allowed = torch.zeros(3, 9, dtype=torch.bool)
    allowed[:, [0, 1, 2, 4, 5]] = True
    allowed[:, 6] = True  # every node sees the root
    allowed[1, 7] = allowed[2, 8] = True  # each child sees itself
    mask = torch.where(allowed, 0.0, torch.finfo(torch.float32).min).view(1, 1, 3, 9)
    q_pos = torch.tensor([5, 6, 6])
    for window in (1, 2, 3, 5, 8):
        got = window_mask(mask, window)[0, 0] == 0
        for i in range(3):
            want = allowed[i] & (q_pos[i] - key_pos < window)
            assert torch.equal(got[i], want), (window, i)
    assert window_mask(mask, 9) is mask  # no query reaches past a window of the full width


def test_window_mask_bool_and_random_against_naive():
    torch.manual_seed(0)
    for _ in range(20):
        t = int(torch.randint(2, 30, ()))
        real = torch.rand(t) > 0.3
        real[-1] = True
        pos = real.long().cumsum(0) - 1
        allowed = torch.ones(t, t, dtype=torch.bool).tril() & real.view(1, t)
        window = int(torch.randint(1, t + 1, ()))
        want = _reference_window(allowed, pos, window)
        assert torch.equal(window_mask(allowed.view(1, 1, t, t), window)[0, 0], want)


@pytest.mark.parametrize("arch", ["gemma3", "qwen2", "mistral"])
def test_4d_mask_gives_the_body_its_own_sliding_logits(arch):
    """Left-padded, longer than the window: the 4-D mask through :func:`body_mask` equals the body's own
    2-D-mask forward; the raw 4-D mask (every layer sees every key) does not."""
    base = _sliding_model(arch)
    torch.manual_seed(1)
    ids = torch.randint(3, 96, (2, 40))
    mask2d = torch.ones_like(ids)
    mask2d[1, :9] = 0
    pos = (mask2d.cumsum(-1) - 1).clamp(min=0)
    body = decoder_of(base)
    with torch.no_grad():
        want = body(input_ids=ids, attention_mask=mask2d, position_ids=pos).last_hidden_state
        mask4d = causal_float_mask(mask2d)
        got = body(input_ids=ids, attention_mask=body_mask(base, mask4d), position_ids=pos).last_hidden_state
        raw = body(input_ids=ids, attention_mask=mask4d, position_ids=pos).last_hidden_state
    real = mask2d.bool()
    assert torch.allclose(got[real], want[real], atol=1e-5)
    assert not torch.allclose(raw[real], want[real], atol=1e-3)
    expected = dict if arch != "mistral" else torch.Tensor
    assert isinstance(body_mask(base, mask4d), expected)


def _sliding_model(arch: str) -> torch.nn.Module:
    import transformers as tf

    if arch == "gemma3":
        return tiny_gemma3()
    torch.manual_seed(0)
    common = dict(vocab_size=96, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=64, max_position_embeddings=512, pad_token_id=0)
    if arch == "qwen2":  # layers >= max_window_layers slide: a mixed layout
        cfg = tf.Qwen2Config(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=2, **common)
        assert cfg.layer_types == [FULL, FULL, SLIDING, SLIDING]
    else:
        cfg = tf.MistralConfig(sliding_window=WINDOW, **common)
    return tf.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").eval()


def test_window_layout_of_each_kind():
    assert window_layout(tiny_gemma3()).window == WINDOW and window_layout(tiny_gemma3()).mixed
    assert window_layout(_sliding_model("mistral")) == window_layout(_sliding_model("mistral"))
    assert not window_layout(_sliding_model("mistral")).mixed
    base = tiny_gemma3()
    base.config.layer_types = [FULL] * 6
    assert window_layout(base).window is None
    mask = causal_float_mask(torch.ones(1, 40, dtype=torch.long))
    assert body_mask(base, mask) is mask and body_mask(base, torch.ones(1, 40)) is not None


def test_unsupported_attention_is_an_error():
    base = tiny_gemma3()
    base.config.layer_types = ["chunked_attention"] * 6
    with pytest.raises(MedusaError, match="chunked_attention"):
        window_layout(base)
    base = tiny_gemma3()
    base.config.use_bidirectional_attention = True
    with pytest.raises(MedusaError, match="bidirectional"):
        window_layout(base)


# ------------------------------------------------------------------ greedy decoding across the window
@pytest.fixture(scope="module")
def gemma3_tiny():
    """The tiny Gemma-3, a left-padded batch (prompts 24 and 15 tokens, both past the window), HF greedy
    references and heads memorised on row 0's continuation only (so row 1 accepts less: holes)."""
    base = tiny_gemma3()
    torch.manual_seed(3)
    ids = torch.randint(3, 96, (2, 24))
    mask = torch.ones_like(ids)
    ids[1, :9], mask[1, :9] = 0, 0
    with torch.no_grad():
        ref = base.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, pad_token_id=0)
    model = MedusaModel.from_base(base, num_heads=3, num_layers=1)
    rows = real_rows(ref, mask, eos_id=2)
    memorise_heads(model, rows[:1], steps=200)
    return model, ids, mask, ref, rows


def test_tiny_gemma3_greedy_equals_hf_batch_of_2_with_holes(gemma3_tiny):
    model, ids, mask, ref, _ = gemma3_tiny
    out = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, return_dict_in_generate=True)
    assert torch.equal(out.sequences, ref)
    a, b = out.accept_lengths
    assert max(a) >= 4 and a[:len(b)] != b  # long runs; rows accept unevenly, so the cache has holes
    assert len(a) > 8  # many steps, most of them past the window of 16


@pytest.mark.parametrize("tree", [None, "dynamic"])
def test_tiny_gemma3_greedy_equals_hf_batch_of_1(gemma3_tiny, tree):
    model, _, mask, _, rows = gemma3_tiny
    runs = []
    for row, seq in enumerate(rows):
        p = int(mask[row].sum())
        out = model.generate(seq[:p].view(1, -1), max_new_tokens=NEW, tree=tree, return_dict_in_generate=True)
        assert torch.equal(out.sequences[0], seq), (row, tree)
        runs.append(max(out.accept_lengths[0]))
    assert runs[0] >= 3  # the memorised row is accepted in runs


@pytest.mark.parametrize("tree", [None, "lookup"])
def test_tiny_gemma3_lookup_chain_across_the_window(gemma3_tiny, tree):
    """The hybrid tree (heads + a lookup chain of 4) and the chain alone on a prompt that repeats itself: the
    chain's nodes attend through the sliding layers' window like the heads' nodes."""
    model, *_ = gemma3_tiny
    torch.manual_seed(5)
    prompt = torch.randint(3, 96, (1, 10)).repeat(1, 3)  # [1, 30]: past the window of 16, repeating
    with torch.no_grad():
        ref = model.base_model.generate(prompt, max_new_tokens=NEW, do_sample=False, pad_token_id=0)
    out = model.generate(prompt, max_new_tokens=NEW, tree=tree, lookup_tokens=4, return_dict_in_generate=True)
    assert torch.equal(out.sequences, ref), tree
    assert len(out.accept_lengths[0]) < NEW  # more than one token per step somewhere
