"""Training recipes: typed dataclasses loaded from YAML, ``dotted.key=value`` overrides, validation.

Every check runs before any model is loaded: an unknown or misspelt key (with the closest known key
suggested), a value of the wrong type, an out-of-range value or a missing local file is a
:class:`ConfigError` naming the key.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

from medusa.errors import ConfigError
from medusa.training.schedules import parse_schedule

METHODS = ("medusa1", "medusa2")
DTYPES = ("float32", "bfloat16", "float16", "fp32", "bf16", "fp16")
QUANTIZATIONS = ("4bit", "8bit")
HEAD_TYPES = ("linear", "shared_lm_head", "hydra")
HYDRA_PROJECTIONS = ("own", "shared_lm_head")
FORMATS = ("auto", "sharegpt", "messages", "alpaca", "prompt_completion", "text")
SCHEDULERS = ("cosine", "linear", "constant")
REPORT_TO = ("none", "wandb", "tensorboard")
MIXED_PRECISION = ("no", "bf16", "fp16", "auto")  # auto: bf16 where the device computes it natively
STEPS_MAX = 10**9


@dataclass
class HeadsConfig:
    num_heads: int = 5
    num_layers: int = 1
    head_type: str = "linear"
    hydra_projection: str = "own"  # hydra heads' W2: their own, or the (frozen) base LM head
    decay: float = 0.8
    init_from: str | None = None  # a MEDUSA heads checkpoint to start from (MEDUSA-2 stage 2)
    draft_vocab: int = 0  # > 0: heads predict only the N target tokens most frequent in the training labels
    teacher_loss: float = 0.0  # weight w of the KL to the base distribution: (1 - w) CE + w KL (Hydra++: 1)


@dataclass
class DataConfig:
    train: str = ""
    eval: str | None = None
    eval_split: float = 0.0  # fraction of train held out for eval when `eval` is not given
    format: str = "auto"
    max_length: int = 2048
    chat_template: str | None = None  # Jinja text, a .jinja file, or a built-in name (chatml, vicuna)
    skip_invalid: bool = False


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


# ---------------------------------------------------------------------------------------- building
# Names other trainers use for our keys, so that the error can point at ours.
_ALIASES = {"learning_rate": "lr", "num_train_epochs": "epochs", "per_device_train_batch_size": "batch_size",
            "gradient_accumulation_steps": "grad_accum", "lr_scheduler_type": "scheduler",
            "lr_scheduler": "scheduler", "max_seq_length": "max_length", "max_seq_len": "max_length",
            "medusa_num_heads": "num_heads", "medusa_num_layers": "num_layers", "torch_dtype": "dtype"}


def _suggest(key: str, known: list[str]) -> str | None:
    """The known key a misspelt one most likely meant."""
    if key in _ALIASES and _ALIASES[key] in known:
        return _ALIASES[key]
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    if close:
        return close[0]
    prefixed = [k for k in known if key.startswith(k) or k.startswith(key)]
    if prefixed:
        return max(prefixed, key=len)
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.45)
    return close[0] if close else None


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _type_name(tp: Any) -> str:
    if tp is type(None):
        return "null"
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is list:
        return f"list of {_type_name(typing.get_args(tp)[0])}"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``tp`` (ints are accepted for floats)."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        for arg in typing.get_args(tp):
            try:
                return _coerce(value, arg, key)
            except ConfigError:
                continue
        raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")
    if tp is type(None):
        if value is None:
            return None
        raise ConfigError(f"{key}: expected null, got {value!r}")
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")
        (item,) = typing.get_args(tp)
        return [_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")


def _build(cls: type, data: Any, prefix: str) -> Any:
    where = prefix.rstrip(".") or "recipe"
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping, got {data!r}")
    hints = _hints(cls)
    kwargs = {}
    for key, value in data.items():
        full = f"{prefix}{key}"
        if key not in hints:
            close = _suggest(str(key), list(hints))
            hint = f" (did you mean {prefix}{close}?)" if close else f" (known keys: {', '.join(hints)})"
            raise ConfigError(f"unknown key {full}{hint}")
        tp = hints[key]
        kwargs[key] = _build(tp, value, f"{full}.") if _is_dataclass_type(tp) else _coerce(value, tp, full)
    return cls(**kwargs)


def _choice(key: str, value: Any, allowed: tuple) -> None:
    if value not in allowed:
        close = difflib.get_close_matches(str(value), [str(a) for a in allowed], n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ConfigError(f"{key}: {value!r} is not one of {', '.join(map(str, allowed))}{hint}")


def _range(key: str, value: float, lo: float | None = None, hi: float | None = None,
           lo_open: bool = False) -> None:
    bad = (value != value or (lo is not None and (value <= lo if lo_open else value < lo))  # nan too
           or (hi is not None and value > hi))
    if bad:
        lo_s = "" if lo is None else (f"> {lo}" if lo_open else f">= {lo}")
        hi_s = "" if hi is None else f"<= {hi}"
        raise ConfigError(f"{key}: {value} is out of range (must be "
                          f"{' and '.join(s for s in (lo_s, hi_s) if s)})")


def _looks_local(path: str) -> bool:
    return path.startswith((".", "/", "~")) or path.endswith((".json", ".jsonl", ".parquet", ".txt", ".csv"))


def _check_path(key: str, path: str | None, must_exist_if_local: bool = True) -> None:
    if path and must_exist_if_local and _looks_local(path) and not Path(path).expanduser().exists():
        raise ConfigError(f"{key}: {path} does not exist (relative paths resolve against {Path.cwd()})")


def _validate_top(recipe: Recipe) -> None:
    if not recipe.model:
        raise ConfigError("model: required (a local path or a hub id)")
    _check_path("model", recipe.model)
    _choice("method", recipe.method, METHODS)
    _choice("dtype", recipe.dtype, DTYPES)
    if recipe.quantization is not None:
        _choice("quantization", recipe.quantization, QUANTIZATIONS)
    _choice("report_to", recipe.report_to, REPORT_TO)
    if not recipe.output_dir:
        raise ConfigError("output_dir: required")


def _validate_heads(recipe: Recipe) -> None:
    h = recipe.heads
    _range("heads.num_heads", h.num_heads, 1, 64)
    _range("heads.num_layers", h.num_layers, 0, 16)
    _choice("heads.head_type", h.head_type, HEAD_TYPES)
    _range("heads.decay", h.decay, 0.0, 1.0, lo_open=True)
    _range("heads.draft_vocab", h.draft_vocab, 0, 10_000_000)
    _range("heads.teacher_loss", h.teacher_loss, 0.0, 1.0)
    if h.head_type == "hydra" and h.num_layers < 1:
        raise ConfigError(f"heads.num_layers: hydra heads need at least 1 layer, got {h.num_layers}")
    _choice("heads.hydra_projection", h.hydra_projection, HYDRA_PROJECTIONS)
    if h.head_type != "hydra" and h.hydra_projection != "own":
        raise ConfigError(f"heads.hydra_projection: only for heads.head_type: hydra (got {h.head_type})")
    if h.teacher_loss and h.draft_vocab:
        raise ConfigError("heads.teacher_loss: the KL to the base distribution needs the full vocabulary "
                          "(heads.draft_vocab: 0)")
    if h.init_from and not Path(h.init_from).expanduser().exists():
        raise ConfigError(f"heads.init_from: {h.init_from} does not exist")


def _validate_data(recipe: Recipe) -> None:
    d = recipe.data
    if not d.train:
        raise ConfigError("data.train: required (a .json/.jsonl/.parquet/.txt file or a hub dataset id)")
    _check_path("data.train", d.train)
    _check_path("data.eval", d.eval)
    _range("data.eval_split", d.eval_split, 0.0, 0.5)
    _choice("data.format", d.format, FORMATS)
    _range("data.max_length", d.max_length, 2, 1 << 20)
    if d.chat_template and d.chat_template.endswith((".jinja", ".j2")):
        _check_path("data.chat_template", d.chat_template)


def _validate_train(recipe: Recipe) -> None:
    t = recipe.train
    _range("train.lr", t.lr, 0.0, 10.0, lo_open=True)
    _range("train.epochs", t.epochs, 0.0, 10_000, lo_open=True)
    if t.max_steps == 0 or t.max_steps < -1 or t.max_steps > STEPS_MAX:
        raise ConfigError(f"train.max_steps: {t.max_steps} is out of range (must be -1 or 1..{STEPS_MAX})")
    _range("train.batch_size", t.batch_size, 1, 65536)
    _range("train.grad_accum", t.grad_accum, 1, 65536)
    _range("train.warmup_ratio", t.warmup_ratio, 0.0, 1.0)
    _choice("train.scheduler", t.scheduler, SCHEDULERS)
    _range("train.weight_decay", t.weight_decay, 0.0, 10.0)
    _range("train.max_grad_norm", t.max_grad_norm, 0.0, 1e6)
    _range("train.save_steps", t.save_steps, 0, STEPS_MAX)
    _range("train.eval_steps", t.eval_steps, 0, STEPS_MAX)
    _range("train.logging_steps", t.logging_steps, 1, STEPS_MAX)
    _range("train.seed", t.seed, 0, 2**32 - 1)
    _range("train.loss_chunk_size", t.loss_chunk_size, 1, 1 << 24)
    if t.mixed_precision is not None:
        _choice("train.mixed_precision", t.mixed_precision, MIXED_PRECISION)
    if t.resume not in (None, "auto"):
        _check_path("train.resume", t.resume, must_exist_if_local=True)
        if not Path(t.resume).expanduser().is_dir():
            raise ConfigError(f"train.resume: {t.resume} is not a checkpoint directory (or use 'auto')")
    if t.hidden_cache is not None and recipe.method != "medusa1":
        raise ConfigError(f"train.hidden_cache: only method medusa1 (a frozen backbone) can train "
                          f"from cached hidden states, the method is {recipe.method}")


def _validate_method_keys(recipe: Recipe) -> None:
    """lora.* and medusa2.* (checked whatever the method, so that an override typo fails early)."""
    lo = recipe.lora
    _range("lora.r", lo.r, 1, 65536)
    _range("lora.alpha", lo.alpha, 0.0, 1e6, lo_open=True)
    _range("lora.dropout", lo.dropout, 0.0, 1.0)
    m = recipe.medusa2
    _range("medusa2.lambda0", m.lambda0, 0.0, 1000.0)
    parse_schedule(m.schedule, "medusa2.schedule")
    _range("medusa2.lr_multiplier", m.lr_multiplier, 0.0, 1000.0, lo_open=True)
    _range("medusa2.distill_temperature", m.distill_temperature, 0.0, 100.0, lo_open=True)


def validate(recipe: Recipe) -> Recipe:
    """Range / choice / file checks on a built recipe; returns it unchanged or raises ConfigError."""
    for check in (_validate_top, _validate_heads, _validate_data, _validate_train, _validate_method_keys):
        check(recipe)
    return recipe


# ---------------------------------------------------------------------------------------- overrides
def parse_value(text: str) -> Any:
    """A command-line value parsed as YAML (``1e-4`` -> float, ``null`` -> None, ``[a,b]`` -> list)."""
    import yaml

    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    # PyYAML reads `1e-4` (no dot) as a string; accept it as a number.
    if isinstance(value, str):
        try:
            return float(value) if re.fullmatch(r"[-+]?\d+(\.\d*)?[eE][-+]?\d+", value) else value
        except ValueError:
            return value
    return value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``dotted.key=value`` strings to a nested dict (unknown keys are caught by validation)."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected dotted.key=value")
        key, raw = item.split("=", 1)
        key = key.strip()
        if key.startswith("--"):
            key = key[2:]
        parts = key.split(".")
        node = data
        for i, part in enumerate(parts[:-1]):
            nxt = node.get(part)
            if nxt is None:
                nxt = node[part] = {}
            if not isinstance(nxt, dict):
                raise ConfigError(f"override {key}: {'.'.join(parts[:i + 1])} is not a section")
            node = nxt
        node[parts[-1]] = parse_value(raw)
    return data


def _yaml_number_fix(data: Any) -> Any:
    """PyYAML leaves `1e-3`-style scalars as strings; turn them into floats."""
    if isinstance(data, dict):
        return {k: _yaml_number_fix(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_yaml_number_fix(v) for v in data]
    if isinstance(data, str) and re.fullmatch(r"[-+]?\d+(\.\d*)?[eE][-+]?\d+", data):
        return float(data)
    return data


def recipe_from_dict(data: dict[str, Any]) -> Recipe:
    """Build and validate a recipe from a nested dict (as read from YAML)."""
    return validate(_build(Recipe, _yaml_number_fix(data), ""))


def load_recipe(path: str | Path, overrides: list[str] | None = None) -> Recipe:
    """Read a YAML recipe, apply ``dotted.key=value`` overrides, build and validate it. A missing or
    non-UTF-8 file, invalid YAML and a key given twice are errors naming the file and line."""
    from medusa.io import read_yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: recipe file not found" if not path.exists()
                          else f"{path}: is a directory, expected a YAML recipe file")
    data = read_yaml(path, ConfigError) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a recipe must be a mapping of keys")
    data = _yaml_number_fix(data)
    apply_overrides(data, list(overrides or []))
    try:
        return recipe_from_dict(data)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
