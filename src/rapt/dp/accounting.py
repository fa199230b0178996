"""(ε, δ) accounting for the sampled Gaussian mechanism, delegated to opacus' accountants.

Nothing here is a home-made bound: ε comes from ``opacus.accountants.RDPAccountant`` (Rényi DP
with the Balle et al. 2020 conversion) or ``PRVAccountant`` (numerical composition of privacy
random variables, Gopi et al. 2021), and σ for a target ε from
``opacus.accountants.utils.get_noise_multiplier`` (a binary search over those accountants).
"""

from __future__ import annotations

import math
import warnings

from opacus.accountants import PRVAccountant, RDPAccountant
from opacus.accountants.accountant import IAccountant
from opacus.accountants.utils import get_noise_multiplier

from rapt.dp.config import ACCOUNTANTS, check_sample_rate


def make_accountant(kind: str) -> IAccountant:
    """A fresh opacus accountant: ``"rdp"`` or ``"prv"``."""
    if kind == "rdp":
        return RDPAccountant()
    if kind == "prv":
        return PRVAccountant()
    raise ValueError(f"accountant must be one of {', '.join(ACCOUNTANTS)} (got {kind!r})")


def _check(noise_multiplier: float, sample_rate: float, steps: int, delta: float) -> None:
    if not math.isfinite(noise_multiplier) or noise_multiplier < 0:
        raise ValueError(f"noise_multiplier must be finite and ≥ 0 (got {noise_multiplier})")
    check_sample_rate(sample_rate)
    if int(steps) < 0:
        raise ValueError(f"steps must be ≥ 0 (got {steps})")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1) (got {delta})")


def epsilon(
    noise_multiplier: float, sample_rate: float, steps: int, delta: float,
    accountant: str = "rdp",
) -> float:
    """ε after ``steps`` Poisson-sampled Gaussian steps (σ = ``noise_multiplier``, rate q).

    σ = 0 gives ε = ∞ (no noise); 0 steps gives ε = 0.
    """
    _check(noise_multiplier, sample_rate, steps, delta)
    if steps == 0:
        return 0.0
    if noise_multiplier == 0:
        return math.inf
    acc = make_accountant(accountant)
    # opacus' accountants compose a history of (σ, q, steps) triples.
    acc.history = [(float(noise_multiplier), float(sample_rate), int(steps))]
    # The RDP -> (ε, δ) conversion (Balle et al. 2020) goes below 0 when δ is large (δ = 1/N
    # = 0.5 for N = 2 gives ln(1 - δ) = -0.69). An (ε, δ) guarantee holds for every larger ε,
    # and a negative ε means nothing, so 0 is the bound reported.
    return max(0.0, float(acc.get_epsilon(delta=delta)))


def find_noise_multiplier(
    target_epsilon: float, delta: float, sample_rate: float, steps: int,
    accountant: str = "rdp", epsilon_tolerance: float = 0.01,
) -> float:
    """Smallest σ (to ``epsilon_tolerance`` in ε) with ε(σ, q, steps, δ) ≤ ``target_epsilon``."""
    if not math.isfinite(target_epsilon) or target_epsilon <= 0:
        raise ValueError(f"target epsilon must be finite and > 0 (got {target_epsilon})")
    _check(0.0, sample_rate, steps, delta)
    if steps < 1:
        raise ValueError(f"steps must be ≥ 1 to calibrate noise (got {steps})")
    make_accountant(accountant)  # validates the name with our message
    try:
        with warnings.catch_warnings():
            # The search probes very large σ, where opacus notes that its largest RDP order is
            # optimal; the σ finally returned is checked with the same accountant.
            warnings.filterwarnings("ignore", message="Optimal order is the largest alpha")
            return float(get_noise_multiplier(
                target_epsilon=float(target_epsilon), target_delta=float(delta),
                sample_rate=float(sample_rate), steps=int(steps), accountant=accountant,
                epsilon_tolerance=epsilon_tolerance,
            ))
    except ValueError as e:
        raise ValueError(
            f"cannot reach ε = {target_epsilon} at δ = {delta:g} with q = {sample_rate:g} over "
            f"{steps} steps ({e}); raise ε, or lower q or the number of steps"
        ) from e


def steps_for_epochs(epochs: float, sample_rate: float) -> int:
    """Number of Poisson steps that visit each example ``epochs`` times in expectation."""
    q = check_sample_rate(sample_rate)
    if not epochs > 0:
        raise ValueError(f"epochs must be > 0 (got {epochs})")
    return max(1, math.ceil(epochs / q - 1e-9))
