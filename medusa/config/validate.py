"""Recipe validation: range, choice and file checks on a built :class:`~medusa.config.schema.Recipe`,
each failure a :class:`ConfigError` naming the key (with the closest allowed value suggested)."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from medusa.config.enums import (
    BASE_FEATURES,
    DRAFTER_HEAD_TYPES,
    DTYPES,
    FORMATS,
    HEAD_TYPES,
    HYDRA_PROJECTIONS,
    LAMBDA0_SCHEDULES,
    METHODS,
    MIXED_PRECISION,
    QUANTIZATIONS,
    REPORT_TO,
    SCHEDULERS,
)
from medusa.config.schema import Recipe
from medusa.errors import ConfigError

STEPS_MAX = 10**9
# The fields a recipe's ``heads`` section and a checkpoint's medusa_config.json share (checked by
# check_head_fields for both).
HEAD_FIELDS = ("num_heads", "num_layers", "head_type", "draft_vocab", "hydra_projection", "feature_layers")


def parse_schedule(schedule: str, key: str = "medusa2.schedule") -> tuple[str, float]:
    """``"sine_0.1"`` -> ``("sine", 0.1)``; ``"sine"`` -> ``("sine", 1.0)``; ``"constant"`` ->
    ``("constant", 1.0)``.

    Raises :class:`ConfigError` naming ``key`` for anything else.
    """
    if not isinstance(schedule, str):
        raise ConfigError(f"{key}: expected a string ({' | '.join(LAMBDA0_SCHEDULES)}), got {schedule!r}")
    if schedule in ("constant", "linear", "sine"):
        return schedule, 1.0
    if schedule.startswith("sine_"):
        text = schedule[len("sine_"):]
        try:
            fraction = float(text)
        except ValueError:
            fraction = float("nan")
        if not (0.0 < fraction <= 1.0):
            raise ConfigError(f"{key}: {schedule!r}: the ramp fraction after 'sine_' must be a "
                              f"number in (0, 1]")
        return "sine", fraction
    raise ConfigError(f"{key}: {schedule!r} is not one of {' | '.join(LAMBDA0_SCHEDULES)}")


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


def check_head_fields(num_heads: int, num_layers: int, head_type: str, draft_vocab: int,
                      hydra_projection: str | None, prefix: str = "heads.",
                      unset: str | None = "own", feature_layers: Any = None) -> None:
    """The heads' shape (:data:`HEAD_FIELDS`) and each family's rules, the one check for a recipe's
    ``heads`` section, a checkpoint's ``medusa_config.json``, ``MedusaModel.from_base`` and ``medusa heads
    init``. Raises :class:`ConfigError` naming ``prefix + key``.

    ``unset``: the projection non-hydra heads carry ("own" in a recipe; None in a checkpoint, whose hydra
    config without the key reads "own")."""
    for name, value in (("num_heads", num_heads), ("num_layers", num_layers), ("draft_vocab", draft_vocab)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(f"{prefix}{name}: expected int, got {value!r}")
    _range(f"{prefix}num_heads", num_heads, 1, 64)
    _range(f"{prefix}num_layers", num_layers, 0, 16)
    _choice(f"{prefix}head_type", head_type, HEAD_TYPES)
    _range(f"{prefix}draft_vocab", draft_vocab, 0, 10_000_000)
    drafter = head_type in DRAFTER_HEAD_TYPES
    if drafter and num_layers != 1:
        raise ConfigError(f"{prefix}num_layers: {head_type} heads have exactly 1 draft decoder layer, "
                          f"got {num_layers}")
    if feature_layers is not None and not drafter:
        raise ConfigError(f"{prefix}feature_layers: only for {prefix}head_type: "
                          f"{' | '.join(DRAFTER_HEAD_TYPES)} (got {str(head_type)[:40]})")
    if head_type == "hydra" and num_layers < 1:
        raise ConfigError(f"{prefix}num_layers: hydra heads need at least 1 layer, got {num_layers}")
    if hydra_projection is not None and hydra_projection not in HYDRA_PROJECTIONS:
        raise ConfigError(f"{prefix}hydra_projection: must be one of {', '.join(HYDRA_PROJECTIONS)}, "
                          f"got {hydra_projection!r}")
    if head_type != "hydra" and hydra_projection != unset:
        raise ConfigError(f"{prefix}hydra_projection: only for {prefix}head_type: hydra (got {head_type}; "
                          f"only hydra heads have it)")


def _validate_heads(recipe: Recipe) -> None:
    h = recipe.heads
    check_head_fields(h.num_heads, h.num_layers, h.head_type, h.draft_vocab, h.hydra_projection,
                      feature_layers=h.feature_layers)
    _range("heads.decay", h.decay, 0.0, 1.0, lo_open=True)
    _range("heads.teacher_loss", h.teacher_loss, 0.0, 1.0)
    _validate_eagle3(recipe)
    if h.init_from and not Path(h.init_from).expanduser().exists():
        raise ConfigError(f"heads.init_from: {h.init_from} does not exist")


def _validate_eagle3(recipe: Recipe) -> None:
    """``heads.head_type: eagle3``: one draft layer, trained with a frozen base (MEDUSA-1); the teacher's KL
    reads the base online."""
    h = recipe.heads
    if h.head_type not in DRAFTER_HEAD_TYPES:
        return
    if recipe.method != "medusa1":
        raise ConfigError(f"method: eagle3 heads train on a frozen base (method: medusa1), "
                          f"got {recipe.method}")
    if h.teacher_loss and recipe.train.hidden_cache:
        raise ConfigError("heads.teacher_loss: eagle3 heads read the base's last hidden state for the KL, "
                          "which train.hidden_cache does not store; set train.hidden_cache: null or "
                          "heads.teacher_loss: 0")
    layers = h.feature_layers
    if layers is not None and (not isinstance(layers, list) or len(layers) != 3 or not all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 4096 for i in layers)):
        raise ConfigError(f"heads.feature_layers: expected three layer indices (ints >= 0), got {layers!r}")


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
    _choice("train.base_features", t.base_features, BASE_FEATURES)
    if t.base_features == "decoder" and (recipe.method != "medusa1" or recipe.heads.head_type != "eagle3"
                                         or recipe.heads.teacher_loss or t.hidden_cache is not None
                                         or recipe.quantization is not None):
        raise ConfigError("train.base_features: decoder computes an eagle3 drafter's features online (method "
                          "medusa1, no teacher_loss, no train.hidden_cache, no quantization); use "
                          "base_features: model")
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
