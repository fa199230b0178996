"""Confident-GNMax aggregation and its data-dependent Rényi-DP analysis.

Papernot, Song, Mironov, Raghunathan, Talwar, Erlingsson, "Scalable private learning with PATE",
ICLR 2018 (the Flocks paper's Algorithm 2 and accounting). Per query with vote histogram ``n``
(counts over C classes from E teachers, each teacher one vote, so adding/removing one private
example changes one teacher's vote):

1. threshold check: answer iff ``max_j n_j + N(0, σ1²) >= T``;
2. if answered, release ``argmax_j (n_j + N(0, σ2²))``.

Privacy. The threshold check is a Gaussian mechanism on ``max_j n_j`` (sensitivity 1):
data-independent RDP ``λ / (2 σ1²)``. GNMax on the histogram has L2 sensitivity √2: data-independent
RDP ``λ / σ2²``. The data-dependent bound (Theorem 6 with q̃ from Proposition 7, orders from
Proposition 10) is much smaller when teachers agree; it is never larger than the data-independent
one because we take the minimum. The GNMax-specific bounds live here, with the accounting of
whole releases (``rdp_data_independent_release``, ``epsilon_from_rdp``, ``compose_epsilon``:
RDP sums over releases from the same teachers); the RDP -> (ε, δ) conversion is opacus'
(``get_privacy_spent``, the Balle et al. 2020 conversion).

Caveat (as in the paper): a data-dependent ε depends on the private votes, so publishing it is not
itself private; Papernot et al. release it through smooth sensitivity, which is not implemented.
``data_dependent=False`` gives the data-independent accounting, whose ε may be published.

Why ε stays near 1.17 at δ = 1e-6 in Flocks' setting (200 teachers, T = 180, σ1 = 1, σ2 = 20)
even when every vote is unanimous: the floor comes from the threshold check, not from the order
grid. Its q̃ = Φ(-20) ≈ e^-204 gives μ1 ≈ 21.2, but Theorem 6's bound is small only while
q̃·B^(λ-1) is, i.e. for λ - 1 ≲ log(1/q̃) / log B ≈ 9.9 (log B = ε1 + log(1/q̃)/(μ1 - 1) ≈ 20.7,
and Proposition 10's μ1 = μ2 + 1 already minimizes B); from λ = 11 up it costs 0.3 to λ/2 per
query. Converting to (ε, δ) at λ = 10 costs (log(1/δ) - log λ)/(λ - 1) + log(1 - 1/λ) = 1.174
even at zero RDP on the old grid (integer orders from 10); DEFAULT_ORDERS now has the half
orders and reaches 1.114 (λ = 10.5); even zero RDP up to λ = μ1 would leave 0.49.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from opacus.accountants.analysis.rdp import get_privacy_spent
from scipy.special import log_ndtr

from rapt.noise import NoiseSource

# Fractional orders matter: the data-dependent bound is only valid below μ1, which can be small,
# and the (ε, δ) conversion's optimum often sits between integers (λ ≈ 10.5 in Flocks' setting):
# 1.25 to 10 in steps of 0.25, 10 to 100 in steps of 0.5, then 40 log-spaced orders to 1000. A
# superset of the previous grid (steps of 1 from 10 to 100), so no ε can grow by the change.
DEFAULT_ORDERS = np.concatenate([np.arange(1.25, 10.0, 0.25), np.arange(10.0, 100.0, 0.5),
                                 np.logspace(2.0, np.log10(1000.0), 40)])


def _log1mexp(x: float) -> float:
    """log(1 - exp(x)) for x < 0, stable near 0 and for very negative x."""
    if x >= 0:
        raise ValueError(f"log1mexp needs x < 0, got {x}")
    return math.log(-math.expm1(x)) if x > -0.693 else math.log1p(-math.exp(x))


def rdp_data_independent_gnmax(sigma: float, orders: np.ndarray) -> np.ndarray:
    """RDP of GNMax with noise σ (histogram sensitivity √2): λ/σ² per order."""
    if sigma <= 0:
        raise ValueError(f"sigma must be > 0, got {sigma}")
    return np.asarray(orders, dtype=np.float64) / sigma**2


def rdp_data_independent_threshold(sigma1: float, orders: np.ndarray) -> np.ndarray:
    """RDP of the noisy threshold check on the max count (sensitivity 1): λ/(2σ1²)."""
    return rdp_data_independent_gnmax(math.sqrt(2.0) * sigma1, orders)


def log_q_gnmax(counts: np.ndarray, sigma: float) -> float:
    """log q̃: an upper bound on Pr[GNMax(counts) != argmax counts] (Proposition 7).

    q̃ = Σ_{i≠i*} ½ erfc((n_i* - n_i) / (2σ)) = Σ_{i≠i*} Pr[N(0, 2σ²) > n_i* - n_i], capped at
    1 - 1/C (the true argmax is the likeliest outcome, so it has probability >= 1/C).
    """
    c = np.asarray(counts, dtype=np.float64)
    if c.ndim != 1 or len(c) < 2:
        raise ValueError("counts must be a 1-D vote histogram over >= 2 classes")
    top = int(np.argmax(c))
    gaps = np.delete(c[top] - c, top)
    # log Pr[N(0, 2σ²) > g] = log Φ(-g / (√2 σ)), stable for large gaps
    logs = log_ndtr(-gaps / (math.sqrt(2.0) * sigma))
    return float(min(np.logaddexp.reduce(logs), math.log(1.0 - 1.0 / len(c))))


def rdp_data_dependent(log_q: float, sigma: float, orders: np.ndarray) -> np.ndarray:
    """Data-dependent RDP of a Gaussian-noise max mechanism given log q̃ (Theorem 6).

    The mechanism is (μ, μ/s²)-RDP for every μ with s = σ (GNMax) or √2 σ1 (threshold). With
    μ2 = s·sqrt(log(1/q̃)) and μ1 = μ2 + 1 (Proposition 10), for λ < μ1:
        ε(λ) <= 1/(λ-1) · log((1-q̃)·A^(λ-1) + q̃·B^(λ-1)),
        A = (1-q̃) / (1 - (q̃ e^ε2)^((μ2-1)/μ2)),   B = e^ε1 / q̃^(1/(μ1-1)),
    valid when μ2 > 1, q̃ e^ε2 < 1 and q̃ <= e^((μ2-1) ε2) / (μ1/(μ1-1) · μ2/(μ2-1))^μ2.
    Returns min(that bound, λ/s²) per order.
    """
    orders = np.asarray(orders, dtype=np.float64)
    if np.any(orders <= 1):
        raise ValueError("Rényi orders must be > 1")
    if log_q > 0:
        raise ValueError(f"log q̃ must be <= 0, got {log_q}")
    indep = orders / sigma**2
    if np.isneginf(log_q):
        return np.zeros_like(orders)  # the output is fixed: 0-RDP
    var = sigma**2
    mu2 = sigma * math.sqrt(-log_q)
    mu1 = mu2 + 1.0
    if mu2 <= 1.0:
        return indep
    eps1, eps2 = mu1 / var, mu2 / var
    # Theorem 6's conditions on q̃ (in log space).
    log_q_max = (mu2 - 1.0) * eps2 - mu2 * (math.log(mu1 / (mu1 - 1.0))
                                           + math.log(mu2 / (mu2 - 1.0)))
    if not (log_q <= log_q_max and -log_q > eps2):
        return indep
    mask = orders < mu1
    lam = orders[mask]
    log_1mq = _log1mexp(log_q)
    log_a = log_1mq - _log1mexp((log_q + eps2) * (1.0 - 1.0 / mu2))
    log_b = eps1 - log_q / (mu1 - 1.0)
    log_s = np.logaddexp(log_1mq + (lam - 1.0) * log_a, log_q + (lam - 1.0) * log_b)
    out = indep.copy()
    out[mask] = np.minimum(indep[mask], log_s / (lam - 1.0))
    return out


def log_pr_answered(counts: np.ndarray, threshold: float, sigma1: float) -> float:
    """log Pr[max counts + N(0, σ1²) >= T]."""
    return float(log_ndtr((float(np.max(counts)) - threshold) / sigma1))


def log_q_threshold(counts: np.ndarray, threshold: float, sigma1: float) -> float:
    """log q̃ of the threshold check: log Pr[the less likely of answered / not answered]
    = log Φ(-|max counts - T| / σ1), computed directly in log space.

    Deriving it from log Pr[answered] (as TensorFlow Privacy's pate_2018 core.py does) loses it:
    once max - T >= ~38 σ1, Pr[answered] rounds to 1, its log to 0.0, and log(1 - e^0) has no
    finite value, so the step was charged 0 RDP, which is not a bound."""
    gap = abs(float(np.max(counts)) - float(threshold))
    return float(log_ndtr(-gap / sigma1))


def rdp_threshold_data_dependent(counts: np.ndarray, threshold: float, sigma1: float,
                                 orders: np.ndarray) -> np.ndarray:
    """Data-dependent RDP of the threshold check: Theorem 6 with q̃ = the less likely outcome."""
    return rdp_data_dependent(log_q_threshold(counts, threshold, sigma1),
                              math.sqrt(2.0) * sigma1, orders)


@dataclass
class GNMaxConfig:
    """Confident-GNMax hyperparameters (Flocks App. E.2: T=180, σ1=1, σ2=20 for 200 teachers)."""

    threshold: float
    sigma1: float
    sigma2: float
    delta: float = 1e-6
    epsilon_budget: float | None = None  # stop before a query would push ε above this
    data_dependent: bool = True
    orders: np.ndarray = field(default_factory=lambda: DEFAULT_ORDERS.copy())

    def __post_init__(self) -> None:
        if self.sigma1 <= 0 or self.sigma2 <= 0:
            raise ValueError(f"sigma1 and sigma2 must be > 0, got {self.sigma1}, {self.sigma2}")
        if not 0 < self.delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {self.delta}")
        if self.epsilon_budget is not None and self.epsilon_budget <= 0:
            raise ValueError(f"epsilon_budget must be > 0, got {self.epsilon_budget}")


@dataclass
class GNMaxResult:
    """Per-query outcome. ``labels[i]`` is the released label or -1 (abstained / not queried)."""

    labels: np.ndarray  # (Q,) int
    answered: np.ndarray  # (Q,) bool
    queried: int  # queries processed before the budget stopped labelling
    epsilon: float  # (ε, δ) after the processed queries
    order: float  # the Rényi order achieving ε
    epsilon_curve: np.ndarray  # (queried,) ε after each processed query
    stopped_by_budget: bool
    rdp: np.ndarray  # (len(orders),) accumulated RDP


class ConfidentGNMax:
    """Confident-GNMax over vote histograms with sequential RDP accounting and a budget stop."""

    def __init__(self, config: GNMaxConfig, *, seed: int | None = None) -> None:
        """``seed`` makes the vote noise repeatable and marks the run ``seeded``; None (the
        default, and the only private choice) draws it from the OS CSPRNG."""
        self.config = config
        self.noise = NoiseSource(seed)
        self.seeded = self.noise.seeded

    def query_rdp(self, counts: np.ndarray, answered: bool) -> np.ndarray:
        """RDP paid for one query: threshold check always, GNMax only when it answered."""
        cfg = self.config
        if cfg.data_dependent:
            rdp = rdp_threshold_data_dependent(counts, cfg.threshold, cfg.sigma1, cfg.orders)
        else:
            rdp = rdp_data_independent_threshold(cfg.sigma1, cfg.orders)
        if answered:
            if cfg.data_dependent:
                rdp = rdp + rdp_data_dependent(log_q_gnmax(counts, cfg.sigma2), cfg.sigma2,
                                               cfg.orders)
            else:
                rdp = rdp + rdp_data_independent_gnmax(cfg.sigma2, cfg.orders)
        return rdp

    def epsilon(self, rdp: np.ndarray) -> tuple[float, float]:
        eps, order = get_privacy_spent(orders=self.config.orders, rdp=rdp, delta=self.config.delta)
        return float(eps), float(order)

    def run(self, counts: np.ndarray, *, spent_rdp: np.ndarray | None = None) -> GNMaxResult:
        """Label queries in order until done or the budget would be exceeded.

        ``counts``: (Q, C) vote histograms. The budget check assumes the query will be answered
        (the larger cost), so it never depends on the noise drawn. ``spent_rdp``: RDP already
        spent on the same private data by earlier releases; the budget caps their composition
        with this run (the result's ``rdp``, ``epsilon`` and curve are this run's alone).
        """
        counts = np.asarray(counts, dtype=np.float64)
        if counts.ndim != 2 or counts.shape[1] < 2:
            raise ValueError(f"counts must be (Q, C>=2), got shape {counts.shape}")
        cfg = self.config
        q_total = counts.shape[0]
        labels = np.full(q_total, -1, dtype=np.int64)
        answered = np.zeros(q_total, dtype=bool)
        rdp = np.zeros(len(cfg.orders))
        spent = np.zeros(len(cfg.orders)) if spent_rdp is None else np.asarray(spent_rdp, float)
        curve: list[float] = []
        eps, order = 0.0, float(cfg.orders[0])
        stopped = False
        for i in range(q_total):
            n = counts[i]
            if cfg.epsilon_budget is not None:
                worst, _ = self.epsilon(spent + rdp + self.query_rdp(n, answered=True))
                if worst > cfg.epsilon_budget:
                    stopped = True
                    break
            ok = float(n.max()) + float(self.noise.normal((1,), std=cfg.sigma1)) >= cfg.threshold
            if ok:
                labels[i] = int(np.argmax(n + self.noise.normal(n.shape, std=cfg.sigma2).numpy()))
                answered[i] = True
            rdp = rdp + self.query_rdp(n, answered=ok)
            eps, order = self.epsilon(rdp)
            curve.append(eps)
        return GNMaxResult(labels=labels, answered=answered, queried=len(curve), epsilon=eps,
                           order=order, epsilon_curve=np.asarray(curve), stopped_by_budget=stopped,
                           rdp=rdp)


def vote_counts(votes: np.ndarray, num_classes: int) -> np.ndarray:
    """(E, Q) teacher votes (label index, -1 = no vote) -> (Q, C) histograms."""
    votes = np.asarray(votes)
    out = np.zeros((votes.shape[1], num_classes), dtype=np.int64)
    for c in range(num_classes):
        out[:, c] = (votes == c).sum(axis=0)
    return out


# --------------------------------------------------------------------------- releases
# The accounting of whole releases (PromptPATE's student prompts from the same teachers).


def epsilon_from_rdp(rdp: np.ndarray, orders: np.ndarray, delta: float) -> tuple[float, float]:
    """(ε, order) at δ from an RDP vector (opacus' conversion); (0, orders[0]) when nothing was
    spent (no query processed: no privacy loss)."""
    rdp = np.asarray(rdp, dtype=np.float64)
    if not np.any(rdp > 0):
        return 0.0, float(orders[0])
    eps, order = get_privacy_spent(orders=np.asarray(orders), rdp=rdp, delta=delta)
    return float(eps), float(order)


def compose_epsilon(rdps: Sequence[np.ndarray], orders: np.ndarray, delta: float
                    ) -> tuple[float, float]:
    """ε of several releases from the same teachers (the same private data): RDP composes by
    summing the vectors order by order; the sum is converted to (ε, δ) once."""
    if len(rdps) == 0:
        return 0.0, float(orders[0])
    return epsilon_from_rdp(np.sum(np.stack([np.asarray(r, np.float64) for r in rdps]), axis=0),
                            orders, delta)


def rdp_data_independent_release(config: GNMaxConfig, queried: int, answered: int
                                 ) -> np.ndarray:
    """Data-independent RDP of one Confident-GNMax release: the threshold check on each processed
    query (λ/(2σ1²)) plus GNMax on each answered one (λ/σ2²). Whether a query was answered is
    part of the output, so charging GNMax only there is ordinary adaptive composition; nothing
    else here depends on the votes."""
    return (queried * rdp_data_independent_threshold(config.sigma1, config.orders)
            + answered * rdp_data_independent_gnmax(config.sigma2, config.orders))
