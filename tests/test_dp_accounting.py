"""Accountant wrappers against opacus' published values, and σ calibration round trips."""

from __future__ import annotations

import math

import pytest

from rapt.dp import epsilon, find_noise_multiplier, steps_for_epochs


def test_rdp_matches_opacus_published_value():
    # opacus/tests/accountants_test.py::test_rdp_accountant: σ=1.5, q=0.04, 90 epochs, δ=1e-5.
    assert epsilon(1.5, 0.04, int(90 / 0.04), 1e-5, "rdp") == pytest.approx(7.32911117143,
                                                                             abs=1e-6)


@pytest.mark.parametrize(("sigma", "q", "steps", "expected"), [
    # opacus/tests/prv_accountant.py (values computed with microsoft/prv_accountant), δ=1e-6.
    (0.8, 0.05, 1000, 19.5258428053837356230815203162),
    (1.5, 0.001, 100, 0.0393694193095203287535710501288),
    (3.0, 0.2, 100, 3.38122051022184422208738396876),
])
def test_prv_matches_published_values(sigma, q, steps, expected):
    assert epsilon(sigma, q, steps, 1e-6, "prv") == pytest.approx(expected, abs=1e-5)


def test_get_noise_multiplier_matches_opacus_published_values():
    # opacus/tests/accountants_test.py: ε=8, δ=1e-5, q=0.04 -> σ=1.416 (90 epochs), 1.3562 (2000)
    assert find_noise_multiplier(8, 1e-5, 0.04, int(90 / 0.04)) == pytest.approx(1.416, abs=1e-4)
    assert find_noise_multiplier(8, 1e-5, 0.04, 2000) == pytest.approx(1.3562, abs=1e-4)


@pytest.mark.parametrize(("acc", "eps", "q", "steps"), [
    ("rdp", 3.0, 0.01, 1000), ("rdp", 8.0, 1024 / 6920, 200), ("prv", 3.0, 0.05, 100),
])
def test_find_noise_multiplier_round_trip(acc, eps, q, steps):
    delta = 1e-5
    sigma = find_noise_multiplier(eps, delta, q, steps, accountant=acc)
    got = epsilon(sigma, q, steps, delta, acc)
    assert got <= eps
    assert got > eps - 0.05  # tight: not a needlessly large σ
    assert epsilon(sigma * 0.95, q, steps, delta, acc) > eps  # less noise overshoots


def test_monotone_and_edge_cases():
    e1 = epsilon(1.0, 0.01, 100, 1e-5)
    assert epsilon(1.0, 0.01, 200, 1e-5) > e1 > epsilon(2.0, 0.01, 100, 1e-5)
    assert epsilon(1.0, 0.01, 0, 1e-5) == 0.0
    assert math.isinf(epsilon(0.0, 0.01, 10, 1e-5))
    with pytest.raises(ValueError, match="cannot reach"):
        find_noise_multiplier(1e-4, 1e-5, 1.0, 10_000)
    with pytest.raises(ValueError, match="accountant"):
        epsilon(1.0, 0.01, 10, 1e-5, "moments")
    with pytest.raises(ValueError, match="sampling rate"):
        epsilon(1.0, 1.5, 10, 1e-5)
    with pytest.raises(ValueError, match="epsilon"):
        find_noise_multiplier(0.0, 1e-5, 0.1, 10)
    assert steps_for_epochs(3, 0.1) == 30
    assert steps_for_epochs(1, 1024 / 6920) == 7


# N -> the logical batch and σ of a small job at the default δ; opacus' own accountant is the
# reference (no home-made bound), queried directly here.
@pytest.mark.parametrize(("n", "batch", "sigma", "epochs"), [
    (2, 1, 5.0, 1), (2, 1, 2.0, 1), (2, 1, 5.0, 3), (64, 8, 1.0, 3), (10_000, 256, 0.8, 2),
])
def test_epsilon_at_the_default_delta_matches_opacus(n, batch, sigma, epochs):
    """Old behaviour: δ defaulted to 1/N, so 2 rows at batch 1 reported ε = 0.0 at σ 5 or 2
    (the conversion at δ = 0.5 went below 0 and was clamped); opacus gives 0.63 and 2.06 at
    δ = 1e-5 for one epoch."""
    from opacus.accountants import RDPAccountant

    from rapt.dp import DPConfig

    cfg = DPConfig(noise_multiplier=sigma)
    q, delta = cfg.resolve_sample_rate(n, batch), cfg.resolve_delta(n)
    steps = steps_for_epochs(epochs, q)
    ref = RDPAccountant()
    for _ in range(steps):
        ref.step(noise_multiplier=sigma, sample_rate=q)
    want = ref.get_epsilon(delta=delta)
    assert want > 0 and delta < 1 / n
    assert epsilon(sigma, q, steps, delta) == pytest.approx(want, rel=1e-9)
    if (n, epochs) == (2, 1):
        assert epsilon(sigma, q, steps, delta) == pytest.approx(
            {5.0: 0.63, 2.0: 2.06}[sigma], abs=0.005)


def test_a_negative_conversion_is_refused_not_reported_as_zero():
    """Old behaviour: ε below 0 (δ = 1/N = 0.5 on 2 rows gave -0.69) was clamped to 0.0, which
    reads as perfect privacy, and calibration "reached" ε = 1e-6 through such a negative ε."""
    with pytest.raises(ValueError, match=r"δ = 0.5 is too large.*ε = -0.6"):
        epsilon(5.0, 0.5, 1, 0.5)
    with pytest.raises(ValueError, match="too large"):
        find_noise_multiplier(1e-6, 1 / 64, 0.125, 8)
    # At the default δ a target of 1e-6 on 64 rows is out of reach: refused with the floor.
    with pytest.raises(ValueError, match=r"cannot reach ε = 1e-06 .*ε ≥ 0\.1"):
        find_noise_multiplier(1e-6, 1e-5, 0.125, 8)
    # A small but reachable target gives a small, positive ε, not a clamped 0.
    sigma = find_noise_multiplier(0.2, 1e-5, 0.125, 8)
    assert 0.19 < epsilon(sigma, 0.125, 8, 1e-5) <= 0.2


def test_a_noise_whose_epsilon_says_nothing_is_refused_with_the_smallest_sigma():
    """Old behaviour: σ = 1e-300 raised ZeroDivisionError inside opacus (a 500 in the service,
    a traceback in the CLI), and σ = 1e-6 "trained under DP" with ε = 2.2e12. Now ε over the
    planned steps must be at most ε_max, and the refusal names the smallest σ accepted, which
    passes while 3 % less does not."""
    import re

    from rapt.dp.accounting import check_noise_multiplier
    from rapt.guarantee import EPSILON_MAX

    assert math.isinf(epsilon(1e-300, 0.01, 10, 1e-5))  # σ -> 0: ε -> ∞, not a crash
    q, steps, delta = 0.01, 1000, 1e-5
    for sigma in (1e-300, 1e-6, 0.2):
        with pytest.raises(ValueError) as e:
            check_noise_multiplier(sigma, q, steps, delta, field="dp.noise_multiplier")
        msg = str(e.value)
        assert f"dp.noise_multiplier = {sigma:g} gives ε = " in msg and "ε_max = 100" in msg
        smallest = float(re.search(r"smallest σ accepted here is ([0-9.e-]+)", msg).group(1))
    assert smallest == pytest.approx(0.278)  # opacus' search at ε_max, rounded up
    check_noise_multiplier(smallest, q, steps, delta)
    assert epsilon(smallest, q, steps, delta) <= EPSILON_MAX
    assert epsilon(smallest * 0.97, q, steps, delta) > EPSILON_MAX
    with pytest.raises(ValueError, match="smallest σ"):
        check_noise_multiplier(smallest * 0.97, q, steps, delta)
    check_noise_multiplier(1.0, q, steps, delta, "prv")  # a valid σ passes, prv too
