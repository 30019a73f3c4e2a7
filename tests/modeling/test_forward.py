"""medusa/modeling/forward.py: what a forward needs from the base (BodyParts) resolved once per decoding run
(TreeVerifier) gives exactly what ``MedusaModel.forward`` gives, for a plain base and for one whose logits
are soft-capped and whose layers use a sliding window (Gemma-2: both steps of the forward that a run may
skip are then taken)."""

import pytest
import torch

from medusa import MedusaModel

from tiny_models import tiny_model


@pytest.mark.parametrize("arch, head_type, post, windowed", [("llama", "eagle3", False, False),
                                                         ("gemma2", "linear", True, True)])
def test_tree_verifier_equals_forward(arch, head_type, post, windowed):
    base = tiny_model(arch, layers=2, sliding_window=4) if arch == "gemma2" else tiny_model(arch, layers=2)
    model = MedusaModel.from_base(base, num_heads=2, head_type=head_type).eval()
    verifier = model.tree_verifier()
    assert (verifier.parts.post, verifier.parts.windowed, verifier.parts.native) == (post, windowed, False)
    ids = torch.randint(3, 96, (1, 9), generator=torch.Generator().manual_seed(0))
    n = ids.shape[1]
    causal = torch.full((n, n), float("-inf")).triu(1).view(1, 1, n, n)  # [B, 1, T, T] additive
    kw = dict(input_ids=ids, attention_mask=causal, position_ids=torch.arange(n).view(1, n), use_cache=False,
              compute_heads=False)
    with torch.no_grad():
        want, got = model(**kw), verifier(**kw)
    assert torch.equal(got.logits, want.logits) and torch.equal(got.hidden_states, want.hidden_states)
    layers = 3 if head_type == "eagle3" else 1  # the drafter's three feature layers, else the last state
    assert got.hidden_states.shape == (1, n, layers * base.config.hidden_size)
