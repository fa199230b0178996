"""Poisson sampling: Binomial(N, q) batch sizes, independent inclusion, seeded repeatability."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from rapt.dp import micro_batches, poisson_batch, poisson_batches
from rapt.noise import NoiseSource


def _chi2_binomial_pvalue(sizes: np.ndarray, n: int, q: float) -> float:
    """Chi-square goodness of fit of observed sizes to Binomial(n, q), tails pooled."""
    k = np.arange(n + 1)
    pmf = stats.binom.pmf(k, n, q)
    expected = pmf * len(sizes)
    lo = int(np.argmax(expected >= 5))
    hi = int(len(expected) - np.argmax(expected[::-1] >= 5) - 1)
    obs = np.bincount(sizes, minlength=n + 1).astype(float)
    o = np.concatenate([[obs[:lo].sum()], obs[lo:hi + 1], [obs[hi + 1:].sum()]])
    e = np.concatenate([[expected[:lo].sum()], expected[lo:hi + 1], [expected[hi + 1:].sum()]])
    return float(stats.chisquare(o, e * o.sum() / e.sum()).pvalue)


def test_batch_sizes_are_binomial():
    n, q, steps = 300, 0.07, 3000
    batches = list(poisson_batches(n, q, steps, NoiseSource()))
    sizes = np.array([b.numel() for b in batches])
    assert _chi2_binomial_pvalue(sizes, n, q) > 1e-3
    # Fixed-size batches (what a shuffled loader gives) fail the same test.
    assert _chi2_binomial_pvalue(np.full(steps, round(n * q)), n, q) < 1e-6
    # Each example is included independently with probability q.
    counts = np.zeros(n)
    for b in batches:
        counts[b.numpy()] += 1
    assert stats.chisquare(counts).pvalue > 1e-3
    assert abs(counts.mean() / steps - q) < 0.002


def test_seeded_repeatability_and_properties():
    a = [b.tolist() for b in poisson_batches(50, 0.2, 20, NoiseSource(7))]
    b = [b.tolist() for b in poisson_batches(50, 0.2, 20, NoiseSource(7))]
    c = [b.tolist() for b in poisson_batches(50, 0.2, 20, NoiseSource(8))]
    assert a == b and a != c
    for batch in a:
        assert batch == sorted(set(batch)) and all(0 <= i < 50 for i in batch)
    # Batches can be empty, and q = 1 takes everything.
    sizes = [x.numel() for x in poisson_batches(5, 0.01, 50, NoiseSource(0))]
    assert 0 in sizes
    assert poisson_batch(9, 1.0, NoiseSource(0)).tolist() == list(range(9))


def test_micro_batches_and_errors():
    idx = torch.arange(10)
    parts = micro_batches(idx, 4)
    assert [p.tolist() for p in parts] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert micro_batches(torch.arange(0), 4) == []
    g = NoiseSource()
    with pytest.raises(ValueError, match="non-empty"):
        poisson_batch(0, 0.5, g)
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        poisson_batch(10, 0.0, g)
    with pytest.raises(ValueError, match="physical_batch_size"):
        micro_batches(idx, 0)


def test_unseeded_batches_differ():
    """Mutation caught: a fixed default seed for the sampler (two unseeded runs would agree)."""
    a = [b.tolist() for b in poisson_batches(200, 0.3, 5, NoiseSource())]
    b = [b.tolist() for b in poisson_batches(200, 0.3, 5, NoiseSource())]
    assert a != b
