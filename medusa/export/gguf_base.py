"""``medusa export --format gguf --with-base``: the base model as the ``llama`` GGUF llama-server loads with
``-m``, beside the drafter, in the precision asked (``--base-precision``), written with the ``gguf``
package's writer as the drafter is.

What is written, mirroring llama.cpp's ``convert_hf_to_gguf.py`` (build 10434, ``LlamaModel``) and, for
``q4_1``, its ``llama-quantize``:

- ``general.architecture = llama``; ``llama.*``: block count, context length, embedding / feed-forward
  sizes, head counts, ``rope.freq_base``, RMS epsilon, key / value length, vocabulary size;
- tensors ``token_embd``, ``blk.{i}.attn_norm / attn_q / attn_k / attn_v / attn_output / ffn_norm /
  ffn_gate / ffn_up / ffn_down``, ``output_norm``, and ``output`` unless the model ties it to the embedding
  (llama.cpp then reads ``token_embd``); Q / K rows RoPE-permuted as for the drafter;
- precisions: ``f32`` (every tensor float32); ``bf16`` (matrices bfloat16, norms float32, as the
  converter's ``--outtype bf16``); ``q4_1`` (llama-quantize's ``Q4_1`` mix: block matrices Q4_1, the
  embedding / output matrix Q8_0 — llama-quantize wants Q6_K there and falls back to Q8_0 for rows that are
  not a multiple of 256, the gguf package quantises no K-quants, so Q8_0 always; rows not a multiple of
  32 float16, llama-quantize's fallback; norms float32). The
  quantisation is the gguf package's ``quants.quantize`` (ggml's reference rounding);
- the tokenizer as for the drafter (:func:`medusa.export.gguf.write_vocab`: byte-level BPE only). The
  pre-tokenizer name (``tokenizer.ggml.pre``) is the one the packaged model's source GGUF carries (SmolLM2:
  ``smollm``, recorded at conversion, :func:`tokenizer_pre`); for any other base it is left out (the
  converter finds it by hashing a probe text against its own table), so llama.cpp splits TEXT with its
  default pre-tokenizer: requests that send token ids (as this project's harness does) are unaffected.

Llama-family bases only (``model_type`` llama, no attention / MLP biases, default RoPE).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from medusa.errors import MedusaError
from medusa.modeling.packaged_models import TOKENIZER_PRE, read_marker

BASE_PRECISIONS = ("f32", "bf16", "q4_1")
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
EMBEDDING_NAMES = ("token_embd.weight", "output.weight")


def rope_permute(weight: torch.Tensor, n_head: int) -> torch.Tensor:
    """Q / K rows from Hugging Face's rotate-half order to llama.cpp's interleaved RoPE pairs (the
    converter's ``LlamaModel.permute``); ``weight [n_head * head_dim, in]``."""
    rows = weight.shape[0]
    return (weight.reshape(n_head, 2, rows // n_head // 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def rope_theta(text: dict[str, Any]) -> float:
    params = text.get("rope_parameters") or text.get("rope_scaling") or {}
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ("default", None):
        raise MedusaError(f"--format gguf writes default RoPE only (the base's rope_type is {kind!r})")
    return float(params.get("rope_theta", text.get("rope_theta", 10000.0)))


def write_layer_hparams(writer: Any, text: dict[str, Any]) -> None:
    """The llama hyperparameters of one decoder layer (the base's) under the writer's architecture."""
    n_head = int(text["num_attention_heads"])
    head_dim = int(text.get("head_dim") or text["hidden_size"] // n_head)
    writer.add_context_length(int(text.get("max_position_embeddings", 4096)))
    writer.add_embedding_length(int(text["hidden_size"]))
    writer.add_feed_forward_length(int(text["intermediate_size"]))
    writer.add_head_count(n_head)
    writer.add_head_count_kv(int(text.get("num_key_value_heads") or n_head))
    writer.add_rope_freq_base(rope_theta(text))
    writer.add_layer_norm_rms_eps(float(text["rms_norm_eps"]))
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_vocab_size(int(text["vocab_size"]))
    writer.add_rope_dimension_count(head_dim)


def write_vocab(writer: Any, tokenizer_dir: str, vocab_size: int) -> None:
    """The target's BPE tokenizer as llama.cpp's ``gpt2`` vocabulary (the converter's ``get_vocab_base``:
    added special tokens CONTROL, other added tokens USER_DEFINED, holes ``[PAD{i}]`` UNUSED)."""
    import gguf
    from transformers import AutoTokenizer

    if not (Path(tokenizer_dir) / "tokenizer.json").is_file():
        raise MedusaError(f"{tokenizer_dir}: --format gguf needs the base's tokenizer.json (a BPE tokenizer)")
    spec = json.loads((Path(tokenizer_dir) / "tokenizer.json").read_text(encoding="utf-8"))
    model_type = spec.get("model", {}).get("type")
    if model_type != "BPE":
        raise MedusaError(f"{tokenizer_dir}/tokenizer.json: --format gguf writes BPE tokenizers only "
                          f"(this one is {model_type})")
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    reverse = {i: t for t, i in tok.get_vocab().items()}
    added = tok.added_tokens_decoder  # {id: AddedToken}
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif i in added:
            tokens.append(reverse[i])
            types.append(gguf.TokenType.CONTROL if added[i].special else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(reverse[i])
            types.append(gguf.TokenType.NORMAL)
    writer.add_tokenizer_model("gpt2")
    pre = tokenizer_pre(tokenizer_dir)
    if pre:  # else llama.cpp splits text with its default pre-tokenizer (token-id requests are unaffected)
        writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    gguf.SpecialVocab(tokenizer_dir, load_merges=True, n_vocab=vocab_size).add_to_gguf(writer)


def tokenizer_pre(tokenizer_dir: str) -> str | None:
    """llama.cpp's pre-tokenizer name for the base in ``tokenizer_dir``: what its source GGUF said, for a
    packaged model (recorded in its marker at conversion); None for any other base (llama.cpp's converter
    finds it by hashing a probe text against its own table)."""
    value = (read_marker(tokenizer_dir) or {}).get(TOKENIZER_PRE)
    return value if isinstance(value, str) and value else None


def base_file(precision: str) -> str:
    return f"base-{precision}.gguf"


def check_base(text: dict[str, Any], model_dir: str, tokenizer_dir: str, precision: str) -> None:
    """Refuse a precision we do not write, and bases llama.cpp's ``llama`` architecture would read wrongly."""
    if precision not in BASE_PRECISIONS:
        raise MedusaError(f"--base-precision {precision!r}: choose one of {', '.join(BASE_PRECISIONS)}")
    if text.get("model_type") != "llama":
        raise MedusaError(f"{model_dir}/config.json: --with-base writes Llama-family bases only "
                          f"(model_type {text.get('model_type')!r}); convert it with llama.cpp's "
                          "convert_hf_to_gguf.py")
    for key in ("attention_bias", "mlp_bias"):
        if text.get(key):
            raise MedusaError(f"{model_dir}/config.json: --with-base writes bias-free layers only "
                              f"({key}: true)")
    require_byte_level(tokenizer_dir)


def require_byte_level(tokenizer_dir: str) -> None:
    """The base's tokenizer must be byte-level BPE (llama.cpp's ``gpt2`` vocabulary); a SentencePiece-style
    BPE (``Metaspace``) would be written under the wrong model and split text wrongly."""
    spec_path = Path(tokenizer_dir) / "tokenizer.json"
    spec = json.loads(spec_path.read_text(encoding="utf-8")) if spec_path.is_file() else {}
    if "ByteLevel" not in json.dumps(spec.get("pre_tokenizer")):
        raise MedusaError(f"{spec_path}: --with-base writes byte-level BPE tokenizers only (this one's "
                          "pre_tokenizer is not ByteLevel); convert the base with llama.cpp's "
                          "convert_hf_to_gguf.py")


def read_base_state(model_dir: str) -> dict[str, torch.Tensor]:
    """Every tensor of the base's ``*.safetensors`` files, names without the ``model.`` prefix."""
    from safetensors.torch import load_file

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise MedusaError(f"{model_dir}: --with-base reads the base's safetensors weights (none found)")
    state: dict[str, torch.Tensor] = {}
    for path in files:
        for name, tensor in load_file(str(path)).items():
            state[name.removeprefix("model.")] = tensor
    return state


def base_tensors(state: dict[str, torch.Tensor], text: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Hugging Face Llama tensors -> llama.cpp's names (Q / K rows RoPE-permuted), in file order."""
    n_head = int(text["num_attention_heads"])
    n_head_kv = int(text.get("num_key_value_heads") or n_head)
    out = {"token_embd.weight": _take(state, "embed_tokens.weight")}
    for i in range(int(text["num_hidden_layers"])):
        for ours, theirs in LAYER_NAMES.items():
            weight = _take(state, f"layers.{i}.{ours}")
            if ours == "self_attn.q_proj.weight":
                weight = rope_permute(weight, n_head)
            elif ours == "self_attn.k_proj.weight":
                weight = rope_permute(weight, n_head_kv)
            out[f"blk.{i}.{theirs}"] = weight
    out["output_norm.weight"] = _take(state, "norm.weight")
    if not text.get("tie_word_embeddings", False):
        out["output.weight"] = _take(state, "lm_head.weight")
    return out


def _take(state: dict[str, torch.Tensor], key: str) -> torch.Tensor:
    if key not in state:
        raise MedusaError(f"the base's weights have no tensor {key}")
    return state[key]


def tensor_type(name: str, shape: tuple[int, ...], precision: str) -> Any:
    """The GGML type ``name`` is stored in at ``precision`` (norms always F32; q4_1: llama-quantize's Q4_1
    mix; q8_0: every whole-block matrix Q8_0)."""
    import gguf

    kind = gguf.GGMLQuantizationType
    if len(shape) < 2 or precision == "f32":
        return kind.F32
    if precision == "bf16":
        return kind.BF16
    block = gguf.GGML_QUANT_SIZES[kind.Q4_1][0]  # 32 values, as Q8_0's
    if shape[-1] % block:
        return kind.F16  # llama-quantize's fallback for rows no quantised block fits
    if precision == "q8_0":  # (a drafter's matrices: medusa.export.gguf)
        return kind.Q8_0
    return kind.Q8_0 if name in EMBEDDING_NAMES else kind.Q4_1


def file_type(precision: str) -> Any:
    """The ``general.file_type`` a GGUF of mostly ``precision`` tensors declares."""
    import gguf

    return {"f32": gguf.LlamaFileType.ALL_F32, "bf16": gguf.LlamaFileType.MOSTLY_BF16,
            "q4_1": gguf.LlamaFileType.MOSTLY_Q4_1, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[precision]


def encode(array: np.ndarray, qtype: Any) -> np.ndarray:
    """``array`` float32 -> the bytes ``qtype`` stores (float32 unchanged)."""
    import gguf

    if qtype == gguf.GGMLQuantizationType.F32:
        return array
    if qtype == gguf.GGMLQuantizationType.F16:
        return array.astype(np.float16)
    return gguf.quants.quantize(array, qtype)


def write_base_gguf(model_dir: str, text: dict[str, Any], tokenizer_dir: str, precision: str,
                    path: Path) -> dict[str, Any]:
    """Write the base at ``model_dir`` to ``path`` as a ``llama`` GGUF; returns what the summary reports."""
    import gguf

    check_base(text, model_dir, tokenizer_dir, precision)
    tensors = base_tensors(read_base_state(model_dir), text)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(f"{Path(model_dir).name}")
    writer.add_block_count(int(text["num_hidden_layers"]))
    write_layer_hparams(writer, text)
    writer.add_file_type(file_type(precision))
    write_vocab(writer, tokenizer_dir, int(text["vocab_size"]))
    types: dict[str, str] = {}
    for name, tensor in tensors.items():
        array = tensor.detach().to(torch.float32).contiguous().numpy()
        qtype = tensor_type(name, array.shape, precision)
        writer.add_tensor(name, encode(array, qtype), raw_dtype=qtype)
        types[qtype.name] = types.get(qtype.name, 0) + 1
    if precision == "q4_1":
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {"base_gguf": path.name, "base_precision": precision, "base_tensor_types": types}
