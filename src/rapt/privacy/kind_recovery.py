"""An attacker's recovery, and so the empirical privacy, per kind of token (I/O-free).

Given the original token ids, an attacker's guesses (same shape), which positions the mechanism
replaced, and each token's kind (:class:`rapt.privacy.kinds.TokenKinds`), it counts for every
kind -- all tokens, each frequency band of public text, personal data, and the rest --

* ``count`` and ``replaced``: how many tokens of that kind there are (``unit``: "token"), and
  how many of them the mechanism replaced;
* ``recovery``: the share of them the attacker guessed right, and ``replaced_recovery``: the
  share of the replaced ones it guessed right (an attacker that returns the release, nearest
  neighbour, gets none of those);
* ``privacy`` = 1 − ``recovery``: the empirical privacy of that kind against this attacker (an
  upper bound on what a stronger attacker would leave);
* each with a 95 % Wilson interval, which treats tokens as independent trials: right for the
  per-token noise of the mechanism and for per-token attackers, optimistic (too narrow) for an
  attacker that reads context, whose errors cluster within a sentence.

What is counted: tokens (word pieces), never special tokens (pass rows without them). With
``words`` (each token's word index in its row, :attr:`TokenKinds.words`) the same figures are
also given per *word* under ``"words"``: a word is recovered when every one of its pieces is,
replaced when any of them is, of a band by its own band, and personal data when any of its
pieces is.
"""

from __future__ import annotations

from collections.abc import Sequence

from rapt.privacy.by_kind import CLASSES, DEFAULT_FREQUENT_RANK
from rapt.privacy.kinds import BANDS
from rapt.stats import wilson_interval

__all__ = ["CLASS_KINDS", "KINDS", "NN", "class_counts",
           "privacy_by_class", "recovery_by_class", "recovery_by_kind", "with_attacker"]

KINDS = ("all", *BANDS, "personal data", "not personal data")
# The kinds of a privacy report's "by_kind": all tokens and the classes of rapt.privacy.by_kind.
CLASS_KINDS = ("all", "rare", "personal", "frequent")
NO_TOKENS = "no token of this kind in the release"
NN = "nearest neighbour"


def _rate(k: int, n: int) -> tuple[float | None, list[float] | None]:
    ci = wilson_interval(k, n)
    return (k / n if n else None), (None if ci is None else [ci[0], ci[1]])


def _summary(hit: list[bool], repl: list[bool], unit: str) -> dict:
    n, r = len(hit), sum(repl)
    k, kr = sum(hit), sum(h and x for h, x in zip(hit, repl, strict=True))
    rec, rec_ci = _rate(k, n)
    rrec, rrec_ci = _rate(kr, r)
    return {"unit": unit, "count": n, "replaced": r, "recovered": k, "replaced_recovered": kr,
            "recovery": rec, "recovery_ci95": rec_ci,
            "replaced_recovery": rrec, "replaced_recovery_ci95": rrec_ci,
            "privacy": None if rec is None else 1.0 - rec,
            "privacy_ci95": None if rec_ci is None else [1.0 - rec_ci[1], 1.0 - rec_ci[0]]}


def _by_kind(hit: list[bool], repl: list[bool], band: list[int], personal: list[bool],
             unit: str) -> dict:
    select = {"all": lambda i: True,
              **{name: (lambda i, b=b: band[i] == b) for b, name in enumerate(BANDS)},
              "personal data": lambda i: personal[i],
              "not personal data": lambda i: not personal[i]}
    out = {}
    for kind in KINDS:
        idx = [i for i in range(len(hit)) if select[kind](i)]
        out[kind] = _summary([hit[i] for i in idx], [repl[i] for i in idx], unit)
    return out


def _check(name: str, rows, original) -> None:
    if len(rows) != len(original) or any(len(a) != len(b)
                                         for a, b in zip(rows, original, strict=True)):
        raise ValueError(f"{name} rows do not align with the original rows")


def recovery_by_kind(original: Sequence[Sequence[int]], guessed: Sequence[Sequence[int]],
                     replaced: Sequence[Sequence[bool]], bands: Sequence[Sequence[int]],
                     personal: Sequence[Sequence[bool]],
                     words: Sequence[Sequence[int]] | None = None) -> dict[str, dict]:
    """Per kind in :data:`KINDS`: counts, recovery and privacy with 95 % CIs (module
    docstring); a rate over no token is None. Rows align position by position; ``bands`` are
    indices into :data:`rapt.privacy.kinds.BANDS`; with ``words``, each kind's dict also holds
    the same figures per word under ``"words"``."""
    for name, rows in (("guessed", guessed), ("replaced", replaced), ("bands", bands),
                       ("personal", personal)) + ((("words", words),) if words else ()):
        _check(name, rows, original)
    flat = [(a == g, bool(r), int(b), bool(p))
            for o, gs, rs, bs, ps in zip(original, guessed, replaced, bands, personal,
                                         strict=True)
            for a, g, r, b, p in zip(o, gs, rs, bs, ps, strict=True)]
    hit, repl, band, pers = (list(c) for c in zip(*flat, strict=True)) if flat else ([],) * 4
    out = _by_kind(hit, repl, band, pers, "token")
    if words is None:
        return out
    grouped: dict[tuple[int, int], list[int]] = {}
    pos = 0
    for row, ws in enumerate(words):
        for w in ws:
            grouped.setdefault((row, int(w)), []).append(pos)
            pos += 1
    members = list(grouped.values())
    per_word = _by_kind([all(hit[i] for i in m) for m in members],
                        [any(repl[i] for i in m) for m in members],
                        [band[m[0]] for m in members],
                        [any(pers[i] for i in m) for m in members], "word")
    for kind in KINDS:
        out[kind]["words"] = per_word[kind]
    return out


def best_by_kind(by_attacker: dict[str, dict]) -> dict[str, dict]:
    """Per kind of :data:`KINDS`, the attacker (of ``{name: recovery_by_kind(...)}``) that
    leaves the least privacy, with its figures: the empirical privacy a table reports is the
    best attacker's, kind by kind (another kind may have another attacker)."""
    out = {}
    for kind in KINDS:
        name = max(by_attacker, key=lambda a: by_attacker[a][kind]["recovery"] or 0.0)
        r = by_attacker[name][kind]
        out[kind] = {"attacker": name, "privacy": r["privacy"],
                     "privacy_ci95": r["privacy_ci95"], "count": r["count"],
                     "replaced": r["replaced"]}
        if "words" in r:
            out[kind]["word_privacy"] = r["words"]["privacy"]
    return out


def class_counts(frequent_rank: int = DEFAULT_FREQUENT_RANK) -> dict[str, str]:
    """What each kind of :data:`CLASS_KINDS` counts, in words (a figure names what it counts)."""
    return {"all": "all text tokens",
            "rare": f"tokens of words outside the {frequent_rank:,} most frequent public words "
                    "(not personal data)",
            "personal": "tokens inside personal-data spans found by Presidio (and tokens that "
                        "could not be placed in their text)",
            "frequent": f"tokens of the {frequent_rank:,} most frequent public words (not "
                        "personal data)"}


def recovery_by_class(original: Sequence[int], guessed: Sequence[int],
                      classes: Sequence[int], special_ids: Sequence[int] = ()
                      ) -> dict[str, dict]:
    """Per kind of :data:`CLASS_KINDS`: ``n_tokens``, ``recovered``, ``recovery`` (share guessed
    right) and its 95 % Wilson interval ``recovery_ci95``, over the non-special positions of
    flat, aligned token ids; ``classes`` are indices into :data:`rapt.privacy.by_kind.CLASSES`
    (position by position, as :func:`rapt.privacy.by_kind.row_noise` gives them). A kind with
    no token has ``recovery`` None and says so in ``note``."""
    if not len(original) == len(guessed) == len(classes):
        raise ValueError(f"original ({len(original)}), guessed ({len(guessed)}) and classes "
                         f"({len(classes)}) must align position by position")
    special = {int(i) for i in special_ids}
    hits: dict[str, list[bool]] = {k: [] for k in CLASS_KINDS}
    for o, g, c in zip(original, guessed, classes, strict=True):
        if int(o) in special:
            continue
        if not 0 <= int(c) < len(CLASSES):
            raise ValueError(f"class {c} is not an index into {CLASSES}")
        hit = int(o) == int(g)
        hits["all"].append(hit)
        hits[CLASSES[int(c)]].append(hit)
    out = {}
    for kind, hs in hits.items():
        rec, ci = _rate(sum(hs), len(hs))
        out[kind] = {"n_tokens": len(hs), "recovered": sum(hs), "recovery": rec,
                     "recovery_ci95": ci} | ({} if hs else {"note": NO_TOKENS})
    return out


def _flip(ci: list[float] | None) -> list[float] | None:
    return None if ci is None else [1.0 - ci[1], 1.0 - ci[0]]


def privacy_by_class(original: Sequence[int], private: Sequence[int], recovered: Sequence[int],
                     classes: Sequence[int], special_ids: Sequence[int] = (), *,
                     frequent_rank: int = DEFAULT_FREQUENT_RANK) -> dict[str, dict]:
    """A privacy report's ``by_kind``: per kind of :data:`CLASS_KINDS`, what it ``counts``, its
    ``n_tokens``, the measured ``replacement_probability``, the nearest-neighbour inversion's
    ``inversion_success`` (its guesses: ``recovered``) and the ``empirical_privacy`` = 1 − the
    best recovery of the attackers run (here nearest neighbour, named in ``attacker``), with 95 %
    Wilson intervals. Flat ids aligned with ``classes``; a kind with no token has None figures
    and a ``note`` saying so."""
    kept = recovery_by_class(original, private, classes, special_ids)  # unchanged tokens
    inv = recovery_by_class(original, recovered, classes, special_ids)
    counts = class_counts(frequent_rank)
    out = {}
    for kind in CLASS_KINDS:
        k, r = kept[kind], inv[kind]
        out[kind] = {"counts": counts[kind], "n_tokens": r["n_tokens"],
                     "replacement_probability": None if k["recovery"] is None
                     else 1.0 - k["recovery"],
                     "inversion_success": r["recovery"], "inversion_success_ci95":
                     r["recovery_ci95"]} | with_attacker(NN, r)
        if r["n_tokens"] == 0:
            out[kind]["note"] = NO_TOKENS
    return out


def with_attacker(attacker: str, recovery: dict) -> dict:
    """``attacker``, ``empirical_privacy`` and ``empirical_privacy_ci95`` of one attacker's
    per-kind ``recovery`` (a :func:`recovery_by_class` entry)."""
    rec = recovery["recovery"]
    return {"attacker": attacker, "empirical_privacy": None if rec is None else 1.0 - rec,
            "empirical_privacy_ci95": _flip(recovery["recovery_ci95"])}

