"""Reading our heads checkpoint without a base model, and the canonical in-memory form exporters share.

The canonical form (:class:`HeadsState`) holds, per head k and layer l, the ResBlock ``W1 [d, d]``,
``b [d]`` and the head's ``W2 [V, d]``, exactly the tensors of ``medusa_heads.safetensors``. For
``shared_lm_head`` checkpoints W2 is materialised from the base LM head, per head (targets that need a
W2 per head) or once (``tied_w2``: one tensor every head shares, for vLLM's ``original_lm_head``), or
left out (``w2 = None``: the heads reuse the base LM head, as official MEDUSA v2 and TGI's
``MedusaHeadV2`` do).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from medusa.errors import CheckpointError, MedusaError
from medusa.modeling.base import lm_head_weight, load_base_model
from medusa.modeling.config import CONFIG_NAME, TREE_NAME, MedusaConfig, base_location
from medusa.modeling.draft_vocab import check_token_map
from medusa.modeling.heads_file import heads_weights_path, read_heads_file
from medusa.tree import MedusaTree

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja")


@dataclass
class HeadsState:
    """K heads x L ResBlocks in plain tensors: ``w1[k][l] [d, d]``, ``b1[k][l] [d]``, ``w2[k] [V, d]``.

    ``w2 is None``: the heads have no W2 of their own and reuse the base model's LM head.
    ``tied_w2``: every ``w2[k]`` is the same tensor (the base LM head materialised once); a format writes
    it once (vLLM's ``original_lm_head``) or not at all (``named_tensors`` refuses a per-head name).
    ``token_map [N]`` (int64, draft id -> target id): a draft vocabulary; W2 is then ``[N, d]`` and
    ``full_vocab_size`` the target vocabulary.
    """

    w1: list[list[torch.Tensor]]
    b1: list[list[torch.Tensor]]
    w2: list[torch.Tensor] | None
    base_model_name_or_path: str = ""
    choices: list[list[int]] | None = None  # the calibrated tree, when the source carries one
    extra: dict[str, Any] = field(default_factory=dict)
    token_map: torch.Tensor | None = None
    full_vocab_size: int | None = None
    tied_w2: bool = False

    @property
    def shared_lm_head(self) -> bool:
        return self.w2 is None

    @property
    def num_heads(self) -> int:
        return len(self.w1)

    @property
    def num_layers(self) -> int:
        return len(self.w1[0]) if self.w1 else 0

    @property
    def hidden_size(self) -> int:
        return int(self.w2[0].shape[1]) if self.w2 is not None else int(self.w1[0][0].shape[1])

    @property
    def vocab_size(self) -> int | None:
        """W2's rows; None for heads that reuse the base LM head (the base decides)."""
        return int(self.w2[0].shape[0]) if self.w2 is not None else None

    @property
    def dtype(self) -> torch.dtype:
        return self.w2[0].dtype if self.w2 is not None else self.w1[0][0].dtype

    def check(self, source: str) -> None:
        """Every head has the same layer count; every tensor has the shape its role needs."""
        if self.num_heads == 0:
            raise CheckpointError(f"{source}: holds no heads")
        if self.token_map is not None:

            if self.full_vocab_size is None:
                raise CheckpointError(f"{source}: a token_map needs the full vocabulary size")
            try:
                check_token_map(self.token_map, int(self.token_map.shape[0]), self.full_vocab_size)
            except ValueError as exc:
                raise CheckpointError(f"{source}: {exc}") from None
            if self.w2 is not None and self.vocab_size != self.token_map.shape[0]:
                raise CheckpointError(f"{source}: W2 has {self.vocab_size} rows but token_map "
                                      f"{self.token_map.shape[0]} ids")
        if self.tied_w2 and (self.w2 is None or any(w is not self.w2[0] for w in self.w2)):
            raise ValueError("tied_w2 needs every head's W2 to be one and the same tensor")
        if self.w2 is None and self.num_layers == 0:
            raise CheckpointError(f"{source}: heads without ResBlocks or a W2 of their own would all be "
                                  "the base LM head")
        d = self.hidden_size
        if len(self.b1) != self.num_heads or (self.w2 is not None and len(self.w2) != self.num_heads):
            raise CheckpointError(f"{source}: ResBlocks found for {self.num_heads} heads but biases for "
                                  f"{len(self.b1)}"
                                  + ("" if self.w2 is None else f" and W2 for {len(self.w2)}"))
        for k in range(self.num_heads):
            if len(self.w1[k]) != self.num_layers or len(self.b1[k]) != self.num_layers:
                raise CheckpointError(f"{source}: head {k} has {len(self.w1[k])} layer(s), head 0 has "
                                      f"{self.num_layers}")
            if self.w2 is not None and tuple(self.w2[k].shape) != (self.vocab_size, d):
                raise CheckpointError(f"{source}: head {k} W2 has shape {tuple(self.w2[k].shape)}, "
                                      f"expected {(self.vocab_size, d)}")
            for l in range(self.num_layers):
                if tuple(self.w1[k][l].shape) != (d, d) or tuple(self.b1[k][l].shape) != (d,):
                    raise CheckpointError(f"{source}: head {k} layer {l} has W1 "
                                          f"{tuple(self.w1[k][l].shape)} / bias "
                                          f"{tuple(self.b1[k][l].shape)}, expected {(d, d)} / {(d,)}")


MATERIALISE = ("per_head", "once", "none")


def read_our_checkpoint(path: str | Path, base: str | None = None,
                        materialise: str = "per_head") -> tuple[MedusaConfig, HeadsState]:
    """Our checkpoint -> (config, canonical heads). ``shared_lm_head`` W2 comes from ``base`` (or the
    base the config names), which is loaded for that purpose only. ``materialise``: ``"per_head"``, a
    copy per head; ``"once"``, one tensor all heads share (``tied_w2``); ``"none"``, left out
    (``w2 = None``) and no base model is loaded. ``linear`` heads always have their own W2."""
    if materialise not in MATERIALISE:
        raise ValueError(f"materialise={materialise!r}: choose one of {', '.join(MATERIALISE)}")

    path = Path(path)
    config = MedusaConfig.load(path)
    src = heads_weights_path(path)
    state = read_heads_file(src)
    src = str(src)
    k_heads, n_layers = config.num_heads, config.num_layers

    def get(key: str) -> torch.Tensor:
        if key not in state:
            raise CheckpointError(f"{src}: missing tensor {key}")
        return state[key]

    w1 = [[get(f"blocks.{k}.{l}.linear.weight") for l in range(n_layers)] for k in range(k_heads)]
    b1 = [[get(f"blocks.{k}.{l}.linear.bias") for l in range(n_layers)] for k in range(k_heads)]
    w2: list[torch.Tensor] | None = None
    token_map = get("token_map") if config.draft_vocab else None
    if config.head_type == "linear":
        w2 = [get(f"lm_heads.{k}.weight") for k in range(k_heads)]
    elif materialise != "none":
        dtype = next((v.dtype for v in state.values() if v.is_floating_point()), torch.float32)
        shared = base_lm_head_weight(base_location(path, config, base,
                                                   hint="shared_lm_head heads need the base model, pass "
                                                        "--base"), dtype)
        if tuple(shared.shape) != (config.vocab_size, config.hidden_size):
            raise CheckpointError(f"base LM head has shape {tuple(shared.shape)} but {path / CONFIG_NAME} "
                                  f"says vocab {config.vocab_size} x hidden {config.hidden_size}")
        if token_map is not None:
            shared = shared.index_select(0, token_map)  # [N, d]: the draft vocabulary's rows
        # per_head: K copies (formats that name a W2 per head); once: one tensor, K references
        w2 = [shared.clone() for _ in range(k_heads)] if materialise == "per_head" else [shared] * k_heads
    choices = None
    if (path / TREE_NAME).is_file():

        tree = MedusaTree.from_json(path / TREE_NAME)
        choices = [list(c) for c in tree.choices]
    heads = HeadsState(w1, b1, w2, base_model_name_or_path=config.base_model_name_or_path, choices=choices,
                       token_map=token_map,
                       full_vocab_size=config.vocab_size if token_map is not None else None,
                       tied_w2=config.head_type == "shared_lm_head" and materialise == "once")
    heads.check(src)
    return config, heads


def base_lm_head_weight(name_or_path: str, dtype: torch.dtype) -> torch.Tensor:
    """The base model's LM head ``[V, d]`` (its input embeddings when tied), as ``dtype`` on the CPU."""

    model = load_base_model(name_or_path)
    return lm_head_weight(model).detach().to(device="cpu", dtype=dtype).contiguous()


def named_tensors(heads: HeadsState, block: str, head: str | None) -> dict[str, torch.Tensor]:
    """Canonical heads -> one format's tensor names. ``block`` is a template with ``{k}`` (head) and ``{l}``
    (layer) that gets ``.weight`` / ``.bias`` appended; ``head`` has ``{k}`` and ``{n}`` (num_layers), and
    must be None exactly when the heads have no W2 of their own. Tied heads (``tied_w2``) need a
    ``head`` without ``{k}``: their one W2 is written once under that name."""
    if (head is None) != heads.shared_lm_head:
        raise ValueError("a W2 name template is needed exactly when the heads have their own W2")
    if head is not None and ("{k}" in head) == heads.tied_w2:
        raise ValueError("a W2 name template has {k} exactly when every head has a W2 of its own"
                         " (tied heads' one W2 is written once)")
    out: dict[str, torch.Tensor] = {}
    n = heads.num_layers
    for k in range(heads.num_heads):
        for l in range(n):
            out[block.format(k=k, l=l) + ".weight"] = heads.w1[k][l].contiguous()
            out[block.format(k=k, l=l) + ".bias"] = heads.b1[k][l].contiguous()
        if head is not None:
            out[head.format(k=k, n=n)] = heads.w2[k].contiguous()
    return out


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise CheckpointError(f"{path}: corrupt JSON ({exc})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return data


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


def copy_tokenizer(base: str, out: Path) -> list[str]:
    """Copy tokenizer files from a local base directory (serving engines read them from the model dir)."""
    import shutil

    src = Path(base) if base else None
    if src is None or not src.is_dir():
        return []
    copied = []
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copyfile(src / name, out / name)
            copied.append(name)
    return copied


def require_tree_fits(choices: list[list[int]], num_heads: int, source: str) -> None:
    deepest = max((len(c) for c in choices), default=0)
    if deepest > num_heads:
        raise MedusaError(f"{source}: tree depth {deepest} is deeper than the {num_heads} heads")
