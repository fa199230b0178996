"""The Bayes attackers' toy mechanism, shared by their tests: 5 words in 2-D, the exact
likelihood p(w' | w) by numerical integration, and priors with a chosen posterior ratio."""

from __future__ import annotations

import torch

# 5 words in 2-D: 0 and 1 are close, 3 and 4 far from both
EMB = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.2], [2.5, 0.5], [1.5, 2.0]])
ETA = 1.5


def exact_likelihood(emb: torch.Tensor, eta: float, n: int = 1601, radius: float = 16.0):
    """p(w' | w) (V, V) by a Riemann sum of the 2-D noise density η²/(2π)·exp(−η‖z‖) over
    the Voronoi cells: an independent check of the Monte-Carlo estimate."""
    g = torch.linspace(-radius, radius, n, dtype=torch.float64)
    z = torch.stack(torch.meshgrid(g, g, indexing="ij"), -1).reshape(-1, 2)
    dens = torch.exp(-eta * z.norm(dim=1))
    dens = dens / dens.sum()  # the cell area and η²/2π cancel; the tail beyond 16 is ~1e-9
    e = emb.double()
    out = torch.zeros(len(e), len(e), dtype=torch.float64)
    for w in range(len(e)):
        nearest = torch.cdist(e[w] + z, e).argmin(1)
        out[w] = torch.zeros(len(e), dtype=torch.float64).index_add_(0, nearest, dens)
    return out


def prior_with_ratio(lik: torch.Tensor, ratio: float) -> torch.Tensor:
    """A log prior under which original 0 beats the release y = 1 by exactly ``ratio``:
    prior(0)·p(1 | 0) = ratio · prior(1)·p(1 | 1); words 2-4 are too rare to compete."""
    p = torch.tensor([ratio * float(lik[1, 1]) / float(lik[0, 1]), 1.0, 1e-4, 1e-4, 1e-4],
                     dtype=torch.float64)
    return (p / p.sum()).log()
