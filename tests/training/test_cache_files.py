"""The hidden-state cache's files are checked before any array is built from them
(medusa/training/cache_files.py): index values, shard offsets, the hidden file's size, tokens.npy's dtype
and shape (objects never unpickled)."""

import json
import os

import numpy as np
import pytest

from medusa.errors import MedusaError
from medusa.training.cache_files import check_index_values, existing_dtype, read_shard

DTYPES = {"bfloat16": None, "float32": None}
NAMES = {"json": "s.json", "hidden": "s.hidden", "tokens.npy": "s.tokens.npy"}


def _index(**kw):
    return {"dtype": "float32", "hidden_size": 4, "num_examples": 3, "shards": [[0, 2], [2, 3]], **kw}


@pytest.mark.parametrize("edit, needle", [
    (dict(dtype="float64"), "dtype 'float64' is not one of"),
    (dict(hidden_size="4"), "hidden_size '4' is not a size"),
    (dict(hidden_size=10**12), "is not a size"),
    (dict(shards=[[0, 2], [1, 3]]), "shard 1 [1, 3] does not continue at example 2"),
    (dict(shards=[[0, 2]]), "the shards cover 2 of 3 examples"),
    (dict(num_examples=-1), "num_examples / shards"),
])
def test_index_values(tmp_path, edit, needle):
    check_index_values(_index(), tmp_path / "cache.json", DTYPES)
    with pytest.raises(MedusaError, match=__import__("re").escape(needle)):
        check_index_values(_index(**edit), tmp_path / "cache.json", DTYPES)


def _shard(tmp_path, offsets=(0, 2, 5), rows=5, tokens=None):
    (tmp_path / "s.json").write_text(json.dumps({"offsets": list(offsets)}))
    np.zeros((rows, 4), np.float32).tofile(tmp_path / "s.hidden")
    np.save(tmp_path / "s.tokens.npy", np.zeros((2, rows), np.int32) if tokens is None else tokens,
            allow_pickle=True)


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_read_shard_checks_every_file(tmp_path):
    _shard(tmp_path)
    offsets, hidden, tokens = read_shard(tmp_path, 0, NAMES, (0, 2), 4, np.float32)
    assert offsets == [0, 2, 5] and hidden.shape == (5, 4) and tokens.shape == (2, 5)
    _shard(tmp_path, offsets=(0, 3, 2))
    with pytest.raises(MedusaError, match="s.json: offsets are not 3 increasing positions"):
        read_shard(tmp_path, 0, NAMES, (0, 2), 4, np.float32)
    _shard(tmp_path)
    with open(tmp_path / "s.hidden", "r+b") as fh:
        fh.truncate(7)
    with pytest.raises(MedusaError, match="s.hidden: 7 bytes, expected 80"):
        read_shard(tmp_path, 0, NAMES, (0, 2), 4, np.float32)
    marker = tmp_path / "marker"
    _shard(tmp_path, tokens=np.array([[_Payload(marker)] * 5] * 2, dtype=object))
    with pytest.raises(MedusaError, match="s.tokens.npy: not a token array"):
        read_shard(tmp_path, 0, NAMES, (0, 2), 4, np.float32)
    assert not marker.exists()
    _shard(tmp_path, tokens=np.zeros((2, 5), np.float32))
    with pytest.raises(MedusaError, match=r"s.tokens.npy: float32 \(2, 5\), expected integer"):
        read_shard(tmp_path, 0, NAMES, (0, 2), 4, np.float32)


def test_an_explicit_dtype_over_an_existing_cache_is_refused(tmp_path):
    assert existing_dtype(tmp_path / "cache.json", None, DTYPES) == "bfloat16"
    (tmp_path / "cache.json").write_text(json.dumps(_index()))
    assert existing_dtype(tmp_path / "cache.json", None, DTYPES) == "float32"
    assert existing_dtype(tmp_path / "cache.json", "float32", DTYPES) == "float32"
    with pytest.raises(MedusaError, match="--dtype bfloat16: .* already holds a float32 cache"):
        existing_dtype(tmp_path / "cache.json", "bfloat16", DTYPES)
