"""``MedusaModel.forward``'s features: the last hidden state, or, for heads with ``feature_layers`` (eagle3),
the base's ``hidden_states[i]`` concatenated over those indices (HF's convention: 0 = the embeddings)."""

import torch
from torch import nn

from medusa import MedusaModel
from medusa.modeling.base import decoder_of

from tiny_models import tiny_model


class _FeatureHeads(nn.Module):
    """A stand-in for heads that read several base layers: only ``feature_layers`` matters to forward."""

    def __init__(self, feature_layers):
        super().__init__()
        self.feature_layers = feature_layers


def test_forward_returns_the_last_hidden_state_without_feature_layers():
    base = tiny_model("llama")
    model = MedusaModel.from_base(base, num_heads=2).eval()
    ids = torch.randint(3, base.config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model(input_ids=ids, compute_heads=False)
        ref = decoder_of(base)(input_ids=ids).last_hidden_state  # [B, T, d]
    assert out.hidden_states.shape == (2, 7, base.config.hidden_size)
    torch.testing.assert_close(out.hidden_states, ref)


def test_forward_concatenates_the_feature_layers_hidden_states():
    base = tiny_model("llama")
    model = MedusaModel.from_base(base, num_heads=2).eval()
    ids = torch.randint(3, base.config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(1))
    d, layers = base.config.hidden_size, base.config.num_hidden_layers
    with torch.no_grad():
        plain = model(input_ids=ids, compute_heads=False)
        model.heads = _FeatureHeads((0, 1, layers))  # embeddings, after layer 1, after the last layer
        out = model(input_ids=ids, compute_heads=False)
        ref = decoder_of(base)(input_ids=ids, output_hidden_states=True).hidden_states  # L+1 x [B, T, d]
        model.heads = _FeatureHeads(None)  # None: the last hidden state, as without the attribute
        none = model(input_ids=ids, compute_heads=False)
    assert out.hidden_states.shape == (2, 7, 3 * d)  # [B, T, len * d]
    torch.testing.assert_close(out.hidden_states, torch.cat([ref[0], ref[1], ref[layers]], dim=-1))
    assert not torch.equal(ref[0], ref[1])  # distinct layers: the order of the concatenation is checked
    torch.testing.assert_close(out.logits, plain.logits)  # the logits stay the last layer's
    torch.testing.assert_close(none.hidden_states, plain.hidden_states)
