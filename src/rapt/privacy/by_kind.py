"""Noise spent by kind of token: dχ-privacy with an η that depends on the token's class.

Uniform word-level noise spends most of its budget on frequent words, which context gives back
to an attacker and which carry most of the task signal; the secrets are names, numbers and rare
words. A :class:`KindPolicy` sorts every text token into one of three classes:

* ``personal``: inside a personal-data span (:mod:`rapt.privacy.personal_data`, Presidio; a
  name, place or organisation found in one text is marked in every text classified with it);
* ``rare``: its word is not among the ``frequent_rank`` most frequent words of rapt's *public*
  word list (:mod:`rapt.privacy.kinds`; never the user's data);
* ``frequent``: the rest.

``personal_rank`` (None: off) gives the rare words outside that many most frequent public words
personal data's noise, as if a detector had found them: names no detector knows are rare
words, and the strong η leaves a kept piece of one for an attacker to read. They stay in the
``rare`` class in every report (what a figure counts does not change with the noise).

``protect`` says which classes get the policy's η (the strong noise): ``all`` (every class: the
uniform mechanism), ``rare`` (personal and rare) or ``personal`` (personal only). The other
classes get ``eta_other`` (weaker noise), or pass in clear when it is None. ``eta_personal``
gives personal data a stronger noise still (a smaller η); at 0 a personal token is swapped for a
uniformly drawn one before the noise, so the release does not depend on it at all.

What is guaranteed (THREAT_MODEL.md, "Noise by kind of token"): for two texts whose tokens fall
in the same classes position by position, the release's probability ratio is at most
exp(Σ_i η_c(i)·‖x_i − x'_i‖): dχ per class at that class's η (a ratio of 1 between any two
personal tokens at η_personal 0). Nothing is promised between
tokens of different classes (a token in clear is distinguishable from any other token), and the
class of a position is a function of the text that the release reveals in part. Tokens the
classifier cannot place (positions that do not line up with the text, the plain tokens of
reconstruction) get the strong noise.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from rapt.config import eta_problem
from rapt.privacy.kinds import (
    BAND_EDGES,
    TokenKinds,
    WordFrequencies,
    load_word_frequencies,
    normalize_word,
    token_kinds,
)
from rapt.privacy.personal_data import PROPAGATED, PersonalSpan, propagate_spans

__all__ = ["CLASSES", "DEFAULT_FREQUENT_RANK", "DEFAULT_PERSONAL_RANK", "DEFAULT_PROTECT",
           "PROTECT", "KindLevelError", "KindPolicy", "align_classes", "classes_of",
           "default_policy", "make_policy", "personal_spans", "row_noise"]

CLASSES = ("personal", "rare", "frequent")
PROTECT = ("all", "rare", "personal")
# rapt's default where a user privatizes without naming a policy (rapt.cli._by_kind keeps a
# copy, as that module must not import torch): chosen from local_baseline_by_kind.md's grid
# and the per-kind privacy against the domain denoiser (privacy_by_mechanism_denoiser.md)
DEFAULT_PROTECT = "rare"
DEFAULT_FREQUENT_RANK = 1000
# rare words beyond it get personal data's η under the default: every word of the names
# outside the Census lists lies there (canaries_unlisted_names_beyond10k_lowercase.md), at no
# measurable cost to the fused model (local_baseline_by_kind.md, r0.7z10k vs r0.7z)
DEFAULT_PERSONAL_RANK = 10_000
PERSONAL, RARE, FREQUENT = range(3)
_PROTECTED = {"all": (PERSONAL, RARE, FREQUENT), "rare": (PERSONAL, RARE),
              "personal": (PERSONAL,)}


class KindLevelError(ValueError):
    """A class's η on the wrong side of the protected η; ``level`` names which: "other" (the
    unprotected classes') or "personal" (personal data's), so callers can name the option."""

    def __init__(self, level: str, message: str) -> None:
        super().__init__(message)
        self.level = level


@dataclass(frozen=True)
class KindPolicy:
    """Which classes get the strong noise (``protect``), where "frequent" ends
    (``frequent_rank``: 100, 1,000 or 10,000 public words), the η of the unprotected
    classes (``eta_other``; None: released in clear) and of personal data (``eta_personal``;
    None: the strong η; 0: independent of the token), and where rare words start getting
    personal data's noise (``personal_rank``, a band edge ≥ ``frequent_rank``; None: never).
    The strong η is the privatizer's."""

    protect: str = "all"
    frequent_rank: int = DEFAULT_FREQUENT_RANK
    eta_other: float | None = None
    eta_personal: float | None = None
    personal_rank: int | None = None

    def __post_init__(self) -> None:
        if self.protect not in PROTECT:
            raise ValueError(f"protect must be one of {', '.join(PROTECT)}, got "
                             f"{self.protect!r}")
        if self.frequent_rank not in BAND_EDGES:
            raise ValueError(f"frequent_rank must be one of {', '.join(map(str, BAND_EDGES))} "
                             f"(the public word list's band edges), got {self.frequent_rank}")
        if self.personal_rank is not None and (self.personal_rank not in BAND_EDGES
                                               or self.personal_rank < self.frequent_rank):
            raise ValueError(f"personal_rank must be a band edge of the public word list "
                             f"({', '.join(map(str, BAND_EDGES))}) no smaller than frequent_rank "
                             f"({self.frequent_rank}), got {self.personal_rank}")
        if self.eta_other is not None:
            problem = eta_problem(float(self.eta_other))
            if problem:
                raise ValueError(f"eta_other {problem}")
        if self.eta_personal is not None and self.eta_personal != 0:
            problem = eta_problem(float(self.eta_personal))
            if problem:
                raise ValueError(f"eta_personal (0, or a dχ η) {problem}")

    @property
    def uniform(self) -> bool:
        """True when every token gets the same η (``protect="all"``, no personal η)."""
        return self.protect == "all" and self.eta_personal is None

    def noise_class(self, cls: int, band: int) -> int:
        """The class whose noise a token of class ``cls`` and public-word band ``band`` (index
        into :data:`rapt.privacy.kinds.BANDS`) gets: personal data's for a rare word beyond
        ``personal_rank``, its own otherwise."""
        if (self.personal_rank is not None and cls == RARE
                and band > BAND_EDGES.index(self.personal_rank)):
            return PERSONAL
        return cls

    def protected(self, cls: int) -> bool:
        return cls in _PROTECTED[self.protect]

    def class_etas(self, eta: float) -> dict[str, float | None]:
        """η of each class (None: in clear) when the strong η is ``eta``."""
        out = {name: float(eta) if self.protected(i) else self.eta_other
               for i, name in enumerate(CLASSES)}
        if self.eta_personal is not None:
            out["personal"] = float(self.eta_personal)
        return out

    def protected_kinds(self, eta: float) -> list[str]:
        """The reported kinds ("rare", "personal") that get at least the strong noise: the ones
        the privacy rule judges (:mod:`rapt.privacy.rule`)."""
        etas = self.class_etas(eta)
        return [k for k in ("rare", "personal") if etas[k] is not None and etas[k] <= eta]

    def check_against(self, eta: float) -> None:
        """The unprotected classes must not get *more* noise than the protected ones, nor
        personal data less."""
        if self.eta_other is not None and self.eta_other < eta and self.protect != "all":
            raise KindLevelError("other", f"eta_other {self.eta_other:g} is below the protected "
                                 f"classes' η {eta:g}: it would noise frequent words more "
                                 "than rare ones")
        if self.eta_personal is not None and self.eta_personal > eta:
            raise KindLevelError("personal", f"eta_personal {self.eta_personal:g} is above the "
                                 f"protected classes' η {eta:g}: it would noise personal data "
                                 "less")

    @classmethod
    def from_record(cls, record: Mapping) -> KindPolicy:
        """The policy an artifact or a declaration recorded (:meth:`record`): the unprotected
        classes' η is the frequent class's, which no policy but "all" protects."""
        etas = record.get("class_eta") or {}
        protect = str(record.get("protect", "all"))
        other = etas.get("frequent") if protect != "all" else None
        personal = record.get("eta_personal")
        rank = record.get("personal_rank")
        return cls(protect, int(record.get("frequent_rank", DEFAULT_FREQUENT_RANK)),
                   None if other is None else float(other),
                   None if personal is None else float(personal),
                   None if rank is None else int(rank))

    def record(self, eta: float, frequencies: WordFrequencies | None = None,
               detector: dict | None = None) -> dict:
        """What goes in an artifact: the policy, each class's η, and the word list and
        detector that decided the classes."""
        out: dict = {"protect": self.protect, "frequent_rank": self.frequent_rank,
                     "class_eta": self.class_etas(eta)}
        if self.eta_personal is not None:
            out["eta_personal"] = float(self.eta_personal)
        if self.personal_rank is not None:
            out["personal_rank"] = self.personal_rank
        if frequencies is not None:
            words = "\n".join(f"{w}\t{c}" for w, c in sorted(frequencies.counts.items()))
            out["word_list_sha256"] = hashlib.sha256(words.encode()).hexdigest()
        if detector is not None:
            out["personal_data_detector"] = detector
        # How the findings were widened (personal_spans): part of what decided the classes.
        out["personal_data_propagated"] = list(PROPAGATED)
        return out


def default_policy() -> KindPolicy:
    """rapt's default: personal data and rare words protected (the privatizer's η, for P ≈
    :data:`rapt.privacy.rule.DEFAULT_PROTECTED_P`), personal data and words outside the 10,000
    most frequent public words at η 0, frequent words in clear: `--protect rare --personal-p 1
    --personal-rank 10000`."""
    return KindPolicy(DEFAULT_PROTECT, DEFAULT_FREQUENT_RANK, None, 0.0, DEFAULT_PERSONAL_RANK)


def make_policy(eta: float, protect: str, frequent_rank: int = DEFAULT_FREQUENT_RANK, *,
                other_p: float | None = None, other_eta: float | None = None,
                personal_p: float | None = None, personal_eta: float | None = None,
                personal_rank: int | None = None,
                calibrate: Callable[[float], float] | None = None) -> KindPolicy | None:
    """The policy of users' options at the protected η ``eta`` (None for uniform noise):
    the unprotected classes' η is ``other_eta``, or ``calibrate(other_p)`` (the η that gives
    that P, calibrated as every level is); personal data's is ``personal_eta``, or
    ``calibrate(personal_p)`` (``personal_p`` 1: η 0); ``personal_rank``: see
    :class:`KindPolicy` (0, as None: off). :class:`KindLevelError` when the
    unprotected η lies below ``eta`` or personal data's above it."""
    def level(p: float | None, given: float | None, name: str) -> float | None:
        if p is None:
            return given
        if calibrate is None:
            raise ValueError(f"{name} needs calibrate (P -> η)")
        return calibrate(p)

    personal = 0.0 if personal_p == 1 else level(personal_p, personal_eta, "personal_p")
    if protect == "all" and personal is None:
        return None
    policy = KindPolicy(protect, frequent_rank, level(other_p, other_eta, "other_p"), personal,
                        personal_rank or None)
    policy.check_against(eta)
    return policy


def classes_of(kinds: TokenKinds, frequent_rank: int = DEFAULT_FREQUENT_RANK
               ) -> list[list[int]]:
    """Class index (into :data:`CLASSES`) of every token of ``kinds``."""
    top = BAND_EDGES.index(frequent_rank) + 1  # bands below this index are "frequent"
    return [[PERSONAL if p else (FREQUENT if b < top else RARE) for b, p in zip(bs, ps,
                                                                                  strict=True)]
            for bs, ps in zip(kinds.bands, kinds.personal, strict=True)]


def _classes_and_noise(kinds: TokenKinds, policy: KindPolicy
                       ) -> tuple[list[list[int]], list[list[int]]]:
    """Per text, each token's class and the class whose noise it gets
    (:meth:`KindPolicy.noise_class`)."""
    classes = classes_of(kinds, policy.frequent_rank)
    noise = [[policy.noise_class(c, b) for c, b in zip(cs, bs, strict=True)]
             for cs, bs in zip(classes, kinds.bands, strict=True)]
    return classes, noise


def align_classes(row: Sequence[int], segments: Sequence[Sequence[int]],
                  classes: Sequence[Sequence[int]], special: set[int], start: int = 0
                  ) -> list[int]:
    """Class of every position of a token-id ``row`` built from the texts whose ids (without
    specials) are ``segments`` (one text, or a sentence pair) with those ``classes``.

    Positions before ``start`` (leading specials, the plain tokens k) and any position whose id
    is not the next one of its segment (truncation, a tokenizer that does not split texts the
    same way twice) get ``PERSONAL``: a token that cannot be placed gets the strong noise.
    A special token after the first segment's tokens moves to the next segment."""
    out = [PERSONAL] * len(row)
    s, j = 0, 0
    for pos in range(start, len(row)):
        tok = int(row[pos])
        if tok in special:
            if j > 0 and s < len(segments):
                s, j = s + 1, 0
            continue
        if s < len(segments) and j < len(segments[s]) and int(segments[s][j]) == tok:
            out[pos] = classes[s][j]
            j += 1
    return out


def _looked_up(texts: Sequence[str], spans: Mapping[str, Sequence] | None):
    if spans is None:
        return None
    missing = [t for t in texts if t not in spans]
    if missing:
        raise KeyError(f"{len(missing)} of {len(texts)} texts have no personal-data spans "
                       f"in the lookup given, e.g. {missing[0][:60]!r}")
    return [list(spans[t]) for t in texts]


def personal_spans(texts: Sequence[str], frequencies: WordFrequencies | None = None,
                   detector=None, spans: Mapping[str, Sequence] | None = None
                   ) -> list[list[PersonalSpan]] | None:
    """Personal data of every text, from ``spans`` (text -> its findings) or ``detector``
    (None when neither is given), each found name, place or organisation then marked wherever
    it recurs among ``texts`` (:func:`rapt.privacy.personal_data.propagate_spans`; one word
    among the 1,000 most frequent public words is not carried)."""
    found = _looked_up(texts, spans)
    if found is None and detector is not None:
        found = detector.find_all(list(texts))
    if found is None:
        return None
    freq = frequencies if frequencies is not None else load_word_frequencies()
    return propagate_spans(texts, found,
                           common=lambda w: freq.in_top(normalize_word(w), 1_000))


def row_noise(rows: Sequence[Sequence[int]], texts: Sequence[str],
              text_pairs: Sequence[str | None] | None, tokenizer, policy: KindPolicy,
              eta: float, *, special: set[int], start: int = 0,
              frequencies: WordFrequencies | None = None, detector=None,
              spans: Mapping[str, Sequence] | None = None
              ) -> tuple[list[torch.Tensor], list[torch.Tensor], list[list[int]]]:
    """Per row: the η scale (float64, 1 = the strong η) and the pass-in-clear mask (bool) that
    :meth:`rapt.privacy.mechanism.Privatizer.privatize_ids` takes, and each position's class
    (what it is, for reports: a rare word beyond ``policy.personal_rank`` stays ``RARE``
    though it gets personal data's noise).

    ``rows[i]`` must have been built from ``texts[i]`` (and ``text_pairs[i]``); ``start``: the
    first text position of every row. Personal data from ``spans`` (text -> its spans, e.g.
    found once ahead on a machine with Presidio) when given, else found by ``detector``; a
    name found in one text is personal data in all of them (:func:`personal_spans`)."""
    if len(rows) != len(texts):
        raise ValueError(f"{len(rows)} rows for {len(texts)} texts")
    policy.check_against(eta)
    pairs = list(text_pairs) if text_pairs is not None else [None] * len(texts)
    have = [i for i, t in enumerate(pairs) if t]
    second = [pairs[i] for i in have]
    freq = frequencies if frequencies is not None else load_word_frequencies()  # read once
    found = personal_spans([*texts, *second], freq, detector, spans)
    k1 = token_kinds(list(texts), tokenizer, freq, detector,
                     None if found is None else found[:len(texts)])
    c1, n1 = _classes_and_noise(k1, policy)
    c2: dict[int, list[int]] = {}
    n2: dict[int, list[int]] = {}
    ids2: dict[int, list[int]] = {}
    if have:
        k2 = token_kinds(second, tokenizer, freq, detector,
                         None if found is None else found[len(texts):])
        cls2, noise2 = _classes_and_noise(k2, policy)
        c2, n2 = dict(zip(have, cls2, strict=True)), dict(zip(have, noise2, strict=True))
        ids2 = dict(zip(have, k2.ids, strict=True))
    other = None if policy.eta_other is None else float(policy.eta_other) / float(eta)
    personal = (None if policy.eta_personal is None
                else float(policy.eta_personal) / float(eta))
    scales, clear, classes = [], [], []
    for i, row in enumerate(rows):
        segs = [k1.ids[i]] + ([ids2[i]] if i in c2 else [])
        got = align_classes(row, segs, [c1[i]] + ([c2[i]] if i in c2 else []), special, start)
        noise = align_classes(row, segs, [n1[i]] + ([n2[i]] if i in n2 else []), special,
                              start)
        weak = torch.tensor([not policy.protected(c) for c in noise], dtype=torch.bool)
        scale = torch.ones(len(row), dtype=torch.float64)
        if other is not None:
            scale[weak] = other
        if personal is not None:
            scale[torch.tensor([c == PERSONAL for c in noise], dtype=torch.bool)] = personal
        clear.append(weak if other is None else torch.zeros(len(row), dtype=torch.bool))
        scales.append(scale)
        classes.append(got)
    return scales, clear, classes
