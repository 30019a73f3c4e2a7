"""Decoding-level checks, through ``model.generate`` only, that see the bugs greedy equality cannot:
typical acceptance's threshold sign (a draft token inside the band where ``exp(-H)`` and ``exp(+H)``
disagree), and the lookup chain's structure and validity, alone and merged into the heads' tree (tokens per
step equal an oracle that rebuilds the chain, the heads' candidates and their merge from their definitions: a
chain hung from the wrong node gains less, an unmatched node accepted gains more)."""

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


def _lookup(ctx: list[int], length: int) -> list[int | None]:
    """The lookup chain of context ``ctx`` by its definition: the ``length`` tokens after the most recent
    earlier occurrence of its longest suffix (n = 3 .. 1); None where the context ends or nothing matched."""
    start = -1
    for n in range(1, MAX_NGRAM + 1):
        hits = [i + n for i in range(len(ctx) - n) if ctx[i:i + n] == ctx[-n:]] if len(ctx) >= n else []
        start = max(hits) if hits else start
    return [ctx[p] if 0 <= start and p < len(ctx) else None for p in range(start, start + length)]


def _candidates(model: MedusaModel, seq: list[int], end: int, choices: list[list[int]],
                lookup: int) -> list[list[int]]:
    """Every candidate path (tokens after the root) of one hybrid step, from the definitions: the heads' paths
    (head d's rank-r token from the hidden state before the root, ``seq[end - 1]``), and the lookup chain of
    ``seq[:end]`` merged where its first m tokens follow a heads path: its next ``lookup`` tokens hang from
    that path's node (an unmatched chain, from the root), cut at its first invalid token."""
    with torch.no_grad():
        heads = model(input_ids=torch.tensor([seq[:end - 1]])).head_logits[:, 0, -1]  # [K, V]
    ranked = heads.argsort(dim=-1, descending=True).tolist()
    paths = [[ranked[d][r] for d, r in enumerate(c)] for c in choices]
    depth = max(len(c) for c in choices)
    chain = _lookup(seq[:end], depth + lookup)
    m = 0
    while m < depth and chain[m] is not None and chain[:m + 1] in paths:
        m += 1
    tail = chain[m:m + lookup]
    tail = tail[:tail.index(None)] if None in tail else tail
    return paths + [chain[:m] + tail]


def _oracle_hybrid_gains(model: MedusaModel, seq: list[int], prompt_len: int, new: int,
                         choices: list[list[int]], lookup: int) -> tuple[list[int], int]:
    """Tokens gained per step by greedy decoding with the hybrid tree, step by step: the longest candidate
    prefix equal to the greedy continuation, plus one. Also counts the steps whose best path was a merged
    chain running past the heads' tree (what a chain hung from the wrong node would lose)."""
    gains, end, produced, merged = [], prompt_len + 1, 1, 0
    while produced < new:
        best, via_chain = 0, False
        for i, path in enumerate(_candidates(model, seq, end, choices, lookup)):
            k = 0
            while k < len(path) and end + k < len(seq) and path[k] == seq[end + k]:
                k += 1
            if k > best or (k == best and i == len(choices)):
                best, via_chain = k, i == len(choices)
        merged += via_chain and best > 1 and best > max(len(c) for c in choices) - 1
        k = min(best, new - produced - 1)
        gains.append(k + 1)
        produced, end = produced + k + 1, end + k + 1
    return gains, merged


def _prompt_where_an_invalid_chain_node_would_be_right(model: MedusaModel, choices: list[list[int]]
                                                       ) -> torch.Tensor:
    """A prompt (seeded search) whose first hybrid step has no lookup match (its chain: invalid 0s, hung from
    the root) while the greedy token after the root is 0 and no heads' path starts with 0: accepting an
    invalid chain node would gain a token there."""
    g = torch.Generator().manual_seed(13)
    for _ in range(2000):
        prompt = torch.randint(3, 16, (1, 6), generator=g)
        seq = model.base_model.generate(prompt, do_sample=False, max_new_tokens=2, pad_token_id=0)[0].tolist()
        if seq[7] != 0 or seq[6] in seq[:6]:
            continue
        if all(path[:1] != [0] for path in _candidates(model, seq, 7, choices, 1)[:-1]):
            return prompt
    raise AssertionError("no prompt found: the search space is too small for this tiny model")


def test_hybrid_tree_gains_exactly_what_its_definition_allows():
    """The heads' tree plus a lookup chain merged into it, checked step by step against the oracle above: a
    chain hung from the root instead of its merge node, or an invalid chain node accepted, changes tokens per
    step. Mutations of medusa.decoding.lookup.hybrid_tree tried by hand, each failing this test: the chain
    hung from the root, or from its merge node's parent, and every chain node taken as valid."""
    base = tiny_model("llama", seed=3, vocab_size=16)  # a small vocabulary: the chain often meets the heads
    model = MedusaModel.from_base(base, num_heads=2, num_layers=1)
    torch.manual_seed(5)
    with torch.no_grad():  # heads that disagree with the base (fresh heads copy its LM head)
        for p in model.heads.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    choices = [[0], [1], [2], [3], [4], [5], [0, 0], [1, 0], [0, 1], [2, 0]]
    tree = MedusaTree.from_choices(choices)
    g = torch.Generator().manual_seed(1)
    merged_total = 0
    repeating = torch.randint(3, 16, (1, 5), generator=g).repeat(1, 3)
    unmatched = _prompt_where_an_invalid_chain_node_would_be_right(model, choices)
    matched = next(p for p in (torch.randint(3, 16, (1, 9), generator=g) for _ in range(100))
                   if int(base.generate(p, do_sample=False, max_new_tokens=1, pad_token_id=0)[0, -1]) in p)
    # a batch: the other row's valid chain keeps chain nodes in the first step (the eager step trims them to
    # the batch's longest valid chain), so the unmatched row's invalid 0s are verified beside it
    pair = torch.cat([torch.cat([torch.zeros(1, 3, dtype=torch.long), unmatched], dim=1), matched])
    mask = torch.cat([torch.cat([torch.zeros(1, 3), torch.ones(1, 6)], dim=1), torch.ones(1, 9)]).long()
    for prompt, attention, new, lookup in ((repeating, None, 40, 4),
                                           (torch.randint(3, 16, (1, 9), generator=g), None, 32, 3),
                                           (pair, mask, 16, 3)):
        ref = base.generate(prompt, attention_mask=attention, do_sample=False, max_new_tokens=new,
                            pad_token_id=0)
        out = model.generate(prompt, attention_mask=attention, max_new_tokens=new, tree=tree,
                             lookup_tokens=lookup, return_dict_in_generate=True)
        assert torch.equal(out.sequences, ref)
        for row in range(prompt.shape[0]):
            pad = 0 if attention is None else int((attention[row] == 0).sum())
            seq = ref[row, pad:].tolist()
            want, merged = _oracle_hybrid_gains(model, seq, prompt.shape[1] - pad, new, choices, lookup)
            got = [int(n) for n in out.accept_lengths[row] if int(n) > 0]
            assert got == want, (row, got, want)
            merged_total += merged
    assert merged_total >= 1  # some step's best path ran through a merged chain past the heads' tree
