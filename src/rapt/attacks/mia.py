"""Membership inference against prompted LLMs (Flocks §3).

The adversary queries the prompted model with candidate texts and scores each by the model's
probability of the candidate's true label; demonstrations in the prompt (members) tend to score
higher than other private examples (non-members). AUC is the Mann-Whitney U statistic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import rankdata

from rapt.pate.pate import Demo, PateInputError, Progress, PromptTemplate
from rapt.pate.scorer import LabelScorer, normalize


def roc_auc(member_scores: Sequence[float], nonmember_scores: Sequence[float]) -> float:
    """P(member score > non-member score) + ½ P(tie), i.e. U / (n1 n0) (ties get mid-ranks)."""
    m = np.asarray(member_scores, dtype=np.float64)
    n = np.asarray(nonmember_scores, dtype=np.float64)
    if len(m) == 0 or len(n) == 0:
        raise ValueError("AUC needs at least one member and one non-member score")
    ranks = rankdata(np.concatenate([m, n]))
    u = ranks[: len(m)].sum() - len(m) * (len(m) + 1) / 2.0
    return float(u / (len(m) * len(n)))


def roc_curve(member_scores: Sequence[float], nonmember_scores: Sequence[float]
              ) -> tuple[np.ndarray, np.ndarray]:
    """(FPR, TPR) at every distinct threshold, from (0, 0) to (1, 1); members are positives."""
    s = np.concatenate([np.asarray(member_scores, float), np.asarray(nonmember_scores, float)])
    y = np.concatenate([np.ones(len(member_scores)), np.zeros(len(nonmember_scores))])
    order = np.argsort(-s, kind="mergesort")
    s, y = s[order], y[order]
    last = np.r_[np.nonzero(np.diff(s))[0], len(s) - 1]  # end of each tie group
    tps, fps = np.cumsum(y)[last], np.cumsum(1 - y)[last]
    tpr = np.r_[0.0, tps / max(1.0, y.sum())]
    fpr = np.r_[0.0, fps / max(1.0, (1 - y).sum())]
    return fpr, tpr


def mean_roc(curves: Sequence[tuple[np.ndarray, np.ndarray]], grid: int = 101
             ) -> tuple[np.ndarray, np.ndarray]:
    """Vertical average of ROC curves on an FPR grid (the blue line of Figure 2b)."""
    fpr = np.linspace(0.0, 1.0, grid)
    tprs = [np.interp(fpr, f, t) for f, t in curves]
    return fpr, np.mean(tprs, axis=0)


def true_label_scores(scorer: LabelScorer, template: PromptTemplate, demos: Sequence[Demo],
                      candidates: Sequence[Demo], *, normalized: bool = False) -> np.ndarray:
    """The attack score: P(true label | prompt, candidate text) for each candidate (N,).

    ``normalized=False`` uses the raw next-token probability (over the whole vocabulary), as the
    paper reads it from the API; ``True`` renormalizes over the label words.
    """
    p = scorer.label_probs(template.prefix(demos), [template.query(t, q) for t, _, q in candidates])
    if normalized:
        p = normalize(p)
    return p[np.arange(len(candidates)), [y for _, y, _ in candidates]]


@dataclass
class MIAResult:
    aucs: np.ndarray  # (P,) one AUC per attacked prompt
    member_scores: list[np.ndarray]
    nonmember_scores: list[np.ndarray]

    @property
    def mean_auc(self) -> float:
        return float(self.aucs.mean())

    def curves(self) -> list[tuple[np.ndarray, np.ndarray]]:
        return [roc_curve(m, n) for m, n in zip(self.member_scores, self.nonmember_scores,
                                                strict=True)]

    def summary(self) -> dict:
        return {"prompts": len(self.aucs), "mean_auc": self.mean_auc,
                "std_auc": float(self.aucs.std()), "aucs": self.aucs.tolist(),
                "mean_member_score": float(np.mean(np.concatenate(self.member_scores))),
                "mean_nonmember_score": float(np.mean(np.concatenate(self.nonmember_scores)))}


def prompt_mia(scorer: LabelScorer, template: PromptTemplate, private: Sequence[Demo], *,
               n_prompts: int = 100, shots: int = 1, n_nonmembers: int = 50, seed: int = 0,
               normalized: bool = False, progress: Progress | None = None) -> MIAResult:
    """Attack ``n_prompts`` random k-shot prompts from ``private``; each AUC: members vs
    ``n_nonmembers`` other random private examples (Flocks: 1 vs 50, 100 prompts)."""
    if n_prompts < 1 or shots < 1 or n_nonmembers < 1:
        raise PateInputError("n_prompts, shots and n_nonmembers must be >= 1")
    if len(private) < shots + n_nonmembers:
        raise PateInputError(f"{len(private)} private examples cannot give {shots} members and "
                             f"{n_nonmembers} non-members")
    rng = np.random.default_rng(seed)
    aucs, ms, ns = [], [], []
    for _ in range(n_prompts):
        idx = rng.choice(len(private), size=shots + n_nonmembers, replace=False)
        members = [private[i] for i in idx[:shots]]
        nonmembers = [private[i] for i in idx[shots:]]
        s = true_label_scores(scorer, template, members, members + nonmembers,
                              normalized=normalized)
        ms.append(s[:shots])
        ns.append(s[shots:])
        aucs.append(roc_auc(s[:shots], s[shots:]))
        if progress:
            progress(len(s))
    return MIAResult(np.asarray(aucs), ms, ns)


def student_mia(scorer: LabelScorer, template: PromptTemplate, student_demos: Sequence[Demo],
                members: Sequence[Demo], nonmembers: Sequence[Demo], *,
                normalized: bool = False) -> MIAResult:
    """The same attack on a released student prompt: members = private examples that were in
    teacher prompts, non-members = private examples that were not. One AUC."""
    if not members or not nonmembers:
        raise PateInputError("student MIA needs at least one member and one non-member")
    s = true_label_scores(scorer, template, student_demos, [*members, *nonmembers],
                          normalized=normalized)
    m, n = s[: len(members)], s[len(members):]
    return MIAResult(np.asarray([roc_auc(m, n)]), [m], [n])
