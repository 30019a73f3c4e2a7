"""The speculators package (``speculators==0.9.0`` in its own pinned venv, built here when missing) loads our
``--format speculators`` export of an eagle3 drafter on stories260K and its own ``Eagle3DraftModel`` computes
our draft logits at every position of every training-time-test step, within 2e-4 (float32; measured
<= 5e-5 on logits of magnitude <= 13; a draft step fed the wrong relative position is off by 0.2-1.6).

The drafter has random (perturbed) weights, an UNSORTED draft vocabulary and feature layers out of ascending
order, so the export's fc column reordering, its sorting of the draft vocabulary (``d2t`` ascending,
``lm_head`` rows reordered) and its ``embed_tokens.weight`` are all exercised: speculators'
own ``Eagle3DraftModel.from_pretrained`` loads the export as it is (the worker adds nothing) and takes its
embedding table from the file. Skipped only where the venv cannot be built (pip failure, no network)."""

from pathlib import Path

import pytest
import torch

from benchmarks.speculators_check import ascending_features, chain_logits, check, compare, our_logits
from benchmarks.speculators_env import SpeculatorsUnavailable, ensure_venv
from medusa import MedusaModel
from medusa.modeling.eagle3 import base_features

from tiny_models import STORIES, require_shared

# the speculators package in its own venv: run first (tests/conftest.py)
pytestmark = pytest.mark.heavy(120)

STEPS = 3
TOL = 2e-4
# a draft vocabulary in frequency order as training writes it, not ascending: the export must sort it
UNSORTED = torch.arange(3, 403, 2)[torch.randperm(200, generator=torch.Generator().manual_seed(3))]


def _drafter(root: Path) -> Path:
    torch.manual_seed(0)
    model = MedusaModel.from_base(str(require_shared(STORIES)), num_heads=STEPS, head_type="eagle3",
                                  feature_layers=(4, 1, 2), token_map=UNSORTED)
    with torch.no_grad():
        for p in model.heads.parameters():
            p.add_(0.3 * torch.randn_like(p))
    model.save_pretrained(root / "heads")
    return root / "heads"


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    try:
        ensure_venv()
    except SpeculatorsUnavailable as exc:
        pytest.skip(f"speculators cannot be installed here: {exc}")
    root = tmp_path_factory.mktemp("speculators")
    heads = _drafter(root)
    torch.manual_seed(1)
    ids = torch.randint(3, 512, (1, 20))
    return check(heads, str(STORIES), ids, STEPS, root / "work")


def test_speculators_computes_our_draft_logits_at_every_position(compared):
    assert compared["worker"]["model_class"] == "Eagle3DraftModel"
    assert compared["worker"]["target_layer_ids"] == [1, 2, 4]
    assert compared["worker"]["draft_vocab_size"] == 200 and compared["d2t_equals_token_map"]
    # speculators' t2d -> verifier lm_head rows: draft id k must be the k-th smallest target id
    assert compared["d2t_ascending"] and compared["verifier_head_matches_d2t"]
    worker = compared["worker"]  # the table from_pretrained loaded: the export's, = the verifier's embeddings
    assert worker["embed_tokens_in_checkpoint"] and worker["embed_tokens_from_checkpoint"]
    assert worker["embed_tokens_equal_verifier"] and not worker["embed_tokens_all_zero"]
    assert [len(s["max_abs_diff"]) for s in compared["steps"]] == [19, 18, 17]  # step j: T - 1 - j chains
    for s in compared["steps"]:
        print(f"step {s['step']}: max |diff| {max(s['max_abs_diff']):.2e}, "
              f"max |logit| {s['max_abs_logit']:.1f}")
        assert max(s["max_abs_diff"]) <= TOL, s
        assert s["argmax_equal"] == 1.0


def test_the_comparison_sees_a_wrong_layout(tmp_path):
    """compare() flags logits one position off (so agreement above is not vacuous), and ascending_features
    puts the feature blocks in the export's layer order."""
    model = MedusaModel.from_pretrained(str(_drafter(tmp_path)), base_model=str(STORIES)).eval()
    torch.manual_seed(2)
    ids = torch.randint(3, 512, (1, 8))
    feats = base_features(model.base_model, ids, None, model.heads.feature_layers)  # [1, 8, 3d]
    ours = our_logits(model.heads, feats, ids, STEPS)
    shifted = torch.stack([torch.cat([o[1:], o[-1:]]) for o in (x[:5] for x in ours)])  # [3, 5, N]
    assert max(compare([o[:5] for o in ours], shifted)[0]["max_abs_diff"]) > 0.1
    with torch.no_grad():
        assert torch.equal(chain_logits(model.heads, feats, ids, 3, 2)[1], ours[1][3])
    d = model.heads.hidden_size
    blocks = ascending_features(model.heads, feats).split(d, -1)  # layers 1, 2, 4
    assert torch.equal(blocks[0], feats[..., d:2 * d]) and torch.equal(blocks[2], feats[..., :d])
