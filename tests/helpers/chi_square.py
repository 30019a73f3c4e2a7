"""Chi-square goodness of fit for the lossless-sampling tests, and the exact two-token joint they
compare to."""

import torch


def chi2_sf(stat: float, dof: int) -> float:
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64),
                                         torch.tensor(stat / 2.0, dtype=torch.float64)))


def chi2_pvalue(counts: torch.Tensor, expected: torch.Tensor, strict: bool = True) -> float:
    """Pearson chi-square; cells expected < 5 are pooled into one. A sample in a zero-probability cell fails
    (``strict``) or gives p-value 0."""
    small = expected < 5
    obs = torch.cat([counts[~small], counts[small].sum().view(1)])
    exp = torch.cat([expected[~small], expected[small].sum().view(1)])
    keep = exp > 0
    if not strict and not torch.all(obs[~keep] == 0):
        return 0.0
    assert torch.all(obs[~keep] == 0), "a token with zero probability was sampled"
    obs, exp = obs[keep], exp[keep]
    stat = float(((obs - exp) ** 2 / exp).sum())
    return chi2_sf(stat, int(keep.sum()) - 1)


def exact_joint(base, prompt, warp):
    """p(x1, x2) = p(x1 | prompt) p(x2 | prompt, x1) under the warped (processed) distribution: [V, V]."""
    with torch.no_grad():
        p1 = torch.softmax(warp(base(prompt).logits[0, -1]), -1)  # [V]
        v = base.config.vocab_size
        ext = torch.cat([prompt.repeat(v, 1), torch.arange(v).view(v, 1)], dim=1)  # [V, P+1]
        p2 = torch.softmax(warp(base(ext).logits[:, -1]), -1)  # [V, V]
    return (p1.view(v, 1) * p2).double()
