"""``head_type: eagle3``: an EAGLE-3 draft layer (Li et al. 2025) over a base causal LM.

The drafter reads the base model's hidden states at three of its layers (low / middle / high; HF's
``output_hidden_states`` index: 0 = the embeddings, i = the output of layer i), fuses them with one linear
layer, joins the result with the embedding of the next token and runs ONE decoder layer of the base's own
architecture (its RoPE, norms, attention and MLP; the attention's q / k / v read the ``2d`` join), with a KV
cache of its own across draft steps; a draft LM head over the draft vocabulary predicts the token after.

```
features f_t [.., 3d] --fc--> h [.., d]          (step 0; later steps feed the layer's own output g)
e = embed(x_{t+1}) [.., d]
x = [input_layernorm(e), hidden_norm(h)] [.., 2d] -> self_attn (+ h) -> post_attention_layernorm -> mlp (+)
g [.., d] ; logits = lm_head(norm(g)) [.., N]    (predicts x_{t+2}; g is the next draft step's h)
```
Tensor names are the speculators ``eagle3`` format's (``fc``, ``layers.0.*``, ``norm``, ``lm_head``), so the
export (:mod:`medusa.export.speculators`) renames nothing; ``token_map [N]`` (draft id -> target id) is ours
(the export derives ``d2t`` / ``t2d``). The input embeddings and the rotary embedding are the base's (read,
never owned or saved). ``num_heads`` is the number of draft steps the drafter is trained for (the
training-time-test unroll; the deepest tree it drafts).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from medusa.decoding.growing_cache import GrowingLayer
from medusa.modeling import head_methods, native_draft, rotary_table
from medusa.modeling.base import decoder_of, text_config, unwrap
from medusa.modeling.draft_vocab import DraftVocab
from medusa.modeling.heads import BaseRef
from medusa.native import pick

LLAMA_STYLE = ("input_layernorm", "post_attention_layernorm", "self_attn", "mlp")


def default_feature_layers(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's choice (vLLM's default): hidden states 2, L // 2 and L - 3 of a base of L >= 8 layers; for a
    shallower base, 1, L // 2 and L - 1 (distinct from 3 layers on)."""
    if num_layers >= 8:
        return (2, num_layers // 2, num_layers - 3)
    return (min(1, num_layers - 1), num_layers // 2, max(num_layers - 1, 0))


def check_feature_layers(layers: Any, num_layers: int,
                         source: str = "heads.feature_layers") -> tuple[int, ...]:
    """Three hidden-state indices in ``[0, num_layers)`` (HF's ``hidden_states`` tuple numbering)."""
    if (not isinstance(layers, (list, tuple)) or len(layers) != 3
            or not all(isinstance(i, int) and not isinstance(i, bool) for i in layers)):
        raise ValueError(f"{source}: expected three layer indices, got {layers!r}")
    bad = [i for i in layers if not 0 <= i < num_layers]
    if bad:
        raise ValueError(f"{source}: layer index {bad[0]} is outside [0, {num_layers}) for this base model")
    return tuple(int(i) for i in layers)


class DraftKV:
    """The draft layer's own keys and values ``[B, H_kv, S, hd]``: the attention-facing cache interface
    (:class:`medusa.decoding.hf.AttentionCache`: it appends and attends to everything held) plus
    ``truncate`` (a step's draft entries dropped); one layer, so no per-layer lists."""

    def __init__(self) -> None:
        self.key: torch.Tensor | None = None
        self.value: torch.Tensor | None = None
        self._buffer: GrowingLayer | None = None  # entries written in place (inference), else concatenated

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0 if self.key is None else int(self.key.shape[2])

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if self.key is None and not (key.requires_grad or value.requires_grad):
            # decoding: in place (training keeps every step's tensors for autograd)
            self._buffer = GrowingLayer()
        if self._buffer is not None:
            self.key, self.value = self._buffer.update(key, value)
        elif self.key is None:
            self.key, self.value = key, value
        else:
            self.key = torch.cat([self.key, key], dim=2)
            self.value = torch.cat([self.value, value], dim=2)
        return self.key, self.value

    def append_slots(self, n: int) -> tuple[torch.Tensor, torch.Tensor, int, int] | None:
        """Room for ``n`` entries a native pass writes straight into the in-place buffers (decoding, after
        the first entries): :meth:`GrowingLayer.append_slots`'s answer; None where entries are concatenated
        (training) or none are held yet (then :meth:`update`)."""
        if self._buffer is None or self.key is None or self.key.dtype != torch.bfloat16:
            return None
        slots = self._buffer.append_slots(n)
        self.key, self.value = self._buffer.keys, self._buffer.values
        return slots

    def truncate(self, length: int) -> None:
        """Drop every entry past ``length`` (a step's draft nodes)."""
        if self._buffer is not None:
            self._buffer.crop(min(length - self.get_seq_length(), 0))
            self.key, self.value = self._buffer.keys, self._buffer.values
        elif self.key is not None:
            self.key, self.value = self.key[:, :, :length], self.value[:, :, :length]


def draft_layer(base: nn.Module) -> nn.Module:
    """A fresh decoder layer of ``base``'s own class and config whose q / k / v read ``2d`` inputs."""
    layers = getattr(decoder_of(base), "layers", None)
    if layers is None or len(layers) == 0:
        raise ValueError(f"eagle3 heads: cannot find the decoder layers of {type(unwrap(base)).__name__}")
    template = layers[0]
    cfg = text_config(base)
    llama_style = all(hasattr(template, name) for name in LLAMA_STYLE)
    if not llama_style or hasattr(template, "pre_feedforward_layernorm"):
        raise ValueError(f"eagle3 heads support Llama-style decoder layers (llama, mistral, qwen2, qwen3); "
                         f"model_type {cfg.model_type!r} ({type(template).__name__}) is not supported")
    layer = type(template)(cfg, layer_idx=0)
    attn, d = layer.self_attn, cfg.hidden_size
    for name in ("q_proj", "k_proj", "v_proj"):
        old = getattr(attn, name)
        setattr(attn, name, nn.Linear(2 * d, old.out_features, bias=old.bias is not None))
    layer.hidden_norm = copy.deepcopy(layer.input_layernorm)  # a fresh norm of the same class
    return layer


class Eagle3Heads(nn.Module):
    """The EAGLE-3 drafter: a sequential drafter (the :class:`~medusa.decoding.drafter.Drafter` protocol:
    its cache, :meth:`context_pass` / :meth:`draft_pass`, :meth:`logits` over the draft vocabulary,
    :meth:`to_target`, :attr:`dtype`), not a set of parallel heads.

    ``feature_layers``: the base hidden-state indices fused (``MedusaModel.forward`` returns their
    concatenation ``[B, T, 3d]`` as ``hidden_states`` for these heads). ``draft_vocab=N > 0``: the LM head
    is ``[N, d]`` over the ``token_map`` ids.
    """

    head_type = "eagle3"

    def __init__(self, base: nn.Module, num_heads: int, feature_layers: tuple[int, ...] | None = None,
                 draft_vocab: int = 0) -> None:
        super().__init__()
        cfg = text_config(base)
        d, vocab_size = int(cfg.hidden_size), int(cfg.vocab_size)
        if num_heads < 1:
            raise ValueError(f"need num_heads >= 1 (draft steps), got {num_heads}")
        n_layers = int(cfg.num_hidden_layers)
        layers = default_feature_layers(n_layers) if feature_layers is None else feature_layers
        self.feature_layers = check_feature_layers(layers, n_layers)
        self.hidden_size, self.vocab_size, self.num_heads, self.num_layers = d, vocab_size, num_heads, 1
        self.vocab = DraftVocab(vocab_size, draft_vocab)
        self.fc = nn.Linear(len(self.feature_layers) * d, d, bias=False)
        self.layers = nn.ModuleList([draft_layer(base)])
        self.norm = copy.deepcopy(self.layers[0].input_layernorm)
        self.lm_head = nn.Linear(d, draft_vocab or vocab_size, bias=False)
        token_map = self.vocab.placeholder()
        if token_map is not None:
            self.register_buffer("token_map", token_map)
        else:
            self.token_map = None
        self._embedding = BaseRef(None)
        self._rotary = BaseRef(None)
        self.bind_base(base)

    draft_vocab = property(head_methods.draft_vocab_size)
    set_token_map, target_to_draft = head_methods.set_token_map, head_methods.target_to_draft

    @property
    def dtype(self) -> torch.dtype:
        """The drafter's compute dtype (its weights')."""
        return self.fc.weight.dtype

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft ids (any shape) -> target ids (``token_map``; the identity with the full vocabulary)."""
        return draft_ids if self.token_map is None else self.token_map[draft_ids]

    # ------------------------------------------------------------------ the base it reads
    def bind_base(self, base_model: nn.Module) -> None:
        """Read ``base_model``'s input embeddings and rotary embedding from now on."""
        self._embedding.module = unwrap(base_model).get_input_embeddings()
        self._rotary.module = getattr(decoder_of(base_model), "rotary_emb", None)
        if self._rotary.module is None:
            raise ValueError("eagle3 heads: the base model has no rotary embedding module (rotary_emb)")

    def init_from_lm_head(self, weight: torch.Tensor) -> None:
        """The draft LM head starts as the base LM head's rows (``token_map``'s with a draft vocabulary)."""
        self.vocab.init_heads(nn.ModuleList([self.lm_head]), self.token_map, weight)

    def restrict_vocab(self, token_map: torch.Tensor, base_weight: torch.Tensor | None = None) -> None:
        """Full vocabulary (or the current draft vocabulary) -> the draft vocabulary ``token_map [N]``, in
        place (the LM head keeps the rows of ids it has; a new id's row is ``base_weight``'s, the base LM
        head ``[V, d]``: :meth:`DraftVocab.restrict`)."""
        device = self.fc.weight.device
        heads, tm = self.vocab.restrict(token_map, nn.ModuleList([self.lm_head]), self.hidden_size, device,
                                        self.token_map, base_weight)
        self.lm_head = heads[0]
        del self.token_map
        self.register_buffer("token_map", tm)

    # ------------------------------------------------------------------ the draft layer
    def new_cache(self) -> DraftKV:
        """An empty KV cache for the draft layer (decoding reads the heads through methods only)."""
        return DraftKV()

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Target ids ``[B, T]`` -> the base's input embeddings ``[B, T, d]`` (no gradient; heads' dtype)."""
        with torch.no_grad():
            return self._embedding.module(ids).to(self.fc.weight.dtype)

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """Base features ``[B, T, 3d]`` -> the layer's first hidden input ``[B, T, d]``."""
        return self.fc(features.to(self.fc.weight.dtype))

    def layer(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
              mask: torch.Tensor, cache: DraftKV, at: torch.Tensor | None = None) -> torch.Tensor:
        """One pass of the draft layer: ``embeds, hidden [B, T, d]`` at ``positions [B, T]``, attending to
        what ``cache`` holds plus these T entries as ``mask [B, 1, T, S + T]`` allows (float: 0 / -inf) ->
        ``g [B, T, d]`` (before the final norm). Appends the T keys / values to ``cache``. ``at [B]``: only
        each row's entry ``at`` is read, ``[B, d]``: the MLP runs there alone (the other entries are
        needed for their keys and values only)."""
        layer = self.layers[0]
        bf16 = embeds.dtype == torch.bfloat16  # (float32 never runs natively: the C ops are bfloat16)
        native = native_draft.native_layer_for(self, layer, embeds, mask) if bf16 else None
        if native is not None:  # bfloat16, a few rows: the native C ops (medusa.modeling.native_draft)
            cos_sin = rotary_table.cos_sin(self._rotary.module, embeds, positions)
            return native_draft.forward(native, embeds, hidden, cos_sin, mask, cache, at)
        x = self.layer_input(embeds, hidden)  # [B, T, 2d]
        cos_sin = self.rotary(x, positions)
        attn, _ = layer.self_attn(hidden_states=x, position_embeddings=cos_sin, attention_mask=mask,
                                  cache=cache)
        if at is not None:
            rows = torch.arange(hidden.shape[0], device=hidden.device)
            return self.layer_output(hidden[rows, at], attn[rows, at])  # [B, d]
        return self.layer_output(hidden, attn)

    def layer_input(self, embeds: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """The draft layer's attention input: ``embeds, hidden [..., d]`` each normed, side by side ->
        ``[..., 2d]``."""
        layer = self.layers[0]
        return torch.cat([layer.input_layernorm(embeds), layer.hidden_norm(hidden)], dim=-1)

    def layer_output(self, hidden: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """The draft layer after its attention: ``hidden`` plus the attention's output ``attn`` (both
        ``[..., d]``), then the MLP's residual -> ``g [..., d]``."""
        layer = self.layers[0]
        h = hidden + attn
        return h + layer.mlp(layer.post_attention_layernorm(h))

    def rotary(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The base's rotary embedding at ``positions [B, T]``: ``cos, sin [B, T, hd]`` in ``x``'s dtype."""
        return self._rotary.module(x, positions)

    def logits(self, g: torch.Tensor) -> torch.Tensor:
        """``g [..., d]`` -> draft logits ``[..., N]`` over the draft vocabulary."""
        return self.lm_head(native_draft.final_norm(self.norm, g))

    def top_log_probs(self, g: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``g [..., d]`` -> each row's ``k`` largest draft log-probabilities ``[..., k]`` (float32,
        descending) and their draft ids ``[..., k]``: :meth:`logits` then
        :func:`medusa.native.pick.top_log_softmax`, in one C call where :func:`native_draft.drafter_for`."""
        native = native_draft.drafter_for(self, k)
        if native is not None:
            return native_draft.top(native, g, k)
        return pick.top_log_softmax(self.logits(g), k)

    # ------------------------------------------------------------------ the decoder's passes
    def context_pass(self, features: torch.Tensor, next_tokens: torch.Tensor, positions: torch.Tensor,
                     mask: torch.Tensor, cache: DraftKV, last: torch.Tensor) -> torch.Tensor:
        """Context entries: the base's features ``[B, M, F]`` with the tokens after them ``[B, M]`` at
        ``positions [B, M]`` (``mask [B, 1, M, S + M]``); appends M entries and returns the output at each
        row's entry ``last [B]`` ``[B, d]`` (the only one read: the MLP runs there alone)."""
        native = native_draft.drafter_for(self, 0)
        done = None if native is None else native_draft.step(native, next_tokens, positions, features, mask,
                                                              cache, last, True, 0)
        if done is not None:  # the same pass in one C call
            return done[0]
        pieces = None if native is None else native_draft.context_pieces(next_tokens.shape, last)
        if pieces is not None:  # a long prompt: in pieces a native pass takes
            for start, end in pieces:
                out = self._context_piece(native, features, next_tokens, positions, mask, cache, last, start,
                                          end)
            return out
        return self.layer(self.embed(next_tokens), self.fuse(features), positions, mask, cache, at=last)

    def _context_piece(self, native: Any, features: torch.Tensor, next_tokens: torch.Tensor,
                       positions: torch.Tensor, mask: torch.Tensor, cache: DraftKV, last: torch.Tensor,
                       start: int, end: int) -> torch.Tensor:
        """Entries ``start .. end - 1`` of a context pass (:meth:`context_pass`'s arguments): each row sees
        the columns held before the pass and the entries up to its own, under the pass's mask; returns the
        output at ``last - start`` (meaningful in the last piece, which holds every row's ``last``). One C
        call, or the layer's own code where none can run (the first piece: no in-place buffer yet)."""
        held = cache.get_seq_length() - start  # the columns held before the pass
        rows = mask[:, :, start:end, :held + end]  # [B, 1, t, held + end]
        at = (last - start).clamp(0, end - start - 1)  # [B]: an entry of the piece
        done = native_draft.step(native, next_tokens[:, start:end], positions[:, start:end],
                                 features[:, start:end], rows, cache, at, True, 0)
        if done is not None:
            return done[0]
        return self.layer(self.embed(next_tokens[:, start:end]), self.fuse(features[:, start:end]),
                          positions[:, start:end], rows, cache, at=at)

    def draft_pass(self, hidden: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
                   mask: torch.Tensor, cache: DraftKV) -> torch.Tensor:
        """One tree level: each node's parent output ``hidden [B, E, d]`` with its token ``[B, E]`` (target
        ids) -> ``g [B, E, d]``; appends E entries (the caller truncates them after the step)."""
        return self.layer(self.embed(tokens), hidden, positions, mask, cache)

    def draft_top(self, hidden: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
                  mask: torch.Tensor, cache: DraftKV, k: int
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`draft_pass` then :meth:`top_log_probs` of its outputs: ``(g [B, E, d], values [B, E, k],
        draft ids [B, E, k])``; one C call (a whole drafting level) where :func:`native_draft.drafter_for`."""
        native = native_draft.drafter_for(self, k)
        done = None if native is None else native_draft.step(native, tokens, positions, hidden, mask, cache,
                                                              None, False, k)
        if done is not None:
            return done
        g = self.draft_pass(hidden, tokens, positions, mask, cache)
        values, ids = self.top_log_probs(g, k)
        return g, values, ids


def base_states(base: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                layers: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """The frozen base's features for eagle3 heads ``[B, T, len(layers) * d]`` and its last (normed) hidden
    state ``[B, T, d]`` (what its LM head reads: the teacher's input), no autograd."""
    with torch.no_grad():
        out = decoder_of(base)(input_ids=input_ids, attention_mask=attention_mask, use_cache=False,
                               output_hidden_states=True)
    return torch.cat([out.hidden_states[i] for i in layers], dim=-1), out.last_hidden_state


def base_features(base: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                  layers: tuple[int, ...]) -> torch.Tensor:
    """The frozen base's features for eagle3 heads: ``[B, T, len(layers) * d]``, no autograd."""
    return base_states(base, input_ids, attention_mask, layers)[0]


__all__ = ["DraftKV", "Eagle3Heads", "base_features", "base_states", "check_feature_layers",
           "default_feature_layers", "draft_layer"]
