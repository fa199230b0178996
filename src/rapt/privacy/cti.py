"""Contributing-token identification (CTI) from Split-and-Privatize (SAP, Shen et al. 2023, §4.4).

From labelled token ids, the utility importance of token t for class c is

    UI(t, c) = Σ_{c' ≠ c} ln p(t | c) / p(t | c'),                       (SAP eq. 5)

with p(t | c) the frequency of t among the tokens of class-c examples. The k tokens with the
largest UI per class are the *contributing* tokens; k is the largest value for which the union
of the per-class top-k sets covers at most 1% of all (non-special) token occurrences in the
data (SAP §5.2). The privatizer then perturbs those tokens less: :func:`eta_scale` turns the
set into a per-token multiplier of η for ``Privatizer.privatize_ids(..., eta_scale=...)``.

What privacy statement still holds (be precise, it is weaker than plain dχ-privacy):

* The contributing set is computed from the customer's *private labelled* data. It stays with
  the customer, but it is not itself privatized: which tokens get less noise is a function of
  the private data, and the released text reflects it (with ``multiplier=inf`` an observer sees
  contributing tokens pass through untouched far more often than other tokens, and so can
  learn label-indicative words of the customer's data).
* Given a fixed contributing set, each token position is privatized at η (others) or
  η·multiplier (contributing). A per-token guarantee P[M(x)=w] ≤ exp(η'·d(x, x'))·P[M(x')=w]
  then holds only for pairs x, x' that are *both* non-contributing (η' = η) or both
  contributing (η' = η·multiplier). A mixture of two η values is **not** ηdχ-private for
  pairs that straddle the set: the two output distributions are centred with different noise
  scales, and for ``multiplier=inf`` a contributing token is released deterministically, so
  no finite bound holds at all for it (SAP Algorithm 1 does exactly this).
* With a finite multiplier every token is dχ-private at η·multiplier at worst (the weaker
  parameter bounds both groups): that is the only uniform statement.

Pure functions on token ids and labels; no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

__all__ = [
    "CTI_RULES",
    "DEFAULT_COVERAGE",
    "DEFAULT_SMOOTHING",
    "DEFAULT_ETA_MULTIPLIER",
    "CTIResult",
    "contributing_tokens",
    "eta_scale",
    "privatize_with_scale",
    "token_class_counts",
    "utility_importance",
]

DEFAULT_COVERAGE = 0.01
"""Largest fraction of token occurrences the contributing tokens may cover (SAP §5.2)."""

DEFAULT_SMOOTHING = 1.0
"""α of the add-α estimate of p(t | c) in :func:`utility_importance` (ours: SAP gives none).

The paper specifies no smoothing; some α > 0 is needed because a token unseen in a class
makes eq. 5 infinite. The choice moves the ranking and, through it, the uniform rule's k:
on the whole Financial PhraseBank train split with MiniLM's vocabulary α = 1 puts ``is``
second for the neutral class and caps k at 1 (3 tokens, 0.29 % coverage), α = 0.1 gives
k = 7 (21 tokens, 1.00 %), α = 0.01 gives k = 9 (27 tokens, 0.95 %). Results on
CTI should therefore name α, and a conclusion should hold across α.

Measured (``benchmarks/results/sap_findings.md``): on that split the uniform rule beats SAP at
P 0.6 and 0.4 with α = 0.1 but not with α = 1; on SST-2 it beats SAP at neither. The default
stays 1 because a smaller α releases rarer, more identifying words unperturbed.
"""

CTI_RULES: tuple[str, ...] = ("uniform", "per-class")
"""How the coverage budget picks tokens from each class's UI ranking.

``"uniform"`` is SAP's rule (§5.2): one k for every class, the largest whose union covers at
most the budget. One frequent token high in a single class's ranking caps k for all classes
(on Financial PhraseBank with MiniLM's vocabulary, neutral's second token ``is`` alone is 0.6 %
of the occurrences, so k = 1: three tokens, 0.29 % coverage). ``"per-class"`` is *not* the
paper's rule, a labelled variant of ours: walk the classes' rankings round-robin and add each
next token that still fits the budget, skipping any that would overflow it, so each class gets
its own k and the budget is filled (FP: 16 tokens, 1.0 %).
"""

DEFAULT_ETA_MULTIPLIER = 2.0
"""η multiplier for contributing tokens when none is given.

SAP's Algorithm 1 adds no noise at all to contributing tokens (multiplier ∞, allowed: pass
``math.inf``), which removes every guarantee for them: anyone can read those words off the
privatized text. The default keeps them dχ-private with a weaker parameter instead. With noise
density ∝ exp(-η‖z‖) the noise norm is Gamma(d, 1/η), so E‖z‖ = d/η: a multiplier of 2 halves
the expected displacement, while the per-token bound of equation 1 becomes exp(2η·d(x, x')),
a documented, finite privacy cost on ≤ 1% of the token occurrences (see the module docstring
for what holds for pairs across the two groups).
"""


def _flatten(token_ids: Sequence[Sequence[int]] | Sequence[torch.Tensor], labels: Sequence[int]
             ) -> tuple[torch.Tensor, torch.Tensor]:
    if len(token_ids) != len(labels):
        raise ValueError(f"{len(token_ids)} token sequences but {len(labels)} labels")
    seqs = [torch.as_tensor(s, dtype=torch.long).reshape(-1) for s in token_ids]
    lens = torch.tensor([len(s) for s in seqs], dtype=torch.long)
    lab = torch.as_tensor(list(labels), dtype=torch.long)
    flat = torch.cat(seqs) if seqs else torch.zeros(0, dtype=torch.long)
    return flat, torch.repeat_interleave(lab, lens)


def token_class_counts(
    token_ids: Sequence[Sequence[int]] | Sequence[torch.Tensor],
    labels: Sequence[int],
    num_classes: int,
    vocab_size: int,
    special_ids: Iterable[int] = (),
) -> torch.Tensor:
    """Occurrence counts, shape (num_classes, vocab_size), float64; special ids are zeroed.

    ``token_ids[i]`` are the ids of example i (padding should be among ``special_ids``),
    ``labels[i]`` its class in [0, num_classes).
    """
    flat, lab = _flatten(token_ids, labels)
    if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= vocab_size):
        raise ValueError(f"token ids must lie in [0, {vocab_size})")
    if lab.numel() and (int(lab.min()) < 0 or int(lab.max()) >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes})")
    counts = torch.bincount(lab * vocab_size + flat, minlength=num_classes * vocab_size)
    counts = counts.reshape(num_classes, vocab_size).to(torch.float64)
    special = [i for i in special_ids if 0 <= i < vocab_size]
    if special:
        counts[:, special] = 0.0
    return counts


def utility_importance(counts: torch.Tensor, smoothing: float = DEFAULT_SMOOTHING,
                       special_ids: Iterable[int] = ()) -> torch.Tensor:
    """UI(t, c) from counts (C, V), shape (C, V); special ids get -inf.

    ``smoothing`` is α (> 0, default :data:`DEFAULT_SMOOTHING` = 1, add-one): p(t | c) is the
    add-α estimate (n_tc + α) / (N_c + α·V'), V' the number of non-special vocabulary entries.
    Without smoothing a token never seen in some class c' has p(t | c') = 0 and UI = +∞, so
    every token seen once in one class only would tie at the top with genuinely indicative
    frequent tokens. α keeps UI finite and shrinks the ratio of rare tokens towards 0: the
    larger α, the more a token must be frequent in c *and* rare elsewhere to rank high, and
    the more frequent function words (``is``) can climb a ranking; the smaller α, the more
    rare one-class tokens rise. The paper gives no α; see :data:`DEFAULT_SMOOTHING` for what
    the choice does on Financial PhraseBank.
    """
    if counts.dim() != 2:
        raise ValueError(f"counts must be (classes, vocab), got shape {tuple(counts.shape)}")
    if smoothing <= 0:
        raise ValueError(f"smoothing must be > 0, got {smoothing}")
    c, v = counts.shape
    if c < 2:
        raise ValueError("utility importance needs at least 2 classes")
    special = torch.zeros(v, dtype=torch.bool)
    special[[i for i in special_ids if 0 <= i < v]] = True
    counts = counts.to(torch.float64).masked_fill(special, 0.0)
    v_eff = int((~special).sum())
    logp = torch.log(counts + smoothing) - torch.log(
        counts.sum(dim=1, keepdim=True) + smoothing * v_eff)
    # Σ_{c'≠c} (log p_c - log p_c') = C·log p_c - Σ_c' log p_c'
    ui = c * logp - logp.sum(dim=0, keepdim=True)
    return ui.masked_fill(special, float("-inf"))


@dataclass
class CTIResult:
    """Contributing tokens. ``per_class[c]`` are class c's top-k ids, best first;
    ``token_ids`` their sorted union; ``coverage`` the fraction of non-special token
    occurrences they account for; ``scores`` the UI matrix (C, V); ``counts`` (C, V);
    ``ranking`` (C, V) each class's candidate ids by decreasing UI, padded with -1."""

    k: int
    token_ids: list[int]
    per_class: list[list[int]]
    coverage: float
    scores: torch.Tensor
    counts: torch.Tensor
    ranking: torch.Tensor

    @property
    def k_per_class(self) -> list[int]:
        """How many tokens each class contributed (all ``k`` under the uniform rule)."""
        return [len(r) for r in self.per_class]

    def eta_scale(self, ids: torch.Tensor, multiplier: float = DEFAULT_ETA_MULTIPLIER
                  ) -> torch.Tensor:
        """Per-token η multiplier for ``ids``; see :func:`eta_scale`."""
        return eta_scale(ids, self.token_ids, multiplier)


def _union(ranked: torch.Tensor, k: int) -> torch.Tensor:
    top = ranked[:, :k].reshape(-1)
    return torch.unique(top[top >= 0])


def contributing_tokens(
    token_ids: Sequence[Sequence[int]] | Sequence[torch.Tensor],
    labels: Sequence[int],
    *,
    num_classes: int | None = None,
    vocab_size: int | None = None,
    special_ids: Iterable[int] = (),
    coverage: float = DEFAULT_COVERAGE,
    k: int | None = None,
    smoothing: float = DEFAULT_SMOOTHING,
    rule: str = "uniform",
) -> CTIResult:
    """Top-k contributing tokens per class (SAP §4.4).

    Only tokens that occur in class c are candidates for class c (an unseen token's UI
    reflects class sizes, not evidence). With ``k=None`` and ``rule="uniform"`` (the paper's),
    k is the largest value such that the union of all classes' top-k tokens covers at most
    ``coverage`` of the non-special token occurrences in ``token_ids`` (coverage grows with k,
    so a binary search finds it; k may be 0 when even the top token of some class is too
    frequent). ``rule="per-class"`` fills the same budget class by class (see
    :data:`CTI_RULES`); ``k`` is then the largest per-class count. An explicit ``k`` is used
    as given (uniform) and its coverage reported. ``smoothing``: α of
    :func:`utility_importance` (it changes the rankings, hence k).
    """
    if not 0.0 <= coverage <= 1.0:
        raise ValueError(f"coverage must be in [0, 1], got {coverage}")
    if rule not in CTI_RULES:
        raise ValueError(f"rule must be one of {', '.join(CTI_RULES)}, got {rule!r}")
    special = sorted(set(int(i) for i in special_ids))
    labels = list(labels)
    if num_classes is None:
        num_classes = max(labels) + 1 if labels else 0
    if vocab_size is None:
        vocab_size = max((int(torch.as_tensor(s).max()) for s in token_ids
                          if torch.as_tensor(s).numel()), default=-1) + 1
    counts = token_class_counts(token_ids, labels, num_classes, vocab_size, special)
    scores = utility_importance(counts, smoothing, special)
    total_per_token = counts.sum(dim=0)
    total = float(total_per_token.sum())
    if total == 0:
        raise ValueError("no non-special tokens to analyse")

    # Rank each class's candidates by UI (ties: more occurrences in c first); -1 pads.
    masked = scores.masked_fill(counts <= 0, float("-inf"))
    order = torch.argsort(counts, dim=1, descending=True, stable=True)
    order = torch.gather(order, 1, torch.argsort(torch.gather(masked, 1, order), dim=1,
                                                 descending=True, stable=True))
    valid = torch.isfinite(torch.gather(masked, 1, order))
    ranked = torch.where(valid, order, torch.full_like(order, -1))
    k_max = int(valid.sum(dim=1).max())

    def cov(kk: int) -> float:
        return float(total_per_token[_union(ranked, kk)].sum()) / total

    if k is None and rule == "per-class":
        per_class = _fill_per_class(ranked, total_per_token, coverage * total)
        union = sorted({t for row in per_class for t in row})
        return CTIResult(k=max((len(r) for r in per_class), default=0), token_ids=union,
                         per_class=per_class,
                         coverage=float(total_per_token[union].sum()) / total,
                         scores=scores, counts=counts, ranking=ranked)
    if k is None:
        lo, hi = 0, k_max  # invariant: cov(lo) <= coverage
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if cov(mid) <= coverage:
                lo = mid
            else:
                hi = mid - 1
        k = lo
    elif k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    per_class = [[int(t) for t in row[:k] if t >= 0] for row in ranked]
    union = _union(ranked, k)
    return CTIResult(k=k, token_ids=[int(t) for t in union], per_class=per_class,
                     coverage=cov(k), scores=scores, counts=counts, ranking=ranked)


def _fill_per_class(ranked: torch.Tensor, occurrences: torch.Tensor, budget: float
                    ) -> list[list[int]]:
    """Round-robin over the classes' rankings (C, V): each class in turn takes its next-ranked
    token that is not yet chosen and whose occurrences still fit ``budget`` (skipping those
    that would overflow it), until no class can add one. Returns each class's tokens."""
    # A Python walk: the union changes what fits, so this is not a vectorisable cumsum; it
    # visits each ranked candidate at most once (C × V steps).
    rows = [[int(t) for t in row if t >= 0] for row in ranked]
    counts = occurrences.tolist()
    pos = [0] * len(rows)
    chosen: set[int] = set()
    per_class: list[list[int]] = [[] for _ in rows]
    used = 0.0
    active = [c for c in range(len(rows)) if rows[c]]
    while active:
        still = []
        for c in active:
            while pos[c] < len(rows[c]):
                t = rows[c][pos[c]]
                pos[c] += 1
                if t not in chosen and used + counts[t] <= budget:
                    chosen.add(t)
                    per_class[c].append(t)
                    used += counts[t]
                    still.append(c)
                    break
        active = still
    return per_class


def eta_scale(ids: torch.Tensor, contributing: Iterable[int] | torch.Tensor,
              multiplier: float = DEFAULT_ETA_MULTIPLIER) -> torch.Tensor:
    """Per-token η multiplier, same shape as ``ids`` (float32, on ``ids``' device).

    ``multiplier`` (≥ 1, ``inf`` allowed) where the id is a contributing token, 1 elsewhere. A
    larger η means smaller noise. ``inf`` means *no* perturbation (SAP Algorithm 1 line 12):
    ``Privatizer.privatize_ids`` refuses an infinite scale, so pass the result to
    :func:`privatize_with_scale`, which lets those positions through unchanged.
    """
    if not multiplier >= 1.0:  # also rejects NaN
        raise ValueError(f"multiplier must be >= 1 (inf = no noise), got {multiplier}")
    ids = torch.as_tensor(ids)
    contrib = torch.as_tensor(list(contributing) if not isinstance(contributing, torch.Tensor)
                              else contributing, dtype=ids.dtype, device=ids.device)
    hit = torch.isin(ids, contrib)
    out = torch.ones(ids.shape, dtype=torch.float32, device=ids.device)
    return out.masked_fill(hit, float(multiplier))


def privatize_with_scale(privatizer, ids: torch.Tensor, scale: torch.Tensor | None = None,
                         noise=None) -> torch.Tensor:
    """``privatizer.privatize_ids`` with a per-token η multiplier that may be ``inf``.

    Positions whose scale is ``inf`` are returned unchanged; the others go through the
    mechanism at η·scale. Noise is drawn per position: every non-special position takes the
    same slot of the noise stream whatever its scale (a passed-through one draws its noise and
    discards it), so with one seed SAP (``scale=None``) and SAP-CTI give the same output on
    every non-contributing position and the paired comparison shares its noise. ``ids`` any
    shape -> same shape (CPU LongTensor)."""
    ids = torch.as_tensor(ids, dtype=torch.long)
    if scale is None:
        return privatizer.privatize_ids(ids, noise=noise).cpu()
    scale = torch.as_tensor(scale, dtype=torch.float64)
    if scale.shape != ids.shape:
        raise ValueError(f"scale must have the ids' shape {tuple(ids.shape)}, got "
                         f"{tuple(scale.shape)}")
    free = torch.isinf(scale)
    # the finite stand-in only scales noise that is thrown away
    finite = torch.where(free, torch.ones_like(scale), scale)
    return privatizer.privatize_ids(ids, eta_scale=finite, noise=noise,
                                    passthrough=free if bool(free.any()) else None).cpu()
