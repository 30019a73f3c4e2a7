"""--format gguf (medusa.export.gguf): eagle3 heads -> the eagle3 GGUF llama.cpp reads, checked by reading the
file back with the gguf package: the eagle3 keys (3 ascending target layers, target hidden size,
norm_before_residual false), the draft layer's hyperparameters, tensor names, fc column blocks in ascending
layer order, Q / K rows in llama.cpp's interleaved RoPE order, d2t = our token map (absolute ids), the
target's BPE vocabulary; MEDUSA heads refused naming what llama.cpp offers. (That the pinned llama-server
serves it, greedy text equal to plain: tests/integration/test_llama_cpp_serving.py.)
"""

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from medusa import MedusaModel
from medusa.errors import CheckpointError
from medusa.export import export_checkpoint
from medusa.export.gguf import rope_permute

from tiny_models import tiny_model

gguf = pytest.importorskip("gguf")


def _bpe_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(vocab_size)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="t1", eos_token="t2", unk_token="t0")


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("base") / "llama"
    model = tiny_model("llama", layers=4)
    model.save_pretrained(path)
    _bpe_tokenizer(model.config.vocab_size).save_pretrained(path)
    return path


def _eagle3(root, base_dir, feature_layers, token_map=None):
    model = MedusaModel.from_base(str(base_dir), num_heads=3, head_type="eagle3",
                                  feature_layers=feature_layers, token_map=token_map)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.heads.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(root / "heads")
    return root / "heads"


def _read(path):
    reader = gguf.GGUFReader(str(path))
    keys = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    tensors = {t.name: np.array(t.data) for t in reader.tensors}
    return keys, tensors


def test_gguf_keys_and_tensors(tmp_path, base_dir):
    V = MedusaModel.from_base(str(base_dir), num_heads=1).config.vocab_size
    tm = torch.arange(3, V, 3)  # a draft vocabulary of every third id
    src = _eagle3(tmp_path, base_dir, [2, 0, 3], token_map=tm)
    summary = export_checkpoint(src, tmp_path / "out", "gguf")
    assert summary["format"] == "gguf" and "--spec-type draft-eagle3" in summary["commands"][0]
    keys, tensors = _read(tmp_path / "out" / "draft.gguf")
    assert keys["general.architecture"] == "eagle3"
    assert keys["eagle3.target_layers"] == [0, 2, 3]
    assert keys["eagle3.target_hidden_size"] == 32 and keys["eagle3.norm_before_residual"] is False
    assert keys["eagle3.block_count"] == 1 and keys["eagle3.vocab_size"] == V
    assert keys["eagle3.attention.head_count"] == 4 and keys["eagle3.embedding_length"] == 32
    assert keys["tokenizer.ggml.model"] == "gpt2" and len(keys["tokenizer.ggml.tokens"]) == V
    assert keys["tokenizer.ggml.eos_token_id"] == 2
    ours = load_file(str(src / "medusa_heads.safetensors"))
    d = 32
    blocks = ours["fc.weight"].split(d, dim=1)  # ours in feature_layers order [2, 0, 3]
    want_fc = torch.cat([blocks[1], blocks[0], blocks[2]], dim=1)  # ascending: 0, 2, 3
    assert np.array_equal(tensors["fc.weight"], want_fc.numpy())
    assert tensors["d2t"].dtype == np.int64 and np.array_equal(tensors["d2t"], tm.numpy())
    assert np.array_equal(tensors["output.weight"], ours["lm_head.weight"].numpy())
    assert np.array_equal(tensors["blk.0.attn_norm_2.weight"], ours["layers.0.hidden_norm.weight"].numpy())
    assert np.array_equal(tensors["blk.0.attn_v.weight"], ours["layers.0.self_attn.v_proj.weight"].numpy())
    assert "token_embd.weight" not in tensors  # llama.cpp embeds with the target's table
    q = ours["layers.0.self_attn.q_proj.weight"]  # [n_head * head_dim, 2d]
    assert np.array_equal(tensors["blk.0.attn_q.weight"], rope_permute(q, 4).numpy())
    assert not np.array_equal(tensors["blk.0.attn_q.weight"], q.numpy())


def test_rope_permute_interleaves_each_heads_halves():
    """HF's rotate-half pairs (i, i + half) become llama.cpp's adjacent rows (2i, 2i + 1), head by head."""
    n_head, head_dim = 2, 6
    w = torch.arange(n_head * head_dim, dtype=torch.float32)[:, None]  # row r holds r
    got = rope_permute(w, n_head)[:, 0].tolist()
    half = head_dim // 2
    want = [h * head_dim + j * half + i for h in range(n_head) for i in range(half) for j in range(2)]
    assert got == want


@pytest.mark.parametrize("head_type", ["linear", "hydra"])
def test_medusa_heads_are_refused_naming_llama_cpp_options(tmp_path, base_dir, head_type):
    model = MedusaModel.from_base(str(base_dir), num_heads=2, head_type=head_type)
    model.save_pretrained(tmp_path / "heads")
    with pytest.raises(CheckpointError, match=f"'{head_type}'.*ngram-mod.*draft model"):
        export_checkpoint(tmp_path / "heads", tmp_path / "out", "gguf")
    assert not (tmp_path / "out").exists()


def test_bf16_drafter_keeps_norms_and_d2t_and_rounds_the_matrices(tmp_path, base_dir):
    """--draft-precision bf16: every matrix BF16 holding our weight rounded to bfloat16 (the bits torch's
    rounding gives), norms F32 and d2t I64 as at f32; the file type says MOSTLY_BF16."""
    V = MedusaModel.from_base(str(base_dir), num_heads=1).config.vocab_size
    tm = torch.arange(2, V, 2)
    src = _eagle3(tmp_path, base_dir, [1, 2, 3], token_map=tm)
    summary = export_checkpoint(src, tmp_path / "out", "gguf", draft_precision="bf16")
    assert summary["dtype"] == "bfloat16"
    reader = gguf.GGUFReader(str(tmp_path / "out" / "draft.gguf"))
    kind = gguf.GGMLQuantizationType
    kinds = {t.name: t.tensor_type for t in reader.tensors}
    f32 = export_checkpoint(src, tmp_path / "f32", "gguf")
    want_kinds = {t.name: (kind.I64 if t.name == "d2t" else kind.F32 if len(t.shape) < 2
                           else kind.BF16)
                  for t in gguf.GGUFReader(str(tmp_path / "f32" / "draft.gguf")).tensors}
    assert kinds == want_kinds and f32["dtype"] == "float32"
    assert sum(k == kind.BF16 for k in kinds.values()) == 9  # fc, q, k, v, o, gate, up, down, output
    ours = load_file(str(src / "medusa_heads.safetensors"))
    data = {t.name: np.array(t.data) for t in reader.tensors}
    want = ours["lm_head.weight"].to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(data["output.weight"].view(np.uint16).reshape(want.shape), want)
    assert _read(tmp_path / "out" / "draft.gguf")[0]["general.file_type"] == gguf.LlamaFileType.MOSTLY_BF16


def test_q8_0_drafter_quantises_whole_block_matrices_and_keeps_norms(tmp_path, base_dir):
    """--draft-precision q8_0: each matrix whose rows are whole 32-value blocks is Q8_0 (others F16, as
    llama-quantize falls back), norms F32, d2t I64; a Q8_0 matrix reads back as our weight to within 0.6 of a
    block's scale d = amax / 127 (half a step, plus up to 127 steps' share of d's float16 rounding, 127 x
    2^-11 ~ 0.06); the file type says MOSTLY_Q8_0."""
    src = _eagle3(tmp_path, base_dir, [1, 2, 3])
    summary = export_checkpoint(src, tmp_path / "out", "gguf", draft_precision="q8_0")
    assert summary["dtype"] == "q8_0"
    reader = gguf.GGUFReader(str(tmp_path / "out" / "draft.gguf"))
    kind = gguf.GGMLQuantizationType
    got = {t.name: t.tensor_type for t in reader.tensors}
    export_checkpoint(src, tmp_path / "f32", "gguf")
    f32_file = str(tmp_path / "f32" / "draft.gguf")
    f32 = {t.name: [int(n) for n in t.shape] for t in gguf.GGUFReader(f32_file).tensors}
    want = {name: (kind.I64 if name == "d2t" else kind.F32 if len(shape) < 2
                   else kind.Q8_0 if shape[0] % 32 == 0 else kind.F16)  # GGUF lists a row's length first
            for name, shape in f32.items()}
    assert got == want and kind.Q8_0 in got.values()
    ours = load_file(str(src / "medusa_heads.safetensors"))["lm_head.weight"].float().numpy()  # [N, d]
    out = next(t for t in reader.tensors if t.name == "output.weight")
    assert out.tensor_type == kind.Q8_0
    back = gguf.quants.dequantize(np.array(out.data), kind.Q8_0).reshape(ours.shape)
    blocks = np.abs(ours).reshape(-1, 32).max(axis=1, keepdims=True) / 127  # each block's scale
    assert np.all(np.abs(back - ours).reshape(-1, 32) <= 0.6 * blocks)
    assert not np.array_equal(back, ours)  # quantised, not copied
    assert _read(tmp_path / "out" / "draft.gguf")[0]["general.file_type"] == gguf.LlamaFileType.MOSTLY_Q8_0


def test_draft_precision_is_refused_outside_gguf_and_unknown_values(tmp_path, base_dir):
    from medusa.errors import MedusaError

    src = _eagle3(tmp_path, base_dir, [1, 2, 3])
    with pytest.raises(MedusaError, match="--draft-precision applies to --format gguf only"):
        export_checkpoint(src, tmp_path / "a", "speculators", draft_precision="bf16")
    with pytest.raises(MedusaError, match="--draft-precision 'q4_1': choose one of f32, bf16, q8_0"):
        export_checkpoint(src, tmp_path / "b", "gguf", draft_precision="q4_1")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_the_printed_command_drafts_the_calibrated_trees_depth(tmp_path, base_dir):
    """With a draft tree.json the llama-server command drafts its depth (llama.cpp drafts chains) and ends a
    chain below p-min 0.5; without one, one draft per head and no early end."""
    from medusa.tree.draft_tree import DraftTreeShape

    src = _eagle3(tmp_path, base_dir, [1, 2, 3])
    plain = export_checkpoint(src, tmp_path / "a", "gguf")["commands"][0]
    assert "--spec-draft-n-max 3 --spec-draft-p-min 0" in plain  # num_heads 3
    DraftTreeShape(4, 2, 2, 2, lookup_tokens=6, min_prob=0.05).to_json(src / "tree.json")
    calibrated = export_checkpoint(src, tmp_path / "b", "gguf")["commands"][0]
    assert calibrated.endswith("--spec-draft-n-max 2 --spec-draft-p-min 0.5")
