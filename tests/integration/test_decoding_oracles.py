"""Decoding-level checks, through ``model.generate`` only, that see the bugs greedy equality cannot:
typical acceptance's threshold sign (a draft token inside the band where ``exp(-H)`` and ``exp(+H)``
disagree), and the lookup chain's structure and validity (tokens per step equal an oracle that rebuilds the
chain from the context: a chain hung from the wrong node gains less, an unmatched node accepted gains
more)."""

from __future__ import annotations

import torch

from medusa import MedusaModel, MedusaTree
from medusa.modeling.base import lm_head_of

from tiny_models import tiny_model

MAX_NGRAM = 3  # the lookup's documented longest suffix (medusa.decoding.lookup)


def test_typical_acceptance_accepts_a_token_inside_the_sign_band():
    """A base model with uniform next-token distributions: every draft token has p = 1/V and H = log V, so
    the threshold ``min(eps, delta * exp(-H)) = delta / V`` (delta = 0.5) accepts it while the flipped
    ``min(eps, delta * exp(+H)) = 1`` (eps = 1) would reject it: every step gains the whole chain."""
    base = tiny_model("llama")
    with torch.no_grad():
        lm_head_of(base).weight.zero_()  # logits 0: p = 1/V exactly, at every node
    model = MedusaModel.from_base(base, num_heads=3, num_layers=1)
    tree = MedusaTree.from_choices([[0], [0, 0], [0, 0, 0]])
    ids = torch.tensor([[5, 9, 17, 33]])
    v = base.config.vocab_size
    assert 1 / v > 0.5 * torch.exp(-torch.log(torch.tensor(float(v)))) and 1 / v < min(1.0, 0.5 * v)
    torch.manual_seed(0)
    out = model.generate(ids, max_new_tokens=16, acceptance="typical", posterior_threshold=1.0,
                         posterior_alpha=0.5, tree=tree, return_dict_in_generate=True)
    gained = [int(n) for n in out.accept_lengths[0] if int(n) > 0]
    assert gained[:3] == [4, 4, 4], gained  # the 3 drafts and the next token, every step
    # the control: delta = 1.5 puts p = 1/V below delta * exp(-H) = 1.5 / V: every draft rejected
    out = model.generate(ids, max_new_tokens=8, acceptance="typical", posterior_threshold=1.0,
                         posterior_alpha=1.5, tree=tree, return_dict_in_generate=True)
    assert set(int(n) for n in out.accept_lengths[0] if int(n) > 0) == {1}


def _oracle_lookup_gains(seq: list[int], prompt_len: int, new: int, length: int) -> list[int]:
    """Tokens gained per step by greedy decoding with a lookup chain alone, rebuilt from its definition:
    the context's longest suffix (n = 3 .. 1) found at its most recent earlier occurrence proposes the
    ``length`` tokens that followed it (only those already in the context: the rest are invalid, never
    accepted); the step accepts the chain's longest prefix equal to the greedy continuation, plus one."""
    gains, end = [], prompt_len + 1  # the first new token (the root) comes from the prefill
    produced = 1
    while produced < new:
        ctx = seq[:end]
        start = -1
        for n in range(1, MAX_NGRAM + 1):
            if len(ctx) < n:
                break
            suffix = ctx[-n:]
            hits = [i + n for i in range(len(ctx) - n) if ctx[i:i + n] == suffix]
            if hits:
                start = max(hits)
        chain = [ctx[p] for p in range(start, min(start + length, end))] if start >= 0 else []
        k = 0
        while k < len(chain) and end + k < len(seq) and chain[k] == seq[end + k]:
            k += 1
        k = min(k, new - produced - 1)
        gains.append(k + 1)
        produced += k + 1
        end += k + 1
    return gains


def _prompt_where_an_unmatched_chain_would_be_right(base, v: int) -> torch.Tensor:
    """A prompt (seeded search) whose first step has no lookup match (its chain: invalid 0s) while the
    greedy token after the root is 0: accepting an invalid node would be seen there."""
    g = torch.Generator().manual_seed(11)
    for _ in range(400):
        prompt = torch.randint(3, v, (1, 6), generator=g)
        ref = base.generate(prompt, do_sample=False, max_new_tokens=2, pad_token_id=0)[0].tolist()
        root, after = ref[6], ref[7]
        if after == 0 and root not in prompt[0].tolist():
            return prompt
    raise AssertionError("no prompt found: the search space is too small for this tiny model")


def test_lookup_chain_gains_exactly_what_its_definition_allows():
    base = tiny_model("llama", seed=2)
    model = MedusaModel.from_base(base, num_heads=2, num_layers=1)
    v = base.config.vocab_size
    g = torch.Generator().manual_seed(7)
    repeating = torch.randint(3, v, (1, 7), generator=g).repeat(1, 3)  # the model falls into a cycle
    prompts = [repeating, _prompt_where_an_unmatched_chain_would_be_right(base, v)]
    for prompt, new, length in ((repeating, 40, 5), (prompts[1], 24, 4)):
        ref = base.generate(prompt, do_sample=False, max_new_tokens=new, pad_token_id=0)
        out = model.generate(prompt, max_new_tokens=new, tree="lookup", lookup_tokens=length,
                             return_dict_in_generate=True)
        assert torch.equal(out.sequences, ref)
        seq = ref[0].tolist()
        want = _oracle_lookup_gains(seq, prompt.shape[1], new, length)
        got = [int(n) for n in out.accept_lengths[0] if int(n) > 0]
        assert got == want, (got, want)
        if prompt is repeating:
            assert max(want) == length + 1  # whole chains accepted: the chain's parents are checked
        else:
            assert want[0] == 1  # the unmatched first step gains one token, though its 0s would be right
