"""The plain sentence a command prints after tuning: on the user's own rows, is the privatized
model worth using, or does the local model the user could train alone do better?"""

from __future__ import annotations

from dataclasses import dataclass, field

NAMES = {"local": "the local model", "fused": "fused", "remote": "the privatized model alone"}
SIDES = {"local": "local model", "remote": "privatized model"}


@dataclass(frozen=True)
class Comparison:
    """Accuracies (0–1) measured on the same ``n_rows`` rows: ``local`` (clean query, local
    model; None when a class has fewer than 2 rows and nothing can be scored on rows the model
    did not see), ``remote`` (privatized query, hosted prompt; None when not measured),
    ``fused`` (cross-fitted on the slice; None without fusion). ``basis`` says which rows:
    "held-out" (rows neither the local model nor the prompt trained on) or the local model's
    k-fold cross-validation, when no slice was held out. ``majority``: the most frequent
    class's share of the rows. From a held-out slice (:func:`rapt.local.fusion.choose_mode`):
    ``mode``, what `rapt predict` uses by default; ``lead``, its margin over the runner-up
    ({over, points, low, high}); ``flat``, the sides no better than the majority class;
    ``one_class``, a near-constant side's share of rows in one class."""

    local: float | None
    remote: float | None = None
    fused: float | None = None
    n_rows: int = 0
    basis: str = "held-out"
    majority: float | None = None
    mode: str | None = None
    lead: dict | None = None
    flat: tuple[str, ...] = ()
    one_class: dict = field(default_factory=dict)


def _pts(x: float) -> str:
    return f"{100 * x:.1f}"


def _signed(x: float) -> str:
    return f"{100 * x:+.1f}".replace("-", "−")


TOO_FEW = ("Too few rows to judge: a class has fewer than 2 rows, so no model can be scored on "
           "rows it did not train on (cross-validation needs 2 rows of each class, a held-out "
           "slice about 100 rows). Label more rows before relying on any model.")


def verdict(c: Comparison) -> str:
    """A few sentences: each model's accuracy beside the majority rate, which one `rapt
    predict` uses by default and why (the rule of :func:`rapt.local.fusion.choose_mode`, with
    the uncertainty of the slice), and what to try. Never names a number the user cannot
    reproduce from the printed accuracies."""
    if c.local is None:
        return TOO_FEW
    if c.remote is None:
        return _cross_validated(c)
    majority = f"; always answering the most frequent class: {_pts(c.majority)} %" if (
        c.majority is not None) else ""
    fused = f", the two fused {_pts(c.fused)} % (weights fitted on the slice's other rows)" if (
        c.fused is not None) else ""
    head = (f"On your data ({c.n_rows} held-out rows, which neither the prompt nor the local "
            f"model trained on): the privatized model scores {_pts(c.remote)} %, the local "
            f"model {_pts(c.local)} %{fused}{majority}.")
    return " ".join([head, *_collapsed(c), _advice(c)])


def _collapsed(c: Comparison) -> list[str]:
    """A sentence per side no better than always answering the most frequent class."""
    out = []
    for side in c.flat:
        acc = c.remote if side == "remote" else c.local
        share = c.one_class.get(side)
        one = f"; it puts {_pts(share)} % of the rows in one class" if share else ""
        alone = ": rapt never uses it alone" if side == "remote" else ""
        out.append(f"The {SIDES[side]} does no better than always answering the most frequent "
                   f"class ({_pts(acc)} % vs {_pts(c.majority)} %, within the noise of "
                   f"{c.n_rows} rows{one}){alone}.")
    return out


def _advice(c: Comparison) -> str:
    """Which one `rapt predict` uses, by the rule, with the slice's uncertainty."""
    mode = c.mode or "fused"
    lead = c.lead or {}
    over = NAMES.get(lead.get("over", ""), "the others")
    if lead:
        ci = f"95 % CI {_signed(lead['low'])} to {_signed(lead['high'])} points"
        sure = "" if lead["low"] > 0 else f": within the noise of {c.n_rows} rows"
        tie = "and on a tie rapt takes the one that sends less"
        if lead["low"] == lead["high"] == 0:
            by = f"right on the same rows as {over}, {tie}"
        elif lead["points"] == 0:
            by = f"as often right as {over} ({ci}), {tie}"
        else:
            by = f"{_pts(lead['points'])} points above {over} ({ci}{sure})"
    else:
        by = "best"
    rule = "Rule: `rapt predict` uses whichever of the three scored best on this slice."
    if mode == "local":
        return (f"{rule} The local model is {by}: `rapt predict` uses it alone by default and "
                f"sends nothing (`--fused` fuses anyway). To make the privatized model worth "
                f"it, try a lower privacy level (--target-p), more rows, or --method prefix.")
    if mode == "remote":
        return (f"{rule} The privatized model alone is {by}: `rapt predict` uses it alone by "
                f"default (`--fused` fuses, `--local-only` uses the local model).")
    return (f"{rule} Fused is {by}: `rapt predict` fuses by default (`--local-only` uses the "
            f"local model alone and sends nothing).")


def _cross_validated(c: Comparison) -> str:
    """No slice was held out: the local model's cross-validated accuracy, and what predict does
    without fusion weights."""
    on = f"on your {c.n_rows} rows ({c.basis}" if c.n_rows else f"on your rows ({c.basis}"
    majority = "" if c.majority is None else (
        f"; always answering the most frequent class: {_pts(c.majority)} %")
    flat = ""
    if c.majority is not None and c.n_rows:
        from rapt.stats import majority_half_width

        if c.local <= c.majority + majority_half_width(c.majority, c.n_rows):
            flat = " It does no better than that, within the noise of this many rows."
    return (f"A local model (TF-IDF + logistic regression on your clean text, on your "
            f"machine) scores {_pts(c.local)} % {on}{majority}).{flat} The privatized model "
            f"was not scored on held-out rows, as none were held out, so nothing is fused: "
            f"`rapt predict` uses it alone, the local model's probabilities beside it "
            f"(`--local-only`: the local model alone); compare them on labelled rows you kept "
            f"apart before relying on it.")


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
    return (f"In {GRID}, a privatized model alone beat the local one {where}; fused with it, "
            f"its mean was at or above the local model's from 250 rows on, in every cell but "
            f"TREC at 250 rows and P 0.6 (1.1 points below, CI ± 21.6).")
