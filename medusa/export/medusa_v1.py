"""The official MEDUSA heads layout, and the engines that read it (TensorRT-LLM, TGI).

``medusa_lm_head.safetensors`` holds ``medusa_head = ModuleList(Sequential(ResBlock x L, Linear(d, V)))``:
``{h}.{l}.linear.weight|bias`` for the ResBlocks and ``{h}.{L}.weight`` for W2. ``config.json`` carries
``medusa_num_heads``, ``medusa_num_layers`` and ``base_model_name_or_path``.

- TensorRT-LLM (``examples/medusa/convert_checkpoint.py`` -> ``load_medusa_hf``) reads the same file
  (``medusa_lm_head.pt`` first, then ``.safetensors``); the tree is a run-time argument
  (``run.py --medusa_choices="[[0], [0, 0], ...]"``), so we add it to the config and ``medusa_choices.txt``.
- TGI (``server/text_generation_server/models/__init__.py``) treats a ``config.json`` with
  ``medusa_num_heads`` as a Medusa model: it loads ``base_model_name_or_path``, speculates
  ``medusa_num_heads`` tokens and, as there is no ``architectures`` key, reads the heads with
  ``MedusaHeadV1`` (``{h}.{l}.linear.*``, ``{h}.{L}.weight``). Its router reads the tokenizer from the
  model directory, so the base's tokenizer files are copied in when the base is local.

Official v0.1 checkpoints ship the same keys as ``medusa_lm_head.pt`` (a pickled state dict);
some v2 checkpoints prefix them with ``medusa_head.``.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from medusa.errors import CheckpointError, first_line
from medusa.export.common import HeadsState, named_tensors, read_json, write_json

WEIGHTS = "medusa_lm_head.safetensors"
LEGACY_WEIGHTS = "medusa_lm_head.pt"
CONFIG = "config.json"
CHOICES_FILE = "medusa_choices.txt"

_KEY = re.compile(r"^(\d+)\.(\d+)\.(linear\.weight|linear\.bias|weight)$")


def v1_tensors(heads: HeadsState) -> dict[str, torch.Tensor]:
    return named_tensors(heads, "{k}.{l}.linear", "{k}.{n}.weight")


def v1_config(heads: HeadsState) -> dict[str, Any]:
    return {
        "medusa_num_heads": heads.num_heads,
        "medusa_num_layers": heads.num_layers,
        "base_model_name_or_path": heads.base_model_name_or_path,
    }


def choices_string(choices: list[list[int]]) -> str:
    """The ``--medusa_choices`` argument TensorRT-LLM's run.py parses: ``[[0], [0, 0], [1]]``."""
    return "[" + ", ".join("[" + ", ".join(str(r) for r in c) + "]" for c in choices) + "]"


def write_v1(heads: HeadsState, out: Path, choices: list[list[int]] | None = None) -> None:
    save_file(v1_tensors(heads), str(out / WEIGHTS), metadata={"format": "pt"})
    config = v1_config(heads)
    if choices is not None:
        text = choices_string(choices)
        config["medusa_choices"] = text
        config["max_draft_len"] = len(choices)  # TensorRT-LLM: tree nodes besides the root
        (out / CHOICES_FILE).write_text(text + "\n")
    write_json(out / CONFIG, config)


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


def read_v1(path: Path) -> HeadsState:
    """Official heads (v0.1 .pt, v2 / medusa-v1 / TGI / TensorRT-LLM safetensors) -> canonical heads.

    Head and layer counts come from the tensor names: the official vicuna-7b-v1.3 heads' config.json
    says ``medusa_num_heads: 2`` but the file holds 4 (TensorRT-LLM's README works around it with
    ``--fixed_num_medusa_heads``).
    """
    state, src = load_v1_state(path)
    entries: dict[int, dict[int, dict[str, torch.Tensor]]] = {}
    for key, tensor in state.items():
        m = _KEY.match(key)
        if m is None:
            raise CheckpointError(f"{src}: unexpected tensor {key!r} (not an official MEDUSA heads file)")
        entries.setdefault(int(m.group(1)), {}).setdefault(int(m.group(2)), {})[m.group(3)] = tensor
    if not entries:
        raise CheckpointError(f"{src}: holds no tensors")
    k_heads = max(entries) + 1
    if sorted(entries) != list(range(k_heads)):
        raise CheckpointError(f"{src}: heads {sorted(set(range(k_heads)) - set(entries))} are missing")
    n_layers = max(entries[0]) if entries[0] else 0
    w1, b1, w2 = [], [], []
    for h in range(k_heads):
        layers = entries[h]
        if sorted(layers) != list(range(n_layers + 1)) or set(layers[n_layers]) != {"weight"}:
            raise CheckpointError(f"{src}: head {h} does not have {n_layers} ResBlock(s) then a "
                                  f"'{h}.{n_layers}.weight' projection")
        for l in range(n_layers):
            if set(layers[l]) != {"linear.weight", "linear.bias"}:
                raise CheckpointError(f"{src}: head {h} layer {l} needs linear.weight and linear.bias")
        w1.append([layers[l]["linear.weight"] for l in range(n_layers)])
        b1.append([layers[l]["linear.bias"] for l in range(n_layers)])
        w2.append(layers[n_layers]["weight"])
    config_path = (path if path.is_dir() else path.parent) / CONFIG
    cfg = read_json(config_path) if config_path.is_file() else {}
    choices = None
    if isinstance(cfg.get("medusa_choices"), str):
        import json

        try:
            choices = json.loads(cfg["medusa_choices"])
        except json.JSONDecodeError:
            raise CheckpointError(f"{config_path}: medusa_choices is not a list of lists") from None
    heads = HeadsState(w1, b1, w2, base_model_name_or_path=str(cfg.get("base_model_name_or_path") or ""),
                       choices=choices)
    heads.check(src)
    return heads
