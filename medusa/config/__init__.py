"""Training recipes: typed dataclasses loaded from YAML, ``dotted.key=value`` overrides, validation.

:mod:`~medusa.config.schema` (the dataclasses), :mod:`~medusa.config.parse` (YAML, the typed coercer,
overrides), :mod:`~medusa.config.validate` (range / choice / file checks), :mod:`~medusa.config.enums`
(every enumeration of the project, defined once). This package imports no medusa package but
:mod:`medusa.errors` and :mod:`medusa.io`.
"""

from __future__ import annotations

from medusa.config.enums import (
    DTYPES,
    FORMATS,
    HEAD_TYPES,
    HYDRA_PROJECTIONS,
    METHODS,
    MIXED_PRECISION,
    QUANTIZATIONS,
    REPORT_TO,
    SCHEDULERS,
)
from medusa.config.parse import apply_overrides, load_recipe, parse_value, recipe_from_dict
from medusa.config.schema import DataConfig, HeadsConfig, LoraConfig, Medusa2Config, Recipe, TrainConfig
from medusa.config.validate import STEPS_MAX, parse_schedule, validate
from medusa.errors import ConfigError

__all__ = ["DTYPES", "FORMATS", "HEAD_TYPES", "HYDRA_PROJECTIONS", "METHODS", "MIXED_PRECISION",
           "QUANTIZATIONS", "REPORT_TO", "SCHEDULERS", "STEPS_MAX", "ConfigError", "DataConfig",
           "HeadsConfig", "LoraConfig", "Medusa2Config", "Recipe", "TrainConfig", "apply_overrides",
           "load_recipe", "parse_schedule", "parse_value", "recipe_from_dict", "validate"]
