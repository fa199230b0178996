"""How every command prints its numbers: one function per kind of number, so that one value
reads the same in every line that names it (η 67.71, never 67.713 in one line and 67.7128 in
the next; an accuracy 85.4 %, never 0.854 beside a verdict in percent).

    pct(0.8537)   -> "85.4 %"   accuracies and other shares of rows
    points(0.012) -> "1.2"      a difference of two accuracies, in percentage points
    eta(67.7128)  -> "67.71"    the dχ privacy parameter η
    p(0.58104)    -> "0.581"    a replacement probability P
    loss(1.40279) -> "1.403"    a training loss (4 significant digits)
    count(1, "row") -> "1 row"; count(1600, "row") -> "1,600 rows"
"""

from __future__ import annotations

__all__ = ["count", "eta", "loss", "p", "pct", "plural", "points", "seconds"]


def pct(share: float) -> str:
    """A share in [0, 1] (an accuracy) as a percent with one decimal: ``"85.4 %"``."""
    return f"{100 * share:.1f} %"


def points(diff: float) -> str:
    """A difference of two shares, in percentage points with one decimal (no unit)."""
    return f"{100 * diff:.1f}"


def eta(value: float) -> str:
    """η with two decimals: the level a user types back with --eta."""
    return f"{value:.2f}"


def p(value: float) -> str:
    """A replacement probability P (or a share of tokens) with three decimals."""
    return f"{value:.3f}"


def loss(value: float) -> str:
    """A loss with 4 significant digits (a full float repr says nothing more)."""
    return f"{value:.4g}"


def seconds(value: float) -> str:
    """A duration: ``"9.8 s"`` below two minutes, ``"3.4 min"`` above."""
    return f"{value:.1f} s" if value < 120 else f"{value / 60:.1f} min"


def plural(unit: str, n: float) -> str:
    """``unit`` for ``n`` of it: "row" for 1, "rows" otherwise ("tokens", "steps"); tqdm's
    "it" (iterations) stays as it is."""
    if n == 1 or unit in ("", "it") or unit.endswith("s") or not unit[-1].isalpha():
        return unit
    return unit + "s"


def count(n: float, unit: str) -> str:
    """``n`` with thousands separators and ``unit`` pluralized: ``"1,600 rows"``."""
    num = f"{n:,.0f}" if float(n).is_integer() else f"{n:,.2f}"
    return f"{num} {plural(unit, n)}"
