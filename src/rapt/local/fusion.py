"""User-side fusion: the remote prediction (on the privatized query) and the local one (on the
clean query) in a weighted log-linear pool, p ∝ p_remote^a · p_local^b.

The two weights are fitted by log-loss on rows the remote prompt never trained on (the held-out
slice of :func:`holdout_split`), with the local model's probabilities on that slice coming from a
model fitted without it. Fitting them on the prompt's own training rows would trust the remote
side for what it memorized. Two weights on a grid, not a learned stacker: a few hundred held-out
rows support two parameters, and a = 0 or b = 0 (one side alone) stays reachable.

The fused accuracy reported is cross-fitted on the slice (each fold pooled with weights fitted
on the others), and one rule picks what `rapt predict` uses by default from the slice: fused,
the local model alone or the remote one alone, whichever scored best (:func:`choose_mode`), so
that fusion is never used where it did worse than one side alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

HOLDOUT_FRACTION = 0.2
HOLDOUT_MAX = 500  # rows: enough for two weights; more would cost the remote prompt rows
MIN_HOLDOUT = 20  # below this no slice is held out and nothing is fused
WEIGHTS = np.round(np.arange(0.0, 3.0001, 0.1), 1)
EPS = 1e-6  # probability floor: a hard 0 from one side must not veto the other
CROSS_FIT_FOLDS = 5  # the slice's folds: each one's fused rows use weights fitted on the others
# What `rapt predict` may use by default; on equal held-out accuracy the first one wins: the
# local model sends nothing, and the fused model is never behind the remote one on the slice.
MODES = ("local", "fused", "remote")


def holdout_split(labels: np.ndarray | list[int], seed: int, *,
                  fraction: float = HOLDOUT_FRACTION, max_rows: int = HOLDOUT_MAX,
                  min_rows: int = MIN_HOLDOUT) -> tuple[np.ndarray, np.ndarray]:
    """(train indices, held-out indices), sorted, a seeded random split stratified by label:
    exactly min(``max_rows``, round(``fraction`` · N)) held-out rows, each class giving its share
    within one row (and at least one row when it has two or more). An empty slice when it would
    hold fewer than ``min_rows`` (then the remote prompt trains on every row and nothing is
    fused)."""
    y = np.asarray(labels, dtype=np.int64)
    n = len(y)
    want = min(max_rows, int(round(fraction * n)))
    if want < min_rows:
        return np.arange(n), np.arange(0)
    rng = np.random.default_rng(seed)
    classes = np.unique(y)
    members = [rng.permutation(np.flatnonzero(y == c)) for c in classes]
    take = _quotas(np.array([len(m) for m in members]), want)
    h = np.concatenate([m[:k] for m, k in zip(members, take, strict=True)])
    if len(h) > want:  # more classes with two rows than the slice holds: a random subset
        h = rng.choice(h, want, replace=False)
    h = np.sort(h)
    mask = np.ones(n, bool)
    mask[h] = False
    return np.flatnonzero(mask), h


def _quotas(counts: np.ndarray, want: int) -> np.ndarray:
    """Rows each class gives to a slice of ``want``: its share rounded by largest remainder
    (the quotas sum to ``want``; rounding each one alone can miss it by a row per class), then
    one row for every class of two or more rows, taken back from the largest quotas."""
    share = counts * want / counts.sum()
    k = np.floor(share).astype(np.int64)
    k[np.argsort(-(share - k), kind="stable")[:want - int(k.sum())]] += 1
    k[(k == 0) & (counts >= 2)] = 1
    while k.sum() > want and k.max() > 1:
        k[int(np.argmax(k))] -= 1
    return k


def _pool(remote: np.ndarray, local: np.ndarray, a: float, b: float) -> np.ndarray:
    z = a * np.log(np.clip(remote, EPS, 1.0)) + b * np.log(np.clip(local, EPS, 1.0))
    z -= z.max(-1, keepdims=True)
    p = np.exp(z)
    return p / p.sum(-1, keepdims=True)


@dataclass(frozen=True)
class Fusion:
    """Weights of the pool (``remote``: a, ``local``: b, both ≥ 0) and what they were fitted on:
    ``n_rows`` held-out rows, on which ``accuracy`` gives remote, local and fused accuracy (0–1;
    from :meth:`fit_slice`: fused cross-fitted, plus ``majority``, the most frequent class's
    share). ``mode``: what `rapt predict` uses by default (one of :data:`MODES`), ``lead``: its
    margin over the runner-up on the slice ({over, points, low, high}, 0–1, a paired bootstrap
    95 % CI), ``flat``: the sides no better than always answering the most frequent class,
    ``one_class``: a side's share of rows in a single predicted class, where it is near-constant.
    Statistics of private rows: they stay on the user's machine."""

    remote: float
    local: float
    n_rows: int = 0
    accuracy: dict | None = None
    mode: str = "fused"  # files from before the mode was recorded fused by default
    lead: dict | None = None
    flat: tuple[str, ...] = ()
    one_class: dict = field(default_factory=dict)

    def __call__(self, remote: np.ndarray, local: np.ndarray) -> np.ndarray:
        """Fused class probabilities (N, C) from remote and local ones of the same shape."""
        remote, local = np.asarray(remote, float), np.asarray(local, float)
        if remote.shape != local.shape:
            raise ValueError(f"remote probabilities {remote.shape} and local ones "
                             f"{local.shape} differ in shape")
        return _pool(remote, local, self.remote, self.local)

    @classmethod
    def fit(cls, remote: np.ndarray, local: np.ndarray, labels: np.ndarray | list[int]
            ) -> Fusion:
        """The (a, b) on the grid WEIGHTS² with the lowest mean log-loss on held-out rows
        (ties: the smaller weights); ``accuracy`` on those same rows (in-sample for the fused
        one: :meth:`fit_slice` scores it on rows its weights did not see). ValueError when
        shapes disagree or no row is given."""
        remote, local, y = _checked(remote, local, labels)
        lr = np.log(np.clip(remote, EPS, 1.0))
        ll = np.log(np.clip(local, EPS, 1.0))
        best = (np.inf, 0.0, 0.0)
        for a in WEIGHTS:
            # all b at once: (B, N, C) logits for this a
            z = a * lr[None] + WEIGHTS[:, None, None] * ll[None]
            z = z - z.max(-1, keepdims=True)
            logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
            loss = -logp[:, np.arange(len(y)), y].mean(-1)
            i = int(np.argmin(loss))
            if loss[i] < best[0] - 1e-12:
                best = (float(loss[i]), float(a), float(WEIGHTS[i]))
        _, a, b = best
        if a == 0.0 and b == 0.0:  # a uniform pool: take the better side alone instead
            a, b = (1.0, 0.0) if _acc(remote, y) >= _acc(local, y) else (0.0, 1.0)
        fused = _pool(remote, local, a, b)
        return cls(a, b, len(y), {"remote": _acc(remote, y), "local": _acc(local, y),
                                  "fused": _acc(fused, y)})

    @classmethod
    def fit_slice(cls, remote: np.ndarray, local: np.ndarray, labels: np.ndarray | list[int],
                  *, seed: int = 0, folds: int = CROSS_FIT_FOLDS) -> Fusion:
        """Weights fitted on the whole held-out slice (what `rapt predict` pools with), the
        fused accuracy cross-fitted (:func:`cross_fitted`: no row is scored by weights fitted
        on it), and the mode `rapt predict` uses by default: :func:`choose_mode`."""
        remote, local, y = _checked(remote, local, labels)
        weights = cls.fit(remote, local, y)
        return replace(weights, **choose_mode(remote, local, cross_fitted(
            remote, local, y, seed=seed, folds=folds), y, seed=seed))

    def comparison(self):
        """The :class:`rapt.local.verdict.Comparison` of a fusion from :meth:`fit_slice`."""
        from rapt.local.verdict import Comparison

        acc = self.accuracy or {}
        return Comparison(acc["local"], acc["remote"], acc["fused"], self.n_rows,
                          majority=acc.get("majority"), mode=self.mode, lead=self.lead,
                          flat=tuple(self.flat), one_class=dict(self.one_class))

    def to_dict(self) -> dict:
        return {"remote": self.remote, "local": self.local, "n_rows": self.n_rows,
                "accuracy": self.accuracy, "mode": self.mode, "lead": self.lead,
                "flat": list(self.flat), "one_class": self.one_class}

    @classmethod
    def from_dict(cls, d: dict) -> Fusion:
        try:
            a, b = float(d["remote"]), float(d["local"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not saved fusion weights: {e}") from e
        if not (a >= 0 and b >= 0 and np.isfinite(a) and np.isfinite(b)):
            raise ValueError(f"fusion weights must be finite and >= 0 (got {a}, {b})")
        mode = d.get("mode", "fused")
        if mode not in MODES:
            raise ValueError(f"field 'mode' is {mode!r}, not one of {', '.join(MODES)}")
        return cls(a, b, int(d.get("n_rows", 0)), d.get("accuracy"), mode, d.get("lead"),
                   tuple(d.get("flat") or ()), dict(d.get("one_class") or {}))


def _checked(remote, local, labels) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    remote, local = np.asarray(remote, float), np.asarray(local, float)
    y = np.asarray(labels, dtype=np.int64)
    if remote.shape != local.shape or remote.ndim != 2 or len(y) != len(remote):
        raise ValueError(f"fusion needs (N, C) remote and local probabilities and N labels "
                         f"(got {remote.shape}, {local.shape}, {len(y)})")
    if len(y) == 0:
        raise ValueError("fusion needs at least one held-out row")
    return remote, local, y


def cross_fitted(remote: np.ndarray, local: np.ndarray, labels: np.ndarray | list[int], *,
                 seed: int = 0, folds: int = CROSS_FIT_FOLDS) -> np.ndarray:
    """Fused probabilities (N, C) of every row with weights (:meth:`Fusion.fit`) fitted on the
    other folds of a seeded split in ``folds`` (at most one per row): the fused model scored
    on rows its weights did not see."""
    remote, local, y = _checked(remote, local, labels)
    k = min(folds, len(y))
    if k < 2:  # one row: nothing to fit on but itself; the two sides with equal weights
        return _pool(remote, local, 1.0, 1.0)
    out = np.empty_like(remote)
    for score in np.array_split(np.random.default_rng(seed).permutation(len(y)), k):
        fit = np.setdiff1d(np.arange(len(y)), score)
        out[score] = Fusion.fit(remote[fit], local[fit], y[fit])(remote[score], local[score])
    return out


def choose_mode(remote: np.ndarray, local: np.ndarray, fused: np.ndarray, labels: np.ndarray,
                *, seed: int = 0) -> dict:
    """The rule that picks what `rapt predict` uses, from the held-out slice (``fused``:
    cross-fitted): the one of :data:`MODES` with the highest accuracy there, the first on a
    tie; the remote model alone only when it does better than always answering the most
    frequent class (:func:`rapt.stats.majority_half_width`: the collapse rule). -> Fusion's
    fields: accuracy (with the majority rate), mode, lead (over the best of the other
    candidates: its points and paired bootstrap 95 % CI), flat and one_class (see
    :class:`Fusion`)."""
    from rapt.stats import NEAR_CONSTANT, majority_half_width, paired_bootstrap

    y = np.asarray(labels, dtype=np.int64)
    right = {"local": local.argmax(-1) == y, "fused": fused.argmax(-1) == y,
             "remote": remote.argmax(-1) == y}
    acc = {m: float(right[m].mean()) for m in MODES}
    majority = float(np.bincount(y).max() / len(y))
    band = majority + majority_half_width(majority, len(y))
    flat = tuple(s for s in ("remote", "local") if acc[s] <= band)

    def best(modes) -> str:
        return max(modes, key=lambda m: (acc[m], -MODES.index(m)))

    allowed = [m for m in MODES if not (m == "remote" and "remote" in flat)]
    mode = best(allowed)
    over = best([m for m in allowed if m != mode])
    d, low, high = paired_bootstrap(right[mode], right[over], seed=seed)
    one_class = {}
    for side, p in (("remote", remote), ("local", local)):
        share = float(np.bincount(p.argmax(-1)).max() / len(y))
        if len(y) >= 10 and share >= NEAR_CONSTANT:
            one_class[side] = share
    return {"accuracy": {**acc, "majority": majority}, "mode": mode,
            "lead": {"over": over, "points": d, "low": low, "high": high}, "flat": flat,
            "one_class": one_class}


def pick(xs: list | None, idx: np.ndarray) -> list | None:
    """The rows ``idx`` of a list (None stays None)."""
    return None if xs is None else [xs[int(i)] for i in idx]


def _acc(p: np.ndarray, y: np.ndarray) -> float:
    return float((p.argmax(-1) == y).mean())


def fit_user_side(texts: list[str], labels: np.ndarray | list[int], num_labels: int,
                  held: np.ndarray, remote_held: np.ndarray | None, *,
                  text_pairs: list[str | None] | None = None, seed: int = 0):
    """Everything the user side fits after a remote tune, on the clean rows the user holds:
    -> (local model on every row, Fusion or None, :class:`rapt.local.verdict.Comparison`).

    ``held``: indices of the held-out slice (the prompt never trained on them; empty: none);
    ``remote_held``: the prompt's probabilities (len(held), C) on those rows, privatized as a
    query is (None: not measured). The fusion weights, the comparison and the mode
    (:meth:`Fusion.fit_slice`) use a local model fitted without the slice; the local model
    returned is refitted on every row. Without a slice the comparison is the local model's
    cross-validated accuracy (None when a class has fewer than 2 rows: too few to judge)."""
    from rapt.local.baseline import LocalBaseline
    from rapt.local.verdict import Comparison

    y = np.asarray(labels, dtype=np.int64)
    held = np.asarray(held, dtype=np.int64)
    final = LocalBaseline.fit(texts, y, num_labels, text_pairs=text_pairs, seed=seed)
    if len(held) == 0 or remote_held is None:
        basis = (f"{final.folds}-fold cross-validation" if final.cv_accuracy is not None
                 else "too few rows to cross-validate")
        return final, None, Comparison(final.cv_accuracy, None, None, final.n_rows, basis,
                                       majority=float(np.bincount(y).max() / len(y)))
    keep = np.setdiff1d(np.arange(len(y)), held)
    part = LocalBaseline.fit(pick(texts, keep), y[keep], num_labels,
                             text_pairs=pick(text_pairs, keep), seed=seed)
    local_held = part.predict_proba(pick(texts, held), pick(text_pairs, held))
    fusion = Fusion.fit_slice(remote_held, local_held, y[held], seed=seed)
    return final, fusion, fusion.comparison()
