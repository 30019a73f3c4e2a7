"""Every enumeration of the project, defined once: recipe choices, head types, data formats, acceptance
modes, export formats, schedules. Plain tuples of strings; importers check membership and list them in
messages and ``argparse`` choices."""

from __future__ import annotations

# ------------------------------------------------------------------------------ training recipes
METHODS = ("medusa1", "medusa2")  # training methods (recipe ``method``)
DTYPES = ("float32", "bfloat16", "float16", "fp32", "bf16", "fp16")
QUANTIZATIONS = ("4bit", "8bit")
REPORT_TO = ("none", "wandb", "tensorboard")
BASE_FEATURES = ("model", "decoder")  # train.base_features: the base's own code, or the bf16 decoder's
MIXED_PRECISION = ("no", "bf16", "fp16", "auto")  # auto: bf16 where the device computes it natively
SCHEDULERS = ("cosine", "linear", "constant")  # LR schedules (``train.scheduler``)
# MEDUSA-2's lambda_0 schedules (``medusa2.schedule``); ``sine_<fraction>`` is ``sine_`` + a number in (0, 1]
LAMBDA0_SCHEDULES = ("constant", "linear", "sine", "sine_<fraction>")

# ------------------------------------------------------------------------------ heads
MEDUSA_HEAD_TYPES = ("linear", "shared_lm_head")  # MEDUSA heads (medusa.modeling.heads)
# sequential drafters (medusa.decoding.drafter.Drafter; "eagle3": medusa.modeling.eagle3); the only place that
# names them besides the loader (medusa.modeling.model.build_heads): the rest asks ``in DRAFTER_HEAD_TYPES``
DRAFTER_HEAD_TYPES = ("eagle3",)
HEAD_TYPES = MEDUSA_HEAD_TYPES + ("hydra",) + DRAFTER_HEAD_TYPES  # hydra: medusa.modeling.hydra
HYDRA_PROJECTIONS = ("own", "shared_lm_head")  # hydra heads' W2: their own, or the (frozen) base LM head

# ------------------------------------------------------------------------------ data
FORMATS = ("auto", "sharegpt", "messages", "alpaca", "prompt_completion", "text")  # recipe ``data.format``
CHAT_FORMATS = ("sharegpt", "messages", "alpaca", "mtbench")  # rows that hold a conversation
PROMPT_FORMATS = ("auto", "sharegpt", "messages", "alpaca", "mtbench", "prompt", "text")  # selfdistill

# ------------------------------------------------------------------------------ decoding, export
ACCEPTANCE = ("greedy", "sample", "typical")  # acceptance modes
EXPORT_FORMATS = ("vllm", "medusa-v1", "tensorrt-llm", "tgi", "speculators", "gguf")  # the last two: eagle3
IMPORT_FORMATS = ("auto", "vllm", "medusa-v1")
# hydra heads read draft tokens: no serving engine's MEDUSA implementation can run them
EXPORTABLE_HEAD_TYPES = MEDUSA_HEAD_TYPES
