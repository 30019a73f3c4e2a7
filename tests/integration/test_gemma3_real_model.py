"""The real Gemma-3-270m (converted from the pinned PyPI wheels): greedy MEDUSA equals HF greedy across the
512-token sliding window (a 480-token prompt and 96 new tokens), batch 1 and a left-padded batch of 2, with
draft-vocabulary heads fitted to accept runs; the draft-vocabulary heads' save / load / vLLM export round
trip; the sliding layers' 4-D mask against the model's own 2-D one.

The converted model is prepared by ``make test`` (``python -m medusa.modeling.packaged_models gemma-3-270m``);
outside CI the tests skip when it is absent, in CI (MEDUSA_REQUIRE_SHARED=1) its absence fails. The model is
loaded, the reference generated and the heads fitted once per module.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from decoding_helpers import real_rows
from real_models import gemma3_dir

from medusa import MedusaModel, MedusaTree
from medusa.modeling import packaged_models as models
from medusa.modeling.base import decoder_of
from medusa.modeling.draft_vocab import build_token_map

from tiny_models import SHARED, require_shared

PROMPT, SHORT, NEW, DRAFT = 480, 440, 96, 2048
# A small tree: every node's logits span 262,144 tokens, so verification cost grows fast with the nodes.
TREE = [[0], [1], [0, 0], [0, 1], [0, 0, 0]]


def fit_draft_heads(model: MedusaModel, sequences: list[torch.Tensor], steps: int, seed: int = 0) -> None:
    """Fit the heads (in place) to predict ``sequences`` (head k at t -> token t+k+2), targets mapped into
    the heads' draft vocabulary (outside it: no target)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        body = decoder_of(model.base_model)
        hidden = [body(input_ids=s.view(1, -1)).last_hidden_state[0] for s in sequences]  # [T, d] each
    t2d = model.heads.target_to_draft()  # [V] target id -> draft id, -1 outside
    opt = torch.optim.Adam(model.heads.parameters(), lr=3e-2)
    with torch.enable_grad():
        for _ in range(steps):
            loss = 0.0
            for k in range(model.num_heads):
                x = torch.cat([h[:-(k + 2)] for h in hidden])  # [T', d]
                y = t2d[torch.cat([s[k + 2:] for s in sequences])]  # [T']
                loss = loss + F.cross_entropy(model.heads.head_logits(k, x), y, ignore_index=-1)
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.heads.eval()


@pytest.fixture(scope="module")
def gemma():
    """(model with 3 fitted draft-vocabulary heads, left-padded batch, HF greedy reference, real rows)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = gemma3_dir()
    require_shared(SHARED)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    text = (SHARED / "data" / "tinystories_sample.txt").read_text(encoding="utf-8").split("\n\n")
    long_ids = tokenizer(" ".join(text[:40]))["input_ids"][:PROMPT]
    short_ids = tokenizer(" ".join(text[40:80]))["input_ids"][:SHORT]
    batch = tokenizer.pad({"input_ids": [long_ids, short_ids]}, return_tensors="pt")
    with torch.no_grad():
        ref = base.generate(**batch, max_new_tokens=NEW, do_sample=False)  # [2, 480 + 96]
    rows = real_rows(ref, batch["attention_mask"], base.generation_config.eos_token_id)
    token_map = build_token_map([{"labels": r.tolist()} for r in rows], base.config.vocab_size, DRAFT)
    model = MedusaModel.from_base(base, num_heads=3, num_layers=1, token_map=token_map)
    fit_draft_heads(model, [r[-(NEW + 32):] for r in rows], steps=40)
    return model, batch, ref, rows


def test_model_is_gemma3_270m(gemma):
    model, _, _, _ = gemma
    cfg = model.base_model.config
    assert type(model.base_model).__name__ == "Gemma3ForCausalLM" and cfg.model_type == "gemma3_text"
    assert cfg.vocab_size == 262144 and cfg.sliding_window == 512
    assert set(cfg.layer_types) == {"full_attention", "sliding_attention"}
    gen = model.base_model.generation_config
    assert (gen.bos_token_id, gen.eos_token_id, gen.pad_token_id) == (2, 1, 0)
    source = json.loads((gemma3_dir() / models.MARKER).read_text())
    assert source["gguf_sha256"] == models.GEMMA3.gguf_sha256
    heads = sum(p.numel() for p in model.heads.parameters())
    assert heads < 0.1 * sum(p.numel() for p in model.base_model.parameters())


def test_greedy_equals_hf_across_the_window_batch_1(gemma):
    model, _, _, rows = gemma
    out = model.generate(rows[0][:PROMPT].view(1, -1), max_new_tokens=NEW, tree=MedusaTree.from_choices(TREE),
                         return_dict_in_generate=True)
    assert rows[0].numel() == PROMPT + NEW > model.base_model.config.sliding_window
    assert torch.equal(out.sequences[0], rows[0])
    assert max(out.accept_lengths[0]) >= 3 and out.tokens_per_step > 2.0  # the heads are accepted


def test_greedy_equals_hf_across_the_window_batch_2(gemma):
    model, batch, ref, _ = gemma
    out = model.generate(batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=NEW,
                         tree=MedusaTree.from_choices(TREE), return_dict_in_generate=True)
    assert torch.equal(out.sequences, ref)  # left padding (40 pads in row 1), holes where rows differ
    assert out.tokens_per_step > 2.0


def test_sliding_layers_see_only_their_window(gemma):
    """The 576-token sequence under the causal 4-D float mask through MedusaModel.forward gives the
    hidden states of the model's own forward (its 2-D mask, its sliding masks); the raw 4-D mask given to
    every layer does not."""
    model, _, _, rows = gemma
    ids = rows[0].view(1, -1)  # [1, 576]
    t = ids.shape[1]
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    mask4d = torch.where(causal, 0.0, torch.finfo(torch.float32).min).view(1, 1, t, t)  # [1, 1, T, T]
    body = decoder_of(model.base_model)
    with torch.no_grad():
        want = body(input_ids=ids).last_hidden_state[0, -64:]
        got = model(input_ids=ids, attention_mask=mask4d, compute_heads=False).hidden_states[0, -64:]
        raw = body(input_ids=ids, attention_mask=mask4d).last_hidden_state[0, -64:]
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)
    assert (raw - want).abs().max() > 1e-3


def test_draft_vocab_round_trip_save_load_vllm(gemma, tmp_path):
    from safetensors.torch import load_file

    from medusa.export import export_checkpoint

    model, _, _, rows = gemma
    model.save_pretrained(tmp_path / "heads")
    again = MedusaModel.from_pretrained(tmp_path / "heads", base_model=model.base_model)
    assert again.config.draft_vocab == DRAFT
    assert torch.equal(again.heads.token_map, model.heads.token_map)
    hidden = torch.randn(1, 5, model.base_model.config.hidden_size)
    with torch.no_grad():
        assert torch.equal(again.heads(hidden), model.heads(hidden))  # [K, 1, 5, V]
    export_checkpoint(str(tmp_path / "heads"), str(tmp_path / "vllm"), "vllm")
    cfg = json.loads((tmp_path / "vllm" / "config.json").read_text())
    # vLLM 0.32 loads no truncated vocabulary: full-vocabulary rows, the draft ones at their target ids
    sizes = (cfg["truncated_vocab_size"], cfg["vocab_size"], cfg["draft_vocab_size"])
    assert sizes == (262144, 262144, DRAFT)
    state = load_file(tmp_path / "vllm" / "model.safetensors")
    assert torch.equal(state["token_map"], model.heads.token_map)
    assert state["lm_heads.0.weight"].shape == (262144, model.base_model.config.hidden_size)
