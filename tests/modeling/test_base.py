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


def test_native_bf16_on_cpu_needs_the_flag_and_a_measured_speedup(monkeypatch):
    import builtins
    import io

    from medusa.modeling import base

    real_open = builtins.open

    def cpuinfo(flags):
        def fake_open(path, *args, **kwargs):
            if str(path) == "/proc/cpuinfo":
                return io.StringIO(f"processor : 0\nflags : fpu sse2 {flags}\n")
            return real_open(path, *args, **kwargs)
        return fake_open

    cases = [("avx512f avx512_bf16", True, True), ("avx512f avx512_bf16", False, False),
             ("avx512f", True, False), ("amx_bf16", True, True)]
    for flags, faster, expected in cases:
        monkeypatch.setattr(builtins, "open", cpuinfo(flags))
        monkeypatch.setattr(base, "cpu_bf16_faster", lambda faster=faster: faster)
        base.cpu_bf16_flagged.cache_clear()  # read once per process: this case's cpuinfo
        assert base.native_bf16("cpu") is expected, (flags, faster)
        assert base.fast_dtype("cpu") == ("bfloat16" if expected else "float32")
    assert base.native_bf16("meta") is False
    monkeypatch.undo()
    base.cpu_bf16_flagged.cache_clear()  # the real CPU's flags for the tests after this one


def test_cpu_bf16_probe_returns_a_bool_and_is_measured_once():
    from medusa.modeling.base import cpu_bf16_faster

    first = cpu_bf16_faster()
    assert isinstance(first, bool) and cpu_bf16_faster() is first
    assert cpu_bf16_faster.cache_info().currsize == 1


def test_fit_max_length_refuses_past_the_limit_and_cuts_the_default():
    from medusa.errors import ConfigError
    from medusa.modeling.base import fit_max_length

    with pytest.raises(ConfigError, match=r"^k 600 exceeds the model's 512 positions .*use at most 512$"):
        fit_max_length("k", 600, 512, 2048, ConfigError)
    assert fit_max_length("k", 512, 512, 2048) == (512, None)
    assert fit_max_length("k", 4096, None, 2048) == (4096, None)  # a model without a limit: as given
    length, note = fit_max_length("k", None, 512, 2048)  # the default: cut, and said
    assert length == 512 and "the default 2048 is past the model's 512 positions" in note
    assert fit_max_length("k", 2048, 512, 2048)[0] == 512
    assert fit_max_length("k", None, 4096, 2048) == (2048, None)


def test_max_positions_reads_the_config_alone(tmp_path):
    from medusa.modeling.base import max_positions

    require_shared(STORIES)
    assert max_positions(str(STORIES)) == 512
    assert max_positions(str(tmp_path / "missing")) is None  # loading the model says why
