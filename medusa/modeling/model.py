"""``MedusaModel``: a Hugging Face causal LM plus MEDUSA heads; strict save / load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from medusa.config.validate import check_head_fields
from medusa.decoding.attention import window_layout
from medusa.decoding.drafter import Drafter
from medusa.decoding.generate import compute_dtype, medusa_generate
from medusa.errors import CheckpointError, ConfigError
from medusa.io import atomic_directory, save_safetensors
from medusa.modeling import native_body
from medusa.modeling.base import (
    decoder_of,
    dtype_name,
    lm_head_of,
    lm_head_weight,
    load_base_model,
    resolve_dtype,
    text_config,
    unwrap,
)
from medusa.modeling.config import (
    BASE_SUBDIR,
    CONFIG_NAME,
    TREE_NAME,
    WEIGHTS_NAME,
    MedusaConfig,
    base_location,
)
from medusa.modeling.draft_vocab import check_token_map
from medusa.modeling.eagle3 import Eagle3Heads
from medusa.modeling.forward import BodyParts, MedusaOutput, TreeVerifier, body_parts, run_body
from medusa.modeling.heads import MedusaHeads
from medusa.modeling.heads_file import check_state_keys, heads_weights_path, read_heads_file
from medusa.modeling.hydra import HydraHeads
from medusa.modeling.packaged import check_packaged_base
from medusa.modeling.protocol import Heads
from medusa.tree import DraftTreeShape, MedusaTree, default_tree


class MedusaModel(nn.Module):
    """A base causal LM (``base_model``) with K MEDUSA heads (``heads``) and, once calibrated, a ``tree``."""

    def __init__(self, base_model: nn.Module, heads: Heads, config: MedusaConfig, tree: Any = None):
        super().__init__()
        self.base_model = base_model
        self.heads = heads
        self.config = config
        self.tree = tree
        self._default_trees: dict[int, MedusaTree] = {}  # built-in default tree per head count

    def default_tree(self) -> MedusaTree:
        """The built-in default tree for this model's head count (built once)."""
        if self.num_heads not in self._default_trees:
            self._default_trees[self.num_heads] = default_tree(self.num_heads)
        return self._default_trees[self.num_heads]

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_base(
        cls,
        base: nn.Module | str,
        num_heads: int = 5,
        num_layers: int = 1,
        head_type: str = "linear",
        heads_dtype: str | torch.dtype | None = None,
        dtype: str | torch.dtype | None = None,
        device_map: Any = None,
        quantization_config: Any = None,
        token_map: torch.Tensor | None = None,
        hydra_projection: str = "own",
        feature_layers: Any = None,
        **load_kwargs: Any,
    ) -> "MedusaModel":
        """New heads on ``base`` (a loaded model, a local path or a hub id).

        Every head starts as the base LM head: ResBlocks are the identity, W2 is copied from the LM head
        (for tied embeddings, the input embedding matrix). ``heads_dtype`` defaults to the LM head's
        dtype (fp32 when the base is quantised). ``token_map [N]`` (draft id -> target id): heads with a
        draft vocabulary of N tokens, W2 starting as those rows of the LM head. ``hydra_projection``
        (``head_type="hydra"`` only): ``"own"`` W2 per head, or ``"shared_lm_head"`` (the base LM head).
        ``feature_layers`` (eagle3 heads only): the three base hidden-state indices the drafter
        fuses (default: EAGLE-3's early / middle / late choice); ``num_heads`` is then its draft depth.
        """
        if isinstance(base, (str, Path)):
            base = load_base_model(str(base), dtype=dtype, device_map=device_map,
                                   quantization_config=quantization_config, **load_kwargs)
        cfg = text_config(base)
        weight = lm_head_weight(base)
        if heads_dtype is None:
            heads_dtype = weight.dtype if weight.is_floating_point() else torch.float32
        heads_dtype = resolve_dtype(heads_dtype)
        draft_vocab = 0 if token_map is None else int(token_map.shape[0])
        projection = _check_head_args(num_heads, num_layers, head_type, draft_vocab, hydra_projection,
                                      feature_layers)
        heads = build_heads(base, cfg.hidden_size, cfg.vocab_size, num_heads, num_layers, head_type,
                            draft_vocab, hydra_projection=projection, feature_layers=feature_layers)
        if token_map is not None:
            heads.set_token_map(token_map)
        heads.to(device=weight.device, dtype=heads_dtype)
        heads.init_from_lm_head(weight.detach())
        name = str(getattr(unwrap(base), "name_or_path", "") or "")
        if name and Path(name).is_dir():
            name = str(Path(name).resolve())  # a local base stays findable from any working directory
        config = MedusaConfig(
            base_model_name_or_path=name,
            base_model_type=cfg.model_type,
            hidden_size=cfg.hidden_size,
            vocab_size=cfg.vocab_size,
            num_heads=num_heads,
            num_layers=num_layers,
            head_type=head_type,
            draft_vocab=draft_vocab,
            hydra_projection=projection,
            feature_layers=list(heads.feature_layers) if isinstance(heads, Drafter) else None,
            dtype=dtype_name(heads_dtype),
        )
        return cls(base, heads, config)

    def use_draft_vocab(self, token_map: torch.Tensor) -> None:
        """Restrict the heads, in place, to a draft vocabulary ``token_map [N]`` (draft id -> target id): see
        :meth:`MedusaHeads.restrict_vocab`; heads that have one are re-mapped (trained rows kept, a new id
        starting from the base LM head's row). Sets ``config.draft_vocab``; build optimizers afterwards (a
        ``linear`` head's W2 is a new parameter)."""
        self.heads.restrict_vocab(token_map, lm_head_weight(self.base_model).detach())
        self.config.draft_vocab = self.heads.draft_vocab

    # ------------------------------------------------------------------ properties
    @property
    def num_heads(self) -> int:
        return self.heads.num_heads

    @property
    def device(self) -> torch.device:
        return lm_head_weight(self.base_model).device

    def freeze_base(self) -> None:
        """Turn off gradients for every base parameter (MEDUSA-1)."""
        for p in self.base_model.parameters():
            p.requires_grad_(False)

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        past_key_values: Any = None,
        use_cache: bool | None = None,
        positions: torch.Tensor | None = None,
        compute_heads: bool = True,
        **kwargs: Any,
    ) -> MedusaOutput:
        """One pass of the base body; base and head logits at ``positions`` (all by default).

        ``positions``: LongTensor ``[P]`` (same for every row) or ``[B, P]``; logits are then ``[B, P, V]``
        and head logits ``[K, B, P, V]``. ``attention_mask`` may be 2-D padding or a 4-D float mask
        ``[B, 1, T, S]``; sliding-window layers get it cut to their window (:func:`body_mask`).
        """
        return run_body(self.body_parts(), self.heads, input_ids, attention_mask, position_ids,
                        past_key_values, use_cache, positions, compute_heads, **kwargs)

    def body_parts(self) -> BodyParts:
        """What a forward needs from the base, resolved now (:class:`BodyParts`)."""
        return body_parts(self.base_model, self.heads)

    def tree_verifier(self) -> "TreeVerifier":
        """This model's forward with its base resolved once: what a decoding run's steps call. A 4-D tree mask
        needs windowing only under a sliding window; the native body applies only to a bfloat16 step (its
        mask and cache take the compute dtype)."""
        base = self.base_model
        return TreeVerifier(body_parts(base, self.heads, windowed=window_layout(base).window is not None,
                                       native=compute_dtype(self) == torch.bfloat16), self.heads)

    def prefill_chunk(self) -> int:
        """Tokens per forward when a decoding run's prompt goes in pieces: the native bfloat16 body's
        :data:`~medusa.modeling.native_body.MAX_ROWS` where it runs this base (a piece computes each row as
        the chain of one-token steps would, the matmuls at the matrix unit's speed and attention in C), else
        0 (the prompt in one forward, as HF ``generate`` runs it)."""
        base = self.base_model
        if compute_dtype(self) != torch.bfloat16 or native_body.unsupported_reason(
                decoder_of(base), text_config(base)):
            return 0
        return native_body.MAX_ROWS

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                 max_new_tokens: int = 64, acceptance: str = "greedy", temperature: float | None = None,
                 top_k: int | None = None, top_p: float | None = None, **kwargs: Any) -> Any:
        """MEDUSA decoding; see :func:`medusa.decoding.generate.medusa_generate` for all the arguments.

        Unset ``temperature`` / ``top_k`` / ``top_p`` (and any other GenerationConfig field passed in
        ``kwargs``, e.g. ``repetition_penalty``) resolve as in HF ``generate``: the base model's
        generation_config, then HF's defaults; its logits processors apply to every tree node.
        """
        return medusa_generate(self, input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens,
                               acceptance=acceptance, temperature=temperature, top_k=top_k, top_p=top_p,
                               **kwargs)

    # ------------------------------------------------------------------ save / load
    def save_pretrained(self, path: str | Path, save_base: bool = False, tokenizer: Any = None,
                        overwrite: bool = False, inputs: Any = ()) -> None:
        """Write ``medusa_config.json`` + ``medusa_heads.safetensors`` (+ ``tree.json``) atomically.

        ``save_base=True`` also stores the backbone (e.g. LoRA-merged after MEDUSA-2) under
        ``base_model/`` so that ``from_pretrained(path)`` needs no other files. An existing non-empty
        ``path`` is refused unless ``overwrite`` (then these names are replaced and a stale ``tree.json``
        removed; other files are kept); a ``path`` holding one of ``inputs`` is refused (:mod:`medusa.io`).
        """
        state = {k: v.detach().contiguous().cpu() for k, v in self.heads.state_dict().items()}
        owns = (CONFIG_NAME, WEIGHTS_NAME, TREE_NAME, BASE_SUBDIR)
        with atomic_directory(path, overwrite=overwrite, inputs=inputs, owns=owns, kind="heads") as tmp:
            config = MedusaConfig(**self.config.to_dict())
            floats = [v for v in state.values() if v.is_floating_point()]
            if floats:
                config.dtype = dtype_name(floats[0].dtype)
            if save_base:
                unwrap(self.base_model).save_pretrained(tmp / BASE_SUBDIR)
                if tokenizer is not None:
                    tokenizer.save_pretrained(tmp / BASE_SUBDIR)
                config.base_model_subdir = BASE_SUBDIR
            config.save(tmp)
            save_safetensors(state, tmp / WEIGHTS_NAME, metadata={"format": "pt"})
            if self.tree is not None:
                self.tree.to_json(tmp / TREE_NAME)
        self.config = config

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        base_model: nn.Module | str | None = None,
        dtype: str | torch.dtype | None = None,
        device_map: Any = None,
        quantization_config: Any = None,
        heads_dtype: str | torch.dtype | None = None,
        **load_kwargs: Any,
    ) -> "MedusaModel":
        """Load heads from ``path``; the base is ``base_model`` or, if None, the one the config names.

        Strict: a missing, extra or mis-shaped tensor, a corrupt file, or a base whose model_type /
        hidden_size / vocab_size differs from the checkpoint's is a :class:`CheckpointError`.
        """
        path = Path(path)
        config = MedusaConfig.load(path)
        if base_model is None:
            base_model = base_location(path, config)
        if isinstance(base_model, (str, Path)):
            base_model = load_base_model(str(base_model), dtype=dtype, device_map=device_map,
                                         quantization_config=quantization_config, **load_kwargs)
        check_base_matches(config, base_model, source=str(path / CONFIG_NAME))
        check_packaged_base(config, base_model, source=str(path / CONFIG_NAME))
        weights_path = heads_weights_path(path)
        state = read_heads_file(weights_path)
        try:  # the config's values against this base (feature layers past its depth, a base without them)
            heads = build_heads(base_model, config.hidden_size, config.vocab_size, config.num_heads,
                                config.num_layers, config.head_type, config.draft_vocab,
                                hydra_projection=config.hydra_projection,
                                feature_layers=config.feature_layers)
        except ValueError as exc:
            raise CheckpointError(f"{path / CONFIG_NAME}: {exc}") from None
        check_state_keys(heads, state, source=str(weights_path))
        if "token_map" in state:
            try:
                check_token_map(state["token_map"], config.draft_vocab, config.vocab_size)
            except ValueError as exc:
                raise CheckpointError(f"{weights_path}: {exc}") from None
        # The heads decode in ``heads_dtype`` or else the config's dtype; the file may store them narrower
        # (the shipped EAGLE-3 drafter: bfloat16 on disk, float32 for CPU decoding), so floats are cast.
        target_dtype = resolve_dtype(heads_dtype if heads_dtype is not None else config.dtype)
        heads.to(dtype=target_dtype)
        heads.load_state_dict({k: v.to(target_dtype) if v.is_floating_point() else v
                               for k, v in state.items()},
                              strict=True)
        heads.to(device=lm_head_weight(base_model).device)
        tree = None
        if (path / TREE_NAME).is_file() and isinstance(heads, Drafter):
            tree = DraftTreeShape.from_json(path / TREE_NAME)  # the drafter's per-step tree sizes
        elif (path / TREE_NAME).is_file():
            tree = MedusaTree.from_json(path / TREE_NAME)
            if tree.depth > config.num_heads:
                raise CheckpointError(
                    f"{path / TREE_NAME}: tree depth {tree.depth} exceeds the checkpoint's "
                    f"{config.num_heads} heads"
                )
        return cls(base_model, heads, config, tree=tree)


def _check_head_args(num_heads: int, num_layers: int, head_type: str, draft_vocab: int,
                     hydra_projection: str, feature_layers: Any) -> str | None:
    """``from_base``'s head arguments against each family's rules (the recipe's and the checkpoint's check,
    :func:`medusa.config.validate.check_head_fields`; ValueError here); returns the hydra projection (None
    for other heads)."""
    try:
        check_head_fields(num_heads, num_layers, head_type, draft_vocab, hydra_projection, prefix="",
                          feature_layers=feature_layers)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    return hydra_projection if head_type == "hydra" else None


def build_heads(base: nn.Module, hidden_size: int, vocab_size: int, num_heads: int, num_layers: int,
                head_type: str, draft_vocab: int = 0, hydra_projection: str | None = None,
                feature_layers: Any = None) -> Heads:
    """Fresh heads of ``head_type`` for ``base`` (not yet initialised from its LM head): MedusaHeads for
    linear / shared_lm_head (the latter reading the base LM head), HydraHeads (reading the base input
    embeddings, and the base LM head when ``hydra_projection`` is ``"shared_lm_head"``; None: ``"own"``)
    for hydra, Eagle3Heads (a draft decoder layer of the base's own class) for eagle3: where the head-type
    string becomes a family (the loader; elsewhere ``isinstance(heads, Drafter)`` or DRAFTER_HEAD_TYPES)."""
    if head_type == Eagle3Heads.head_type:
        layers = None if feature_layers is None else tuple(feature_layers)
        return Eagle3Heads(base, num_heads, feature_layers=layers, draft_vocab=draft_vocab)
    if head_type == "hydra":
        projection = hydra_projection or "own"
        return HydraHeads(hidden_size, vocab_size, num_heads, num_layers,
                          embedding=unwrap(base).get_input_embeddings(), projection=projection,
                          shared_lm_head=lm_head_of(base) if projection == "shared_lm_head" else None,
                          draft_vocab=draft_vocab)
    return MedusaHeads(hidden_size, vocab_size, num_heads, num_layers, head_type,
                       shared_lm_head=lm_head_of(base) if head_type == "shared_lm_head" else None,
                       draft_vocab=draft_vocab)


def check_base_matches(config: MedusaConfig, base_model: nn.Module, source: str) -> None:
    """Raise if the base model's model_type / hidden_size / vocab_size differ from the checkpoint's."""
    cfg = text_config(base_model)
    for key, ours in (("model_type", config.base_model_type), ("hidden_size", config.hidden_size),
                      ("vocab_size", config.vocab_size)):
        theirs = getattr(cfg, key, None)
        if theirs != ours:
            raise CheckpointError(
                f"{source}: base model {key} is {theirs!r} but the heads were trained for {ours!r}"
            )
