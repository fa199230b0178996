"""Confident-GNMax: sampling statistics and the data-dependent RDP bounds vs independent values."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm

from rapt.gnmax import (
    DEFAULT_ORDERS,
    ConfidentGNMax,
    GNMaxConfig,
    log_pr_answered,
    log_q_gnmax,
    rdp_data_dependent,
    rdp_data_independent_gnmax,
    rdp_data_independent_threshold,
    rdp_threshold_data_dependent,
    vote_counts,
)

ORDERS = DEFAULT_ORDERS


def test_log_q_matches_erfc_sum():
    q = math.exp(log_q_gnmax(np.array([10.0, 3.0, 1.0]), 2.0))
    assert q == pytest.approx(0.5 * math.erfc(7 / 4) + 0.5 * math.erfc(9 / 4), rel=1e-10)
    # ties: q̃ capped at 1 - 1/C
    assert math.exp(log_q_gnmax(np.array([5.0, 5.0, 5.0]), 1.0)) == pytest.approx(2 / 3)
    # far in the tail log-space stays finite where erfc underflows
    assert np.isfinite(log_q_gnmax(np.array([2000.0, 0.0]), 1.0))


def test_data_independent_values():
    np.testing.assert_allclose(rdp_data_independent_gnmax(20.0, np.array([2.0, 10.0])),
                               [2 / 400, 10 / 400])
    np.testing.assert_allclose(rdp_data_independent_threshold(1.0, np.array([2.0, 10.0])),
                               [1.0, 5.0])


def test_theorem6_hand_computed():
    """200 unanimous teachers, 3 classes, σ2 = 20 (Flocks' setting): direct float formula."""
    counts = np.array([200.0, 0.0, 0.0])
    sigma = 20.0
    q = math.erfc(5.0)  # 2 × ½ erfc(200 / 40)
    assert math.exp(log_q_gnmax(counts, sigma)) == pytest.approx(q, rel=1e-9)
    mu2 = sigma * math.sqrt(-math.log(q))
    mu1 = mu2 + 1
    e1, e2 = mu1 / sigma**2, mu2 / sigma**2
    lam = 10.0
    a = (1 - q) / (1 - (q * math.exp(e2)) ** ((mu2 - 1) / mu2))
    b = math.exp(e1) / q ** (1 / (mu1 - 1))
    expect = math.log((1 - q) * a ** (lam - 1) + q * b ** (lam - 1)) / (lam - 1)
    got = rdp_data_dependent(log_q_gnmax(counts, sigma), sigma, np.array([lam]))[0]
    assert got == pytest.approx(expect, rel=1e-4)
    assert got < 1e-9 < lam / sigma**2  # consensus makes the query nearly free
    # orders >= μ1 fall back to the data-independent bound
    big = rdp_data_dependent(math.log(q), sigma, np.array([mu1 + 5]))[0]
    assert big == pytest.approx((mu1 + 5) / sigma**2)


def test_data_dependent_never_exceeds_independent():
    rng = np.random.default_rng(0)
    for _ in range(300):
        c = rng.integers(0, 60, size=int(rng.integers(2, 7))).astype(float)
        sigma = float(rng.choice([0.5, 1.0, 3.0, 10.0, 20.0, 40.0]))
        dd = rdp_data_dependent(log_q_gnmax(c, sigma), sigma, ORDERS)
        assert np.all(dd >= 0)
        assert np.all(dd <= ORDERS / sigma**2 + 1e-12)
        th = rdp_threshold_data_dependent(c, 40.0, sigma, ORDERS)
        assert np.all(th >= 0) and np.all(th <= ORDERS / (2 * sigma**2) + 1e-12)


def test_more_consensus_costs_less():
    sigma = 5.0
    costs = [rdp_data_dependent(log_q_gnmax(np.array([50.0 + g, 50.0 - g]), sigma), sigma,
                                ORDERS)[20] for g in (0, 10, 20, 30, 40, 50)]
    assert all(x >= y for x, y in zip(costs, costs[1:], strict=False))
    assert costs[-1] < costs[0] / 100


def test_log_pr_answered():
    assert math.exp(log_pr_answered(np.array([18.0, 2.0]), 18.0, 1.0)) == pytest.approx(0.5)
    assert math.exp(log_pr_answered(np.array([17.0, 3.0]), 18.0, 2.0)) == \
        pytest.approx(norm.sf(1.0, scale=2.0))


def test_confident_gnmax_statistics():
    # threshold exactly at the top count: answered with probability 1/2
    g = ConfidentGNMax(GNMaxConfig(threshold=10, sigma1=1.0, sigma2=1.0), seed=1)
    res = g.run(np.tile([10.0, 9.0], (4000, 1)))
    se = math.sqrt(0.25 / 4000)
    assert abs(res.answered.mean() - 0.5) < 4 * se
    # noisy argmax: P(label 0) = P(N(0, 2) > -1) = Φ(1/√2)
    p0 = norm.cdf(1 / math.sqrt(2))
    got = (res.labels[res.answered] == 0).mean()
    assert abs(got - p0) < 4 * math.sqrt(p0 * (1 - p0) / res.answered.sum())
    assert np.all(res.labels[~res.answered] == -1)


def test_consensus_all_answered_and_correct():
    counts = np.tile([0.0, 30.0, 0.0], (20, 1))
    res = ConfidentGNMax(GNMaxConfig(threshold=27, sigma1=1.0, sigma2=3.0), seed=0).run(counts)
    assert res.answered.all() and np.all(res.labels == 1)
    low = ConfidentGNMax(GNMaxConfig(threshold=27, sigma1=1.0, sigma2=3.0), seed=0).run(
        np.tile([10.0, 10.0, 10.0], (20, 1)))
    assert not low.answered.any()


def test_data_independent_accounting_and_conversion():
    cfg = GNMaxConfig(threshold=0, sigma1=2.0, sigma2=4.0, data_dependent=False)
    res = ConfidentGNMax(cfg, seed=0).run(np.tile([9.0, 1.0], (25, 1)))
    assert res.answered.all()
    expect_rdp = 25 * (ORDERS / (2 * 2.0**2) + ORDERS / 4.0**2)
    np.testing.assert_allclose(res.rdp, expect_rdp)
    # opacus' conversion is at least as tight as the classic rdp + log(1/δ)/(λ-1)
    classic = float(np.min(expect_rdp + math.log(1 / cfg.delta) / (ORDERS - 1)))
    assert 0 < res.epsilon <= classic
    assert np.all(np.diff(res.epsilon_curve) >= 0)


def test_data_dependent_smaller_than_independent_in_total():
    counts = np.tile([190.0, 6.0, 4.0], (100, 1))
    dd = ConfidentGNMax(GNMaxConfig(180, 1.0, 20.0), seed=0).run(counts)
    di = ConfidentGNMax(GNMaxConfig(180, 1.0, 20.0, data_dependent=False), seed=0).run(counts)
    assert dd.epsilon < di.epsilon


def test_budget_stop():
    counts = np.tile([30.0, 2.0], (200, 1))
    free = ConfidentGNMax(GNMaxConfig(threshold=0, sigma1=2.0, sigma2=6.0, data_dependent=False),
                          seed=0).run(counts)
    assert free.queried == 200 and not free.stopped_by_budget
    budget = float(free.epsilon_curve[9]) + 1e-9  # exactly 10 queries fit
    cfg = GNMaxConfig(threshold=0, sigma1=2.0, sigma2=6.0, data_dependent=False,
                      epsilon_budget=budget)
    res = ConfidentGNMax(cfg, seed=0).run(counts)
    assert res.stopped_by_budget and res.queried == 10
    assert res.epsilon <= budget
    assert np.all(res.labels[10:] == -1) and np.all(res.labels[:10] == 0)
    # data-dependent: stops too, never above the budget
    dd = ConfidentGNMax(GNMaxConfig(threshold=25, sigma1=2.0, sigma2=6.0, epsilon_budget=5.0),
                        seed=0).run(np.tile([20.0, 12.0], (500, 1)))
    assert dd.stopped_by_budget and 0 < dd.queried < 500 and dd.epsilon <= 5.0


def test_config_validation():
    with pytest.raises(ValueError):
        GNMaxConfig(threshold=1, sigma1=0, sigma2=1)
    with pytest.raises(ValueError):
        GNMaxConfig(threshold=1, sigma1=1, sigma2=1, delta=0)
    with pytest.raises(ValueError):
        ConfidentGNMax(GNMaxConfig(1, 1, 1)).run(np.zeros((3, 1)))


def test_vote_counts():
    votes = np.array([[0, 1, -1], [0, 2, 2], [1, 1, 2]])
    np.testing.assert_array_equal(vote_counts(votes, 3), [[2, 1, 0], [0, 2, 1], [0, 0, 2]])
