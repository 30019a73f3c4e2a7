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
