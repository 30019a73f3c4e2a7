"""``--format speculators``: ``head_type: eagle3`` heads as a speculators ``eagle3`` checkpoint (speculators
0.9.0's format) that vLLM 0.32 loads unmodified (``vllm serve OUT`` or a speculative_config naming OUT).

What vLLM 0.32 reads (``transformers_utils/configs/speculators/{base,algos}.py``, ``models/llama_eagle3.py``):

- ``speculators_model_type: "eagle3"``; ``speculators_config.proposal_methods[0].speculative_tokens`` (the
  draft steps) and ``speculators_config.verifier.name_or_path`` (the target vLLM then serves: the base the
  heads were trained on, a local directory here); a dict ``transformer_layer_config`` (the base's text config,
  ``num_hidden_layers: 1``, ``vocab_size`` = the TARGET vocabulary: vLLM builds the ``[..., V]`` logits from
  it); ``model_type`` llama or qwen3 only (``Eagle3LlamaForCausalLM`` / ``Eagle3Qwen3ForCausalLM``).
- ``draft_vocab_size`` always (vLLM copies it unchecked; N = V means no mapping); ``norm_before_residual``
  always: vLLM defaults it to TRUE when absent, speculators to false; ours is false (the residual is the
  fused hidden state before ``hidden_norm``).
- ``eagle_aux_hidden_state_layer_ids``: vLLM id i = the residual stream after i decoder layers = Hugging
  Face's ``hidden_states[i]``, our ``feature_layers`` numbering; vLLM concatenates them in ASCENDING layer
  order, so ``fc.weight [d, 3d]``'s column blocks are written in that order.
- tensors: ``fc.weight``, ``layers.0.*`` (q / k / v read ``2d``), ``norm.weight``, ``lm_head.weight [N, d]``;
  ``d2t [N]`` int64 OFFSETS (target id = draft id + ``d2t[draft id]``), ascending target ids (speculators
  and the EAGLE-3 reference assume draft id k = the k-th smallest target id; ours is in frequency order,
  so the export sorts it and reorders ``lm_head``'s rows) and ``t2d [V]`` bool (vLLM skips it,
  speculators reads it) only with a draft vocabulary (with N = V vLLM has no parameter to put ``d2t`` in).
- ``embed_tokens.weight [V, d]``: the base's input embeddings (ours reads the base's), in the heads' dtype.
  Both readers take that name: speculators' ``Eagle3DraftModel`` (``embed_tokens``) and vLLM's
  ``Eagle3LlamaForCausalLM.load_weights`` (``model.embed_tokens``; when it equals the target's table vLLM
  shares the target's). Without it (``embed_tokens=False``, a V x d smaller file) vLLM shares the target's,
  but speculators 0.9.0 under transformers 5.x drafts with an uninitialised table (``torch.empty``): its NaN
  "load me from the verifier" marker does not survive ``from_pretrained``'s meta-device initialisation.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from medusa.config.enums import DRAFTER_HEAD_TYPES
from medusa.errors import CheckpointError, MedusaError
from medusa.export.common import write_json
from medusa.io import save_safetensors
from medusa.modeling.base import dtype_name, load_base_model
from medusa.modeling.config import CONFIG_NAME, MedusaConfig
from medusa.modeling.draft_vocab import check_token_map
from medusa.modeling.heads_file import heads_weights_path, read_heads_file

SPECULATORS_VERSION = "0.9.0"
VLLM_MODEL_TYPES = ("llama", "qwen3")  # vLLM 0.32's eagle3 architectures


def eagle3_tensors(state: dict[str, torch.Tensor], layers: list[int],
                   vocab_size: int) -> dict[str, torch.Tensor]:
    """Our eagle3 heads' tensors -> the speculators names (fc columns in ascending layer order, d2t / t2d
    from ``token_map`` sorted ascending, ``lm_head`` rows in that order)."""
    out = {k: v.contiguous() for k, v in state.items() if k != "token_map"}
    order = sorted(range(len(layers)), key=lambda i: layers[i])
    if order != list(range(len(layers))):
        d = out["fc.weight"].shape[0]
        blocks = out["fc.weight"].split(d, dim=1)  # one [d, d] block per feature layer, ours in our order
        out["fc.weight"] = torch.cat([blocks[i] for i in order], dim=1).contiguous()
    token_map = state.get("token_map")
    if token_map is not None:
        # speculators (t2d -> lm_head rows) and the EAGLE-3 reference take draft id k = the k-th smallest
        # target id: ours are in frequency order, so the draft vocabulary is sorted and lm_head's rows follow
        tm, order = torch.sort(token_map.to(torch.int64))  # [N] ascending, [N] our draft id of each
        out["lm_head.weight"] = out["lm_head.weight"].index_select(0, order).contiguous()  # [N, d]
        out["d2t"] = (tm - torch.arange(tm.numel())).contiguous()  # [N] offsets
        t2d = torch.zeros(vocab_size, dtype=torch.bool)
        t2d[tm] = True
        out["t2d"] = t2d  # [V]
    return out


def check_state(state: dict[str, torch.Tensor], cfg: MedusaConfig, where: Path) -> None:
    """The heads' tensors before they are rewritten: ``lm_head [N, d]``, ``fc [d, 3d]``, a ``token_map`` of N
    distinct ids in ``[0, V)`` exactly when the config has a draft vocabulary (finite: read_heads_file)."""
    for name in ("lm_head.weight", "fc.weight"):
        if name not in state:
            raise CheckpointError(f"{where}: missing tensor {name}")
    d, n = cfg.hidden_size, cfg.draft_vocab or cfg.vocab_size
    shapes = {"lm_head.weight": (n, d), "fc.weight": (d, 3 * d)}
    for name, shape in shapes.items():
        if tuple(state[name].shape) != shape:
            raise CheckpointError(f"{where}: {name} is {tuple(state[name].shape)}, the config needs {shape}")
    token_map = state.get("token_map")
    if (token_map is not None) != bool(cfg.draft_vocab):
        raise CheckpointError(f"{where}: token_map {'present' if token_map is not None else 'missing'} but "
                              f"draft_vocab is {cfg.draft_vocab}")
    if token_map is not None:
        try:
            check_token_map(token_map, cfg.draft_vocab, cfg.vocab_size)
        except ValueError as exc:
            raise CheckpointError(f"{where}: {exc}") from None


EMBEDDING_KEYS = ("model.embed_tokens.weight", "model.language_model.embed_tokens.weight",
                  "language_model.model.embed_tokens.weight", "embed_tokens.weight", "transformer.wte.weight",
                  "wte.weight")


def embeddings_from_files(verifier: str) -> torch.Tensor | None:
    """The input embedding table read alone from a local base's safetensors (one file or an index), or None
    where the base is not such a directory or names its table otherwise: a big base is not loaded whole."""
    directory = Path(verifier).expanduser()
    index = directory / "model.safetensors.index.json"
    where = index
    try:
        if index.is_file():
            weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {})
            found = [(k, directory / str(weight_map[k])) for k in EMBEDDING_KEYS if k in weight_map]
        elif (directory / "model.safetensors").is_file():
            where = directory / "model.safetensors"
            with safe_open(where, framework="pt") as f:
                names = set(f.keys())
            found = [(k, where) for k in EMBEDDING_KEYS if k in names]
        else:
            return None
        if not found:
            return None
        key, where = found[0]
        with safe_open(where, framework="pt") as f:
            return f.get_tensor(key)
    except Exception as exc:  # noqa: BLE001  (json, OS and safetensors' own errors: one clear line)
        raise CheckpointError(f"{where}: cannot read the base's input embeddings ({exc})") from None


def verifier_embeddings(verifier: str, vocab_size: int, dtype: torch.dtype) -> torch.Tensor:
    """The verifier's input embedding table ``[V, d]`` as ``dtype`` on the CPU (what our drafter embeds its
    tokens with, read from the base at decode time): from its safetensors where they name it, else from the
    loaded base."""
    weight = embeddings_from_files(verifier)
    if weight is None:  # safetensors only: a base's pickled weights (pytorch_model.bin) are never unpickled
        directory = Path(verifier).expanduser()
        pickles = sorted(directory.glob("*.bin")) if directory.is_dir() else []
        if pickles and not any(directory.glob("*.safetensors")):
            raise CheckpointError(f"{pickles[0]}: the base's weights are a pickle (code could run when it "
                                  "loads); medusa reads safetensors only: save the base as model.safetensors")
        weight = load_base_model(verifier, use_safetensors=True).get_input_embeddings().weight
    if weight.shape[0] != vocab_size:
        raise CheckpointError(f"{verifier}: its input embeddings have {weight.shape[0]} rows, the heads were "
                              f"trained on a vocabulary of {vocab_size}")
    return weight.detach().to(device="cpu", dtype=dtype).contiguous()


def eagle3_config(cfg: MedusaConfig, base_config: dict[str, Any], verifier: str,
                  draft_vocab_size: int) -> dict[str, Any]:
    """config.json of the speculators checkpoint (see the module docstring for what vLLM needs)."""
    layer_cfg = {k: v for k, v in base_config.items()
                 if k not in ("architectures", "auto_map", "_name_or_path", "transformers_version")}
    layer_cfg.update(num_hidden_layers=1, tie_word_embeddings=False)
    proposal = {"proposal_type": "greedy", "speculative_tokens": cfg.num_heads}
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [proposal],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier, "architectures": base_config.get("architectures") or []},
        },
        "transformer_layer_config": layer_cfg,
        "draft_vocab_size": draft_vocab_size,
        "norm_before_residual": False,
        "eagle_aux_hidden_state_layer_ids": sorted(cfg.feature_layers or []),
        "torch_dtype": cfg.dtype,
    }


def write_speculators(src: Path, cfg: MedusaConfig, base_config: dict[str, Any], verifier: str,
                      out: Path, embed_tokens: bool = True) -> dict[str, Any]:
    """Write ``out/config.json`` + ``out/model.safetensors`` (with the verifier's input embeddings as
    ``embed_tokens.weight`` unless ``embed_tokens`` is False); returns what the summary reports."""
    if cfg.head_type not in DRAFTER_HEAD_TYPES:
        raise CheckpointError(f"{src / CONFIG_NAME}: --format speculators exports head_type eagle3 heads "
                              f"(this checkpoint's is {cfg.head_type!r}); MEDUSA heads export with --format "
                              "vllm")
    if base_config.get("model_type") not in VLLM_MODEL_TYPES:
        raise MedusaError(f"vLLM 0.32 serves speculators eagle3 drafters on {' / '.join(VLLM_MODEL_TYPES)} "
                          f"bases only (this base's model_type is {base_config.get('model_type')!r})")
    if not cfg.feature_layers or len(set(cfg.feature_layers)) != len(cfg.feature_layers):
        # vLLM collects each layer once: a repeated layer would feed fc fewer blocks than it has
        raise CheckpointError(f"{src / CONFIG_NAME}: eagle3 heads need distinct feature_layers for vLLM, got "
                              f"{cfg.feature_layers!r}")
    depth = base_config.get("num_hidden_layers")
    if isinstance(depth, int) and any(not 0 <= i <= depth for i in cfg.feature_layers):
        raise CheckpointError(f"{src / CONFIG_NAME}: feature_layers {cfg.feature_layers} lie outside the "
                              f"base's hidden states 0..{depth}")
    weights = heads_weights_path(src)
    state = read_heads_file(weights)
    check_state(state, cfg, weights)
    decoding = getattr(torch, cfg.dtype)  # the dtype the drafter decodes in (stored narrower when shipped)
    state = {k: v.to(decoding) if v.is_floating_point() else v for k, v in state.items()}
    tensors = eagle3_tensors(state, list(cfg.feature_layers), cfg.vocab_size)
    n = int(tensors["lm_head.weight"].shape[0])
    if embed_tokens:
        tensors["embed_tokens.weight"] = verifier_embeddings(verifier, cfg.vocab_size,
                                                             tensors["lm_head.weight"].dtype)  # [V, d]
    save_safetensors(tensors, out / "model.safetensors", metadata={"format": "pt"})
    write_json(out / "config.json", eagle3_config(cfg, base_config, verifier, n))
    return {"draft_vocab_size": n, "dtype": dtype_name(tensors["lm_head.weight"].dtype),
            "embed_tokens": embed_tokens}
