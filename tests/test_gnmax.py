"""Confident-GNMax: sampling statistics and the data-dependent RDP bounds vs independent values."""

from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import pytest
from scipy.stats import norm

from rapt.pate.gnmax import (
    DEFAULT_ORDERS,
    ConfidentGNMax,
    GNMaxConfig,
    log_pr_answered,
    log_q_gnmax,
    log_q_threshold,
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


def _theorem6_mp(q, s, lam):
    """Papernot et al. 2018, Theorem 6, evaluated in 60-digit mpmath straight from the paper's
    statement (not from rapt.pate.gnmax): a mechanism that is (μ, μ/s²)-RDP for all μ, with
    q̃ >= Pr[M(D) != i*]; Proposition 10's orders μ2 = s·sqrt(log 1/q̃), μ1 = μ2 + 1,
    ε_i = μ_i / s². Returns (min(bound, λ/s²), whether the data-dependent bound applied)."""
    with mp.workdps(60):
        q, s, lam = mp.mpf(q), mp.mpf(s), mp.mpf(lam)
        indep = lam / s**2
        mu2 = s * mp.sqrt(mp.log(1 / q))
        mu1 = mu2 + 1
        eps1, eps2 = mu1 / s**2, mu2 / s**2
        applies = (mu2 > 1 and lam < mu1 and q * mp.exp(eps2) < 1
                   and q <= mp.exp((mu2 - 1) * eps2)
                   / ((mu1 / (mu1 - 1)) * (mu2 / (mu2 - 1))) ** mu2)
        if not applies:
            return float(indep), False
        a = (1 - q) / (1 - (q * mp.exp(eps2)) ** ((mu2 - 1) / mu2))
        b = mp.exp(eps1) / q ** (1 / (mu1 - 1))
        bound = mp.log((1 - q) * a ** (lam - 1) + q * b ** (lam - 1)) / (lam - 1)
        return float(min(bound, indep)), bool(bound < indep)


def _q_gnmax_mp(counts, sigma):
    """Proposition 7: q̃ = Σ_{i≠i*} ½ erfc((n_i* - n_i) / (2σ)), capped at 1 - 1/C."""
    with mp.workdps(60):
        n = [mp.mpf(c) for c in counts]
        top = max(n)
        star = n.index(top)
        q = mp.fsum(mp.erfc((top - x) / (2 * mp.mpf(sigma))) / 2
                    for i, x in enumerate(n) if i != star)
        return min(q, 1 - mp.mpf(1) / len(n))


GNMAX_CASES = [([30, 10, 5], 4.0), ([200, 0, 0], 20.0), ([50, 20], 6.0), ([12, 2, 1, 0], 2.0),
               ([40, 25, 5], 3.0)]
THM6_ORDERS = [1.5, 2.0, 3.0, 5.0, 10.0, 20.0, 50.0]


def test_theorem6_against_mpmath():
    """GNMax's data-dependent RDP vs an independent 60-digit mpmath evaluation of Theorem 6.

    The cases cover bounds from 1e-12 to ~1 and orders on both sides of μ1 (fallback to λ/σ²).
    Mutations of rapt.pate.gnmax tried by hand, each made this test fail: μ1 = μ2 + 2; exponent
    (1 - 1/μ2) -> (1 - 1/μ1) in A; ε2 = μ1/σ² instead of μ2/σ²; B's q̃^(1/(μ1-1)) ->
    q̃^(1/μ1); the (1 - q̃) weight dropped from the first term; orders < μ1 -> orders <= μ1 + 1.
    """
    applied = 0
    for counts, sigma in GNMAX_CASES:
        c = np.array(counts, dtype=float)
        q = _q_gnmax_mp(counts, sigma)
        assert math.exp(log_q_gnmax(c, sigma)) == pytest.approx(float(q), rel=1e-12)
        got = rdp_data_dependent(log_q_gnmax(c, sigma), sigma, np.array(THM6_ORDERS))
        for lam, g in zip(THM6_ORDERS, got, strict=True):
            expect, dd = _theorem6_mp(q, sigma, lam)
            applied += dd
            assert g == pytest.approx(expect, rel=1e-10, abs=0), (counts, sigma, lam)
    assert applied >= 20  # most cases exercise the data-dependent branch, not the fallback
    # 200 unanimous teachers, σ2 = 20 (Flocks' setting): the query is nearly free
    assert rdp_data_dependent(log_q_gnmax(np.array([200.0, 0, 0]), 20.0), 20.0,
                              np.array([10.0]))[0] < 1e-10


def test_theorem6_reference_value_in_a_nontrivial_regime():
    """Counts [150, 40, 10], σ2 = 20, λ = 10: data-dependent RDP 1.10503e-4 (Papernot et al.
    2018, Theorem 6 with Proposition 7's q̃ and Proposition 10's orders), 226x below the
    data-independent 10/400 = 0.025. The bound here is ~1e-4, not < 1e-9 as in the unanimous
    case, so every term of A and B shows in the digits compared. Computed straight from the
    paper in 50-digit mpmath, independent of rapt.pate.gnmax; the intermediate values are written
    out so that a wrong q̃ or μ cannot hide behind a matching final number.

    Mutations of rapt.pate.gnmax tried by hand, each made this test fail: μ1 = μ2 + 2; ε2 = μ1/σ²;
    exponent (μ2-1)/μ2 -> (μ1-1)/μ1 in A; the (1 - q̃) weight dropped; q̃ without the ½."""
    with mp.workdps(50):
        sigma, lam = mp.mpf(20), mp.mpf(10)
        n_star, others = 150, (40, 10)
        q = mp.fsum(mp.erfc((n_star - n) / (2 * sigma)) / 2 for n in others)
        mu2 = sigma * mp.sqrt(mp.log(1 / q))
        mu1 = mu2 + 1
        eps1, eps2 = mu1 / sigma**2, mu2 / sigma**2
        # Theorem 6 applies: q̃ < 1, μ1, μ2 > 1, λ <= μ1, q̃ e^ε2 < 1 (A > 0) and the bound on
        # q̃ that keeps it in the range where the bound increases with q̃.
        assert q < 1 and mu2 > 1 and lam <= mu1 and q * mp.exp(eps2) < 1
        assert q <= mp.exp((mu2 - 1) * eps2) / ((mu1 / (mu1 - 1)) * (mu2 / (mu2 - 1))) ** mu2
        a = (1 - q) / (1 - (mp.exp(eps2) * q) ** ((mu2 - 1) / mu2))
        b = mp.exp(eps1) / q ** (1 / (mu1 - 1))
        bound = mp.log((1 - q) * a ** (lam - 1) + q * b ** (lam - 1)) / (lam - 1)
    assert float(q) == pytest.approx(5.068251e-5, rel=1e-6)
    assert float(mu2) == pytest.approx(62.896517, rel=1e-7)
    assert float(bound) == pytest.approx(1.10503e-4, abs=5e-10)  # the figure of issue 15
    assert float(bound) < 10 / 400
    c = np.array([150.0, 40.0, 10.0])
    assert math.exp(log_q_gnmax(c, 20.0)) == pytest.approx(float(q), rel=1e-12)
    got = rdp_data_dependent(log_q_gnmax(c, 20.0), 20.0, np.array([10.0, 2.0, 30.0]))
    assert got[0] == pytest.approx(float(bound), rel=1e-9)
    # The order grid the accountant uses contains λ = 10 and gives the same value there.
    i10 = int(np.flatnonzero(DEFAULT_ORDERS == 10.0)[0])
    assert rdp_data_dependent(log_q_gnmax(c, 20.0), 20.0, DEFAULT_ORDERS)[i10] == got[0]


def _theorem6_formula_mp(q, s, lam):
    """Theorem 6's expression, evaluated even where its conditions fail (None if A <= 0)."""
    with mp.workdps(50):
        q, s, lam = mp.mpf(q), mp.mpf(s), mp.mpf(lam)
        mu2 = s * mp.sqrt(mp.log(1 / q))
        mu1 = mu2 + 1
        eps1, eps2 = mu1 / s**2, mu2 / s**2
        a = (1 - q) / (1 - (q * mp.exp(eps2)) ** ((mu2 - 1) / mu2))
        b = mp.exp(eps1) / q ** (1 / (mu1 - 1))
        if a <= 0:
            return None
        return float(mp.log((1 - q) * a ** (lam - 1) + q * b ** (lam - 1)) / (lam - 1))


def test_theorem6_conditions_fall_back_to_data_independent():
    """Outside Theorem 6's conditions the data-dependent bound is not a bound; the
    implementation must return the data-independent λ/σ² there, even where the formula,
    evaluated anyway, would give less.

    (a) λ >= μ1 (the reference case, μ1 = 63.90): at λ = 65, 70, 100 the formula gives 0.16245,
        0.1737, 0.2171 < λ/400. Mutation caught: dropping the ``orders < μ1`` mask.
    (b) μ2 <= 1 (counts [2, 1], σ = 0.5: q̃ = 0.0786, μ2 = 0.80): the formula gives 3.67 and
        5.59 < λ/σ² = 5, 6 at λ = 1.25, 1.5. Mutation caught: dropping the ``μ2 > 1`` check.
        (For μ2 > 0, q̃ e^ε2 < 1 is the same condition as μ2 > 1: -log q̃ > μ2/σ² <=>
        σ·sqrt(log 1/q̃) > 1, so (b) also covers A > 0.)
    (c) μ2 > 1 but q̃ above the theorem's bound (σ = 1, log q̃ = -1.21, μ2 = 1.1): λ/σ² is
        returned. Dropping only this check is not observable here: wherever it fails and
        μ2 > 1, the formula came out above λ/σ² in a scan of σ in [0.2, 100], μ2 in (1, 2.5],
        λ in (1, μ1), so the minimum with λ/σ² hides it.
    (d) q̃ = 1 (log q̃ = 0): λ/σ²; q̃ > 1 is refused."""
    # (a)
    c = np.array([150.0, 40.0, 10.0])
    log_q = log_q_gnmax(c, 20.0)
    mu1 = 20.0 * math.sqrt(-log_q) + 1
    high = np.array([65.0, 70.0, 100.0])
    assert np.all(high > mu1)
    np.testing.assert_array_equal(rdp_data_dependent(log_q, 20.0, high), high / 400)
    for lam in high:
        assert _theorem6_formula_mp(math.exp(log_q), 20.0, lam) < lam / 400 - 1e-5
    below = np.array([60.0, 63.0])  # just inside: the data-dependent bound is used
    assert np.all(rdp_data_dependent(log_q, 20.0, below) < below / 400)
    # (b)
    c = np.array([2.0, 1.0])
    log_q = log_q_gnmax(c, 0.5)
    assert 0.5 * math.sqrt(-log_q) < 1
    lams = np.array([1.25, 1.5])
    np.testing.assert_array_equal(rdp_data_dependent(log_q, 0.5, lams), lams / 0.25)
    for lam in lams:
        assert _theorem6_formula_mp(math.exp(log_q), 0.5, lam) < lam / 0.25 - 0.3
    # (c)
    log_q = -(1.1**2)
    with mp.workdps(50):
        mu2 = mp.mpf(1.1)
        mu1 = mu2 + 1
        eps2 = mu2
        assert mp.exp(log_q) > mp.exp((mu2 - 1) * eps2) / ((mu1 / (mu1 - 1))
                                                           * (mu2 / (mu2 - 1))) ** mu2
        assert mp.exp(log_q) * mp.exp(eps2) < 1
    lams = np.array([1.25, 1.5, 2.0])
    np.testing.assert_array_equal(rdp_data_dependent(log_q, 1.0, lams), lams)
    # (d)
    np.testing.assert_array_equal(rdp_data_dependent(0.0, 3.0, lams), lams / 9)
    with pytest.raises(ValueError, match="log q"):
        rdp_data_dependent(0.1, 3.0, lams)


def test_threshold_theorem6_against_mpmath():
    """The threshold check: Theorem 6 with q̃ = the less likely of answered / not answered
    (Pr[answered] = Φ((max n - T) / σ1)) and s = √2 σ1 (sensitivity-1 Gaussian, λ/(2σ1²)).
    Mutation tried: s = σ1 instead of √2 σ1 in rdp_threshold_data_dependent (fails)."""
    applied = 0
    for top, thr, sigma1 in [(30.0, 25.0, 2.0), (190.0, 180.0, 3.0), (20.0, 26.0, 2.0)]:
        with mp.workdps(60):
            pa = mp.ncdf((mp.mpf(top) - thr) / sigma1)
            q = min(pa, 1 - pa)
        got = rdp_threshold_data_dependent(np.array([top, 0.0]), thr, sigma1,
                                           np.array(THM6_ORDERS))
        for lam, g in zip(THM6_ORDERS, got, strict=True):
            expect, dd = _theorem6_mp(q, math.sqrt(2.0) * sigma1, lam)
            applied += dd
            assert g == pytest.approx(expect, rel=1e-10, abs=0), (top, thr, sigma1, lam)
    assert applied >= 8


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
    # data-dependent: stops too, never above the budget, and exactly where the rule says: the
    # RDP is the sum of the processed queries' costs, and one more (worst case: answered) would
    # pass the budget. Mutation caught (issue 29 item 11b): unanswered queries charged nothing
    # ran 231 queries instead of 4 and passed the old bound 0 < queried < 500.
    cfg = GNMaxConfig(threshold=25, sigma1=2.0, sigma2=6.0, epsilon_budget=5.0)
    g = ConfidentGNMax(cfg, seed=0)
    dd = g.run(np.tile([20.0, 12.0], (500, 1)))
    assert dd.stopped_by_budget and dd.epsilon <= 5.0
    c = np.array([20.0, 12.0])
    th = rdp_threshold_data_dependent(c, 25.0, 2.0, cfg.orders)
    gn = rdp_data_dependent(log_q_gnmax(c, 6.0), 6.0, cfg.orders)
    k = dd.queried
    np.testing.assert_allclose(dd.rdp, k * th + dd.answered[:k].sum() * gn, rtol=1e-12)
    assert g.epsilon(dd.rdp + th + gn)[0] > 5.0
    # whatever the noise: between "all answered" (3 fit) and "none answered" (4 fit)
    fits = [g.epsilon(j * (th + gn))[0] <= 5.0 for j in range(1, 8)]
    assert fits == [True] * 3 + [False] * 4
    assert g.epsilon(3 * th + th + gn)[0] <= 5.0 < g.epsilon(4 * th + th + gn)[0]
    assert 3 <= k <= 4


def _balle_epsilon(rdp: np.ndarray, orders: np.ndarray, delta: float) -> float:
    """Balle et al. 2020, Proposition 12 / opacus' conversion, written out here:
    ε = min_λ rdp(λ) + log((λ-1)/λ) - (log δ + log λ)/(λ-1)."""
    eps = rdp + np.log1p(-1.0 / orders) - (math.log(delta) + np.log(orders)) / (orders - 1.0)
    return float(np.min(eps))


@pytest.mark.parametrize("data_dependent", [False, True])
def test_unanswered_queries_are_charged_the_threshold_check(data_dependent):
    """Issue 29 item 11b: a run that answers nothing still pays for every threshold check.
    20 queries of [10, 10, 10] with T = 27, σ1 = 1: data-independent RDP 20·λ/(2σ1²), ε = 32.32
    at δ = 1e-6; data-dependent, q̃ = Φ(-17) per query, ε = 1.34. Mutation caught: charging
    nothing for an unanswered query (ε = 0)."""
    cfg = GNMaxConfig(threshold=27, sigma1=1.0, sigma2=3.0, data_dependent=data_dependent)
    res = ConfidentGNMax(cfg, seed=0).run(np.tile([10.0, 10.0, 10.0], (20, 1)))
    assert not res.answered.any() and res.queried == 20
    if data_dependent:
        with mp.workdps(60):
            q = mp.ncdf(-17)
        per = np.array([_theorem6_mp(q, math.sqrt(2.0), lam)[0] for lam in ORDERS])
        assert res.epsilon == pytest.approx(1.338, abs=1e-3)
    else:
        per = ORDERS / 2.0
        assert res.epsilon == pytest.approx(32.316, abs=1e-3)
    # atol: where the bound is ~1e-58 its float64 evaluation is exact only to ~1e-62
    np.testing.assert_allclose(res.rdp, 20 * per, rtol=1e-9, atol=1e-12)
    assert res.epsilon == pytest.approx(_balle_epsilon(20 * per, ORDERS, cfg.delta), rel=1e-9)


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


def test_unseeded_runs_differ_seeded_runs_repeat():
    """Privacy noise: OS entropy unless a seed is passed. Ties with σ2 = 1 make every label a
    coin flip, so two unseeded runs agree on all 200 labels with probability 2^-200."""
    counts = np.tile([5.0, 5.0], (200, 1))
    cfg = GNMaxConfig(threshold=0.0, sigma1=1.0, sigma2=1.0)
    a, b = ConfidentGNMax(cfg), ConfidentGNMax(cfg)
    assert not a.seeded and not b.seeded
    ra, rb = a.run(counts), b.run(counts)
    assert ra.answered.all() and rb.answered.all()
    assert not np.array_equal(ra.labels, rb.labels)
    assert not np.array_equal(a.noise.normal((8,)).numpy(), b.noise.normal((8,)).numpy())
    s1, s2 = ConfidentGNMax(cfg, seed=7), ConfidentGNMax(cfg, seed=7)
    assert s1.seeded and s2.seeded
    r1, r2 = s1.run(counts), s2.run(counts)
    np.testing.assert_array_equal(r1.labels, r2.labels)
    np.testing.assert_array_equal(r1.answered, r2.answered)
    assert not np.array_equal(r1.labels, ConfidentGNMax(cfg, seed=8).run(counts).labels)


def test_budget_counts_rdp_spent_by_earlier_releases():
    """spent_rdp: a second release from the same teachers stops once the composition would pass
    the budget (without it, each release would spend the whole budget on its own)."""
    counts = np.tile([30.0, 2.0], (20, 1))
    free = ConfidentGNMax(GNMaxConfig(threshold=0, sigma1=2.0, sigma2=6.0,
                                      data_dependent=False), seed=0).run(counts)
    budget = float(free.epsilon_curve[14]) + 1e-9  # exactly 15 queries fit in all
    cfg = GNMaxConfig(threshold=0, sigma1=2.0, sigma2=6.0, data_dependent=False,
                      epsilon_budget=budget)
    first = ConfidentGNMax(cfg, seed=1).run(counts[:10])
    assert first.queried == 10 and not first.stopped_by_budget
    second = ConfidentGNMax(cfg, seed=2).run(counts[10:], spent_rdp=first.rdp)
    assert second.stopped_by_budget and second.queried == 5
    alone = ConfidentGNMax(cfg, seed=2).run(counts[10:])
    assert alone.queried == 10  # the per-run budget alone would not have stopped it
    np.testing.assert_allclose(first.rdp + second.rdp, free.rdp * 15 / 20)  # all answered


@pytest.mark.parametrize(("threshold", "sigma1", "expect"), [(150.0, 1.0, 0.392),
                                                             (180.0, 0.5, 1.107)])
def test_threshold_far_below_the_votes_is_still_charged(threshold, sigma1, expect):
    """Issue 29 item 10: with max votes - T >= ~38 σ1, Pr[answered] rounds to 1 and the old
    code charged the threshold check 0 RDP (ε 0.224 in both cases below). 100 unanimous queries
    of 200 teachers, σ2 = 20, δ = 1e-6: ε = 0.392 (T = 150, σ1 = 1) and 1.107 (T = 180,
    σ1 = 0.5), the RDP checked order by order against a 60-digit mpmath evaluation of Theorem
    6 with q̃ = Φ(-|200 - T| / σ1) and Proposition 7's q̃ for GNMax."""
    counts = np.array([200.0, 0.0])
    gap = 200.0 - threshold
    assert gap / sigma1 >= 38  # the regime where Pr[answered] is 1.0 in float64
    assert log_pr_answered(counts, threshold, sigma1) == 0.0
    with mp.workdps(60):
        q_th = mp.ncdf(-mp.mpf(gap) / sigma1)
    assert log_q_threshold(counts, threshold, sigma1) == pytest.approx(float(mp.log(q_th)),
                                                                       rel=1e-12)
    q_gn = _q_gnmax_mp([200, 0], 20.0)
    expect_rdp = np.array([
        _theorem6_mp(q_th, math.sqrt(2.0) * sigma1, lam)[0] + _theorem6_mp(q_gn, 20.0, lam)[0]
        for lam in ORDERS])
    th = rdp_threshold_data_dependent(counts, threshold, sigma1, ORDERS)
    assert th.max() > 1.0  # was 0 at every order (below λ ≈ 10 the exact bound is < 1e-300)
    cfg = GNMaxConfig(threshold, sigma1, 20.0)
    res = ConfidentGNMax(cfg, seed=0).run(np.tile(counts, (100, 1)))
    assert res.answered.all()
    np.testing.assert_allclose(res.rdp, 100 * expect_rdp, rtol=1e-9, atol=1e-12)
    assert res.epsilon == pytest.approx(_balle_epsilon(100 * expect_rdp, ORDERS, 1e-6), rel=1e-9)
    assert res.epsilon == pytest.approx(expect, abs=5e-4)


def test_order_grid_has_half_orders_and_the_paper_setting_value():
    """Issue 29 item 10: orders 1.25..10 by 0.25, 10..100 by 0.5, then log-spaced to 1000 (a
    superset of the old integer grid). Flocks' setting (200 unanimous votes, T = 180, σ1 = 1,
    σ2 = 20, δ = 1e-6) then costs 1.114 at λ = 10.5, not 1.174 at λ = 10."""
    assert ORDERS[0] == 1.25 and ORDERS[-1] == pytest.approx(1000.0)
    assert np.all(np.diff(ORDERS) > 0)
    np.testing.assert_array_equal(ORDERS[ORDERS < 10], np.arange(1.25, 10.0, 0.25))
    np.testing.assert_array_equal(ORDERS[(ORDERS >= 10) & (ORDERS < 100)],
                                  np.arange(10.0, 100.0, 0.5))
    res = ConfidentGNMax(GNMaxConfig(180.0, 1.0, 20.0), seed=0).run(np.tile([200.0, 0], (100, 1)))
    assert res.epsilon == pytest.approx(1.1137, abs=1e-4) and res.order == 10.5
