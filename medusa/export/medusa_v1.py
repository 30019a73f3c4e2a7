"""The official MEDUSA heads layouts, and the engines that read them (TensorRT-LLM, TGI).

Version 1 (``medusa_lm_head.safetensors``, official v0.1 ``medusa_lm_head.pt``, medusa-v1 / TensorRT-LLM /
TGI ``MedusaHeadV1``): ``medusa_head = ModuleList(Sequential(ResBlock x L, Linear(d, V, bias=False)))``,
i.e. ``{h}.{l}.linear.weight [d, d]`` / ``{h}.{l}.linear.bias [d]`` for the ResBlocks and
``{h}.{L}.weight [V, d]`` for W2. ``config.json``: ``medusa_num_heads``, ``medusa_num_layers``,
``base_model_name_or_path`` (no ``architectures`` key).

Version 2 (FasterDecoding/Medusa ``train_legacy.py`` since "Creating medusa2", config ``version: "2"``;
TGI ``MedusaHeadV2``): the heads have no W2, only ``{h}.{l}.linear.weight|bias``; head h's logits are
the BASE model's LM head applied to its ResBlocks' output. We import it as ``head_type: shared_lm_head``
and write it for shared_lm_head heads exported to TGI (see :func:`medusa.export.export_checkpoint`).
The official code builds ``Sequential(*[ResBlock(d)] * L)`` (one module repeated): with L > 1 every
layer index holds the same tensors (only a ``.pt`` can store them; safetensors refuses shared tensors).
We read the tensors stored under each layer index into distinct layers, which computes exactly what
the official module computes, whether the layers were shared or not.

- Official MEDUSA (``medusa_model.py`` and ``medusa_model_legacy.py``) reads only ``medusa_lm_head.pt``, so
  the ``medusa-v1`` export writes it beside the safetensors file (the same tensors), and refuses heads with
  different ResBlocks (:func:`require_official_layers`).
- TensorRT-LLM (``examples/medusa/convert_checkpoint.py`` -> ``load_medusa_hf``) reads version 1
  (``medusa_lm_head.pt`` first, then ``.safetensors``); its head / layer / draft-length counts come from the
  converter's flags (see :mod:`medusa.export.serving`), ``MedusaConfig.from_hugging_face`` reads
  ``num_medusa_heads`` and ``medusa_num_layers``; the tree is a run-time argument
  (``run.py --medusa_choices="[[0], [0, 0], ...]"``), so we add it to the config and ``medusa_choices.txt``.
- TGI (``server/text_generation_server/models/__init__.py``) treats a ``config.json`` with
  ``medusa_num_heads`` as a Medusa model: it loads ``base_model_name_or_path``, speculates
  ``medusa_num_heads`` tokens and, as there is no ``architectures`` key, tries ``MedusaHeadV1``
  (version 1) and falls back to ``MedusaHeadV2`` (version 2: asserts ``medusa_num_layers == 1``, needs
  the biases, loads ``{i}.0.linear.weight|bias`` and applies the base LM head). Its router reads the
  tokenizer from the model directory, so the base's tokenizer files are copied in when the base is local.

Some checkpoints prefix the keys with ``medusa_head.`` (the heads inside a full model state dict).
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from medusa.errors import CheckpointError, first_line
from medusa.export.common import HeadsState, named_tensors, read_json, write_json
from medusa.io import save_safetensors

WEIGHTS = "medusa_lm_head.safetensors"
LEGACY_WEIGHTS = "medusa_lm_head.pt"
CONFIG = "config.json"
CHOICES_FILE = "medusa_choices.txt"

_KEY = re.compile(r"^(\d+)\.(\d+)\.(linear\.weight|linear\.bias|weight)$")


def v1_tensors(heads: HeadsState) -> dict[str, torch.Tensor]:
    """Version 1 names, or version 2 (ResBlocks only) for heads that reuse the base LM head."""
    return named_tensors(heads, "{k}.{l}.linear", None if heads.shared_lm_head else "{k}.{n}.weight")


def v1_config(heads: HeadsState) -> dict[str, Any]:
    config: dict[str, Any] = {
        "medusa_num_heads": heads.num_heads,
        "medusa_num_layers": heads.num_layers,
        "base_model_name_or_path": heads.base_model_name_or_path,
    }
    if heads.shared_lm_head:
        config["version"] = "2"  # what the official train_legacy.py writes for heads without W2
    return config


def choices_string(choices: list[list[int]]) -> str:
    """The ``--medusa_choices`` argument TensorRT-LLM's run.py parses: ``[[0], [0, 0], [1]]``."""
    return "[" + ", ".join("[" + ", ".join(str(r) for r in c) + "]" for c in choices) + "]"


def write_v1(heads: HeadsState, out: Path, choices: list[list[int]] | None = None,
             target: str = "medusa-v1") -> None:
    """The v1 layout for ``target`` (``medusa-v1``, ``tensorrt-llm`` or ``tgi``). ``medusa-v1`` also gets
    ``medusa_lm_head.pt`` (the same tensors): the official loaders read only that file. ``tensorrt-llm`` also
    gets ``num_medusa_heads`` (what ``MedusaConfig.from_hugging_face`` reads) and ``max_draft_len``."""
    tensors = v1_tensors(heads)
    save_safetensors(tensors, out / WEIGHTS, metadata={"format": "pt"})
    if target == "medusa-v1":
        torch.save({k: v.clone() for k, v in tensors.items()}, out / LEGACY_WEIGHTS)
    config = v1_config(heads)
    if target == "tensorrt-llm":
        config["num_medusa_heads"] = heads.num_heads
    if choices is not None:
        text = choices_string(choices)
        config["medusa_choices"] = text
        if target == "tensorrt-llm":
            config["max_draft_len"] = len(choices)  # TensorRT-LLM: tree nodes besides the root
        (out / CHOICES_FILE).write_text(text + "\n")
    write_json(out / CONFIG, config)


def require_official_layers(heads: HeadsState, source: str) -> None:
    """Official MEDUSA builds a head as ``Sequential(*[ResBlock(d)] * L, Linear)``: ONE module repeated, so
    loading L different ResBlocks leaves the last one's weights in every layer. Only heads whose layers are
    all the same tensors (e.g. imported from an official checkpoint) mean the same thing there."""
    for k in range(heads.num_heads):
        for l in range(1, heads.num_layers):
            same = torch.equal(heads.w1[k][l], heads.w1[k][0]) and torch.equal(heads.b1[k][l], heads.b1[k][0])
            if not same:
                raise CheckpointError(
                    f"{source}: --format medusa-v1 cannot hold head {k}'s {heads.num_layers} different "
                    f"ResBlocks (layer {l} differs from layer 0): the official MEDUSA code builds each head "
                    f"as [ResBlock(d)] * medusa_num_layers, one module repeated, so it would run the last "
                    f"layer's weights {heads.num_layers} times; export with --format tensorrt-llm, tgi or "
                    f"vllm (they build distinct layers), or train with heads.num_layers: 1")


def is_v1_dir(path: Path) -> bool:
    return (path / WEIGHTS).is_file() or (path / LEGACY_WEIGHTS).is_file()


def load_v1_state(path: Path) -> tuple[dict[str, torch.Tensor], str]:
    """The state dict of ``medusa_lm_head.safetensors`` or (v0.1) ``medusa_lm_head.pt`` in ``path``
    (a directory or the file itself)."""
    if path.is_dir():
        file = path / WEIGHTS if (path / WEIGHTS).is_file() else path / LEGACY_WEIGHTS
    else:
        file = path
    if not file.is_file():
        raise CheckpointError(f"{path}: no {WEIGHTS} or {LEGACY_WEIGHTS}")
    try:
        if file.suffix == ".safetensors":
            state = load_file(str(file))
        else:
            state = torch.load(str(file), map_location="cpu", weights_only=True)
    except (SafetensorError, OSError, ValueError, RuntimeError, EOFError, pickle.UnpicklingError) as exc:
        first = first_line(exc)
        raise CheckpointError(f"{file}: cannot read ({first})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{file}: expected a state dict of tensors")
    return {str(k).removeprefix("medusa_head."): v for k, v in state.items()}, str(file)


def _unshare(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Clone tensors that share storage with an earlier one (an official ``[ResBlock] * L`` head saved
    with torch.save): our layers are distinct modules, and safetensors refuses shared tensors."""
    seen: set[int] = set()
    out = {}
    for key, tensor in state.items():
        ptr = tensor.untyped_storage().data_ptr()
        out[key] = tensor.clone() if ptr in seen else tensor
        seen.add(ptr)
    return out


def _parse_head(h: int, layers: dict[int, dict[str, torch.Tensor]], src: str) -> tuple[list, list, Any]:
    """One head's ``{layer: {name: tensor}}`` -> (W1s, biases, W2 or None for the version-2 layout)."""
    top = max(layers)
    if sorted(layers) != list(range(top + 1)):
        raise CheckpointError(f"{src}: head {h} has layers {sorted(layers)}, expected 0..{top} without gaps")
    has_w2 = set(layers[top]) == {"weight"}
    n_blocks = top if has_w2 else top + 1
    for l in range(n_blocks):
        if set(layers[l]) != {"linear.weight", "linear.bias"}:
            raise CheckpointError(f"{src}: head {h} layer {l} has {sorted(layers[l])}, expected a ResBlock "
                                  f"('{h}.{l}.linear.weight' and '{h}.{l}.linear.bias')"
                                  + ("" if l < top else f" or a '{h}.{l}.weight' projection"))
    w1 = [layers[l]["linear.weight"] for l in range(n_blocks)]
    b1 = [layers[l]["linear.bias"] for l in range(n_blocks)]
    return w1, b1, (layers[top]["weight"] if has_w2 else None)


def read_v1(path: Path) -> HeadsState:
    """Official heads (v0.1 .pt, v2, medusa-v1 / TGI / TensorRT-LLM safetensors) -> canonical heads.

    Head and layer counts come from the tensor names: the official vicuna-7b-v1.3 heads' config.json
    says ``medusa_num_heads: 2`` but the file holds 4 (TensorRT-LLM's README works around it with
    ``--fixed_num_medusa_heads``). Version-2 heads (no ``{h}.{L}.weight``) give ``w2 = None``; their
    config's ``medusa_num_layers``, when present, must match the tensors.
    """
    state, src = load_v1_state(path)
    entries: dict[int, dict[int, dict[str, torch.Tensor]]] = {}
    for key, tensor in _unshare(state).items():
        m = _KEY.match(key)
        if m is None:
            raise CheckpointError(f"{src}: unexpected tensor {key!r} (not an official MEDUSA heads file)")
        entries.setdefault(int(m.group(1)), {}).setdefault(int(m.group(2)), {})[m.group(3)] = tensor
    if not entries:
        raise CheckpointError(f"{src}: holds no tensors")
    k_heads = max(entries) + 1
    if sorted(entries) != list(range(k_heads)):
        raise CheckpointError(f"{src}: heads {sorted(set(range(k_heads)) - set(entries))} are missing")
    parsed = [_parse_head(h, entries[h], src) for h in range(k_heads)]
    with_w2 = [h for h, (_, _, w2) in enumerate(parsed) if w2 is not None]
    if with_w2 and len(with_w2) != k_heads:
        without = sorted(set(range(k_heads)) - set(with_w2))
        raise CheckpointError(f"{src}: heads {with_w2} have a W2 ('{{h}}.{{L}}.weight') but heads {without} "
                              "do not (version-1 and version-2 layouts mixed)")
    config_path = (path if path.is_dir() else path.parent) / CONFIG
    cfg = read_json(config_path) if config_path.is_file() else {}
    n_layers = len(parsed[0][0])
    if not with_w2 and "medusa_num_layers" in cfg and cfg["medusa_num_layers"] != n_layers:
        raise CheckpointError(f"{config_path}: medusa_num_layers is {cfg['medusa_num_layers']!r} but the "
                              f"version-2 heads in {src} have {n_layers} ResBlock(s)")
    choices = None
    if isinstance(cfg.get("medusa_choices"), str):
        import json

        try:
            choices = json.loads(cfg["medusa_choices"])
        except json.JSONDecodeError:
            raise CheckpointError(f"{config_path}: medusa_choices is not a list of lists") from None
    heads = HeadsState([p[0] for p in parsed], [p[1] for p in parsed],
                       [p[2] for p in parsed] if with_w2 else None,
                       base_model_name_or_path=str(cfg.get("base_model_name_or_path") or ""), choices=choices)
    heads.check(src)
    return heads
