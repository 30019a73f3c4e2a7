"""--format gguf --with-base (medusa.export.gguf_base): the base written as the ``llama`` GGUF llama-server
loads, read back with the gguf package: keys, every tensor under llama.cpp's name (Q / K RoPE-permuted),
each precision's tensor types and values (f32 exact, bf16 / q4_1 within their rounding, q4_1 of weights
already on the Q4_1 grid reproduced byte for byte), refusals, and the export's overwrite rules (a file the
command did not write is never replaced or removed). Serving it: tests/integration/test_llama_cpp_serving.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from medusa import MedusaModel
from medusa.errors import MedusaError
from medusa.export import export_checkpoint
from medusa.export.gguf import rope_permute
from medusa.export.gguf_base import base_tensors, tensor_type

from tiny_models import tiny_model

gguf = pytest.importorskip("gguf")


def _tokenizer(vocab_size: int, pre: str = "byte_level"):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(vocab={f"t{i}": i for i in range(vocab_size)}, merges=[]))
    tok.pre_tokenizer = (pre_tokenizers.ByteLevel(add_prefix_space=False) if pre == "byte_level"
                         else pre_tokenizers.Metaspace())
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="t1", eos_token="t2", unk_token="t0")


def _base(root, tie: bool = False, pre: str = "byte_level"):
    path = root / f"llama-{tie}-{pre}"
    model = tiny_model("llama", layers=3, tie_word_embeddings=tie)
    model.save_pretrained(path)
    _tokenizer(model.config.vocab_size, pre).save_pretrained(path)
    return path, model


def _heads(root, base):
    model = MedusaModel.from_base(str(base), num_heads=3, head_type="eagle3", feature_layers=[0, 1, 2])
    model.save_pretrained(root / "heads")
    return root / "heads"


def _read(path):
    reader = gguf.GGUFReader(str(path))
    keys = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    return keys, {t.name: t for t in reader.tensors}


def _values(t) -> np.ndarray:
    data = np.array(t.data)
    if t.tensor_type == gguf.GGMLQuantizationType.F32:
        return data
    return gguf.quants.dequantize(data, t.tensor_type)


def test_f32_base_has_every_tensor_under_llama_cpp_names(tmp_path):
    base, model = _base(tmp_path)
    summary = export_checkpoint(_heads(tmp_path, base), tmp_path / "out", "gguf", base=str(base),
                                base_precision="f32")
    assert summary["commands"][0].startswith(f"llama-server -m {tmp_path / 'out' / 'base-f32.gguf'} -md ")
    keys, tensors = _read(tmp_path / "out" / "base-f32.gguf")
    cfg = model.config
    assert keys["general.architecture"] == "llama" and keys["llama.block_count"] == 3
    assert keys["llama.embedding_length"] == cfg.hidden_size and keys["llama.vocab_size"] == cfg.vocab_size
    assert keys["llama.attention.head_count_kv"] == cfg.num_key_value_heads
    assert keys["tokenizer.ggml.model"] == "gpt2" and keys["general.file_type"] == gguf.LlamaFileType.ALL_F32
    hf = {k.removeprefix("model."): v for k, v in model.state_dict().items()}
    assert len(tensors) == 2 + 9 * 3 + 1  # token_embd, output_norm, output + 9 per layer
    assert np.array_equal(_values(tensors["token_embd.weight"]), hf["embed_tokens.weight"].numpy())
    assert np.array_equal(_values(tensors["output.weight"]), hf["lm_head.weight"].numpy())
    down = hf["layers.1.mlp.down_proj.weight"]
    assert np.array_equal(_values(tensors["blk.1.ffn_down.weight"]), down.numpy())
    k = hf["layers.0.self_attn.k_proj.weight"]
    assert np.array_equal(_values(tensors["blk.0.attn_k.weight"]),
                          rope_permute(k, cfg.num_key_value_heads).numpy())


def test_tied_embeddings_leave_output_out(tmp_path):
    base, model = _base(tmp_path, tie=True)
    text = model.config.to_dict()
    names = base_tensors({k.removeprefix("model."): v for k, v in model.state_dict().items()}, text)
    assert "output.weight" not in names and "token_embd.weight" in names


@pytest.mark.parametrize("precision, matrix, embedding, tol", [
    ("bf16", "BF16", "BF16", 2 ** -7), ("q4_1", "Q4_1", "Q8_0", 0.2)])
def test_low_precision_types_and_values(tmp_path, precision, matrix, embedding, tol):
    base, model = _base(tmp_path)
    export_checkpoint(_heads(tmp_path, base), tmp_path / "out", "gguf", base=str(base),
                      base_precision=precision)
    _, tensors = _read(tmp_path / "out" / f"base-{precision}.gguf")
    assert tensors["blk.0.attn_v.weight"].tensor_type.name == matrix
    assert tensors["token_embd.weight"].tensor_type.name == embedding
    assert tensors["blk.0.attn_norm.weight"].tensor_type.name == "F32"
    want = model.state_dict()["model.layers.0.self_attn.v_proj.weight"].numpy()
    got = _values(tensors["blk.0.attn_v.weight"]).reshape(want.shape)
    assert np.abs(got - want).max() <= tol * np.abs(want).max()


def test_q4_1_of_weights_on_the_q4_1_grid_is_byte_identical():
    """A model de-quantised from Q4_1 (as the packaged SmolLM2 is) re-quantises to the same bytes."""
    torch.manual_seed(0)
    q41 = gguf.GGMLQuantizationType.Q4_1
    published = gguf.quants.quantize(torch.randn(8, 64).numpy(), q41)
    again = gguf.quants.quantize(gguf.quants.dequantize(published, q41), q41)
    assert np.array_equal(again, published)
    assert tensor_type("blk.0.ffn_up.weight", (8, 64), "q4_1") == q41
    assert tensor_type("token_embd.weight", (8, 64), "q4_1") == gguf.GGMLQuantizationType.Q8_0
    assert tensor_type("blk.0.ffn_up.weight", (8, 48), "q4_1") == gguf.GGMLQuantizationType.F16


def test_refusals_name_the_cause(tmp_path):
    base, _ = _base(tmp_path, pre="metaspace")
    heads = _heads(tmp_path, base)
    with pytest.raises(MedusaError, match="byte-level BPE"):
        export_checkpoint(heads, tmp_path / "out", "gguf", base=str(base), base_precision="f32")
    assert not (tmp_path / "out").exists()
    with pytest.raises(MedusaError, match="--base-precision 'q4_0'"):
        export_checkpoint(heads, tmp_path / "out", "gguf", base=str(base), base_precision="q4_0")
    with pytest.raises(MedusaError, match="--format gguf only"):
        export_checkpoint(heads, tmp_path / "out", "vllm", base=str(base), base_precision="f32")


def test_overwrite_keeps_files_the_export_did_not_write(tmp_path):
    base, _ = _base(tmp_path)
    heads = _heads(tmp_path, base)
    out = tmp_path / "out"
    out.mkdir()
    (out / "base-f32.gguf").write_text("the user's own file")
    with pytest.raises(MedusaError):
        export_checkpoint(heads, out, "gguf", base=str(base), base_precision="f32", overwrite=True)
    assert (out / "base-f32.gguf").read_text() == "the user's own file"
    (out / "notes.txt").write_text("keep me")
    (out / "base-f32.gguf").unlink()
    export_checkpoint(heads, out, "gguf", base=str(base), base_precision="f32", overwrite=True)
    export_checkpoint(heads, out, "gguf", base=str(base), base_precision="bf16", overwrite=True)
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == [
        "base-bf16.gguf", "draft.gguf", "notes.txt"]  # the f32 file the first export wrote is replaced


def test_the_pre_tokenizer_name_of_a_packaged_base_is_written(tmp_path):
    """A packaged base records its source GGUF's ``tokenizer.ggml.pre`` at conversion (its marker): the base
    and the drafter files carry it; a base without the marker (any other) leaves it out."""
    import json

    from medusa.modeling.packaged_models import MARKER, TOKENIZER_PRE

    base, _ = _base(tmp_path)
    heads = _heads(tmp_path, base)
    export_checkpoint(heads, tmp_path / "plain", "gguf", base=str(base), base_precision="f32")
    assert "tokenizer.ggml.pre" not in _read(tmp_path / "plain" / "base-f32.gguf")[0]
    (base / MARKER).write_text(json.dumps({"gguf_sha256": "aa", TOKENIZER_PRE: "smollm"}))
    export_checkpoint(heads, tmp_path / "tied", "gguf", base=str(base), base_precision="f32")
    for name in ("base-f32.gguf", "draft.gguf"):
        assert _read(tmp_path / "tied" / name)[0]["tokenizer.ggml.pre"] == "smollm", name
