"""rapt.noise: the privacy-noise source samples the laws it claims, from OS entropy by default."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from rapt.noise import NoiseSource


@pytest.mark.parametrize("seed", [None, 7])
def test_uniform_normal_gamma_bernoulli_laws(seed):
    """Each draw passes a KS / binomial test against its law, and the test has power: a
    10 % wrong scale is rejected (mutation caught: Box–Muller with sin and cos halves swapped for
    ``sqrt(-ln u)``, or the Gamma inverse CDF at the wrong shape)."""
    src = NoiseSource(seed)
    u = src.uniform(20000).numpy()
    assert 0.0 < u.min() and u.max() < 1.0
    assert stats.kstest(u, "uniform").pvalue > 1e-3
    z = src.normal((100, 200), std=2.0).numpy().ravel()
    assert stats.kstest(z, "norm", args=(0, 2.0)).pvalue > 1e-3
    assert stats.kstest(z, "norm", args=(0, 2.2)).pvalue < 1e-3
    g = src.gamma(384.0, 5000).numpy()
    assert stats.kstest(g, "gamma", args=(384.0,)).pvalue > 1e-3
    assert stats.kstest(g, "gamma", args=(384.0, 0, 1.1)).pvalue < 1e-3
    b = src.bernoulli(0.3, 20000)
    assert b.dtype == torch.bool
    assert stats.binomtest(int(b.sum()), 20000, 0.3).pvalue > 1e-3


def test_normal_pairs_are_independent():
    """Box–Muller's cos and sin halves are independent; a mistake that reuses one angle would
    correlate them."""
    z = NoiseSource().normal((20000,)).numpy()
    assert abs(stats.pearsonr(z[:10000], z[10000:]).statistic) < 0.05


def test_unseeded_draws_are_fresh_and_stateless():
    """No seed: nothing to checkpoint, and two sources (or two draws) never agree.
    Mutation caught: falling back to a fixed seed when ``seed=None``."""
    a, b = NoiseSource(), NoiseSource()
    assert not a.seeded and a._gen is None
    assert not torch.equal(a.normal((64,)), b.normal((64,)))
    assert not torch.equal(a.uniform(64), a.uniform(64))


def test_seeded_draws_repeat_and_are_marked():
    a, b, c = NoiseSource(3), NoiseSource(3), NoiseSource(4)
    assert a.seeded
    x = a.normal((5, 7))
    assert torch.equal(x, b.normal((5, 7))) and not torch.equal(x, c.normal((5, 7)))
    assert x.shape == (5, 7) and x.dtype == torch.float64
    assert NoiseSource(3).normal((3,), dtype=torch.float32).dtype == torch.float32
    # odd sizes use half a Box–Muller pair
    assert NoiseSource(1).normal((1,)).shape == (1,)
    assert np.isfinite(NoiseSource(1).gamma(1.0, 3).numpy()).all()
