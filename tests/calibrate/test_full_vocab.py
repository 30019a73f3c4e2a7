"""medusa/calibrate/full_vocab.py: the full-vocabulary twin of shared-LM-head draft heads keeps their
ResBlocks and projects on every LM-head row; the draft-vs-full comparison calibrates both."""

import pytest
import torch

from medusa import MedusaModel
from medusa.calibrate.full_vocab import draft_vs_full_vocab, full_vocab_twin
from medusa.errors import MedusaError

from tiny_models import tiny_model


def _draft_shared(seed=0, n=40):
    torch.manual_seed(seed)
    tm = torch.randperm(96)[:n]
    model = MedusaModel.from_base(tiny_model("llama"), num_heads=2, num_layers=1, head_type="shared_lm_head",
                                  token_map=tm)
    with torch.no_grad():
        for p in model.heads.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return model.eval(), tm


def test_twin_keeps_the_resblocks_and_projects_on_every_row():
    model, tm = _draft_shared()
    twin = full_vocab_twin(model)
    assert twin.heads.token_map is None and twin.base_model is model.base_model
    x = torch.randn(3, model.config.hidden_size)
    with torch.no_grad():
        full = twin.heads.head_logits(1, x)  # [3, V]
        draft = model.heads.head_logits(1, x)  # [3, N]
    assert full.shape[-1] == 96 and draft.shape[-1] == tm.numel()
    torch.testing.assert_close(full[:, tm], draft)  # the same logits on the draft vocabulary's rows


def test_draft_vs_full_vocab_calibrates_both_and_refuses_other_heads():
    model, tm = _draft_shared()
    g = torch.Generator().manual_seed(2)
    examples = []
    for i in range(4):
        ids = torch.randint(3, 96, (14 + i,), generator=g).tolist()
        examples.append({"input_ids": ids, "labels": [-100] * 3 + ids[3:]})
    out = draft_vs_full_vocab(model, examples, nodes=4, progress=False)
    assert out["draft_vocab"] == 40 and out["nodes"] == 4
    assert out["lost"] == pytest.approx(1 - out["draft_tokens_per_step"] / out["full_vocab_tokens_per_step"])
    assert out["full_vocab_tokens_per_step"] >= 1.0 and out["draft_tokens_per_step"] >= 1.0
    known = {"expected_tokens_per_step": out["draft_tokens_per_step"], "top1": out["draft_top1"]}
    assert draft_vs_full_vocab(model, examples, nodes=4, progress=False, draft=known) == out  # not redone
    linear = MedusaModel.from_base(tiny_model("llama"), num_heads=2, token_map=tm)
    with pytest.raises(MedusaError, match="needs shared_lm_head heads with a draft vocabulary"):
        full_vocab_twin(linear)
