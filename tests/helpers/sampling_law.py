"""The exact law of later tokens under HF sampling, and near-miss variants of lossless sampling.

:func:`pair_law` enumerates every continuation of a prompt over a tiny vocabulary with HF's own sampling
distributions (the processed, warped ``scores`` that ``generate(do_sample=True)`` samples from), EOS ending
a sequence, and returns the law of two consecutive new tokens; :func:`pair_counts` reads the same cells
off generated sequences. :func:`patch_sample_accept` swaps a broken variant of our recursive rejection
sampler in wherever the decoding package looks it up, so that a test can show its statistic rejects it.
"""

from __future__ import annotations

import inspect
import sys
import textwrap
from typing import Any

import torch


@torch.no_grad()
def hf_next_probs(base: Any, prefixes: torch.Tensor, mask: torch.Tensor, setting: dict[str, Any],
                  chunk: int = 8192) -> torch.Tensor:
    """HF's sampling distribution after each row of ``prefixes [R, T]`` (left-padding ``mask [R, T]``):
    ``generate(do_sample=True, **setting)``'s first ``output_scores``, softmaxed: ``[R, V]`` float64."""
    out = []
    for i in range(0, prefixes.shape[0], chunk):
        gen = base.generate(prefixes[i:i + chunk], attention_mask=mask[i:i + chunk], do_sample=True,
                            max_new_tokens=1, output_scores=True, return_dict_in_generate=True,
                            pad_token_id=0, **setting)
        out.append(torch.softmax(gen.scores[0].double(), dim=-1))  # [r, V]
    return torch.cat(out)


def pair_law(base: Any, prompt: torch.Tensor, mask: torch.Tensor, eos: int, setting: dict[str, Any],
             first: int = 5) -> torch.Tensor:
    """The law of new tokens ``first`` and ``first + 1`` after ``prompt [1, P]`` (``mask [1, P]``) under HF
    sampling, a sequence ending at its first ``eos``: ``[(V+1) * (V+1)]`` float64, cell ``a * (V+1) + b``,
    where token value ``V`` means "ended before this position" (:func:`pair_counts` is the same map)."""
    v = base.config.vocab_size
    keep = torch.tensor([t for t in range(v) if t != eos])  # [V-1] tokens that continue a sequence
    prefixes, pmask = prompt, mask
    mass = torch.ones(1, dtype=torch.float64)  # [R] probability of each live prefix
    ended = torch.zeros((), dtype=torch.float64)
    for _ in range(first - 1):  # new tokens 1 .. first-1
        q = hf_next_probs(base, prefixes, pmask, setting)  # [R, V]
        ended = ended + (mass * q[:, eos]).sum()
        mass = (mass.view(-1, 1) * q[:, keep]).reshape(-1)  # [R * (V-1)]
        prefixes, pmask = _extend(prefixes, pmask, keep)
    law = torch.zeros(v + 1, v + 1, dtype=torch.float64)
    law[v, v] = ended
    q = hf_next_probs(base, prefixes, pmask, setting)  # [R, V] token `first`
    law[eos, v] = (mass * q[:, eos]).sum()
    mass = (mass.view(-1, 1) * q[:, keep]).reshape(-1)  # [R * (V-1)]
    prefixes, pmask = _extend(prefixes, pmask, keep)
    q = hf_next_probs(base, prefixes, pmask, setting)  # [R * (V-1), V] token `first + 1`
    joint = (mass.view(-1, 1) * q).view(-1, len(keep), v).sum(dim=0)  # [V-1, V]
    law[keep, :v] = joint
    return law.view(-1)


def _extend(prefixes: torch.Tensor, mask: torch.Tensor, tokens: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Every row followed by every token: ``[R, T] -> [R * len(tokens), T + 1]`` (row-major)."""
    r, k = prefixes.shape[0], tokens.numel()
    rows = prefixes.repeat_interleave(k, dim=0)  # [R * k, T]
    new = tokens.repeat(r).view(-1, 1)  # [R * k, 1]
    masks = mask.repeat_interleave(k, dim=0)  # [R * k, T]
    return torch.cat([rows, new], dim=1), torch.cat([masks, torch.ones_like(new)], dim=1)


def pair_counts(new_tokens: torch.Tensor, eos: int, vocab: int, first: int = 5) -> torch.Tensor:
    """Counts of :func:`pair_law`'s cells in ``new_tokens [n, >= first + 1]`` (the generated part of each
    row, padded after its EOS however the generator pads): ``[(V+1) * (V+1)]`` float64."""
    is_eos = (new_tokens == eos).long()
    ended = (is_eos.cumsum(dim=1) - is_eos) > 0  # [n, T] an EOS came strictly before this position
    y = torch.where(ended, torch.full_like(new_tokens, vocab), new_tokens)
    cells = y[:, first - 1] * (vocab + 1) + y[:, first]  # [n]
    return torch.zeros((vocab + 1) ** 2, dtype=torch.float64).index_add_(
        0, cells, torch.ones(cells.numel(), dtype=torch.float64))


# Recursive rejection sampling accepts a sibling with probability p_res(x) / sum(p_res): the rejected
# siblings' mass is removed and the residual renormalised. The near miss forgets the renormalisation.
UNRENORMALISED = ("u * p.sum(dim=-1) < p_tok", "u < p_tok")


def sample_accept_variant(old: str, new: str) -> Any:
    """``medusa.decoding.acceptance.sample_accept`` with one expression replaced (a fault to inject)."""
    from medusa.decoding import acceptance

    source = textwrap.dedent(inspect.getsource(acceptance.sample_accept))
    assert source.count(old) == 1, f"sample_accept no longer contains {old!r}: update the variant"
    namespace = dict(vars(acceptance))
    exec(compile(source.replace(old, new), acceptance.__file__, "exec"), namespace)
    return namespace["sample_accept"]


def patch_sample_accept(monkeypatch: Any, replacement: Any) -> int:
    """Replace ``sample_accept`` in every loaded ``medusa`` module that imported it; returns how many."""
    from medusa.decoding import acceptance

    original = acceptance.sample_accept
    modules = [m for name, m in list(sys.modules.items())
               if name.split(".")[0] == "medusa" and getattr(m, "sample_accept", None) is original]
    for module in modules:
        monkeypatch.setattr(module, "sample_accept", replacement)
    return len(modules)
