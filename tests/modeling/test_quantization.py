"""bitsandbytes configs and the CPU 4-bit layout fix (medusa/modeling/quantization.py)."""

import pytest
import torch

from medusa.errors import ConfigError
from medusa.modeling.quantization import bnb_config, keep_plain_4bit_layout


def test_bnb_config_bits():
    four = bnb_config("4bit", compute_dtype="float32", double_quant=False)
    assert four.load_in_4bit and four.bnb_4bit_quant_type == "nf4"
    assert four.bnb_4bit_compute_dtype is torch.float32 and not four.bnb_4bit_use_double_quant
    assert bnb_config("4bit").bnb_4bit_use_double_quant
    assert bnb_config("8bit").load_in_8bit
    with pytest.raises(ConfigError, match="'2bit' is not one of 4bit, 8bit"):
        bnb_config("2bit")


def test_keep_plain_4bit_layout_turns_the_repacking_off_where_a_layer_has_it():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    model[1].support_avx512bf16_for_cpu = True
    keep_plain_4bit_layout(model)
    assert model[1].support_avx512bf16_for_cpu is False
    assert not hasattr(model[0], "support_avx512bf16_for_cpu")
