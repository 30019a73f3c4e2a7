"""Lossless sampling after several verification steps: the law of new tokens 5 and 6 (decided at the second
step or later, after cache compactions) of a left-padded batch of different prompts, EOS on, equals HF's
``generate(do_sample=True)`` law enumerated exactly over a tiny vocabulary from HF's own scores — with
heads fitted so that deep tree paths are accepted (asserted), for static and dynamic trees, MEDUSA and
Hydra heads, the static-cache and compiled paths. A near miss (recursive rejection sampling without
renormalising the residual) is rejected by the same test at the same sample size."""

from __future__ import annotations

import pytest
import torch
from chi_square import chi2_pvalue
from decoding_helpers import left_padded_batch
from sampling_law import UNRENORMALISED, pair_counts, pair_law, patch_sample_accept, sample_accept_variant

from medusa import MedusaModel, MedusaTree
from medusa.decoding.tree_option import DynamicTreeOption

from fit_heads import fit_heads
from tiny_models import tiny_model

V = 8
EOS = 2  # the tiny models' eos_token_id, left on (from the generation_config)
FIRST = 5  # the law of new tokens 5 and 6
ROWS = 3000  # samples per prompt
# Depth 2 (so the first step emits tokens 2..4 at most): new token 5 is decided at the second step or later.
STATIC = MedusaTree.from_choices([[0], [1], [2], [0, 0], [0, 1], [1, 0]])
DYNAMIC = DynamicTreeOption(num_nodes=8, depth=2, branch=3)


@pytest.fixture(scope="module")
def sampler():
    """One tiny llama (vocab 8), MEDUSA and Hydra heads (2 heads) fitted on its own samples, and three
    different prompts, left-padded."""
    base = tiny_model("llama", vocab_size=V, seed=0)
    with torch.no_grad():  # sharpen the LM head: entropy ~1.3 nats, so fitted heads are accepted often
        base.lm_head.weight.mul_(4.0)
    torch.manual_seed(0)
    prompts = torch.randint(3, V, (512, 4))
    samples = base.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=True, top_k=0,
                            max_new_tokens=12, eos_token_id=None, pad_token_id=0)  # [512, 16]
    heads = {}
    for head_type in ("linear", "hydra"):
        model = MedusaModel.from_base(base, num_heads=2, head_type=head_type)
        model.freeze_base()
        fit_heads(model, samples, steps=300)
        heads[head_type] = model.eval()
    ids, mask = left_padded_batch(V, lengths=(6, 4, 3), seed=1)  # [3, 6]
    return base, heads, ids, mask


def _sample(model, ids, mask, tree, setting, seed=1, **path):
    """ROWS samples of each prompt (one left-padded batch of 3 * ROWS rows), 6 new tokens."""
    return model.generate(ids.repeat_interleave(ROWS, 0), attention_mask=mask.repeat_interleave(ROWS, 0),
                          max_new_tokens=FIRST + 1, acceptance="sample", tree=tree,
                          generator=torch.Generator().manual_seed(seed), return_dict_in_generate=True,
                          **setting, **path)


def _pvalue(base, ids, mask, out, setting) -> float:
    """One chi-square over the three prompts' (token 5, token 6) cells against HF's exact laws (degrees of
    freedom counted as for one multinomial: conservative by 2)."""
    new = out.sequences[:, ids.shape[1]:]
    counts, expected = [], []
    for j in range(ids.shape[0]):
        counts.append(pair_counts(new[j * ROWS:(j + 1) * ROWS], EOS, V, FIRST))
        expected.append(pair_law(base, ids[j:j + 1], mask[j:j + 1], EOS, setting, FIRST) * ROWS)
    assert all(c[-1] > 0 for c in counts)  # (ended, ended): rows did stop at EOS before token 5
    return chi2_pvalue(torch.cat(counts), torch.cat(expected), strict=False)


def _check_accepted(out):
    """Deep paths accepted: many steps keep 2 tree nodes + the bonus token (3 tokens), and token 5 is
    decided at the second step for some rows, later for others."""
    lengths = [a for a in out.accept_lengths if a]
    full = sum(1 for a in lengths if 3 in a) / len(lengths)
    assert full > 0.3, full
    step_of_5 = [next(s for s in range(len(a)) if 1 + sum(a[:s + 1]) >= FIRST) for a in lengths
                 if 1 + sum(a) >= FIRST]  # 0-based step that emitted new token 5
    assert min(step_of_5) >= 1 and step_of_5.count(1) > 0.2 * len(step_of_5)
    assert sum(s >= 2 for s in step_of_5) > 0.05 * len(step_of_5)


CASES = {
    "medusa-static-processors": ("linear", STATIC, {"temperature": 0.8, "repetition_penalty": 1.3}, {}),
    "medusa-dynamic-topp": ("linear", DYNAMIC, {"top_p": 0.9}, {}),
    "hydra-static": ("hydra", STATIC, {}, {}),
    "hydra-dynamic-static-cache": ("hydra", DYNAMIC, {"temperature": 1.2, "top_k": 5},
                                   {"cache_implementation": "static"}),
    "medusa-static-compiled": ("linear", STATIC, {}, {"compile": True}),
    "medusa-dynamic-compiled": ("linear", DYNAMIC, {"temperature": 0.8}, {"compile": True}),
}
SLOW = {"medusa-dynamic-compiled"}  # CPU inductor compiles the dynamic tree's proposal step too


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW else c for c in CASES])
def test_later_tokens_follow_hf_law(sampler, case):
    base, heads, ids, mask = sampler
    head_type, tree, setting, path = CASES[case]
    if path.get("compile"):
        torch._dynamo.reset()  # compiled here, within dynamo's recompile limit, whatever ran before
    try:
        out = _sample(heads[head_type], ids, mask, tree, setting, **path)
    finally:
        torch._dynamo.reset()
    assert out.compile_time_s > 0 if path.get("compile") else out.compile_time_s == 0
    _check_accepted(out)
    p = _pvalue(base, ids, mask, out, setting)
    assert p > 1e-3, p


def test_near_miss_unrenormalised_residual_is_rejected(sampler, monkeypatch):
    """Forgetting to renormalise the residual between siblings: the same test at the same sample size
    rejects it."""
    base, heads, ids, mask = sampler
    assert patch_sample_accept(monkeypatch, sample_accept_variant(*UNRENORMALISED)) >= 1
    out = _sample(heads["linear"], ids, mask, STATIC, {})
    _check_accepted(out)  # still accepts deep paths: only the law is wrong
    p = _pvalue(base, ids, mask, out, {})
    assert p < 1e-6, p
