"""Shared helpers for the decoding tests: left-padded batches, heads that are accepted often, a tiny llama
with fitted heads, the vocabulary-8 samplers of the chi-square tests and the settings several test modules
share."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from medusa import MedusaModel
from medusa.decoding.acceptance import greedy_accept
from medusa.decoding.generate import prefill
from medusa.decoding.proposals import choose_proposer
from medusa.decoding.step import step
from medusa.decoding.tree_option import DynamicTreeOption, TreeChoice
from medusa.decoding.trees import static_tree
from medusa.tree import default_tree

from tiny_models import tiny_model

FITTED_NEW = 48  # new tokens of fitted_llama's references
SAMPLER_VOCAB = 8  # the chi-square samplers' vocabulary: their joint laws are enumerated exactly
# A static tree covering the sampler's vocabulary at depth 1 (and under rank 0 at depth 2).
FULL_TREE = ([[r] for r in range(SAMPLER_VOCAB)] + [[0, r] for r in range(SAMPLER_VOCAB)]
             + [[1, 0], [1, 1], [0, 0, 0]])
# Hydra heads / dynamic trees on the static and compiled paths (stories260K with fitted heads). SCORE: a
# calibrated path score (medusa.tree.path_score's record; depth 4 scored raw).
SCORE = {"weight": [2.0, 1.5, 1.2, 1.0], "bias": [1.0, 0.5, 0.2, 0.0], "positions": [99] * 4, "raw": [3]}
COMBOS = [("hydra", None), ("hydra", "dynamic:16"), ("linear", "dynamic:16"),
          ("linear", DynamicTreeOption(num_nodes=48, branch=8)),
          ("hydra", DynamicTreeOption(num_nodes=16, score=SCORE))]
COMBO_IDS = ["hydra-static", "hydra-dynamic16", "medusa-dynamic16", "medusa-dynamic48-branch8",
             "hydra-calibrated16"]


def left_padded_batch(vocab_size: int, lengths=(9, 6, 4), seed: int = 0, pad_id: int = 0):
    """``input_ids [B, P]`` (left-padded) and ``attention_mask [B, P]``; tokens avoid 0..2 (pad/bos/eos)."""
    g = torch.Generator().manual_seed(seed)
    p = max(lengths)
    ids = torch.full((len(lengths), p), pad_id, dtype=torch.long)
    mask = torch.zeros(len(lengths), p, dtype=torch.long)
    for row, n in enumerate(lengths):
        ids[row, p - n:] = torch.randint(3, vocab_size, (n,), generator=g)
        mask[row, p - n:] = 1
    return ids, mask


def randomize_heads(model: MedusaModel, seed: int = 0, std: float = 0.5) -> MedusaModel:
    """Heads that are no longer copies of the LM head: random ResBlock weights (rarely accepted)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.heads.parameters():
            if p.dim() == 2 and p.shape[0] == p.shape[1]:
                p.copy_(torch.randn(p.shape, generator=g) * std)
    return model


def memorise_heads(model: MedusaModel, sequences: list[torch.Tensor], steps: int = 300,
                   seed: int = 0) -> None:
    """Fit the heads (in place) to predict the given real-token sequences: head k at t -> token t+k+2.

    Trained on the model's own greedy continuations of the test prompts, the heads are then accepted
    often, so long accepted runs and cache compaction get exercised. Hydra heads are teacher-forced on
    the sequences' own tokens.
    """
    from medusa.modeling.base import decoder_of

    torch.manual_seed(seed)
    feats: list[list[torch.Tensor]] = [[] for _ in range(model.num_heads)]
    targets: list[list[torch.Tensor]] = [[] for _ in range(model.num_heads)]
    with torch.no_grad():
        for seq in sequences:
            hidden = decoder_of(model.base_model)(input_ids=seq.view(1, -1)).last_hidden_state  # [1, T, d]
            hidden = model.heads.teacher_inputs(hidden, seq.view(1, -1))  # Hydra: [1, T, d * (K+1)]
            hidden = hidden[0]
            for k in range(model.num_heads):
                shift = k + 2
                if seq.numel() > shift:
                    feats[k].append(hidden[:-shift])
                    targets[k].append(seq[shift:])
    opt = torch.optim.Adam(model.heads.parameters(), lr=3e-2)
    xs = [torch.cat(f) for f in feats]
    ys = [torch.cat(t) for t in targets]
    with torch.enable_grad():
        for _ in range(steps):
            loss = sum(F.cross_entropy(model.heads.head_logits(k, xs[k]), ys[k])
                       for k in range(model.num_heads))
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.heads.eval()


def real_rows(sequences: torch.Tensor, prompt_mask: torch.Tensor,
              eos_id: int | None = None) -> list[torch.Tensor]:
    """Each row of HF generate output without its left padding (and cut after the first EOS)."""
    rows = []
    p = prompt_mask.shape[1]
    for row in range(sequences.shape[0]):
        prompt = sequences[row, :p][prompt_mask[row].bool()]
        new = sequences[row, p:]
        if eos_id is not None and (new == eos_id).any():
            new = new[: int((new == eos_id).nonzero()[0]) + 1]
        rows.append(torch.cat([prompt, new]))
    return rows


def stories_left_padded():
    """Three stories260K prompts, left-padded: ``(encoding, pad id)``."""
    from fit_heads import stories_prompts
    from tiny_models import stories_tokenizer

    tok = stories_tokenizer()
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.unk_token or tok.eos_token
    enc = tok(stories_prompts(3), return_tensors="pt", padding=True)
    assert (enc["attention_mask"] == 0).any()  # a real left-padded batch
    return enc, tok.pad_token_id


def check_stories_greedy(model: MedusaModel, tree, new: int = 96, min_tokens_per_step: float = 1.8, **path):
    """Greedy MEDUSA == HF greedy ``generate`` (``torch.equal``) on :func:`stories_left_padded` and on its
    third prompt alone, with long accepted runs (>= 4: cache compaction exercised) and more than
    ``min_tokens_per_step``; ``path``: e.g. ``cache_implementation`` / ``compile``. Returns
    ``(batch output, HF batch reference, encoding)``."""
    base = model.base_model
    enc, pad = stories_left_padded()
    ref = base.generate(**enc, do_sample=False, max_new_tokens=new, pad_token_id=pad)
    out = model.generate(enc["input_ids"], attention_mask=enc["attention_mask"], max_new_tokens=new,
                         tree=tree, return_dict_in_generate=True, **path)
    assert torch.equal(out.sequences, ref)
    one = model.generate(enc["input_ids"][2:], max_new_tokens=new, tree=tree, return_dict_in_generate=True,
                         **path)
    assert torch.equal(one.sequences, base.generate(enc["input_ids"][2:], do_sample=False,
                                                    max_new_tokens=new))
    assert max(max(a) for a in out.accept_lengths) >= 4
    assert out.tokens_per_step > min_tokens_per_step and one.tokens_per_step > min_tokens_per_step, (
        out.tokens_per_step, one.tokens_per_step)
    return out, ref, enc


def fitted_llama(seed: int = 0, new: int = FITTED_NEW, **gen):
    """A tiny llama, its HF greedy references (left-padded batch and row 0 alone) and heads fitted on them."""
    base = tiny_model("llama")
    for key, value in gen.items():
        setattr(base.generation_config, key, value)
    ids, mask = left_padded_batch(base.config.vocab_size, seed=seed)
    ref = base.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=new)
    ref1 = base.generate(ids[:1], do_sample=False, max_new_tokens=new)
    model = MedusaModel.from_base(base, num_heads=4)
    memorise_heads(model, real_rows(ref, mask, base.generation_config.eos_token_id), steps=150)
    return model, ids, mask, ref, ref1


def sampler_model(seed: int = 0):
    """A tiny llama over :data:`SAMPLER_VOCAB` tokens with a softened LM head (many tokens have real mass)
    and 3 MEDUSA heads with random ResBlocks: ``(base, model)``."""
    base = tiny_model("llama", vocab_size=SAMPLER_VOCAB, seed=seed)
    with torch.no_grad():  # soften the scaled LM head so that many tokens have real mass
        base.lm_head.weight.mul_(0.3)
    model = MedusaModel.from_base(base, num_heads=3)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.heads.parameters():
            if p.dim() == 2 and p.shape[0] == p.shape[1]:
                p.copy_(torch.randn(p.shape, generator=g))
    return base, model


def sampler_heads(head_type: str):
    """As :func:`sampler_model` (seed 0) with 3 heads of ``head_type``: every square or input layer of the
    heads (not their output projection) random: ``(base, model)``."""
    base = tiny_model("llama", vocab_size=SAMPLER_VOCAB, seed=0)
    with torch.no_grad():  # soften the scaled LM head so that many tokens have real mass
        base.lm_head.weight.mul_(0.3)
    model = MedusaModel.from_base(base, num_heads=3, head_type=head_type)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.heads.parameters():
            if p.dim() == 2 and p.shape[0] != SAMPLER_VOCAB:  # ResBlocks / Hydra input layers, not W2
                p.copy_(torch.randn(p.shape, generator=g))
    return base, model


def hf_next_probs(base, prefixes: torch.Tensor) -> torch.Tensor:
    """HF's own sampling distribution after each row of ``prefixes [R, T]``: the processed, warped scores that
    ``generate(do_sample=True)`` samples from (its ``output_scores``), read from the model's
    generation_config. Returns ``[R, V]``."""
    with torch.no_grad():
        out = base.generate(prefixes, attention_mask=torch.ones_like(prefixes), do_sample=True,
                            max_new_tokens=1,
                            output_scores=True, return_dict_in_generate=True, eos_token_id=None,
                            pad_token_id=0)
    return torch.softmax(out.scores[0].double(), dim=-1)  # [R, V]


def exact_joint3(base, prompt: torch.Tensor) -> torch.Tensor:
    """p(x1, x2, x3 | prompt) from HF's sampling distributions over :data:`SAMPLER_VOCAB`: [V, V, V]."""
    v = SAMPLER_VOCAB
    p1 = hf_next_probs(base, prompt)[0]  # [V]
    x1 = torch.arange(v).view(v, 1)
    p2 = hf_next_probs(base, torch.cat([prompt.repeat(v, 1), x1], dim=1))  # [V, V]
    x12 = torch.stack(torch.meshgrid(torch.arange(v), torch.arange(v), indexing="ij"), -1).view(v * v, 2)
    p3 = hf_next_probs(base, torch.cat([prompt.repeat(v * v, 1), x12], dim=1)).view(v, v, v)
    return p1.view(v, 1, 1) * p2.view(v, v, 1) * p3


def check_compaction_equals_prefill(arch: str, new_cache=None):
    """12 greedy steps over a left-padded batch of 3 (rows 0-1 memorised by the heads, row 2 not: uneven
    accepts, holes in the cache) through ``medusa.decoding.step.step`` on the cache ``new_cache(ids, dt)``
    builds (None: the default DynamicCache); then each row's valid cache entries equal a fresh prefill over
    the same tokens, which are HF's greedy tokens. Returns the final DecodeState for cache-specific checks."""
    base = tiny_model(arch)
    ids, mask = left_padded_batch(base.config.vocab_size, seed=11)
    ref = base.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=60, eos_token_id=None)
    model = MedusaModel.from_base(base, num_heads=4)
    memorise_heads(model, real_rows(ref, mask)[:2], steps=30)  # row 2 unknown to the heads: uneven accepts
    dt = static_tree(default_tree(4, 64), torch.device("cpu"), torch.float32)
    with torch.no_grad():
        proposer = choose_proposer(model.heads, TreeChoice(static=default_tree(4, 64)), torch.device("cpu"),
                                   torch.float32)
        state = prefill(model, ids, mask, proposer,
                        new_cache=None if new_cache is None else new_cache(ids, dt))
        cached = [ids[row][mask[row].bool()].tolist() for row in range(3)]  # tokens in each row's cache
        kept = []
        for _ in range(12):
            result = step(model, state, lambda lg, tk, tr, q=None: greedy_accept(lg, tk, tr))
            kept.append(result.kept.tolist())
            for row in range(3):
                cached[row] += result.tokens[row, :kept[-1][row]].tolist()
    assert max(max(k) for k in kept) >= 4  # long accepted runs
    assert any(len(set(k)) > 1 for k in kept), kept  # rows kept different counts: holes in the cache
    valid = state.cache.valid  # [B, used columns]
    assert valid.sum(-1).tolist() == [len(c) for c in cached] == state.n_valid.tolist()
    for row in range(3):
        seq = torch.tensor([cached[row]])
        assert seq[0].tolist() == real_rows(ref, mask)[row][:seq.shape[1]].tolist()  # greedy tokens
        fresh = base(input_ids=seq, use_cache=True).past_key_values
        for layer, fresh_layer in zip(state.cache.hf.layers, fresh.layers):
            for name in ("keys", "values"):
                ours = getattr(layer, name)[row][:, :valid.shape[1]][:, valid[row]]  # [H, T_row, hd]
                torch.testing.assert_close(ours, getattr(fresh_layer, name)[0], rtol=1e-4, atol=1e-5)
    return state


def greedy_examples(model, tokenizer, prompts, new_tokens):
    """Calibration examples from the base model's own greedy continuations of ``prompts`` (``input_ids`` and
    ``labels``, the prompt masked): on them calibration's replay predicts decoding's tokens/step exactly."""
    rows = []
    for p in prompts:
        ids = tokenizer(p, return_tensors="pt").input_ids  # [1, P]
        with torch.no_grad():
            out = model.base_model.generate(ids, max_new_tokens=new_tokens, do_sample=False)
        seq, n = out[0].tolist(), ids.shape[1]
        rows.append({"input_ids": seq, "labels": [-100] * n + seq[n:]})
    return rows
