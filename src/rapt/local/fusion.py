"""User-side fusion: the remote prediction (on the privatized query) and the local one (on the
clean query) in a weighted log-linear pool, p ∝ p_remote^a · p_local^b.

The two weights are fitted by log-loss on rows the remote prompt never trained on (the held-out
slice of :func:`holdout_split`), with the local model's probabilities on that slice coming from a
model fitted without it. Fitting them on the prompt's own training rows would trust the remote
side for what it memorized. Two weights on a grid, not a learned stacker: a few hundred held-out
rows support two parameters, and a = 0 or b = 0 (one side alone) stays reachable.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

HOLDOUT_FRACTION = 0.2
HOLDOUT_MAX = 500  # rows: enough for two weights; more would cost the remote prompt rows
MIN_HOLDOUT = 20  # below this no slice is held out and nothing is fused
WEIGHTS = np.round(np.arange(0.0, 3.0001, 0.1), 1)
EPS = 1e-6  # probability floor: a hard 0 from one side must not veto the other


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
    ``n_rows`` held-out rows, on which ``accuracy`` gives remote, local and fused accuracy (0–1).
    Statistics of private rows: they stay on the user's machine."""

    remote: float
    local: float
    n_rows: int = 0
    accuracy: dict | None = None

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
        (ties: the smaller weights). ValueError when shapes disagree or no row is given."""
        remote, local = np.asarray(remote, float), np.asarray(local, float)
        y = np.asarray(labels, dtype=np.int64)
        if remote.shape != local.shape or remote.ndim != 2 or len(y) != len(remote):
            raise ValueError(f"fusion needs (N, C) remote and local probabilities and N labels "
                             f"(got {remote.shape}, {local.shape}, {len(y)})")
        if len(y) == 0:
            raise ValueError("fusion needs at least one held-out row")
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

    def to_dict(self) -> dict:
        return {"remote": self.remote, "local": self.local, "n_rows": self.n_rows,
                "accuracy": self.accuracy}

    @classmethod
    def from_dict(cls, d: dict) -> Fusion:
        try:
            a, b = float(d["remote"]), float(d["local"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not saved fusion weights: {e}") from e
        if not (a >= 0 and b >= 0 and np.isfinite(a) and np.isfinite(b)):
            raise ValueError(f"fusion weights must be finite and >= 0 (got {a}, {b})")
        return cls(a, b, int(d.get("n_rows", 0)), d.get("accuracy"))


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
    query is (None: not measured). The fusion weights and the comparison use a local model
    fitted without the slice; the local model returned is refitted on every row."""
    from rapt.local.baseline import LocalBaseline
    from rapt.local.verdict import Comparison

    y = np.asarray(labels, dtype=np.int64)
    held = np.asarray(held, dtype=np.int64)
    final = LocalBaseline.fit(texts, y, num_labels, text_pairs=text_pairs, seed=seed)
    if len(held) == 0 or remote_held is None:
        return final, None, Comparison(final.cv_accuracy or 0.0, None, None, final.n_rows,
                                       f"{final.folds}-fold cross-validation")
    keep = np.setdiff1d(np.arange(len(y)), held)
    part = LocalBaseline.fit(pick(texts, keep), y[keep], num_labels,
                             text_pairs=pick(text_pairs, keep), seed=seed)
    local_held = part.predict_proba(pick(texts, held), pick(text_pairs, held))
    fusion = Fusion.fit(remote_held, local_held, y[held])
    acc = fusion.accuracy or {}
    return final, fusion, Comparison(acc["local"], acc["remote"], acc["fused"], len(held))
