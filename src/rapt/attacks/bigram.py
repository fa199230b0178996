"""A context prior for the mechanism-aware Bayes attacker: a bigram language model over token
ids, and exact per-token posteriors of a row under it (an HMM, by forward-backward).

The unigram Bayes attacker (:mod:`rapt.attacks.bayes`) decides each token alone, and on real
backbones it rarely leaves the release: a replaced token lands on one of thousands of outputs,
so p(y | x) for the true x is thousands of times smaller than p(y | y), and no unigram prior
ratio makes up for that.  The neighbours can: after "of the" an original "company" is far more
probable than a released "##zar".  Each row is an HMM: hidden = the original tokens, emissions
= p(released y_t | original x_t) (the screen's estimates, for the release itself and the
screened originals that reached y_t), transitions = the bigram prior.  Forward-backward gives
the posterior of each position given the whole row; its per-token argmax maximizes the
expected number of tokens recovered (the metric), unlike the best path (Viterbi).

Everything here is in log space, vectorized with torch over rows and states; a row boundary is
an extra token id ``V`` (the vocabulary size), so the prior also knows how rows start and end.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["BigramPrior", "forward_backward"]

DEFAULT_DISCOUNT = 0.75  # Kneser-Ney's usual absolute discount for bigrams


@dataclass(frozen=True)
class BigramPrior:
    """log p(b | a) over token ids 0..V−1 and the row boundary ``V``: interpolated Kneser-Ney.

        p(b | a) = max(c(a, b) − D, 0) / c(a) + λ(a) · q(b),   λ(a) = D · N₁₊(a •) / c(a)

    with q the continuation unigram (in how many distinct contexts b follows, + ``alpha`` so an
    unseen token keeps some mass) and p(b | a) = q(b) for a context never seen.  Special tokens
    are ordinary tokens here: the mechanism passes them through, so in a row they are observed
    states, never candidates, and a zero probability would zero the whole row.
    Sparse: only the seen bigrams are stored (sorted keys a·(V+1) + b), so it fits a 30k or 50k
    vocabulary. Written here, not taken from a library: nltk.lm scores one n-gram per Python
    call over strings (a lattice is millions of calls) and kenlm needs a compiled binary and
    ARPA files; interpolated KN over a sparse table is a dozen tensor operations.

    ``keys``: seen bigrams (sorted, long); ``log_seen``: their log p(b | a) (float64);
    ``log_lambda``: (V+1,) log λ(a) (0 for unseen contexts); ``log_q``: (V+1,) log q(b)."""

    vocab_size: int
    keys: Tensor
    log_seen: Tensor
    log_lambda: Tensor
    log_q: Tensor

    @property
    def boundary(self) -> int:
        return self.vocab_size

    @classmethod
    def fit(cls, rows: Sequence[Sequence[int]], vocab_size: int,
            discount: float = DEFAULT_DISCOUNT, alpha: float = 1.0) -> BigramPrior:
        """Count the bigrams of ``rows`` (each framed by the boundary) and smooth them."""
        if not 0.0 < discount < 1.0:
            raise ValueError(f"discount must be in (0, 1), got {discount}")
        if not alpha > 0:
            raise ValueError(f"alpha must be positive (unseen tokens need mass), got {alpha}")
        V, W = int(vocab_size), int(vocab_size) + 1
        seqs = [torch.tensor([V, *[int(i) for i in r], V], dtype=torch.long) for r in rows]
        if seqs:
            pairs = torch.cat([s[:-1] * W + s[1:] for s in seqs])
        else:
            pairs = torch.zeros(0, dtype=torch.long)
        keys, counts = torch.unique(pairs, return_counts=True)  # sorted
        a, b, c = keys // W, keys % W, counts.double()
        ctx = torch.zeros(W, dtype=torch.float64).index_add_(0, a, c)
        types = torch.zeros(W, dtype=torch.float64).index_add_(0, a, torch.ones_like(c))
        cont = torch.zeros(W, dtype=torch.float64).index_add_(0, b, torch.ones_like(c)) + alpha
        log_q = (cont / cont.sum()).log()
        seen = ctx > 0
        lam = torch.ones(W, dtype=torch.float64)
        lam[seen] = discount * types[seen] / ctx[seen]
        p = (c - discount).clamp_min(0) / ctx[a] + lam[a] * log_q[b].exp()
        return cls(V, keys, p.log(), lam.log(), log_q)

    def log_prob(self, prev: Tensor, nxt: Tensor) -> Tensor:
        """log p(nxt | prev), elementwise over broadcast long tensors of ids in 0..V (float64);
        an id < 0 (no state) gives −inf."""
        prev, nxt = torch.broadcast_tensors(prev.long(), nxt.long())
        valid = (prev >= 0) & (nxt >= 0)
        a, b = prev.clamp_min(0), nxt.clamp_min(0)
        key = a * (self.vocab_size + 1) + b
        if self.keys.numel():
            pos = torch.searchsorted(self.keys, key).clamp_max(self.keys.numel() - 1)
            hit = self.keys[pos] == key
            out = torch.where(hit, self.log_seen[pos], self.log_lambda[a] + self.log_q[b])
        else:
            out = self.log_q[b].clone()
        return out.masked_fill(~valid, -float("inf"))


def _lse(x: Tensor, dim: int) -> Tensor:
    """logsumexp that returns −inf (not NaN) where every term is −inf."""
    m = x.amax(dim, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    return (x - m).exp().sum(dim).log() + m.squeeze(dim)


def forward_backward(states: Tensor, log_emit: Tensor, prior: BigramPrior) -> Tensor:
    """Log posterior marginals (B, T, S) of an HMM per row.

    ``states``: (B, T, S) long, the token id of each hidden state at each position (−1: no
    state); ``log_emit``: (B, T, S) float64, log p(released token at t | state).  Row b starts
    after the boundary and ends before it; a position past a row's end holds the boundary id
    alone (emission 0), which the chain stays in with probability 1, so rows of different
    lengths share one batch.  Transitions: ``prior.log_prob``."""
    B, T, S = states.shape
    bnd = prior.boundary
    log_emit = log_emit.masked_fill(states < 0, -float("inf"))
    trans = prior.log_prob(states[:, :-1, :, None], states[:, 1:, None, :])  # (B, T-1, S, S)
    stay = (states[:, :-1, :, None] == bnd) & (states[:, 1:, None, :] == bnd)
    trans = trans.masked_fill(stay, 0.0)
    start = prior.log_prob(torch.full_like(states[:, 0], bnd), states[:, 0])
    alpha = torch.empty(B, T, S, dtype=torch.float64)
    alpha[:, 0] = start + log_emit[:, 0]
    for t in range(1, T):
        alpha[:, t] = log_emit[:, t] + _lse(alpha[:, t - 1, :, None] + trans[:, t - 1], 1)
    beta = torch.zeros(B, T, S, dtype=torch.float64)
    end = prior.log_prob(states[:, -1], torch.full_like(states[:, -1], bnd))
    beta[:, -1] = end.masked_fill(states[:, -1] == bnd, 0.0)
    for t in range(T - 2, -1, -1):
        beta[:, t] = _lse(trans[:, t] + (log_emit[:, t + 1] + beta[:, t + 1])[:, None, :], 2)
    post = alpha + beta
    return post - _lse(post, 2)[..., None]
