"""Export heads to serving engines' formats, and import official MEDUSA / vLLM heads into ours.

``export_checkpoint(src, out, format)`` with ``format`` one of :data:`EXPORT_FORMATS`;
``import_checkpoint(src, out, base=None)`` detects the source layout. Both write ``out`` atomically
(a temp directory renamed into place), so ``out`` is never left half-written.

``shared_lm_head`` heads (no W2 of their own; they reuse the base LM head):

- ``tgi`` with one ResBlock per head: the MEDUSA v2 layout TGI's ``MedusaHeadV2`` loads
  (``{h}.0.linear.weight|bias`` only, ``config.json`` with ``medusa_num_layers: 1`` and ``version: "2"``);
  TGI applies the base model's own LM head, so nothing is materialised and no base model is loaded.
- ``tgi`` with any other ResBlock count: ``MedusaHeadV2`` asserts ``medusa_num_layers == 1``, so we fall
  back to the version-1 layout with W2 materialised from the base LM head (``MedusaHeadV1`` loads any
  layer count); the summary's ``layout`` says which one was written.
- ``vllm``: the base LM head materialised ONCE, as vLLM's shared ``lm_head.weight`` with
  ``original_lm_head: true`` (its draft-vocabulary rows when ``heads.draft_vocab`` is set); the summary's
  ``layout`` is ``vllm-original-lm-head``.
- ``medusa-v1`` / ``tensorrt-llm``: W2 materialised from the base LM head into every head.

Importing an official v2 file (ResBlocks only) gives a ``shared_lm_head`` checkpoint.

Every export records the backbone the heads were trained for (a MEDUSA-2 checkpoint's merged one; see
:mod:`medusa.export.backbone`) and returns the commands that load it in its engine
(:mod:`medusa.export.serving`). ``medusa-v1`` refuses heads whose ResBlocks differ (the official code repeats
one module) and writes the tree (``medusa_choices``) no deeper than the 5 heads official MEDUSA builds.

Heads with a draft vocabulary (``heads.draft_vocab``) export only to ``vllm`` (``truncated_vocab_size`` +
``token_map``); medusa-v1, TensorRT-LLM and TGI have no way to express one, so they are refused.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import torch

from medusa.config.enums import EXPORT_FORMATS, EXPORTABLE_HEAD_TYPES, IMPORT_FORMATS
from medusa.errors import CheckpointError, MedusaError, first_line
from medusa.export.backbone import Backbone, resolve_backbone, write_backbone
from medusa.export.common import (
    HeadsState,
    copy_tokenizer,
    named_tensors,
    read_our_checkpoint,
    require_tree_fits,
)
from medusa.export.gguf import export_gguf
from medusa.export.medusa_v1 import is_v1_dir, read_v1, require_official_layers, write_v1
from medusa.export.serving import (
    OFFICIAL_MODEL_TYPES,
    OFFICIAL_NUM_HEADS,
    official_depth,
    official_note,
    serving_commands,
)
from medusa.export.speculators import write_speculators
from medusa.export.vllm import is_vllm_dir, read_vllm, write_vllm
from medusa.io import atomic_directory, save_safetensors
from medusa.modeling.base import dtype_name
from medusa.modeling.config import CONFIG_NAME, TREE_NAME, WEIGHTS_NAME, MedusaConfig
from medusa.modeling.heads_file import heads_weights_path
from medusa.tree import MedusaTree, default_tree


def _check_paths(src: Path, out: Path) -> None:
    if out.resolve() == src.resolve() or src.resolve() in out.resolve().parents:
        raise MedusaError(f"{out}: the output must not be the source checkpoint or inside it")


def export_checkpoint(src: str | Path, out: str | Path, format: str, tree: str | Path | None = None,
                      base: str | None = None, with_backbone: bool = False,
                      overwrite: bool = False, embed_tokens: bool = True,
                      base_precision: str | None = None, draft_precision: str | None = None
                      ) -> dict[str, Any]:
    """Write the heads of our checkpoint ``src`` in ``format`` to ``out``; returns a summary.

    ``tree``: a tree.json (or bare choices list) for ``tensorrt-llm`` / ``medusa-v1``; default: the
    checkpoint's own, else the built-in default tree. ``base``: the backbone the export records and where
    ``shared_lm_head`` checkpoints find the LM head (default: a MEDUSA-2 checkpoint's merged backbone, else
    the config's base). ``with_backbone``: copy a MEDUSA-2 checkpoint's merged backbone into
    ``out/base_model`` and record that. The summary's ``backbone`` / ``backbone_source`` say which was
    recorded, ``commands`` how each engine loads the export, ``notes`` what the engine needs besides.
    An existing non-empty ``out`` is refused unless ``overwrite`` (then only the files written are
    replaced; see :mod:`medusa.io`). ``embed_tokens=False`` (``speculators`` only) leaves the base's input
    embeddings out of the export (see :mod:`medusa.export.speculators`). ``base_precision`` (``gguf`` only:
    f32 / bf16 / q4_1) also writes the backbone as the GGUF llama-server loads (``base-PRECISION.gguf``);
    ``draft_precision`` (``gguf`` only: f32, the default, bf16 or q8_0) the drafter's matrices.
    """
    if format not in EXPORT_FORMATS:
        raise MedusaError(f"unknown export format {format!r}; choose one of {', '.join(EXPORT_FORMATS)}")
    src, out = Path(src), Path(out)
    _check_paths(src, out)
    _check_format_flags(format, embed_tokens, base_precision, draft_precision)
    pre = MedusaConfig.load(src)
    if format == "speculators":
        if tree is not None or with_backbone:  # the format has no tree, and names its verifier by path
            flag = "--tree" if tree is not None else "--with-backbone"
            raise MedusaError(f"{flag} does not apply to --format speculators (its drafter drafts a chain; "
                              "its verifier is the base, named by path)")
        return _export_speculators(src, out, pre, base, overwrite, embed_tokens)
    if format == "gguf":
        return export_gguf(src, out, pre, base, overwrite, base_precision, draft_precision)
    if pre.head_type not in EXPORTABLE_HEAD_TYPES:
        raise CheckpointError(f"{src / CONFIG_NAME}: head_type {pre.head_type!r} cannot be exported to "
                              f"{format}: it serves MEDUSA heads of head_type "
                              f"{' or '.join(EXPORTABLE_HEAD_TYPES)} only")
    if pre.draft_vocab and format != "vllm":
        raise MedusaError(f"{src}: --format {format} cannot express a draft vocabulary (heads.draft_vocab: "
                          f"{pre.draft_vocab}); export it with --format vllm, or train with "
                          f"heads.draft_vocab: 0")
    backbone = resolve_backbone(src, pre, out, base=base, with_backbone=with_backbone)
    keep_shared = format == "tgi" and pre.head_type == "shared_lm_head" and pre.num_layers == 1
    materialise = "none" if keep_shared else "once" if format == "vllm" else "per_head"
    config, heads = read_our_checkpoint(src, base=base, materialise=materialise)
    heads.base_model_name_or_path = backbone.path
    if format == "medusa-v1":
        require_official_layers(heads, str(heads_weights_path(src)))
    choices = _export_choices(format, src, tree, heads)
    # the base model folder is never an output (its files are another command's)
    base_dir = backbone.path if backbone.copy_from is None else None  # (not the copy this export writes)
    with atomic_directory(out, overwrite=overwrite, inputs=[src, tree, base, base_dir], kind="export") as tmp:
        write_backbone(backbone, tmp)
        if format == "vllm":
            write_vllm(heads, tmp)
        else:
            write_v1(heads, tmp, choices=choices, target=format)
        tok_dir = backbone.tokenizer_dir
        copied = copy_tokenizer(str(tok_dir), tmp) if format == "tgi" and tok_dir is not None else []
    return _summary(format, out, config, heads, backbone, choices, copied)


def _check_format_flags(format: str, embed_tokens: bool, base_precision: str | None,
                        draft_precision: str | None) -> None:
    if not embed_tokens and format != "speculators":
        raise MedusaError(f"--no-embed-tokens applies to --format speculators only (not {format})")
    if base_precision is not None and format != "gguf":
        raise MedusaError(f"--with-base applies to --format gguf only (not {format})")
    if draft_precision is not None and format != "gguf":
        raise MedusaError(f"--draft-precision applies to --format gguf only (not {format})")


def _export_speculators(src: Path, out: Path, config: MedusaConfig, base: str | None,
                        overwrite: bool, embed_tokens: bool) -> dict[str, Any]:
    """eagle3 heads -> a speculators ``eagle3`` checkpoint naming the backbone as its verifier."""
    from transformers import AutoConfig

    backbone = resolve_backbone(src, config, out, base=base)
    try:
        base_cfg = AutoConfig.from_pretrained(backbone.path)
    except (OSError, ValueError) as exc:  # missing, not a model folder, a corrupt config.json
        raise CheckpointError(f"cannot read the base model's config {backbone.path!r}: "
                              f"{first_line(exc)}") from None
    text = base_cfg.get_text_config() if hasattr(base_cfg, "get_text_config") else base_cfg
    with atomic_directory(out, overwrite=overwrite, inputs=[src, base, backbone.path], kind="export") as tmp:
        info = write_speculators(src, config, text.to_dict(), backbone.path, tmp, embed_tokens)
    comment = f"  # {backbone.hub_id}" if backbone.hub_id else ""
    spec = json.dumps({"model": str(out), "num_speculative_tokens": config.num_heads})
    commands = [shlex.join(["vllm", "serve", str(out)]) + comment,
                shlex.join(["vllm", "serve", backbone.path, "--speculative-config", spec]) + comment]
    return {"format": "speculators", "out": str(out), "num_heads": config.num_heads, "num_layers": 1,
            "layout": "speculators-eagle3", "materialised_lm_head": False, "lm_head_copies": 1,
            "tree_nodes": None, "tree_depth": None, "tokenizer_files": [], "backbone": backbone.path,
            "backbone_source": backbone.source, "backbone_description": backbone.description,
            "tokenizer": backbone.tokenizer, "commands": commands, "notes": _speculators_notes(embed_tokens),
            **info}


def _speculators_notes(embed_tokens: bool) -> list[str]:
    if embed_tokens:
        return ["embed_tokens.weight holds the base's input embeddings (vLLM shares the target's when "
                "equal); --no-embed-tokens writes a smaller file that vLLM loads, speculators 0.9.0 does not"]
    return ["no embed_tokens.weight: vLLM shares the target's embeddings, but speculators 0.9.0's "
            "Eagle3DraftModel.from_pretrained then drafts with an uninitialised embedding table"]


def _export_choices(format: str, src: Path, tree: str | Path | None,
                    heads: HeadsState) -> list[list[int]] | None:
    """The tree written with ``tensorrt-llm`` / ``medusa-v1`` exports (``medusa_choices``): ``tree``, the
    checkpoint's, else the default one; no deeper than the heads (official MEDUSA: than its 5 heads)."""
    if format not in ("tensorrt-llm", "medusa-v1"):
        if tree is not None:
            raise MedusaError(f"--tree only applies to --format tensorrt-llm or medusa-v1 (got {format})")
        return None

    depth = official_depth(heads.num_heads) if format == "medusa-v1" else heads.num_heads
    if tree is not None:
        choices, source = [list(c) for c in MedusaTree.from_json(tree).choices], str(tree)
    elif heads.choices is not None:
        choices, source = heads.choices, str(src / TREE_NAME)
    else:
        return [list(c) for c in default_tree(depth).choices]
    require_tree_fits(choices, heads.num_heads, source)
    deepest = max(len(c) for c in choices)
    if deepest > depth:
        raise MedusaError(f"{source}: tree depth {deepest} is deeper than the {OFFICIAL_NUM_HEADS} heads "
                          f"official MEDUSA builds; pass --tree with depth <= {depth}")
    return choices


def _summary(format: str, out: Path, config: MedusaConfig, heads: HeadsState, backbone: Backbone,
             choices: list[list[int]] | None, copied: list[str]) -> dict[str, Any]:
    depth = max((len(c) for c in choices), default=0) if choices is not None else None
    notes = [official_note(heads.num_heads, depth)] if format == "medusa-v1" and depth is not None else []
    if format == "medusa-v1" and config.base_model_type not in OFFICIAL_MODEL_TYPES:
        notes.append(f"official MEDUSA serves {' and '.join(OFFICIAL_MODEL_TYPES)} backbones only (this "
                     f"one is {config.base_model_type})")
    if backbone.tokenizer is None:
        notes.append(f"no tokenizer files found beside the backbone {backbone.path}: give the server one")
    commands = serving_commands(format, str(out), backbone.path, backbone.tokenizer, heads.num_heads,
                                heads.num_layers, len(choices) if choices is not None else None,
                                dtype_name(heads.dtype), hub_id=backbone.hub_id)
    return {"format": format, "out": str(out), "num_heads": heads.num_heads, "num_layers": heads.num_layers,
            "layout": _layout(format, heads),
            "materialised_lm_head": config.head_type == "shared_lm_head" and not heads.shared_lm_head,
            "lm_head_copies": _lm_head_copies(heads),
            "tree_nodes": (len(choices) + 1) if choices is not None else None, "tree_depth": depth,
            "tokenizer_files": copied, "backbone": backbone.path, "backbone_source": backbone.source,
            "backbone_description": backbone.description, "tokenizer": backbone.tokenizer,
            "commands": commands, "notes": notes}


def _layout(format: str, heads: HeadsState) -> str:
    if format == "vllm":
        return "vllm-original-lm-head" if heads.tied_w2 else "vllm"
    return "medusa-v2" if heads.shared_lm_head else "medusa-v1"


def _lm_head_copies(heads: HeadsState) -> int:
    """How many W2 tensors the export wrote: one per head, one shared (tied), or none (base LM head)."""
    if heads.shared_lm_head:
        return 0
    return 1 if heads.tied_w2 else heads.num_heads


def detect_format(src: Path) -> str:
    if (src / CONFIG_NAME).is_file():
        raise MedusaError(f"{src}: already a checkpoint in this project's format (medusa_config.json)")
    if src.is_file() and src.suffix in (".pt", ".safetensors"):
        return "medusa-v1"
    if not src.is_dir():
        raise CheckpointError(f"{src}: not found" if not src.exists()
                              else f"{src}: not a checkpoint directory")
    if is_vllm_dir(src):
        return "vllm"
    if is_v1_dir(src):
        return "medusa-v1"
    raise CheckpointError(f"{src}: not a MEDUSA checkpoint (no medusa_lm_head.safetensors / .pt, "
                          "and no vLLM config.json with model_type medusa + model.safetensors)")


def import_checkpoint(src: str | Path, out: str | Path, base: str | None = None,
                      format: str = "auto", overwrite: bool = False) -> dict[str, Any]:
    """Official heads (v0.1 ``.pt``, v2 safetensors, medusa-v1 / TGI / TensorRT-LLM) or vLLM heads ->
    our checkpoint at ``out``. The base model is ``base`` or the one the source config names; only its
    config is read (model_type / hidden_size / vocab_size must fit the heads). Heads without a W2 of
    their own (official MEDUSA v2) become ``head_type: shared_lm_head``; the summary's format is then
    ``medusa-v2``."""
    if format not in IMPORT_FORMATS:
        raise MedusaError(f"unknown import format {format!r}; choose one of {', '.join(IMPORT_FORMATS)}")
    src, out = Path(src), Path(out)
    _check_paths(src, out)
    fmt = detect_format(src) if format == "auto" else format
    heads = read_vllm(src) if fmt == "vllm" else read_v1(src)
    base_name = base or heads.base_model_name_or_path
    if not base_name:
        raise MedusaError(f"{src}: the source names no base model; pass --base")
    model_type, hidden, vocab = _base_fingerprint(base_name)
    if heads.shared_lm_head and hidden != heads.hidden_size:
        raise CheckpointError(f"base model {base_name!r} has hidden_size {hidden} but the heads in {src} "
                              f"have {heads.hidden_size}")
    heads_vocab = heads.full_vocab_size if heads.token_map is not None else heads.vocab_size
    if not heads.shared_lm_head and (hidden != heads.hidden_size or vocab != heads_vocab):
        raise CheckpointError(f"base model {base_name!r} has hidden_size {hidden} / vocab_size "
                              f"{vocab} but the heads in {src} have {heads.hidden_size} / {heads_vocab}")
    if heads.shared_lm_head:
        fmt = "medusa-v2" if fmt == "medusa-v1" else fmt
    if base_name and Path(base_name).is_dir():
        base_name = str(Path(base_name).resolve())
    config = MedusaConfig(base_model_name_or_path=base_name, base_model_type=model_type, hidden_size=hidden,
                          vocab_size=vocab, num_heads=heads.num_heads, num_layers=heads.num_layers,
                          head_type="shared_lm_head" if heads.shared_lm_head else "linear",
                          draft_vocab=0 if heads.token_map is None else int(heads.token_map.shape[0]),
                          dtype=dtype_name(heads.dtype),
                          extra={"imported_from": str(src), "import_format": fmt})
    tree = None
    if heads.choices is not None:

        tree = MedusaTree.from_choices(heads.choices, num_heads=heads.num_heads)
    with atomic_directory(out, overwrite=overwrite, inputs=[src, base, base_name], kind="heads",
                          owns=(CONFIG_NAME, WEIGHTS_NAME, TREE_NAME)) as tmp:
        config.save(tmp)
        save_safetensors(our_tensors(heads), str(tmp / WEIGHTS_NAME), metadata={"format": "pt"})
        if tree is not None:
            tree.to_json(tmp / TREE_NAME)
    return {"format": fmt, "out": str(out), "num_heads": heads.num_heads, "num_layers": heads.num_layers,
            "base_model": base_name, "tree_nodes": len(tree) if tree is not None else None}


def our_tensors(heads: HeadsState) -> dict:
    """Canonical heads -> the tensor names of ``medusa_heads.safetensors`` (``linear`` heads, or
    ``shared_lm_head`` heads without ``lm_heads.*``)."""
    out = named_tensors(heads, "blocks.{k}.{l}.linear", None if heads.shared_lm_head
                        else "lm_heads.{k}.weight")
    if heads.token_map is not None:
        out["token_map"] = heads.token_map.to(torch.int64).contiguous()
    return out


def _base_fingerprint(name: str) -> tuple[str, int, int]:
    from transformers import AutoConfig

    try:
        cfg = AutoConfig.from_pretrained(name)
    except (OSError, ValueError) as exc:
        first = first_line(exc)
        raise CheckpointError(f"cannot read the config of base model {name!r}: {first}") from None
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    return text.model_type, int(text.hidden_size), int(text.vocab_size)


__all__ = ["EXPORT_FORMATS", "IMPORT_FORMATS", "HeadsState", "detect_format", "export_checkpoint",
           "import_checkpoint"]
