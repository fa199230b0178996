"""Seed statistics for comparing tuning settings: mean ± Student-t CI and paired differences.

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


def paired_difference(a: Sequence[float], b: Sequence[float],
                      level: float = 0.95) -> dict:
    """Per-seed differences a[i] − b[i] (same seed = same init, data order and privatized text)
    -> {"mean_diff", "ci95", "n", "excludes_zero"}. ``excludes_zero`` needs n ≥ 2."""
    if len(a) != len(b):
        raise ValueError(f"paired_difference needs one value per seed on both sides "
                         f"(got {len(a)} and {len(b)})")
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    mean, ci = mean_ci(diffs, level)
    return {"mean_diff": mean, "ci95": ci, "n": len(diffs),
            "excludes_zero": len(diffs) > 1 and abs(mean) > ci}


def gap_won_back(remedy: Sequence[float], privatized: Sequence[float],
                 clean: Sequence[float], level: float = 0.95) -> dict:
    """How much of the privatization gap a remedy wins back, paired per seed:
    {"diff": remedy − privatized, "gap": clean − privatized (both :func:`paired_difference`),
    "share": mean diff / mean gap (nan when there is no gap to win back)}."""
    diff = paired_difference(remedy, privatized, level)
    gap = paired_difference(clean, privatized, level)
    share = diff["mean_diff"] / gap["mean_diff"] if gap["mean_diff"] > 0 else float("nan")
    return {"diff": diff, "gap": gap, "share": share}


def effect_word(d: dict) -> str:
    """'helped' / 'hurt' when the paired CI excludes 0, else 'made no significant difference'."""
    if not d["excludes_zero"]:
        return "made no significant difference"
    return "helped" if d["mean_diff"] > 0 else "hurt"
