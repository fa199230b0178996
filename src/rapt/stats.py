"""Seed statistics for comparing tuning settings: mean ± Student-t CI and paired differences;
the Wilson interval of a rate.

Shared by ``rapt demo`` and the benchmarks so that both say "helped" under the same rule."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def mean_ci(xs: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """(mean, half-width of the Student-t confidence interval at ``level``); half-width 0 for
    a single value."""
    from scipy import stats

    if len(xs) == 0:
        raise ValueError("mean_ci needs at least one value")
    m = statistics.mean(xs)
    if len(xs) < 2:
        return m, 0.0
    return m, float(stats.t.ppf(0.5 + level / 2, len(xs) - 1) * statistics.stdev(xs)
                    / math.sqrt(len(xs)))


def wilson_interval(successes: int, n: int, level: float = 0.95) -> tuple[float, float] | None:
    """Wilson score interval for a binomial rate ``successes / n`` at ``level``; None for
    ``n == 0``. It assumes independent trials, and stays inside [0, 1] with a sensible width
    at rates of 0 or 1, where the normal interval collapses to a point."""
    if n < 0 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n, got {successes} of {n}")
    if n == 0:
        return None
    z = statistics.NormalDist().inv_cdf(0.5 + level / 2)
    p, z2 = successes / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    # At a rate of 0 or 1 the interval's closed end is exactly that rate (no rounding error).
    lo = 0.0 if successes == 0 else max(0.0, centre - half)
    hi = 1.0 if successes == n else min(1.0, centre + half)
    return lo, hi


def paired_difference(a: Sequence[float], b: Sequence[float],
                      level: float = 0.95) -> dict:
    """Per-seed differences a[i] − b[i] (same seed = same init, data order and privatized text)
    -> {"mean_diff", "ci95", "n", "excludes_zero", "p_value"}. ``excludes_zero`` needs n ≥ 2;
    ``p_value`` is the two-sided paired t-test of mean 0 (nan for one seed), the number to
    adjust with :func:`holm` when several comparisons are reported together."""
    if len(a) != len(b):
        raise ValueError(f"paired_difference needs one value per seed on both sides "
                         f"(got {len(a)} and {len(b)})")
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    mean, ci = mean_ci(diffs, level)
    return {"mean_diff": mean, "ci95": ci, "n": len(diffs),
            "excludes_zero": len(diffs) > 1 and abs(mean) > ci, "p_value": _t_test(diffs)}


def _t_test(diffs: Sequence[float]) -> float:
    """Two-sided one-sample t-test of mean 0; nan for n < 2. Identical differences (sd 0) give
    0 when they are not 0 and 1 when they are (scipy returns nan there)."""
    from scipy import stats

    if len(diffs) < 2:
        return float("nan")
    if statistics.pstdev(diffs) == 0:
        return 0.0 if diffs[0] != 0 else 1.0
    return float(stats.ttest_1samp(diffs, 0.0).pvalue)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm–Bonferroni adjusted p-values, in the input order (Holm 1979, step-down).

    Sorted ascending p_(1) ≤ … ≤ p_(m): adjusted p_(i) = max_{j ≤ i} min(1, (m − j + 1)·p_(j)).
    Rejecting where the adjusted value is ≤ α controls the family-wise error rate at α for any
    dependence between the tests. nan entries (a comparison with one seed) stay nan and do not
    count in m. Written here because statsmodels (``multipletests(method="holm")``) is not a
    rapt dependency and scipy (``false_discovery_control``) offers only the BH/BY FDR
    procedures."""
    ps = [float(p) for p in p_values]
    for p in ps:
        if not (math.isnan(p) or 0.0 <= p <= 1.0):
            raise ValueError(f"p-values must lie in [0, 1] (or be nan), got {p!r}")
    live = sorted((p, i) for i, p in enumerate(ps) if not math.isnan(p))
    out = [float("nan")] * len(ps)
    m, running = len(live), 0.0
    for rank, (p, i) in enumerate(live):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


def gap_won_back(remedy: Sequence[float], privatized: Sequence[float],
                 clean: Sequence[float], level: float = 0.95) -> dict:
    """How much of the privatization gap a remedy wins back, paired per seed:
    {"diff": remedy − privatized, "gap": clean − privatized (both :func:`paired_difference`),
    "share": mean diff / mean gap (nan when there is no gap to win back)}."""
    diff = paired_difference(remedy, privatized, level)
    gap = paired_difference(clean, privatized, level)
    share = diff["mean_diff"] / gap["mean_diff"] if gap["mean_diff"] > 0 else float("nan")
    return {"diff": diff, "gap": gap, "share": share}


def paired_bootstrap(a: Sequence[float], b: Sequence[float], *, seed: int = 0,
                     level: float = 0.95, resamples: int = 2000) -> tuple[float, float, float]:
    """(mean of a − b, lower, upper): the percentile bootstrap CI at ``level`` of the mean
    difference of paired per-row values (e.g. 1/0 correct, two models on the same rows),
    resampling rows; seeded, so the same rows give the same interval. Identical differences
    give a zero-width interval."""
    import numpy as np
    from scipy import stats

    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    if d.size == 0:
        raise ValueError("paired_bootstrap needs at least one pair")
    if np.all(d == d[0]):
        return float(d[0]), float(d[0]), float(d[0])
    ci = stats.bootstrap((d,), np.mean, n_resamples=resamples, confidence_level=level,
                         method="percentile", random_state=seed).confidence_interval
    return float(d.mean()), float(ci.low), float(ci.high)


def majority_half_width(m: float, n: int, level: float = 0.95) -> float:
    """Half-width of the ``level`` interval around the majority rate ``m`` on ``n`` rows
    (normal approximation of a classifier that always answers the majority class): an
    accuracy at or below m + this is no better than that classifier."""
    z = statistics.NormalDist().inv_cdf(0.5 + level / 2)
    return z * math.sqrt(m * (1 - m) / n)


def effect_word(d: dict) -> str:
    """'helped' / 'hurt' when the paired CI excludes 0, else 'made no significant difference'."""
    if not d["excludes_zero"]:
        return "made no significant difference"
    return "helped" if d["mean_diff"] > 0 else "hurt"


NEAR_CONSTANT = 0.95  # share of rows in one predicted class above which predictions collapsed


def collapse_warnings(pred: Sequence[int], gold: Sequence[int | None] | None,
                      names: Sequence[str], *, near_constant: float = NEAR_CONSTANT,
                      level: float = 0.95) -> list[str]:
    """Why a classifier's predictions look collapsed, one sentence each; []
    when they do not:

    * near-constant: one class takes at least ``near_constant`` of the predictions (and there
      are at least 10 rows);
    * no better than the majority class: with every gold label known, the accuracy lies
      within the ``level`` confidence interval of the majority rate m (normal approximation
      of a classifier that always answers the majority class: m ± z·√(m(1 − m)/n))."""
    n = len(pred)
    if n == 0:
        return []
    out = []
    counts = [0] * len(names)
    for p in pred:
        counts[int(p)] += 1
    top = max(range(len(names)), key=counts.__getitem__)
    if n >= 10 and counts[top] >= near_constant * n:
        out.append(f"predictions are near-constant: '{names[top]}' for {counts[top]} of {n} "
                   f"rows ({counts[top] / n:.1%})")
    if gold is not None and len(gold) == n and all(g is not None for g in gold):
        freq = [0] * len(names)
        for g in gold:
            freq[int(g)] += 1
        major = max(range(len(names)), key=freq.__getitem__)
        m = freq[major] / n
        acc = sum(int(int(p) == int(g)) for p, g in zip(pred, gold, strict=True)) / n
        half = majority_half_width(m, n, level)
        if acc <= m + half:
            from rapt.numfmt import pct, points

            out.append(f"accuracy {pct(acc)} is within the {level:.0%} CI of the majority rate "
                       f"{pct(m)} ± {points(half)} points (always answering '{names[major]}', "
                       f"{n} rows): "
                       "no better than guessing the majority class")
    return out
