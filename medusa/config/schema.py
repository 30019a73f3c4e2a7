"""The training recipe: typed dataclasses, one per YAML section (``heads``, ``data``, ``train``, ``lora``,
``medusa2``). The field names are the recipe's keys; :mod:`medusa.config.parse` builds them from YAML and
:mod:`medusa.config.validate` checks their values."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass
class HeadsConfig:
    num_heads: int = 5
    num_layers: int = 1
    head_type: str = "linear"
    hydra_projection: str = "own"  # hydra heads' W2: their own, or the (frozen) base LM head
    decay: float = 0.8
    init_from: str | None = None  # a MEDUSA heads checkpoint to start from (MEDUSA-2 stage 2)
    draft_vocab: int = 0  # > 0: heads predict only the N target tokens most frequent in the training labels
    feature_layers: list[int] | None = None  # eagle3: the 3 base hidden-state indices fused (None: EAGLE-3's)
    teacher_loss: float = 0.0  # weight w of the KL to the base distribution (over the draft vocabulary when
    # draft_vocab > 0, renormalised there): (1 - w) CE + w KL (Hydra++: 1)


@dataclass
class DataConfig:
    train: str = ""
    eval: str | None = None
    eval_split: float = 0.0  # fraction of train held out for eval when `eval` is not given
    format: str = "auto"
    max_length: int = 2048
    chat_template: str | None = None  # Jinja text, a .jinja file, or a built-in name (chatml, vicuna)
    skip_invalid: bool = False
    group_by_length: bool = False  # micro-batches of rows of like length (less padding), order still shuffled


@dataclass
class TrainConfig:
    lr: float = 1e-3
    epochs: float = 2.0
    max_steps: int = -1  # > 0 overrides epochs
    batch_size: int = 8  # per device, per micro-batch
    grad_accum: int = 1
    warmup_ratio: float = 0.1
    scheduler: str = "cosine"
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0  # 0 disables clipping
    seed: int = 42
    save_steps: int = 0  # 0: no intermediate checkpoints
    eval_steps: int = 0  # 0: evaluate only at the end (when there is eval data)
    logging_steps: int = 10
    resume: str | None = None  # null | auto | a checkpoint-<step> directory
    mixed_precision: str | None = None  # null: whatever `accelerate launch` was given; auto: bf16 if native
    loss_chunk_size: int = 1024  # positions per head per chunk in the head loss
    hidden_cache: str | None = None  # MEDUSA-1: a directory of cached backbone hidden states (built once)
    base_features: str = "model"  # eagle3: model (the base's own code) | decoder (as bf16 decoding computes)


@dataclass
class LoraConfig:
    r: int = 16
    alpha: float = 32.0
    dropout: float = 0.05
    target_modules: list[str] | None = None  # null: chosen per architecture
    full_finetune: bool = False


@dataclass
class Medusa2Config:
    lambda0: float = 0.2
    schedule: str = "constant"  # constant | linear | sine | sine_<fraction>
    lr_multiplier: float = 4.0
    self_distill: bool = False
    distill_temperature: float = 1.0


@dataclass
class Recipe:
    model: str = ""
    method: str = "medusa1"
    dtype: str = "bfloat16"
    quantization: str | None = None
    heads: HeadsConfig = field(default_factory=HeadsConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    medusa2: Medusa2Config = field(default_factory=Medusa2Config)
    output_dir: str = "out/medusa1"
    report_to: str = "none"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
