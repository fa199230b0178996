"""The mechanism-aware Bayes attacker (rapt.attacks.bayes) on a 5-word vocabulary in 2-D."""

from __future__ import annotations

import math

import pytest
import torch

from rapt.attacks.bayes import BayesAttacker, bayes_attack, unigram_log_prior
from rapt.attacks.recovery import ATTACKERS, ReconstructionInput, run_attackers
from rapt.privacy.mechanism import Privatizer

EMB = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.2], [2.5, 0.5], [1.5, 2.0]])
COUNTS = [60, 20, 10, 5, 1]
ETA = 1.5


def _public_rows() -> list[list[int]]:
    return [[w] * c for w, c in enumerate(COUNTS)]


def _exact_likelihood(emb: torch.Tensor, eta: float, n: int = 1601, radius: float = 16.0):
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


def test_decisions_match_the_exact_bayes_rule():
    prior = torch.tensor(COUNTS, dtype=torch.float64) + 1.0
    prior = prior / prior.sum()
    lik = _exact_likelihood(EMB, ETA)
    assert torch.allclose(lik.sum(1), torch.ones(5, dtype=torch.float64), atol=1e-6)
    post = prior.unsqueeze(1) * lik  # [w, w']
    top2 = post.topk(2, dim=0).values
    # the check is only meaningful where the exact rule is not a near tie
    assert bool((top2[0] > 1.15 * top2[1]).all()), top2
    exact = post.argmax(0)
    assert len(set(exact.tolist())) < 5  # the prior overrules the release somewhere

    log_prior = unigram_log_prior(_public_rows(), 5, alpha=1.0)
    assert torch.allclose(log_prior.exp(), prior)
    att = BayesAttacker.build(EMB, ETA, log_prior, k=5, samples=40_000, seed=0)
    guess = att.guess(torch.arange(5))
    assert guess.tolist() == exact.tolist()
    # the MC table itself is close to the integral
    mc = torch.zeros(5, 5, dtype=torch.float64)
    k_idx, out, cnt = att.entries.unbind(1)
    mc[att.originals[k_idx], out] = cnt.double() / att.samples
    assert (mc - lik).abs().max() < 0.01


def test_top_k_restriction_falls_back_to_the_release():
    log_prior = unigram_log_prior(_public_rows(), 5)
    att = BayesAttacker.build(EMB, 10.0, log_prior, k=1, samples=2000, seed=0)
    assert att.originals.tolist() == [0]
    # at η = 10 word 0 never lands on word 4 (2.5 away): w' = 4 has no table candidate with a
    # non-zero estimate, so the guess is w' itself
    assert 4 not in att.entries[:, 1].tolist()
    assert att.guess(torch.tensor([4, 0])).tolist() == [4, 0]


def _release(seed: int, n: int = 3000):
    g = torch.Generator().manual_seed(seed)
    prior = torch.tensor(COUNTS, dtype=torch.float64)
    orig = torch.multinomial(prior / prior.sum(), n, replacement=True, generator=g)
    priv = Privatizer(EMB, ETA, seed=seed).privatize_ids(orig)
    rows_o = [orig[i:i + 10].tolist() for i in range(0, n, 10)]
    rows_p = [priv[i:i + 10].tolist() for i in range(0, n, 10)]
    return rows_o, rows_p


def test_bayes_beats_nearest_neighbour_and_chance():
    orig, priv = _release(7)
    inp = ReconstructionInput(priv, EMB, ETA, public_rows=_public_rows(), seed=1,
                              options={"bayes_k": 5, "bayes_samples": 4000})
    rec = run_attackers(["nn", "bayes"], inp, orig)
    assert rec["nn"]["replaced"] == 0.0
    assert rec["nn"]["all"] == pytest.approx(1 - rec["nn"]["n_replaced"] / rec["nn"]["n_all"])
    assert rec["bayes"]["all"] > rec["nn"]["all"] + 0.02
    assert rec["bayes"]["replaced"] > 1 / 5  # chance over 5 words
    assert "bayes" in ATTACKERS


def test_seeded_repeatable_and_needs_public_text():
    _, priv = _release(3, n=200)
    inp = ReconstructionInput(priv, EMB, ETA, public_rows=_public_rows(), seed=5,
                              options={"bayes_k": 3, "bayes_samples": 500})
    assert bayes_attack(inp) == bayes_attack(inp)
    with pytest.raises(ValueError, match="public_rows"):
        bayes_attack(ReconstructionInput(priv, EMB, ETA))


def test_special_ids_pass_through():
    log_prior = unigram_log_prior(_public_rows(), 5, special_ids=[4])
    assert math.isinf(float(log_prior[4]))
    att = BayesAttacker.build(EMB, ETA, log_prior, k=5, samples=500, special_ids=[4], seed=0)
    assert 4 not in att.originals.tolist()
    assert att.guess(torch.tensor([4, 4])).tolist() == [4, 4]
