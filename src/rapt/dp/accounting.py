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

from rapt.dp.config import ACCOUNTANTS, DPConfig, check_sample_rate
from rapt.guarantee import EPSILON_MAX

_MAX_SIGMA = 2.0 ** 20  # beyond opacus' search (MAX_SIGMA = 1e6): the ε no noise goes below


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

    σ = 0 gives ε = ∞ (no noise); 0 steps gives ε = 0. ValueError when δ is so large that
    the accountant's conversion goes below 0 (ε would then say nothing).
    """
    _check(noise_multiplier, sample_rate, steps, delta)
    if steps == 0:
        return 0.0
    if noise_multiplier == 0:
        return math.inf
    eps = _raw_epsilon(noise_multiplier, sample_rate, steps, delta, accountant)
    if eps < 0:
        # The RDP -> (ε, δ) conversion (Balle et al. 2020) goes below 0 only when δ is large
        # (above ~0.006 with opacus' orders; δ = 1/N = 0.5 gave -0.69). Reporting 0 there would
        # be true but read as perfect privacy, while δ alone carries the (weak) guarantee.
        raise ValueError(
            f"δ = {delta:g} is too large for a meaningful ε: the {accountant} accountant's "
            f"(ε, δ) conversion gives ε = {eps:.3g} < 0 (σ = {noise_multiplier:g}, q = "
            f"{sample_rate:g}, {steps} steps), so δ alone bounds the privacy loss; use a "
            "smaller δ (the default is min(1e-5, 1/(10·N)))")
    return eps


def _raw_epsilon(noise_multiplier: float, sample_rate: float, steps: int, delta: float,
                 accountant: str) -> float:
    acc = make_accountant(accountant)
    # opacus' accountants compose a history of (σ, q, steps) triples.
    acc.history = [(float(noise_multiplier), float(sample_rate), int(steps))]
    try:
        return float(acc.get_epsilon(delta=delta))
    except (ZeroDivisionError, OverflowError):
        # 1/σ² overflows or divides by 0 (σ = 1e-300): ε grows without bound as σ -> 0
        return math.inf


def check_noise_multiplier(noise_multiplier: float, sample_rate: float, steps: int,
                           delta: float, accountant: str = "rdp",
                           field: str = "noise multiplier σ") -> None:
    """ValueError unless σ gives a meaningful ε over the planned ``steps``: at most
    :data:`EPSILON_MAX` (the message gives the smallest σ accepted), and a δ small enough for
    the accountant (:func:`epsilon` at one step).

    The ε_max test uses the rdp accountant whatever ``accountant`` is: it is an upper bound,
    takes milliseconds and stays finite-or-∞ at any σ, where prv runs out of memory on tiny σ.
    """
    with warnings.catch_warnings():
        # near and above ε_max opacus notes that its smallest RDP order is optimal (a looser
        # bound than larger orders would give): moot for a refusal
        warnings.filterwarnings("ignore", message="Optimal order is the smallest alpha")
        eps = epsilon(noise_multiplier, sample_rate, steps, delta, "rdp")
        if eps > EPSILON_MAX:
            raise ValueError(
                f"{field} = {noise_multiplier:g} gives ε = "
                f"{'∞' if math.isinf(eps) else f'{eps:.3g}'} over the {steps} planned steps "
                f"(q = {sample_rate:g}, δ = {delta:g}, rdp accountant), above ε_max = "
                f"{EPSILON_MAX:g}, where a DP guarantee promises nothing (e^ε > 1e43); "
                f"{_smallest_sigma(sample_rate, steps, delta)}, or give a target ε ≤ "
                f"{EPSILON_MAX:g}, or train without DP")
    epsilon(noise_multiplier, sample_rate, 1, delta, accountant)


def _smallest_sigma(sample_rate: float, steps: int, delta: float) -> str:
    """'the smallest σ accepted here is S', S rounded up to 3 digits (so S itself passes)."""
    try:
        s = find_noise_multiplier(EPSILON_MAX, delta, sample_rate, steps, "rdp")
    except ValueError:
        return "more noise is needed"
    digits = math.floor(math.log10(s)) - 2
    return f"the smallest σ accepted here is {math.ceil(s / 10 ** digits) * 10 ** digits:.3g}"


def check_plan(config: DPConfig, n_examples: int, steps: int, batch_size: int | None = None,
               fields: tuple[str, str] = ("DPConfig.delta", "DPConfig.noise_multiplier")
               ) -> None:
    """ValueError, before any training, for a DP run whose guarantee would say nothing: δ of
    at least 1/N, a σ above the ε_max bound
    (:func:`check_noise_multiplier`), or a target ε that no noise reaches. A target is
    calibrated with the rdp accountant only (a fraction of a second; prv's calibration takes
    seconds, so such a run fails with the same message when it starts). ``fields``: the
    caller's names for δ and σ, for the messages."""
    delta = config.resolve_delta(n_examples, fields[0])
    q = config.resolve_sample_rate(n_examples, batch_size)
    if config.noise_multiplier is not None:
        check_noise_multiplier(config.noise_multiplier, q, steps, delta, config.accountant,
                               fields[1])
    elif config.accountant == "rdp":
        find_noise_multiplier(config.target_epsilon, delta, q, steps, accountant="rdp")


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
    with warnings.catch_warnings():
        # The search probes very large σ, where opacus notes that its largest RDP order is
        # optimal; the σ finally returned is checked with the same accountant.
        warnings.filterwarnings("ignore", message="Optimal order is the largest alpha")
        try:
            sigma = float(get_noise_multiplier(
                target_epsilon=float(target_epsilon), target_delta=float(delta),
                sample_rate=float(sample_rate), steps=int(steps), accountant=accountant,
                epsilon_tolerance=epsilon_tolerance,
            ))
        except ValueError as e:
            floor = _raw_epsilon(_MAX_SIGMA, sample_rate, steps, delta, accountant)
            raise ValueError(
                f"cannot reach ε = {target_epsilon:g} at δ = {delta:g} with q = "
                f"{sample_rate:g} over {steps} steps ({e}): however much noise is added, the "
                f"{accountant} accountant reports ε ≥ {floor:.3g} at this δ; ask for a "
                f"larger ε"
            ) from e
        # opacus stops at the first σ whose ε is ≤ the target, a negative one included: the
        # guarantee must hold at one step too (ε grows with the steps), or δ is too large.
        epsilon(sigma, sample_rate, 1, delta, accountant)
    return sigma


def steps_for_epochs(epochs: float, sample_rate: float) -> int:
    """Number of Poisson steps that visit each example ``epochs`` times in expectation."""
    q = check_sample_rate(sample_rate)
    if not epochs > 0:
        raise ValueError(f"epochs must be > 0 (got {epochs})")
    return max(1, math.ceil(epochs / q - 1e-9))
