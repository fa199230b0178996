"""rapt.noise: the privacy-noise source samples the laws it claims, from OS entropy by default."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats
from scipy.special import gammaincinv

from rapt import noise
from rapt.noise import NoiseSource, bits_to_uniform


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


def test_uniform_grid_is_open_and_exact():
    """Issue 29 item 8: the largest integer maps strictly below 1 and the smallest above 0, so
    the Gamma inverse CDF never sees u = 1 (it returned ∞ there). Mutation caught: 53-bit
    integers (k + 0.5 rounds up to 2**53 for the top k, u = 1.0)."""
    top = torch.tensor([2 ** noise.BITS - 1])
    assert bits_to_uniform(top).item() == noise.U_MAX == 1.0 - 2.0 ** -53 < 1.0
    assert bits_to_uniform(torch.tensor([0])).item() == noise.U_MIN == 2.0 ** -53 > 0.0
    # the bit trick equals the textbook (k + ½)·2^-52, bit for bit
    k = torch.randint(0, 2 ** noise.BITS, (10000,), generator=torch.Generator().manual_seed(0))
    k = torch.cat([k, torch.tensor([0, 1, 2 ** 51, 2 ** 52 - 2, 2 ** 52 - 1])])
    assert torch.equal(bits_to_uniform(k), (k.to(torch.float64) + 0.5) * 2.0 ** -noise.BITS)
    assert np.isfinite(gammaincinv(384.0, noise.U_MAX)) and gammaincinv(1.0, noise.U_MIN) > 0


@pytest.mark.parametrize("seed", [None, 7])
def test_extreme_bits_give_finite_draws(seed, monkeypatch):
    """Every integer the sources can return stays in [0, 2**52), and the extreme ones give
    finite gamma, normal and bernoulli draws."""
    src = NoiseSource(seed)
    k = src._bits(200000)
    assert k.dtype == torch.int64 and 0 <= int(k.min()) and int(k.max()) < 2 ** noise.BITS
    assert int(k.max()) >= 2 ** (noise.BITS - 1)  # the top bit is used
    for fill in (0, 2 ** noise.BITS - 1):
        monkeypatch.setattr(src, "_bits", lambda n, fill=fill: torch.full((n,), fill))
        assert torch.isfinite(src.gamma(384.0, 4)).all() and torch.isfinite(src.gamma(1.0, 4)).all()
        assert torch.isfinite(src.normal((4,))).all()
        assert src.bernoulli(1.0, 4).all() and not src.bernoulli(0.0, 4).any()


def test_os_bits_are_a_fresh_chacha20_keystream(monkeypatch):
    """The OS path reads a ChaCha20 keystream keyed by 32 bytes of os.urandom drawn inside the
    call: with the key forced to zeros it is RFC 8439's keystream (block 0, nonce 0, section
    2.3.2's all-zero test vector ``76b8e0ad a0f13d90 …``), and each call reads a new key."""
    calls = []

    def zeros(n: int) -> bytes:
        calls.append(n)
        return bytes(n)

    monkeypatch.setattr(noise.os, "urandom", zeros)
    words = noise._os_bits(2)
    expect = np.frombuffer(bytes.fromhex("76b8e0ada0f13d90405d6ae55386bd28"), dtype="<u8") >> 12
    np.testing.assert_array_equal(words, expect.astype(np.int64))
    noise._os_bits(3)
    assert calls == [32, 32]  # a fresh key per call, nothing kept between calls
    monkeypatch.undo()
    assert not np.array_equal(noise._os_bits(4), noise._os_bits(4))


def test_large_os_draws_use_one_fresh_key_per_parallel_slice(monkeypatch):
    """A draw large enough to be split is filled slice by slice in threads, each slice from its
    own keystream under its own os.urandom key (so, keys forced to zeros, every slice is RFC
    8439's all-zero keystream from block 0); with real keys the slices differ and the words stay
    uniform."""
    monkeypatch.setattr(noise, "_KEYSTREAM_THREADS", 3)
    n = 3 * noise._PARALLEL_MIN_WORDS + 5  # 3 slices of ceil(n / 3) words, the last shorter
    keys = []

    def zeros(k: int) -> bytes:
        keys.append(k)
        return bytes(k)

    monkeypatch.setattr(noise.os, "urandom", zeros)
    w = noise._os_bits(n)
    per = -(-n // 3)
    assert keys == [32] * 3 and w.shape == (n,) and w.dtype == np.int64
    head = np.frombuffer(bytes.fromhex("76b8e0ada0f13d90405d6ae55386bd28"), dtype="<u8") >> 12
    for s in range(0, n, per):
        np.testing.assert_array_equal(w[s:s + 2], head.astype(np.int64))
    monkeypatch.undo()  # real keys again (the thread count too: any split must hold)
    monkeypatch.setattr(noise, "_KEYSTREAM_THREADS", 3)
    w = noise._os_bits(n)
    assert not np.array_equal(w[:per], w[per:2 * per])
    assert 0 <= w.min() and w.max() < 2 ** noise.BITS
    u = (w + 0.5) / 2.0 ** noise.BITS  # 3M uniforms: mean 1/2 within 6 standard errors
    assert abs(u.mean() - 0.5) < 6 * math.sqrt(1 / 12 / n)
    for bit in (0, 25, 51):  # every bit of every slice is a fair coin
        for s in range(0, n, per):
            ones = ((w[s:s + per] >> bit) & 1).mean()
            assert abs(ones - 0.5) < 6 * 0.5 / math.sqrt(min(per, n - s))


@pytest.mark.parametrize("seed", [None, 3])
def test_secure_normal_sums_four_draws_and_keeps_the_law(seed, monkeypatch):
    """The default (secure) normal is (z1+z2+z3+z4)/2 of Box–Muller draws (opacus secure_mode):
    it reads 4x the bits, still passes a KS test against N(0, std²) with power against a 10 %
    wrong scale, and ``secure=False`` is one draw per value. Mutations caught: secure ignored
    (bit count), sum divided by 4 instead of 2 (scale)."""
    src = NoiseSource(seed)
    z = src.normal((40000,), std=3.0).numpy()
    # Unseeded, a right law fails p > 1e-3 once in a thousand runs (it did, 2026-11-29; 300
    # more runs gave uniform p-values): 1e-6, with the wrong scale still far below it.
    assert stats.kstest(z, "norm", args=(0, 3.0)).pvalue > 1e-6
    assert stats.kstest(z, "norm", args=(0, 3.3)).pvalue < 1e-12
    zs = src.normal((40000,), std=3.0, secure=False).numpy()
    assert stats.kstest(zs, "norm", args=(0, 3.0)).pvalue > 1e-6
    seen = []
    real = src._bits
    monkeypatch.setattr(src, "_bits", lambda n: seen.append(n) or real(n))
    src.normal((5, 2))
    src.normal((5, 2), secure=False)
    assert seen == [4 * 10, 10]


def test_derived_streams_are_repeatable_and_distinct():
    """derive(): a seeded sub-stream depends only on (seed, labels), not on earlier draws; an
    unseeded source derives itself (fresh draws anyway)."""
    a, b = NoiseSource(5), NoiseSource(5)
    a.normal((100,))  # draws on the parent do not move a derived stream
    x = a.derive("noise", 3).normal((8,))
    assert torch.equal(x, b.derive("noise", 3).normal((8,)))
    assert not torch.equal(x, b.derive("noise", 4).normal((8,)))
    assert not torch.equal(x, b.derive("batch", 3).normal((8,)))
    assert not torch.equal(x, NoiseSource(6).derive("noise", 3).normal((8,)))
    assert a.derive("noise", 3).seeded
    u = NoiseSource()
    assert u.derive("noise", 3) is u


def test_large_os_draws_work_in_a_forked_child():
    """The keystream threads belong to one process: a child forked after the parent used them
    gets its own (it would otherwise wait forever on threads that fork did not copy)."""
    import os

    n = 2 * noise._PARALLEL_MIN_WORDS + 1
    noise._os_bits(n)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        try:
            ok = noise._os_bits(n).shape == (n,)
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_integers_are_uniform_and_seeded_draws_repeat():
    from scipy import stats

    from rapt.noise import NoiseSource

    k = NoiseSource(7).integers(37, 37 * 400)
    assert k.dtype == torch.int64 and int(k.min()) >= 0 and int(k.max()) < 37
    assert stats.chisquare(torch.bincount(k, minlength=37).numpy()).pvalue > 1e-3
    assert torch.equal(NoiseSource(7).integers(37, 100), NoiseSource(7).integers(37, 100))
    assert NoiseSource().integers(1, 5).tolist() == [0] * 5
    with pytest.raises(ValueError, match="high"):
        NoiseSource().integers(0, 3)
