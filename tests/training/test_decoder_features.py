"""medusa/training/decoder_features.py (``train.base_features: decoder``): an EAGLE-3 drafter's training
features computed as bf16 decoding computes them -- each row exactly its own decoding prefill's features
(left or right padding), zeros on padding, close to the model's own bf16-autocast features; the copy frozen,
the training model untouched; the loss and its gradients through the method; what it cannot serve refused."""

from pathlib import Path

import pytest
import torch

from medusa.config import ConfigError, Recipe, load_recipe
from medusa.decoding.kv_cache import FIRST_PIECE, dynamic_prefill
from medusa.modeling import bf16_kernel
from medusa.modeling.eagle3 import base_states
from medusa.modeling.model import MedusaModel
from medusa.training import medusa1
from medusa.training.decoder_features import decoder_copy, decoder_features
from medusa.training.eagle3 import Eagle3Loss

from tiny_models import SHARED, require_shared, tiny_model

ROOT = Path(__file__).resolve().parents[2]
EAGLE3 = ROOT / "recipes" / "tiny" / "eagle3.yaml"

native = pytest.mark.skipif(not bf16_kernel.available(),
                            reason=f"native bf16 kernel unavailable: {bf16_kernel.unavailable_reason()}")


def _eagle3() -> MedusaModel:
    """A tiny Llama whose widths the native body takes (hidden 128, MLP 256), an EAGLE-3 drafter, float32."""
    base = tiny_model("llama", hidden_size=128, intermediate_size=256, layers=4)
    model = MedusaModel.from_base(base, num_heads=2, head_type="eagle3", heads_dtype=torch.float32)
    model.freeze_base()
    return model


def _batch() -> dict[str, torch.Tensor]:
    """Three rows of 40 columns: full, right-padded (27 tokens), left-padded (21): past FIRST_PIECE, so the
    rest of each row goes through the native body's pieces."""
    ids = torch.randint(0, 96, (3, 40), generator=torch.Generator().manual_seed(1))  # [B, T]
    mask = torch.ones_like(ids)
    mask[1, 27:] = 0
    mask[2, :19] = 0
    assert 21 > FIRST_PIECE
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


@native
def test_each_row_gets_its_own_decoding_prefills_features():
    model, batch = _eagle3(), _batch()
    dec = decoder_copy(model)
    feats = decoder_features(dec, batch["input_ids"], batch["attention_mask"])  # [B, T, 3d]
    assert feats.shape == (3, 40, 3 * 128) and feats.dtype == torch.float32
    with torch.no_grad():
        for row, (lo, hi) in enumerate(((0, 40), (0, 27), (19, 40))):
            ids = batch["input_ids"][row:row + 1, lo:hi]
            _, _, alone, _ = dynamic_prefill(dec, ids, torch.ones_like(ids), 1, 0,
                                             torch.bfloat16)  # alone [1, n, F]
            assert torch.equal(feats[row, lo:hi], alone[0].float()), row
            assert not feats[row, :lo].any() and not feats[row, hi:].any(), row
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref, _ = base_states(model.base_model, batch["input_ids"], batch["attention_mask"],
                             model.heads.feature_layers)
    on = batch["attention_mask"].bool()
    cos = torch.nn.functional.cosine_similarity(feats[on], ref.float()[on], dim=-1)  # [N]
    assert cos.min() > 0.99 and not torch.equal(feats[on], ref.float()[on])
    assert all(p.dtype == torch.bfloat16 and not p.requires_grad for p in dec.parameters())
    assert all(p.dtype == torch.float32 for p in model.base_model.parameters())  # the training model's own


@native
def test_the_method_trains_on_the_decoders_features():
    model, batch = _eagle3(), _batch()
    trainable, dec = Eagle3Loss(model.heads, 0.8), decoder_copy(model)
    loss, stats = medusa1.compute_loss(model, trainable, batch, bf16_base=True, decoder=dec)
    want, _ = trainable(decoder_features(dec, batch["input_ids"], batch["attention_mask"]), batch["labels"],
                        batch["input_ids"], batch["attention_mask"])
    assert torch.equal(loss, want) and stats.shape[1] == 2
    loss.backward()
    assert all(p.grad is not None for p in model.heads.parameters() if p.requires_grad)
    assert all(p.grad is None for p in dec.parameters()) and all(p.grad is None for p in
                                                                 model.base_model.parameters())
    recipe = Recipe(model="m")
    recipe.train.base_features = "decoder"
    got, _, parts = medusa1.METHOD.compute_loss(recipe, model, trainable, batch, 0, dec)
    assert parts == {} and torch.allclose(got, want)


@native
def test_a_mask_with_a_gap_is_refused():
    model, batch = _eagle3(), _batch()
    batch["attention_mask"][0, 5] = 0
    with pytest.raises(ValueError, match="row 0's attention mask is not one run of ones"):
        decoder_features(decoder_copy(model), batch["input_ids"], batch["attention_mask"])


def test_what_it_cannot_serve_is_refused(monkeypatch):
    base = tiny_model("llama", hidden_size=128, intermediate_size=256, layers=4)
    with pytest.raises(ConfigError, match="take none"):
        decoder_copy(MedusaModel.from_base(base, num_heads=2, heads_dtype=torch.float32))
    require_shared(SHARED)
    monkeypatch.chdir(ROOT)
    assert load_recipe(EAGLE3, ["train.base_features=decoder"]).train.base_features == "decoder"
    for extra in ("heads.head_type=hydra", "heads.teacher_loss=0.5", "train.hidden_cache=out/cache",
                  "quantization=8bit"):
        with pytest.raises(ConfigError, match="train.base_features: decoder computes"):
            load_recipe(EAGLE3, ["train.base_features=decoder", extra])
    with pytest.raises(ConfigError, match="train.base_features: 'native'"):
        load_recipe(EAGLE3, ["train.base_features=native"])
