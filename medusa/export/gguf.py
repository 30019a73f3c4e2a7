"""``--format gguf``: an EAGLE-3 drafter as the ``eagle3`` GGUF llama.cpp serves (``llama-server -m
TARGET.gguf -md OUT/draft.gguf --spec-type draft-eagle3``), written with the ``gguf`` package's writer.

What llama.cpp (build 10434, ``src/models/eagle3.cpp``) reads, and what its own converter writes for a
speculators checkpoint (``convert_hf_to_gguf.py --target-model-dir``), which this module mirrors:

- ``general.architecture = eagle3``; the llama hyperparameters of the draft layer (``block_count`` 1,
  ``embedding_length``, ``feed_forward_length``, head counts, ``rope.freq_base``, RMS epsilon,
  ``vocab_size`` = the TARGET vocabulary) under ``eagle3.*``;
- ``eagle3.target_layers``: exactly 3 ids, llama.cpp's numbering = the INPUT of that target layer = Hugging
  Face's ``hidden_states[i]`` = our ``feature_layers``; the fused features are concatenated in that array's
  order, so ids are written ascending and ``fc.weight``'s column blocks in the same order;
- ``eagle3.target_hidden_size``, ``eagle3.norm_before_residual`` (ours: false, the residual is the fused
  hidden state before ``hidden_norm``), ``eagle3.norm_before_fc`` (false);
- tensors: ``fc.weight``, ``blk.0.attn_norm`` (input_layernorm on the token embedding), ``blk.0.attn_norm_2``
  (hidden_norm), ``blk.0.attn_q/k/v`` reading ``2d`` (Q and K rows permuted as llama.cpp's RoPE wants),
  ``attn_output``, ``ffn_norm``, ``ffn_gate/up/down``, ``output_norm``, ``output`` ``[N, d]``, and ``d2t [N]``
  int64 ABSOLUTE target ids (our ``token_map``; llama.cpp's converter adds ``arange`` to speculators'
  offsets);
  no ``token_embd``: llama.cpp then embeds the draft tokens with the target's table, as our drafter does;
- the matrices at ``draft_precision``: ``f32`` (as the converter's ``--outtype f32``), ``bf16`` (the
  tensor types its ``--outtype bf16`` gives: matrices BF16 rounded to nearest even, norms float32, ``d2t``
  int64; the drafter's passes then stream half the bytes beside a bf16 or quantised target) or ``q8_0``
  (its ``--outtype q8_0``: each matrix whose rows are whole 32-value blocks Q8_0, 32 int8 with one float16
  scale a block, others F16, norms float32: about a quarter of f32's bytes);
- the target's tokenizer (BPE: ``tokenizer.ggml.model = gpt2``, tokens, types, merges, special ids, chat
  template). llama.cpp loads it with the model but never tokenizes with the drafter; the pre-tokenizer name
  (``tokenizer.ggml.pre``) as for the base (:func:`medusa.export.gguf_base.tokenizer_pre`).

MEDUSA / Hydra heads are refused: llama.cpp has no MEDUSA heads (its speculation is a draft model, EAGLE-3,
MTP / DFlash drafters or n-gram lookup).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from medusa.config.enums import DRAFTER_HEAD_TYPES
from medusa.errors import CheckpointError, MedusaError
from medusa.export.gguf_base import LAYER_NAMES as BASE_LAYER_NAMES
from medusa.export.gguf_base import (
    base_file,
    check_base,
    encode,
    file_type,
    rope_permute,
    tensor_type,
    write_base_gguf,
    write_layer_hparams,
    write_vocab,
)
from medusa.modeling.config import CONFIG_NAME, TREE_NAME, WEIGHTS_NAME, MedusaConfig
from medusa.modeling.heads_file import heads_weights_path, read_heads_file
from medusa.tree.draft_tree import DraftTreeShape, is_draft_tree_file

ARCH = "eagle3"
DRAFT_FILE = "draft.gguf"
DRAFT_PRECISIONS = ("f32", "bf16", "q8_0")
LLAMA_CPP_OFFERS = ("llama.cpp has no MEDUSA or Hydra heads; serve the base there with its n-gram drafters "
                    "(llama-server --spec-type ngram-mod or ngram-simple) or a small draft model "
                    "(-md DRAFT.gguf), or train head_type eagle3 and export that")

# our layer-0 names -> llama.cpp's (the converter's tensor map for arch eagle3): a llama layer's, with the
# hidden-state norm after the input norm
LAYER_NAMES = {"input_layernorm.weight": BASE_LAYER_NAMES["input_layernorm.weight"],
               "hidden_norm.weight": "attn_norm_2.weight",
               **{ours: theirs for ours, theirs in BASE_LAYER_NAMES.items()
                  if ours != "input_layernorm.weight"}}


def refuse_non_eagle3(src: Path, cfg: MedusaConfig) -> None:
    if cfg.head_type not in DRAFTER_HEAD_TYPES:
        raise CheckpointError(f"{src / CONFIG_NAME}: --format gguf exports head_type eagle3 drafters only "
                              f"(this checkpoint's is {cfg.head_type!r}): {LLAMA_CPP_OFFERS}")


def draft_tensors(state: dict[str, torch.Tensor], layers: list[int], n_head: int,
                  n_head_kv: int) -> dict[str, np.ndarray]:
    """Our eagle3 tensors -> llama.cpp's names as float32 arrays (:func:`write_draft_gguf` encodes them at
    its precision), fc column blocks in ascending layer order, Q / K rows RoPE-permuted, ``d2t`` absolute
    target ids."""
    fc = state["fc.weight"]  # [d, 3d]: one [d, d] block per feature layer, in our layer order
    d = fc.shape[0]
    blocks = fc.split(d, dim=1)
    order = sorted(range(len(layers)), key=lambda i: layers[i])
    out = {"fc.weight": torch.cat([blocks[i] for i in order], dim=1),
           "output_norm.weight": state["norm.weight"], "output.weight": state["lm_head.weight"]}
    for ours, theirs in LAYER_NAMES.items():
        key = f"layers.0.{ours}"
        if key not in state:
            raise CheckpointError(f"{WEIGHTS_NAME}: missing tensor {key}")
        weight = state[key]
        if ours == "self_attn.q_proj.weight":
            weight = rope_permute(weight, n_head)
        elif ours == "self_attn.k_proj.weight":
            weight = rope_permute(weight, n_head_kv)
        out[f"blk.0.{theirs}"] = weight
    arrays = {k: v.detach().to(torch.float32).contiguous().numpy() for k, v in out.items()}
    if "token_map" in state:
        arrays["d2t"] = state["token_map"].to(torch.int64).contiguous().numpy()  # [N] absolute target ids
    return arrays


def write_hparams(writer: Any, cfg: MedusaConfig, text: dict[str, Any]) -> None:
    """eagle3.* keys: the draft layer's llama hyperparameters (the base's) and the EAGLE-3 ones."""
    layers = sorted(cfg.feature_layers or [])
    if len(layers) != 3 or len(set(layers)) != 3:
        raise CheckpointError(f"{CONFIG_NAME}: llama.cpp's eagle3 reads exactly 3 distinct target layers, "
                              f"feature_layers is {cfg.feature_layers!r}")
    writer.add_name(f"{text.get('model_type', 'llama')} eagle3 drafter")
    writer.add_block_count(1)
    write_layer_hparams(writer, text)
    writer.add_array(f"{ARCH}.target_layers", layers)
    writer.add_uint32(f"{ARCH}.target_hidden_size", int(text["hidden_size"]))
    writer.add_bool(f"{ARCH}.norm_before_residual", False)
    writer.add_bool(f"{ARCH}.norm_before_fc", False)


def check_draft_precision(precision: str) -> None:
    if precision not in DRAFT_PRECISIONS:
        raise MedusaError(f"--draft-precision {precision!r}: choose one of {', '.join(DRAFT_PRECISIONS)}")


def write_draft_gguf(src: Path, cfg: MedusaConfig, text: dict[str, Any], tokenizer_dir: str,
                     out: Path, precision: str = "f32") -> dict[str, Any]:
    """Write ``out/draft.gguf`` with its matrices at ``precision`` (f32 / bf16 / q8_0, checked by
    :func:`export_gguf`); returns what the export summary reports."""
    import gguf

    refuse_non_eagle3(src, cfg)
    weights = heads_weights_path(src)
    state = read_heads_file(weights)
    for key in ("fc.weight", "norm.weight", "lm_head.weight"):
        if key not in state:
            raise CheckpointError(f"{weights}: missing tensor {key}")
    n_head = int(text["num_attention_heads"])
    tensors = draft_tensors(state, list(cfg.feature_layers or []), n_head,
                            int(text.get("num_key_value_heads") or n_head))
    path = out / DRAFT_FILE
    writer = gguf.GGUFWriter(str(path), ARCH)
    write_hparams(writer, cfg, text)
    writer.add_file_type(file_type(precision))
    write_vocab(writer, tokenizer_dir, int(text["vocab_size"]))
    for name, array in tensors.items():
        if name == "d2t":
            writer.add_tensor(name, array, raw_dtype=gguf.GGMLQuantizationType.I64)
        else:
            qtype = tensor_type(name, array.shape, precision)  # matrices at precision, norms float32
            writer.add_tensor(name, encode(array, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {"draft_vocab_size": int(tensors["output.weight"].shape[0]), "gguf": str(path),
            "target_layers": sorted(cfg.feature_layers or []),
            "dtype": {"f32": "float32", "bf16": "bfloat16", "q8_0": "q8_0"}[precision]}


def export_gguf(src: Path, out: Path, cfg: MedusaConfig, base: str | None, overwrite: bool,
                base_precision: str | None = None, draft_precision: str | None = None) -> dict[str, Any]:
    """eagle3 heads -> ``out/draft.gguf`` (matrices at ``draft_precision``: f32, the default, bf16 or q8_0)
    beside the backbone they were trained on (its config and tokenizer are read); ``base_precision`` (f32 /
    bf16 / q4_1): also that backbone as ``out/base-PRECISION.gguf`` (:mod:`medusa.export.gguf_base`). The
    summary's ``commands`` serve them with llama-server."""
    import shlex

    from transformers import AutoConfig

    from medusa.export.backbone import resolve_backbone
    from medusa.io import atomic_directory

    refuse_non_eagle3(src, cfg)
    draft_precision = "f32" if draft_precision is None else draft_precision
    check_draft_precision(draft_precision)
    backbone = resolve_backbone(src, cfg, out, base=base)
    base_cfg = AutoConfig.from_pretrained(backbone.path)
    text = (base_cfg.get_text_config() if hasattr(base_cfg, "get_text_config") else base_cfg).to_dict()
    tokenizer_dir = str(backbone.tokenizer_dir or backbone.path)
    if base_precision is not None:
        check_base(text, backbone.path, tokenizer_dir, base_precision)
    with atomic_directory(out, overwrite=overwrite, inputs=[src, base, backbone.path], kind="export") as tmp:
        info = write_draft_gguf(src, cfg, text, tokenizer_dir, tmp, draft_precision)
        if base_precision is not None:
            info |= write_base_gguf(backbone.path, text, tokenizer_dir, base_precision,
                                    tmp / base_file(base_precision))
    draft = str(out / DRAFT_FILE)
    target = str(out / base_file(base_precision)) if base_precision is not None else "TARGET.gguf"
    serve = ["llama-server", "-m", target, "-md", draft, "--spec-type", "draft-eagle3",
             *chain_flags(src, cfg)]
    return {"format": "gguf", "out": str(out), "num_heads": cfg.num_heads, "num_layers": 1,
            "layout": "gguf-eagle3", "materialised_lm_head": False, "lm_head_copies": 1,
            "tree_nodes": None, "tree_depth": None, "tokenizer_files": [], "backbone": backbone.path,
            "backbone_source": backbone.source, "backbone_description": backbone.description,
            "tokenizer": backbone.tokenizer, "commands": [shlex.join(serve)],
            "notes": [_target_note(backbone.path, base_precision)],
            **{k: v for k, v in info.items() if k != "gguf"}}


def chain_flags(src: Path, cfg: MedusaConfig) -> list[str]:
    """llama.cpp drafts chains: as many drafts as the calibrated tree's depth (``src/tree.json``, its longest
    path), ended at the first draft below p-min 0.5 (the setting measured fastest in llama.cpp,
    docs/results/cpu-engines.md); without a draft tree, one draft per head and no early end."""
    tree = src / TREE_NAME
    if is_draft_tree_file(tree):
        return ["--spec-draft-n-max", str(DraftTreeShape.from_json(tree).depth), "--spec-draft-p-min", "0.5"]
    return ["--spec-draft-n-max", str(cfg.num_heads), "--spec-draft-p-min", "0"]


def _target_note(backbone: str, base_precision: str | None) -> str:
    drafter = "the drafter embeds its tokens with the target's table and drafts chains only"
    if base_precision is None:
        return (f"TARGET.gguf: the backbone {backbone} in GGUF (--with-base writes it, or llama.cpp's "
                f"convert_hf_to_gguf.py); {drafter}")
    return (f"{base_file(base_precision)}: the backbone {backbone} at {base_precision}; llama.cpp splits "
            f"text with its default pre-tokenizer (send token ids for Hugging Face's split); {drafter}")
