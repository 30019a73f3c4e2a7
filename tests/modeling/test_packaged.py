"""Heads tied to a packaged base (medusa/modeling/packaged.py): the weights fingerprint, the conversion
marker and the base check. Offline: no packaged model is fetched."""

import json

import pytest
import torch

from medusa.errors import CheckpointError
from medusa.modeling.config import MedusaConfig
from medusa.modeling.packaged import (
    MARKER,
    PACKAGED_KEY,
    check_marker,
    check_packaged_base,
    packaged_info,
    weights_fingerprint,
)

from tiny_models import tiny_model


def _config(info):
    return MedusaConfig(base_model_name_or_path="", base_model_type="llama", hidden_size=32, vocab_size=96,
                        extra={PACKAGED_KEY: info})


def test_fingerprint_is_stable_and_changes_with_the_weights():
    a, b = tiny_model("llama"), tiny_model("llama")
    assert weights_fingerprint(a) == weights_fingerprint(b) and len(weights_fingerprint(a)) == 32
    with torch.no_grad():
        b.lm_head.weight.add_(1.0)
    assert weights_fingerprint(a) != weights_fingerprint(b)


def test_packaged_info_and_the_base_check():
    base = tiny_model("llama")
    assert packaged_info(MedusaConfig("", "llama", 32, 96)) is None
    info = {"name": "tiny", "weights": weights_fingerprint(base)}
    assert packaged_info(_config(info)) == info
    check_packaged_base(_config(info), base, source="cfg")  # the right base passes
    with pytest.raises(CheckpointError, match="cfg: these heads were trained on tiny"):
        check_packaged_base(_config(info), tiny_model("llama", seed=1), source="cfg")
    check_packaged_base(_config(info), tiny_model("llama", seed=1).to(torch.bfloat16), source="cfg")


def test_check_marker(tmp_path):
    info = {"name": "tiny", "gguf_sha256": "aa"}
    check_marker(info, tmp_path)  # no marker: nothing to check
    (tmp_path / MARKER).write_text(json.dumps({"gguf_sha256": "aa"}))
    check_marker(info, tmp_path)
    (tmp_path / MARKER).write_text(json.dumps({"gguf_sha256": "bb"}))
    with pytest.raises(CheckpointError, match="converted from GGUF sha256 bb"):
        check_marker(info, tmp_path)
