"""A contextual guess that ignores the token itself: each original token from its released
neighbours only, counted on public text released by the same mechanism.

Where the release of a position does not depend on its token (personal data at η 0,
``--personal-p 1``), nearest neighbour and the Bayes attackers recover nothing by construction;
what is left to an attacker is the context, which a by-kind release sends partly in clear.
This attacker measures that part: for every position of a release it returns the original
token seen most often between the same two released neighbours in its training pairs, backing
off to the left neighbour, then the right one, then the most frequent token. It is weaker than
the trained domain denoiser (it reads one token either side, never the position), so the
recovery it measures is a floor for what context gives back, not a ceiling.

Counts over token ids, written here: an n-gram table keyed by released neighbours is a few
dictionary updates, and no language-model library takes a (released, original) pairing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["ContextGuesser"]

EDGE = -1  # the neighbour of a row's first and last token


def _best(counts: Counter) -> dict:
    """key -> the most frequent original (ties to the smallest id, so a fit is deterministic)."""
    best: dict = {}
    for (key, tok), n in counts.items():
        have = best.get(key)
        if have is None or n > have[1] or (n == have[1] and tok < have[0]):
            best[key] = (tok, n)
    return {k: t for k, (t, _) in best.items()}


@dataclass(frozen=True)
class ContextGuesser:
    """``both[(left, right)]``, ``left[left]``, ``right[right]``: the guess for a position
    whose released neighbours are those ids (:data:`EDGE` beyond the row); ``default``: the
    most frequent original token."""

    both: dict[tuple[int, int], int]
    left: dict[int, int]
    right: dict[int, int]
    default: int

    @classmethod
    def fit(cls, clean_rows: Sequence[Sequence[int]],
            released_rows: Sequence[Sequence[int]]) -> ContextGuesser:
        """Counts from aligned (original, released) rows of public text."""
        if len(clean_rows) != len(released_rows):
            raise ValueError(f"{len(clean_rows)} clean rows for {len(released_rows)} released")
        both, left, right, uni = Counter(), Counter(), Counter(), Counter()
        for i, (c, r) in enumerate(zip(clean_rows, released_rows, strict=True)):
            if len(c) != len(r):
                raise ValueError(f"row {i}: {len(c)} clean tokens for {len(r)} released")
            for j, tok in enumerate(c):
                a = r[j - 1] if j else EDGE
                b = r[j + 1] if j + 1 < len(r) else EDGE
                both[((a, b), tok)] += 1
                left[(a, tok)] += 1
                right[(b, tok)] += 1
                uni[(None, tok)] += 1
        if not uni:
            raise ValueError("no tokens to count")
        return cls(_best(both), _best(left), _best(right), _best(uni)[None])

    def guess(self, released_rows: Sequence[Sequence[int]]) -> list[list[int]]:
        """The guessed original of every position, rows as given."""
        out = []
        for r in released_rows:
            row = []
            for j in range(len(r)):
                a = r[j - 1] if j else EDGE
                b = r[j + 1] if j + 1 < len(r) else EDGE
                g = self.both.get((a, b))
                if g is None:
                    g = self.left.get(a, self.right.get(b, self.default))
                row.append(g)
            out.append(row)
        return out
