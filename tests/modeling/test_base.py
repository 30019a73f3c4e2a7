"""Loading a base model and reading it (medusa/modeling/base.py): dtype names, ``~`` in paths, the peft
unwrap, the decoder body and the LM head, errors naming what failed."""

import pytest
import torch

from medusa.errors import CheckpointError
from medusa.modeling.base import (
    decoder_of,
    dtype_name,
    expand_home,
    lm_head_of,
    lm_head_weight,
    load_base_model,
    load_tokenizer,
    resolve_dtype,
    unwrap,
)

from tiny_models import STORIES, require_shared, tiny_model


def test_dtype_names_round_trip():
    assert resolve_dtype("bfloat16") is torch.bfloat16 and resolve_dtype(None) is None
    assert resolve_dtype(torch.float16) is torch.float16
    assert dtype_name(torch.float32) == "float32"
    assert resolve_dtype(dtype_name(torch.bfloat16)) is torch.bfloat16


def test_body_and_lm_head_of_a_model():
    base = tiny_model("llama")
    assert unwrap(base) is base and decoder_of(base) is base.model
    assert lm_head_of(base) is base.lm_head and lm_head_weight(base) is base.lm_head.weight


def test_a_missing_base_is_a_checkpoint_error(tmp_path):
    with pytest.raises(CheckpointError, match="cannot load base model"):
        load_base_model(str(tmp_path / "missing"))


def test_loaders_expand_a_home_relative_model_path(monkeypatch, tmp_path):
    """A recipe's ``model: ~/...`` (as the SmolLM2 recipe writes it) loads: the loaders expand ``~``."""
    require_shared()
    (tmp_path / "m").symlink_to(STORIES)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert expand_home("~/m") == str(tmp_path / "m") and expand_home("org/name") == "org/name"
    assert load_base_model("~/m").config.vocab_size == 512
    assert load_tokenizer("~/m").vocab_size == 512
