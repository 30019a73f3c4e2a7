"""The heads' weight file: ``medusa_heads.safetensors``, or the same bytes xz-compressed
(``medusa_heads.safetensors.xz``) — how the project ships its drafters in ``data/heads/``: lossless
(``unxz`` restores the very file training wrote), and ~30% fewer bytes for bfloat16 weights, so the
repository stays small enough to travel. Every reader of a heads folder goes through here."""

from __future__ import annotations

import lzma
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_bytes
from safetensors.torch import load_file

from medusa.errors import CheckpointError
from medusa.modeling.config import WEIGHTS_NAME
from medusa.modeling.protocol import Heads

PACKED_WEIGHTS_NAME = WEIGHTS_NAME + ".xz"


def heads_weights_path(folder: str | Path) -> Path:
    """The weight file of the heads folder ``folder``: the plain one, else the xz-compressed one (a path that
    may not exist: :func:`read_heads_file` names it). Refuses a folder holding both (which one is meant?)."""
    folder = Path(folder)
    plain, packed = folder / WEIGHTS_NAME, folder / PACKED_WEIGHTS_NAME
    if packed.is_file() and plain.exists():
        raise CheckpointError(f"{folder}: holds both {WEIGHTS_NAME} and {PACKED_WEIGHTS_NAME}; keep one "
                              f"(`unxz {packed}` replaces the compressed one by the plain file)")
    return packed if packed.is_file() else plain


def read_heads_file(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of a heads weight file (plain or ``.xz``), each checked finite."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: not found")
    try:
        if path.name.endswith(".xz"):
            state = load_bytes(lzma.decompress(path.read_bytes()))
        else:
            state = load_file(str(path))
    except lzma.LZMAError as exc:
        raise CheckpointError(f"{path}: corrupt xz file ({exc})") from None
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: corrupt safetensors file ({exc})") from None
    if not state:
        raise CheckpointError(f"{path}: holds no tensors")
    for name, tensor in state.items():  # NaN / inf weights would only surface as a sampling crash
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise CheckpointError(f"{path}: {name} holds NaN or infinite values")
    return state


def pack_heads_file(folder: str | Path, preset: int = 9) -> Path:
    """Replace ``folder``'s ``medusa_heads.safetensors`` by its xz compression (written beside it first, then
    the plain file removed): the form the project ships. Returns the packed file's path."""
    folder = Path(folder)
    plain, packed = folder / WEIGHTS_NAME, folder / PACKED_WEIGHTS_NAME
    if not plain.is_file():
        raise CheckpointError(f"{plain}: not found")
    if packed.exists():
        raise CheckpointError(f"{packed}: already exists")
    data = plain.read_bytes()
    tmp = packed.with_name(packed.name + ".tmp")
    tmp.write_bytes(lzma.compress(data, preset=preset))
    if lzma.decompress(tmp.read_bytes()) != data:  # lossless or nothing
        tmp.unlink()
        raise CheckpointError(f"{plain}: xz round trip differs")
    tmp.rename(packed)
    plain.unlink()
    return packed


def check_state_keys(heads: Heads, state: dict[str, torch.Tensor], source: str) -> None:
    """``state`` holds exactly ``heads``' tensors, each of its shape."""
    expected = heads.state_dict()
    missing = sorted(set(expected) - set(state))
    extra = sorted(set(state) - set(expected))
    if missing:
        raise CheckpointError(f"{source}: missing tensor(s) {', '.join(missing[:5])}"
                              + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))
    if extra:
        raise CheckpointError(f"{source}: unexpected tensor(s) {', '.join(extra[:5])}"
                              + (f" and {len(extra) - 5} more" if len(extra) > 5 else ""))
    for key, tensor in state.items():
        if tuple(tensor.shape) != tuple(expected[key].shape):
            raise CheckpointError(f"{source}: tensor {key} has shape {tuple(tensor.shape)}, "
                                  f"expected {tuple(expected[key].shape)}")


__all__ = ["PACKED_WEIGHTS_NAME", "check_state_keys", "heads_weights_path", "pack_heads_file",
           "read_heads_file"]
