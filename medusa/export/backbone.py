"""The backbone an export records (``base_model_name_or_path``) and where its tokenizer comes from.

Heads are only right on the backbone they were trained for. A MEDUSA-1 checkpoint's heads belong to the
base its config names. A MEDUSA-2 checkpoint carries its merged backbone in ``base_model/``
(``base_model_subdir``): its heads were trained for THAT model, not for the original base the config still
names, so an export of it records the merged backbone's absolute path, or, with ``with_backbone``, a copy of
it written beside the heads (``OUT/base_model/``, recorded by its final absolute path). ``--base`` overrides
both.

Heads tied to a packaged base (``extra.packaged_base``, :mod:`medusa.modeling.packaged`) record the local
converted directory they were trained on (fetched when missing), not the hub id their config names: the hub
model's weights are not the packaged conversion's.

The tokenizer: the backbone's own directory when it holds tokenizer files; for a merged backbone saved
without them, the original base's (a local directory, else its hub id); a copied backbone gets the tokenizer
files written into it. TGI's router reads the tokenizer from the Medusa directory itself, so the ``tgi``
export copies them there too (see :mod:`medusa.export`).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from medusa.errors import CheckpointError, MedusaError
from medusa.export.common import TOKENIZER_FILES, copy_tokenizer
from medusa.modeling.config import CONFIG_NAME, MedusaConfig
from medusa.modeling.packaged import packaged_info, resolve_packaged

BACKBONE_DIR = "base_model"  # where ``with_backbone`` writes the merged backbone, inside the export

SOURCES = {
    "config": "the base model the checkpoint was trained on (its base_model_name_or_path)",
    "packaged": "the packaged base the heads were trained on, converted locally from its hub id",
    "merged": "the merged MEDUSA-2 backbone inside the checkpoint",
    "merged-copy": "the merged MEDUSA-2 backbone, copied beside the heads",
    "base": "the backbone given with --base",
}


@dataclass
class Backbone:
    """``path``: what the export records; ``source``: a key of :data:`SOURCES`; ``copy_from``: the merged
    backbone directory to copy into ``OUT/base_model``; ``tokenizer``: where a server loads the tokenizer
    from (None: none found); ``tokenizer_dir``: a local directory holding its files."""

    path: str
    source: str
    copy_from: Path | None = None
    tokenizer: str | None = None
    tokenizer_dir: Path | None = None
    hub_id: str | None = None  # a packaged base's hub id (the model the local directory was converted from)

    @property
    def description(self) -> str:
        return SOURCES[self.source]


def _has_tokenizer(path: Path) -> bool:
    return path.is_dir() and any((path / name).is_file() for name in TOKENIZER_FILES)


def _local_or_name(name: str) -> str:
    """An existing local directory as its absolute path; anything else (a hub id) unchanged."""
    return str(Path(name).resolve()) if name and Path(name).is_dir() else name


def _tokenizer_source(candidates: list[str]) -> tuple[str | None, Path | None]:
    """The first candidate with tokenizer files; else the first one that is not a local path (a hub id)."""
    for name in candidates:
        if name and _has_tokenizer(Path(name)):
            return str(Path(name).resolve()), Path(name).resolve()
    for name in candidates:
        if name and not Path(name).exists():
            return name, None
    return None, None


def resolve_backbone(src: Path, config: MedusaConfig, out: Path, base: str | None = None,
                     with_backbone: bool = False) -> Backbone:
    """The backbone an export of checkpoint ``src`` to ``out`` records (see the module docstring)."""
    original = config.base_model_name_or_path
    if with_backbone and (base is not None or not config.base_model_subdir):
        why = "--base names another backbone" if base is not None else (
            f"{src / CONFIG_NAME} has no merged backbone (base_model_subdir); its heads belong to "
            f"{original!r}")
        raise MedusaError(f"--with-backbone copies a MEDUSA-2 checkpoint's merged backbone, but {why}")
    if base is not None:
        path = _local_or_name(base)
        tokenizer, tok_dir = _tokenizer_source([path])
        return Backbone(path, "base", tokenizer=tokenizer, tokenizer_dir=tok_dir)
    if not config.base_model_subdir and packaged_info(config) is not None:
        # heads tied to a packaged base: the local converted directory they were trained on, not the hub id
        path = str(Path(resolve_packaged(packaged_info(config))).resolve())
        tokenizer, tok_dir = _tokenizer_source([path, original])
        return Backbone(path, "packaged", tokenizer=tokenizer, tokenizer_dir=tok_dir, hub_id=original or None)
    if not config.base_model_subdir:
        path = _local_or_name(original)
        tokenizer, tok_dir = _tokenizer_source([path])
        return Backbone(path, "config", tokenizer=tokenizer, tokenizer_dir=tok_dir)
    merged = (src / config.base_model_subdir).resolve()
    if not (merged / "config.json").is_file():
        raise CheckpointError(f"{src / CONFIG_NAME}: base_model_subdir {config.base_model_subdir!r} but "
                              f"{merged} holds no model (no config.json)")
    tokenizer, tok_dir = _tokenizer_source([str(merged), _local_or_name(original)])
    if not with_backbone:
        return Backbone(str(merged), "merged", tokenizer=tokenizer, tokenizer_dir=tok_dir)
    copied = out.resolve() / BACKBONE_DIR  # the path it will have once the export is renamed into place
    return Backbone(str(copied), "merged-copy", copy_from=merged,
                    tokenizer=str(copied) if tok_dir is not None else tokenizer, tokenizer_dir=tok_dir)


def write_backbone(backbone: Backbone, tmp: Path) -> None:
    """Copy the merged backbone (and, when it has none, the tokenizer files) into ``tmp/base_model``."""
    if backbone.copy_from is None:
        return
    dest = tmp / BACKBONE_DIR
    shutil.copytree(backbone.copy_from, dest)
    if backbone.tokenizer_dir is not None and not _has_tokenizer(dest):
        copy_tokenizer(str(backbone.tokenizer_dir), dest)
