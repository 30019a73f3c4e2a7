"""A heads checkpoint ready to decode: the MedusaModel (eval mode) and the tokenizer of its base."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from medusa.errors import MedusaError
from medusa.modeling.base import load_tokenizer, resolve_dtype, text_config
from medusa.modeling.config import MedusaConfig, base_location
from medusa.modeling.cpu_linear import auto_pack, pack_linears
from medusa.modeling.model import MedusaModel


def decoding_heads_dtype(dtype: str | torch.dtype | None) -> str | torch.dtype | None:
    """The heads' dtype for decoding in ``dtype``: a half precision (bfloat16 / float16) for the heads
    too (drafting runs in the decoding dtype, on the same kernels), else None (as saved)."""
    half = dtype is not None and resolve_dtype(dtype) in (torch.bfloat16, torch.float16)
    return dtype if half else None


def load_for_generation(heads: str | Path, base: str | None = None, dtype: str | None = None,
                        tokenizer: str | None = None,
                        cpu_pack: bool | None = None) -> tuple[MedusaModel, Any]:
    """The MedusaModel (eval mode) and its tokenizer (from ``tokenizer``, ``base``, the merged backbone,
    or the checkpoint's recorded base, in that order). A half-precision ``dtype`` (bfloat16 / float16) loads
    the heads in it too: drafting runs in the decoding dtype (verification by the base decides every token).
    ``cpu_pack``: pre-pack the CPU linear layers (:mod:`medusa.modeling.cpu_linear`: float32 few-row and
    every bfloat16 matmul); None: unless ``MEDUSA_CPU_PACK=0`` or memory is short
    (:func:`medusa.modeling.cpu_linear.auto_pack`)."""
    config = MedusaConfig.load(Path(heads))
    model = MedusaModel.from_pretrained(heads, base_model=base, dtype=dtype,
                                        heads_dtype=decoding_heads_dtype(dtype)).eval()
    if cpu_pack is None:
        auto_pack(model)
    elif cpu_pack:
        pack_linears(model)
    source = tokenizer or base_location(heads, config, base, hint="pass --base")
    return model, load_tokenizer(source)


def encode_prompt(tokenizer: Any, prompt: str, chat: bool = False) -> Any:
    """Token ids ``[1, T]`` of one prompt; with ``chat``, wrapped in the chat template as a user turn."""
    if chat:
        if not getattr(tokenizer, "chat_template", None):
            raise MedusaError(f"--chat: the tokenizer of {tokenizer.name_or_path!r} has no chat template")
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                            return_tensors="pt", return_dict=True)
        return ids["input_ids"]
    return tokenizer(prompt, return_tensors="pt").input_ids


def check_positions(model: MedusaModel, tokenizer: Any, prompts: list[str], max_new_tokens: int,
                    chat: bool = False) -> None:
    """A prompt plus ``max_new_tokens`` past the base model's ``max_position_embeddings`` is an error naming
    the prompt and the allowed ``--max-new-tokens`` (past it the model's output is garbage, silently)."""
    limit = getattr(text_config(model.base_model), "max_position_embeddings", None)
    if not isinstance(limit, int) or limit <= 0:
        return
    for i, prompt in enumerate(prompts):
        n = int(encode_prompt(tokenizer, prompt, chat).shape[1])
        if n + max_new_tokens > limit:
            allowed = f"1..{limit - n}" if n < limit else "none: the prompt alone fills them"
            raise MedusaError(f"prompt {i + 1}: {n} tokens + --max-new-tokens {max_new_tokens} exceed the "
                              f"base model's {limit} positions (max_position_embeddings); allowed "
                              f"--max-new-tokens for this prompt: {allowed}")


def check_tree_fits(model: MedusaModel, tree: Any) -> None:
    """A tree's ranks against the heads' vocabulary (the draft vocabulary when they have one): a MEDUSA
    tree's deepest rank, a draft tree's ``branch`` / ``expand``, must be below it (else ``topk`` fails
    mid-decoding). ``tree``: the option's value, else the checkpoint's own (None)."""
    from medusa.tree import DraftTreeShape, MedusaTree

    tree = model.tree if tree is None else tree
    vocab = model.config.draft_vocab or model.config.vocab_size
    if isinstance(tree, MedusaTree) and max(tree.topk_per_depth, default=0) > vocab:
        raise MedusaError(f"tree: rank {max(tree.topk_per_depth) - 1} is past the heads' vocabulary of "
                          f"{vocab} tokens")
    if isinstance(tree, DraftTreeShape) and max(tree.branch, tree.expand) > vocab:
        raise MedusaError(f"tree: branch {tree.branch} / expand {tree.expand} exceed the drafter's "
                          f"vocabulary of {vocab} tokens")
