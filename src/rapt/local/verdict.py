"""The plain sentence a command prints after tuning: on the user's own rows, is the privatized
model worth using, or does the local model the user could train alone do better?"""

from __future__ import annotations

from dataclasses import dataclass

MARGIN = 0.01  # accuracy (0–1) below which two models are called even


@dataclass(frozen=True)
class Comparison:
    """Accuracies (0–1) measured on the same ``n_rows`` rows: ``local`` (clean query, local
    model), ``remote`` (privatized query, hosted prompt; None when not measured), ``fused``
    (None without fusion). ``basis`` says which rows: "held-out" (rows neither the local model
    nor the prompt trained on) or "cross-validation" (the local model's k-fold estimate, when no
    slice was held out)."""

    local: float
    remote: float | None = None
    fused: float | None = None
    n_rows: int = 0
    basis: str = "held-out"


def _pts(x: float) -> str:
    return f"{100 * x:.1f}"


def verdict(c: Comparison) -> str:
    """One or two sentences: which model wins on the user's data, by how many points, and what
    to try. Never names a number the user cannot reproduce from the printed accuracies."""
    on = f"on {c.n_rows} of your rows ({c.basis})" if c.n_rows else f"on your rows ({c.basis})"
    if c.remote is None:
        return (f"A local model (TF-IDF + logistic regression on your clean text, on your "
                f"machine) scores {_pts(c.local)} % {on}. The privatized model was not scored "
                f"on held-out rows: compare it with `rapt predict` on labelled rows you kept "
                f"apart before relying on it.")
    gap = c.local - c.remote
    if gap > MARGIN:
        head = (f"On your data, a local model beats this privatized model by {_pts(gap)} "
                f"points ({_pts(c.local)} % vs {_pts(c.remote)} %, {on}).")
    elif gap < -MARGIN:
        head = (f"On your data, this privatized model beats a local model by {_pts(-gap)} "
                f"points ({_pts(c.remote)} % vs {_pts(c.local)} %, {on}).")
    else:
        head = (f"On your data, this privatized model and a local model score about the same "
                f"({_pts(c.remote)} % vs {_pts(c.local)} %, {on}).")
    best = max(c.local, c.remote)
    if c.fused is not None and c.fused > best + MARGIN:
        return (f"{head} Fused (both, combined on your machine) scores {_pts(c.fused)} %: "
                f"`rapt predict` uses it by default.")
    if gap > MARGIN:
        return (f"{head} Use the local model (`rapt predict --local-only`), or try a lower "
                f"privacy level (--target-p), more rows, or --method prefix.")
    return head


# What benchmarks/results/local_baseline.md measured (SST-2, FP, TREC; 100 rows to all; 2-3
# paired seeds): the row counts at which a privatized remote model *alone* beat the local one.
GRID = "rapt's grid (benchmarks/results/local_baseline.md, 3 tasks, 100 to 6,920 rows)"


def grid_note(p: float | None) -> str:
    """What the measured grid says for a release at replacement probability ``p`` (None: no
    privacy): below which row count the hosted model alone beat the local model."""
    if p is None:
        return (f"In {GRID}, without privacy the hosted model beat the local one at every row "
                f"count, by 3 to 22 points.")
    if p >= 0.5:
        where = "at no row count at P 0.6"
    elif p >= 0.3:
        where = "at P 0.4 only on SST-2 and only below about 500 rows"
    else:
        where = "at P 0.2 up to about 1,000 rows on every task"
    return (f"In {GRID}, a privatized model alone beat the local one {where}; fused with it "
            f"(rapt predict's default) it matched or beat the local model from 250 rows on.")
