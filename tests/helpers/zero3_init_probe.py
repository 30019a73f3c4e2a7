"""Run as a script (one process, gloo): heads initialised from a ZeRO-3 partitioned LM head.

Prints ``OK`` when the heads' W2 equal the gathered LM head; exits non-zero otherwise.
"""

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.update(MASTER_ADDR="127.0.0.1", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
os.environ.setdefault("MASTER_PORT", "29533")

import deepspeed
from transformers import AutoModelForCausalLM

from medusa import MedusaModel
from medusa.modeling.base import lm_head_weight
from medusa.training import medusa2 as m2

from tiny_models import tiny_config

deepspeed.init_distributed(dist_backend="gloo")
config = tiny_config("llama", pad_token_id=None)
# Resolve the model class (and torch._dynamo, which transformers imports lazily) before zero.Init patches
# tensor construction.
model_class = AutoModelForCausalLM._model_mapping[type(config)]
with deepspeed.zero.Init(config_dict_or_path={"zero_optimization": {"stage": 3},
                                              "train_micro_batch_size_per_gpu": 1}):
    base = model_class(config)
weight = lm_head_weight(base)
assert hasattr(weight, "ds_id") and weight.numel() == 0, "the LM head is not partitioned"
try:
    MedusaModel.from_base(base, num_heads=2)
except RuntimeError:
    pass  # the plain constructor cannot copy a partitioned weight
else:
    raise SystemExit("expected MedusaModel.from_base to fail on a partitioned LM head")
model = m2.medusa_from_base(base, num_heads=2)
with deepspeed.zero.GatheredParameters([weight]):
    full = weight.detach().clone()  # [V, d]
assert full.shape == (96, 32)
for head in model.heads.lm_heads:
    assert torch.equal(head.weight, full)
with torch.no_grad():
    for head in model.heads.lm_heads:
        head.weight.mul_(2.0)
m2.init_heads_from_lm_head(model)
for head in model.heads.lm_heads:
    assert torch.equal(head.weight, full)
print("OK")
