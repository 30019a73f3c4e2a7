"""Recipe parsing: YAML loading, the typed coercer (YAML values -> the schema's dataclasses) and
``dotted.key=value`` overrides.

Every check runs before any model is loaded: an unknown or misspelt key (with the closest known key
suggested), a value of the wrong type, an out-of-range value or a missing local file is a
:class:`ConfigError` naming the key.

YAML 1.1 reads ``no`` / ``yes`` / ``off`` / ``on`` as booleans; the recipe loader keeps their literal text
(:class:`BoolWord`), so that a string field (``train.mixed_precision: no``) gets the word and a boolean
field (``data.skip_invalid: yes``) the boolean.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from pathlib import Path
from typing import Any, Union

import yaml

from medusa.config.schema import Recipe
from medusa.config.validate import validate
from medusa.errors import ConfigError, MedusaError
from medusa.io import read_text

# `1e-4` (no dot): PyYAML (YAML 1.1) leaves it a string; the recipe reads it as a number.
FLOAT_RE = re.compile(r"[-+]?\d+(\.\d*)?[eE][-+]?\d+")
_BOOL_WORDS = ("yes", "no", "on", "off")  # YAML 1.1 booleans that are also plain words


class BoolWord(str):
    """A YAML boolean written as a word (``no``, ``On``, ...): its text, with the boolean in ``value``."""

    value: bool

    def __new__(cls, text: str, value: bool) -> "BoolWord":
        word = super().__new__(cls, text)
        word.value = value
        return word


class RecipeLoader(yaml.SafeLoader):
    """The safe loader, with yes/no/on/off kept as :class:`BoolWord` (true/false stay booleans)."""

    def construct_yaml_bool(self, node: yaml.ScalarNode) -> bool | BoolWord:
        value = super().construct_yaml_bool(node)
        return BoolWord(node.value, value) if node.value.lower() in _BOOL_WORDS else value


RecipeLoader.add_constructor("tag:yaml.org,2002:bool", RecipeLoader.construct_yaml_bool)


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
        if isinstance(value, (bool, BoolWord)):
            return value.value if isinstance(value, BoolWord) else value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return str(value)  # a BoolWord gives its literal text
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


# ---------------------------------------------------------------------------------------- YAML
def read_yaml(path: str | Path, error_cls: type[MedusaError] = MedusaError,
              loader: type | None = None) -> Any:
    """The YAML value in ``path`` (safe loader, or ``loader``: a ``yaml.SafeLoader`` subclass); invalid YAML
    or a key given twice in one mapping raises ``error_cls`` naming the file and line; aliases that expand
    past :data:`MAX_YAML_VALUES` values (an alias bomb) too."""

    class _Loader(loader or yaml.SafeLoader):
        pass

    def mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise error_cls(f"{path}:{line}: duplicate key {key!r} (first given on line {seen[key]})")
            seen[key] = line
        return loader.construct_mapping(node, deep=deep)

    _Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    text = read_text(path, error_cls)
    try:
        value = yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:
        raise error_cls(f"{path}: YAML nested too deeply to read") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise error_cls(f"{path}{where}: invalid YAML ({getattr(exc, 'problem', exc)})") from None
    size = _expanded_size(value, {})
    if size > MAX_YAML_VALUES:
        raise error_cls(f"{path}: its aliases expand to {size:,} values (at most {MAX_YAML_VALUES:,}); "
                        "write the values out or use fewer nested aliases")
    return value


MAX_YAML_VALUES = 100_000  # a YAML file's values once its aliases are expanded (an alias bomb stops here)


def _expanded_size(value: Any, memo: dict[int, int]) -> int:
    """How many values ``value`` holds with every alias expanded, counted once per distinct container
    (aliases share one Python object), so a 9^9 bomb is counted in microseconds, never walked."""
    if not isinstance(value, (dict, list)):
        return 1
    key = id(value)
    if key not in memo:
        memo[key] = 0  # a recursive alias counts as nothing more while it is being counted
        items = list(value.keys()) + list(value.values()) if isinstance(value, dict) else value
        memo[key] = 1 + sum(_expanded_size(item, memo) for item in items)
    return memo[key]


# ---------------------------------------------------------------------------------------- overrides
def parse_value(text: str) -> Any:
    """A command-line value parsed as YAML (``1e-4`` -> float, ``null`` -> None, ``[a,b]`` -> list;
    ``no`` -> :class:`BoolWord`)."""
    try:
        value = yaml.load(text, Loader=RecipeLoader)  # noqa: S506 - a SafeLoader subclass
    except (yaml.YAMLError, RecursionError):
        return text
    return float(value) if isinstance(value, str) and FLOAT_RE.fullmatch(value) else value


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


def _numbers(data: Any) -> Any:
    """PyYAML leaves `1e-3`-style scalars as strings; turn them into floats (nested too)."""
    if isinstance(data, dict):
        return {k: _numbers(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_numbers(v) for v in data]
    if isinstance(data, str) and FLOAT_RE.fullmatch(data):
        return float(data)
    return data


def recipe_from_dict(data: dict[str, Any]) -> Recipe:
    """Build and validate a recipe from a nested dict (as read from YAML)."""
    return validate(_build(Recipe, _numbers(data), ""))


def load_recipe(path: str | Path, overrides: list[str] | None = None) -> Recipe:
    """Read a YAML recipe, apply ``dotted.key=value`` overrides, build and validate it. A missing or
    non-UTF-8 file, invalid YAML and a key given twice are errors naming the file and line."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: recipe file not found" if not path.exists()
                          else f"{path}: is a directory, expected a YAML recipe file")
    data = read_yaml(path, ConfigError, loader=RecipeLoader) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a recipe must be a mapping of keys")
    data = _numbers(data)
    apply_overrides(data, list(overrides or []))
    try:
        return recipe_from_dict(data)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
