"""The ``Heads`` Protocol (medusa/modeling/protocol.py): every head family provides each of its members."""

import pytest

from medusa import MedusaModel
from medusa.modeling.draft_vocab import DraftVocab
from medusa.modeling.protocol import Heads

from tiny_models import tiny_model

MEMBERS = sorted(name for name in vars(Heads) if not name.startswith("_") or name == "__call__")
MEMBERS += sorted(getattr(Heads, "__annotations__", {}))


@pytest.mark.parametrize("head_type", ["linear", "shared_lm_head", "hydra"])
@pytest.mark.parametrize("draft", [0, 8])
def test_every_head_family_provides_the_protocol(head_type, draft):
    import torch

    tm = torch.arange(draft) * 3 if draft else None
    heads = MedusaModel.from_base(tiny_model("llama"), num_heads=2, head_type=head_type, token_map=tm).heads
    assert {"head_logits", "teacher_inputs", "hidden_logits", "bind_base", "restrict_vocab",
            "num_heads", "vocab_size", "token_map"} <= set(MEMBERS)
    missing = [name for name in MEMBERS if not hasattr(heads, name)]
    assert not missing, f"{type(heads).__name__} lacks {missing}"
    assert isinstance(heads.vocab, DraftVocab) and heads.draft_vocab == draft == heads.vocab.size
    assert heads.head_type == head_type


def test_eagle3_is_a_whole_drafter_not_stubbed_heads():
    """EAGLE-3 implements the sequential Drafter protocol fully and none of the parallel-heads members it
    used to stub (lm_heads = None, hidden_logits -> None, project ignoring its head); heads are no Drafter."""
    import torch

    from medusa.decoding.drafter import Drafter

    base = tiny_model("llama", layers=4)
    token_map = torch.arange(8) * 3
    drafter = MedusaModel.from_base(base, num_heads=2, head_type="eagle3", token_map=token_map).heads
    members = [n for n in vars(Drafter) if not n.startswith("_")] + list(Drafter.__annotations__)
    assert {"new_cache", "context_pass", "draft_pass", "logits", "to_target", "dtype"} <= set(members)
    assert isinstance(drafter, Drafter) and all(hasattr(drafter, n) for n in members)
    assert not any(hasattr(drafter, n) for n in ("lm_heads", "hidden_logits", "project", "head_logits"))
    assert drafter.to_target(torch.tensor([0, 2])).tolist() == [0, 6] and drafter.dtype == torch.float32
    for head_type in ("linear", "hydra"):
        assert not isinstance(MedusaModel.from_base(base, num_heads=2, head_type=head_type).heads, Drafter)
