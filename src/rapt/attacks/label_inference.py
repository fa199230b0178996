"""Label inference from the loss gradients a split-learning customer returns.

In SAP the customer keeps the labels and its output layer W (classes × width) and returns, per
training step, ∂l/∂g (B, width) to the provider. For cross-entropy over B rows,

    ∂l/∂g_i = Wᵀ (p_i − e_{y_i}) / B,

and the rows of p − e_y sum to zero, so every batch's gradients lie in the (C − 1)-dimensional
image of the zero-sum vectors under Wᵀ: the provider reads the number of classes C off the
numerical rank of any batch that holds every class. Within that subspace the gradient of a
class-y row points along Wᵀ(q − e_y), q a distribution over the *other* classes (its only
negative coordinate is y's), so the classes form C disjoint cones: clustering the gradient
directions groups the rows by label (Li et al., "Label Leakage and Protection in Two-party
Split Learning", ICLR 2022, do the two-class case with the sign of a projection).

The attacker here is the provider: it sees the gradients batch by batch (and which rows each
batch holds), estimates C from their rank, clusters the first batch that spans C − 1 dimensions
(spherical k-means, restarts) and follows the clusters through training (each batch starts
from the current centroids, and they move with W). Naming the clusters takes a few rows whose
labels it knows; :func:`score_clusters` gives the accuracy under the best naming (what those
few rows buy) and the purity (what it learns without naming anything: which rows share a
label). Pure tensor code; no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
from torch import Tensor

__all__ = ["LabelInferenceResult", "estimate_num_classes", "gradient_rank",
           "infer_labels", "label_inference_attack", "score_clusters"]

RANK_RTOL = 1e-5
"""Singular values below this share of the largest count as zero: float32 gradients put the
exact zeros near 1e-7 relative, a real class direction (a rare class's) well above 1e-3."""


def gradient_rank(grad: Tensor, rtol: float = RANK_RTOL) -> int:
    """Numerical rank of one batch's gradients (B, width)."""
    if grad.dim() != 2 or grad.shape[0] == 0:
        raise ValueError(f"gradients must be (B, width) with B >= 1, got {tuple(grad.shape)}")
    s = torch.linalg.svdvals(grad.double())
    return int((s > rtol * s[0]).sum()) if float(s[0]) > 0 else 0


def estimate_num_classes(batches: Sequence[Tensor], rtol: float = RANK_RTOL) -> int:
    """C = 1 + the largest rank over the batches (a batch missing a class only lowers it).
    Noise on the gradients makes every batch full rank, and the estimate becomes B + 1."""
    if not batches:
        raise ValueError("no gradient batches")
    return 1 + max(gradient_rank(g, rtol) for g in batches)


def _unit(x: Tensor) -> Tensor:
    return torch.nn.functional.normalize(x.double(), dim=-1)


def _lloyd(u: Tensor, centroids: Tensor, iters: int) -> tuple[Tensor, Tensor]:
    """Spherical k-means on unit rows ``u`` from ``centroids`` (k, width): (assignment, new
    centroids); a cluster left empty keeps its centroid."""
    c = centroids.clone()
    for _ in range(iters):
        a = (u @ c.T).argmax(1)
        new = c.clone()
        for j in range(len(c)):
            if bool((a == j).any()):
                new[j] = _unit(u[a == j].sum(0))
        if torch.equal(new, c):
            break
        c = new
    return (u @ c.T).argmax(1), c


def _kmeans(u: Tensor, k: int, gen: torch.Generator, restarts: int, iters: int) -> Tensor:
    """Centroids (k, width) of the best of ``restarts`` spherical k-means++ runs on ``u``."""
    best, best_fit = None, -float("inf")
    for _ in range(restarts):
        idx = [int(torch.randint(len(u), (1,), generator=gen))]
        for _ in range(1, k):
            dist = (1 - (u @ u[idx].T).max(1).values).clamp_min(0)
            if float(dist.sum()) == 0:
                idx.append(int(torch.randint(len(u), (1,), generator=gen)))
            else:
                idx.append(int(torch.multinomial(dist, 1, generator=gen)))
        a, c = _lloyd(u, u[idx], iters)
        fit = float((u * c[a]).sum())  # total cosine to the own centroid
        if fit > best_fit:
            best, best_fit = c, fit
    assert best is not None
    return best


def infer_labels(batches: Sequence[Tensor], k: int | None = None, *, rtol: float = RANK_RTOL,
                 seed: int = 0, restarts: int = 10, iters: int = 20,
                 momentum: float = 0.5) -> tuple[list[Tensor], int]:
    """Cluster ids for every row of every batch (one (B,) tensor per batch) and the number of
    clusters used (``k``, else :func:`estimate_num_classes`). ``momentum``: how far each
    batch's centroids move the tracked ones (they follow the customer's changing W)."""
    if not batches:
        raise ValueError("no gradient batches")
    k = k or estimate_num_classes(batches, rtol)
    units = [_unit(g) for g in batches]
    gen = torch.Generator().manual_seed(seed)
    # start from the first batch that spans every class (rank k - 1), else the largest one
    full = [i for i, g in enumerate(batches) if gradient_rank(g, rtol) >= k - 1
            and len(g) >= k]
    first = full[0] if full else max(range(len(units)), key=lambda i: len(units[i]))
    if len(units[first]) < k:
        raise ValueError(f"no batch has {k} rows to start {k} clusters from")
    centroids = _kmeans(units[first], k, gen, restarts, iters)
    out = []
    for u in units:
        a, c = _lloyd(u, centroids, iters)
        present = torch.zeros(k, dtype=torch.bool)
        present[a.unique()] = True
        moved = _unit((1 - momentum) * centroids + momentum * c)
        centroids = torch.where(present.unsqueeze(1), moved, centroids)
        out.append(a)
    return out, k


def score_clusters(clusters: Tensor, labels: Tensor) -> tuple[float, float]:
    """(purity, accuracy under the best one-to-one naming of clusters by labels) of cluster ids
    (n,) against the true labels (n,)."""
    from scipy.optimize import linear_sum_assignment

    clusters, labels = clusters.long().flatten(), labels.long().flatten()
    if clusters.shape != labels.shape or clusters.numel() == 0:
        raise ValueError(f"need one cluster per label, got {clusters.numel()} and "
                         f"{labels.numel()}")
    k, c = int(clusters.max()) + 1, int(labels.max()) + 1
    table = torch.zeros(k, c, dtype=torch.long)
    table.index_put_((clusters, labels), torch.ones_like(clusters), accumulate=True)
    n = clusters.numel()
    purity = float(table.max(1).values.sum()) / n
    rows, cols = linear_sum_assignment(table.numpy(), maximize=True)
    return purity, float(table[rows, cols].sum()) / n


@dataclass
class LabelInferenceResult:
    """What the provider learned from ∂l/∂g: ``num_classes_inferred`` (from the rank),
    ``purity`` and ``accuracy`` (best naming) against the labels the gradients were computed
    from, over ``n`` gradient rows; ``num_classes`` the true count, for comparison."""

    num_classes_inferred: int
    num_classes: int
    purity: float
    accuracy: float
    n: int

    def as_dict(self) -> dict:
        return asdict(self)


def label_inference_attack(batches: Sequence[Tensor], labels: Sequence[Tensor], *,
                           num_classes: int, seed: int = 0) -> LabelInferenceResult:
    """Run :func:`infer_labels` on the provider's gradient batches and score it against the
    labels of each batch's rows (only the scoring reads ``labels``; the clustering does not)."""
    if len(batches) != len(labels):
        raise ValueError(f"{len(batches)} gradient batches but {len(labels)} label batches")
    clusters, k = infer_labels(batches, seed=seed)
    purity, acc = score_clusters(torch.cat(clusters), torch.cat([torch.as_tensor(y).long()
                                                                 for y in labels]))
    return LabelInferenceResult(k, int(num_classes), purity, acc,
                                sum(len(g) for g in batches))
