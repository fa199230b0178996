"""PromptDPSGD settings, validated when built so impossible budgets fail before any training."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Literal

from rapt.guarantee import EPSILON_MAX

Accountant = Literal["rdp", "prv"]
ACCOUNTANTS: tuple[str, ...] = ("rdp", "prv")


@dataclass
class DPConfig:
    """DP-SGD settings for prompt / prefix tuning (Flocks of Stochastic Parrots, Alg. 1).

    Give exactly one of ``target_epsilon`` (σ is then calibrated for the planned steps) or
    ``noise_multiplier`` (σ > 0, noise std in units of ``max_grad_norm``; clipping without
    noise gives no guarantee and is refused). The sampling rate q is ``sample_rate`` or, when
    unset, the trainer's logical batch size / N. ``delta`` defaults to min(1e-5, 1/(10·N))
    (:func:`default_delta`) and must stay below 1/N; the paper's δ = 1/N is refused, since a
    mechanism that publishes one random row in the clear meets it. ``physical_batch_size``
    bounds memory: a logical Poisson batch is processed in micro-batches of at most that many
    examples.
    ``noise_seed`` makes the Poisson sampling and the Gaussian noise repeatable (tests and
    benchmarks only; the run is then recorded as ``seeded``); None draws both from the OS
    CSPRNG. It is separate from ``TuneConfig.seed`` (init, data order) on purpose.
    """

    target_epsilon: float | None = None
    noise_multiplier: float | None = None
    max_grad_norm: float = 1.0
    delta: float | None = None
    sample_rate: float | None = None
    physical_batch_size: int = 32
    accountant: Accountant = "rdp"
    noise_seed: int | None = None

    def __post_init__(self) -> None:
        if self.target_epsilon is not None and self.noise_multiplier is not None:
            raise ValueError(
                "DPConfig: give either target_epsilon or noise_multiplier, not both "
                f"(got target_epsilon={self.target_epsilon}, "
                f"noise_multiplier={self.noise_multiplier})"
            )
        if self.target_epsilon is None and self.noise_multiplier is None:
            raise ValueError("DPConfig: one of target_epsilon or noise_multiplier is required")
        if self.target_epsilon is not None:
            check_target_epsilon(self.target_epsilon, "DPConfig.target_epsilon")
        if self.noise_multiplier is not None:
            s = float(self.noise_multiplier)
            if not math.isfinite(s) or s <= 0:
                raise ValueError(f"DPConfig.noise_multiplier must be finite and > 0 (got {s}): "
                                 f"{NO_NOISE}")
        c = float(self.max_grad_norm)
        if not math.isfinite(c) or c <= 0:
            raise ValueError(f"DPConfig.max_grad_norm (clip C) must be finite and > 0 (got {c})")
        if self.delta is not None and not 0 < float(self.delta) < 1:
            raise ValueError(f"DPConfig.delta must be in (0, 1) (got {self.delta})")
        if self.sample_rate is not None:
            check_sample_rate(self.sample_rate, "DPConfig.sample_rate")
        if int(self.physical_batch_size) < 1:
            raise ValueError(
                f"DPConfig.physical_batch_size must be ≥ 1 (got {self.physical_batch_size})"
            )
        if self.accountant not in ACCOUNTANTS:
            raise ValueError(
                f"DPConfig.accountant must be one of {', '.join(ACCOUNTANTS)} "
                f"(got {self.accountant!r})"
            )

    def resolve_sample_rate(self, n_examples: int, batch_size: int | None = None) -> float:
        """q for a data set of ``n_examples``: ``sample_rate`` or ``batch_size / n_examples``."""
        check_n_examples(n_examples)
        if self.sample_rate is not None:
            return float(self.sample_rate)
        if batch_size is None:
            raise ValueError(
                "DPConfig.sample_rate is not set and no logical batch size was given to derive "
                "it (q = batch_size / N)"
            )
        if int(batch_size) < 1:
            raise ValueError(f"logical batch size must be ≥ 1 (got {batch_size})")
        return check_sample_rate(int(batch_size) / n_examples, f"batch_size/N = {batch_size}/"
                                 f"{n_examples}")

    def resolve_delta(self, n_examples: int, field: str = "DPConfig.delta") -> float:
        """δ for a data set of ``n_examples``: ``delta``, which must be below 1/N (ValueError
        naming ``field``, the caller's name for it), or :func:`default_delta`."""
        n = check_n_examples(n_examples)
        if self.delta is None:
            return default_delta(n)
        d = float(self.delta)
        if d >= 1.0 / n:
            raise ValueError(
                f"{field} = {d:g} is not below 1/N = {1.0 / n:g} (N = {n} training rows): "
                "a mechanism that publishes one row in the clear meets such a δ, so the "
                f"(ε, δ) it reports says nothing; give {field} well below 1/N, or leave it "
                f"out for the default min(1e-5, 1/(10·N)) = {default_delta(n):g}")
        return d

    def to_dict(self) -> dict:
        return asdict(self)


NO_NOISE = ("clipping without noise gives no privacy guarantee (ε = ∞); give a noise "
            "multiplier > 0 or a target ε, or train without DP")


def default_delta(n_examples: int) -> float:
    """The default δ: min(1e-5, 1/(10·N)), well below 1/N at every N (the usual rule: δ much
    smaller than the chance of picking any one row)."""
    return min(1e-5, 1.0 / (10 * check_n_examples(n_examples)))


def check_target_epsilon(eps: float, field: str) -> float:
    """Return a target ε as float, or raise ValueError naming ``field`` unless it is finite,
    > 0 and at most :data:`EPSILON_MAX`."""
    eps = float(eps)
    if not math.isfinite(eps) or eps <= 0:
        raise ValueError(f"{field} must be a finite number > 0 (got {eps}); for ε = ∞ train "
                         "without DP")
    if eps > EPSILON_MAX:
        raise ValueError(f"{field} = {eps:g} is above ε_max = {EPSILON_MAX:g}, where a DP "
                         f"guarantee promises nothing (e^ε > 1e43); give {field} ≤ "
                         f"{EPSILON_MAX:g}, or train without DP")
    return eps


def check_sample_rate(q: float, what: str = "sample_rate") -> float:
    """Return q as float, or raise ValueError if it is not in (0, 1]."""
    q = float(q)
    if not (0.0 < q <= 1.0):
        raise ValueError(f"{what}: the sampling rate q must be in (0, 1] (got {q})")
    return q


def check_n_examples(n: int) -> int:
    """Return n, or raise ValueError for an empty training set."""
    if int(n) < 1:
        raise ValueError(f"PromptDPSGD needs a non-empty training set (got {n} examples)")
    return int(n)


def dp_config_from_options(
    epsilon: float | None = None, noise: float | None = None, clip: float | None = None,
    delta: float | None = None, physical_batch: int | None = None,
    sample_rate: float | None = None, accountant: str = "rdp", noise_seed: int | None = None,
) -> DPConfig | None:
    """DPConfig from ``rapt tune --dp-*`` options; None when neither --dp-epsilon nor --dp-noise
    is given (non-private training). Errors name the command-line flag."""
    if epsilon is None and noise is None:
        extra = [f for f, v in (("--dp-clip", clip), ("--dp-delta", delta),
                                ("--dp-physical-batch", physical_batch),
                                ("--dp-sample-rate", sample_rate)) if v is not None]
        if extra:
            raise ValueError(f"{', '.join(extra)} given without --dp-epsilon or --dp-noise")
        return None
    if epsilon is not None and noise is not None:
        raise ValueError("give either --dp-epsilon or --dp-noise, not both")
    if epsilon is not None:
        check_target_epsilon(epsilon, "--dp-epsilon")
    if noise is not None and (not math.isfinite(noise) or noise <= 0):
        raise ValueError(f"--dp-noise must be > 0 (got {noise}): {NO_NOISE}, i.e. leave out "
                         "--dp-noise and --dp-epsilon")
    if clip is not None and (not math.isfinite(clip) or clip <= 0):
        raise ValueError(f"--dp-clip must be > 0 (got {clip})")
    if delta is not None and not 0 < delta < 1:
        raise ValueError(f"--dp-delta must be in (0, 1) (got {delta})")
    if physical_batch is not None and physical_batch < 1:
        raise ValueError(f"--dp-physical-batch must be ≥ 1 (got {physical_batch})")
    if sample_rate is not None and not 0 < sample_rate <= 1:
        raise ValueError(f"--dp-sample-rate must be in (0, 1] (got {sample_rate})")
    kw: dict = {"target_epsilon": epsilon, "noise_multiplier": noise, "delta": delta,
                "sample_rate": sample_rate, "accountant": accountant, "noise_seed": noise_seed}
    if clip is not None:
        kw["max_grad_norm"] = clip
    if physical_batch is not None:
        kw["physical_batch_size"] = physical_batch
    return DPConfig(**kw)
