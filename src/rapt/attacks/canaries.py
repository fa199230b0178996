"""Planted secrets (canaries) and what an attacker recovers of them from a release.

The Secret Sharer (Carlini et al. 2019) plants random secrets of a known format in training
data and asks how far a model's view of the true secret stands out among random secrets of
the same format that were never planted. Here the "model" is the provider's reading of a
privatized release: an attacker turns released rows into guessed rows (nearest neighbour, the
Bayes attacker of :mod:`rapt.attacks.bayes`, a denoiser), and a candidate secret scores the
share of its token ids that the guesses match at the secret's positions.

* :func:`plant` copies randomly chosen task rows and appends a template sentence holding a
  synthetic secret (a person's name, an account number, a phone number; :data:`KINDS`), each
  secret ``repeats`` times.
* :func:`exposure`: log2(R + 1) − log2(rank) of the true secret among R candidates, the rank
  averaged over every order of the tied scores (a random attacker's exposure is then
  log2(R + 1) − log2((R + 1)!)/(R + 1), about log2(e) ≈ 1.44 bits for large R; a perfect one
  scores log2(R + 1)).
* :func:`score_canaries`: per canary, its exposure, the share of its tokens recovered (per
  occurrence, and after a per-position vote over its occurrences) and the base rate: the same
  measures for the never-planted candidates at the same positions.

The scorer knows where each secret sits in its row (an attacker who knows the template finds
it: the template's words are frequent and released in clear under a by-kind policy), so the
figures bound from above what an attacker that must first find the secret recovers. Every
attacker is scored by its point guesses: the Bayes attacker exposes no per-candidate
log-posterior (:meth:`rapt.attacks.bayes.BayesAttacker.guess` returns decisions only). A
token-by-token release keeps the secret's token count, so a candidate whose tokens have another
count or layout scores lower: that is leakage too, and counted.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["FIRST_NAMES", "KINDS", "LAST_NAMES", "TEMPLATES", "UNLISTED_FIRST_NAMES",
           "UNLISTED_LAST_NAMES", "Canary", "CanaryScore",
           "Occurrence", "Planted", "Release", "candidate_ids", "class_shares", "draw_candidates",
           "draw_secret", "draw_secrets", "exposure", "locate", "match_share", "plant",
           "run_canaries", "score_canaries", "secret_token_ids", "summarize"]

KINDS = ("name", "account", "phone")
# Common public given and family names (US census lists): no real person is meant.
FIRST_NAMES = (
    "james", "mary", "robert", "patricia", "john", "jennifer", "michael", "linda", "david",
    "elizabeth", "william", "barbara", "richard", "susan", "joseph", "jessica", "thomas",
    "sarah", "charles", "karen", "christopher", "lisa", "daniel", "nancy", "matthew", "betty",
    "anthony", "margaret", "mark", "sandra", "donald", "ashley", "steven", "kimberly", "paul",
    "emily", "andrew", "donna", "joshua", "michelle", "kenneth", "carol", "kevin", "amanda",
    "brian", "melissa", "george", "deborah", "timothy", "stephanie")
LAST_NAMES = (
    "smith", "johnson", "williams", "brown", "jones", "garcia", "miller", "davis", "rodriguez",
    "martinez", "hernandez", "lopez", "gonzalez", "wilson", "anderson", "thomas", "taylor",
    "moore", "jackson", "martin", "lee", "perez", "thompson", "white", "harris", "sanchez",
    "clark", "ramirez", "lewis", "robinson", "walker", "young", "allen", "king", "wright",
    "scott", "torres", "nguyen", "hill", "flores", "green", "adams", "nelson", "baker", "hall",
    "rivera", "campbell", "mitchell", "carter", "roberts")
# Names from elsewhere, outside the US 1990 Census lists that rapt's name-list recognizer reads
# (rapt.privacy.name_list: none a given name borne by 0.02 % of people there, none a listed
# surname; tests/test_canaries.py checks it): kind "unlisted_name", names only spaCy's model can
# find. No real person is meant.
UNLISTED_FIRST_NAMES = (
    "aarav", "aditi", "akosua", "anjali", "arjun", "chidi", "chiamaka", "dmitri", "emeka",
    "farida", "gunnar", "ikenna", "jomo", "kaveh", "kwame", "leszek", "mehmet", "ngozi",
    "oluwaseun", "priya", "radek", "sanjay", "saoirse", "thandiwe", "tomasz", "ugne", "vesna",
    "wojciech", "xiulan", "yerlan", "zaheer", "bronislava", "eero", "aino", "tenzin", "sione",
    "abebe", "folake", "jiho")
UNLISTED_LAST_NAMES = (
    "adebayo", "okonkwo", "chakraborty", "oyelaran", "virtanen", "lindqvist", "bjornsson",
    "yilmaz", "ozturk", "demir", "hashemi", "abubakar", "achterberg", "novakova", "horvathova",
    "kuznetsov", "sokolov", "petrenko", "shevchenko", "bondarenko", "eze", "onyango", "odhiambo",
    "wanjiru", "raghunathan", "venkataraman", "gunawardena", "jayasuriya", "adeyemi", "olawale",
    "chukwuma", "mwangi", "kamau", "otieno", "oyelowo", "adegoke", "nkosi", "dlamini",
    "mahlangu", "khumalo", "tshabalala", "ndlovu")
_NAME_POOLS = {"name": (FIRST_NAMES, LAST_NAMES),
               "unlisted_name": (UNLISTED_FIRST_NAMES, UNLISTED_LAST_NAMES)}
TEMPLATES = {
    "name": ("{} wrote to us about the refund .", "please forward this to {} ."),
    "unlisted_name": ("{} wrote to us about the refund .", "please forward this to {} ."),
    "account": ("my account number is {} .", "the payment went to account {} ."),
    "phone": ("please call {} tomorrow .", "you can reach me at {} ."),
}
ACCOUNT_DIGITS = 8


def draw_secret(kind: str, rng: random.Random) -> str:
    """One random secret of ``kind``: "First Last" from the public name lists (or, for
    ``unlisted_name``, from names outside them), an 8-digit account number, or a phone number
    555-01xx-xxxx (555-01xx: numbers reserved for fiction)."""
    if kind in _NAME_POOLS:
        first, last = _NAME_POOLS[kind]
        return f"{rng.choice(first).title()} {rng.choice(last).title()}"
    if kind == "account":
        return "".join(str(rng.randrange(10)) for _ in range(ACCOUNT_DIGITS))
    if kind == "phone":
        return f"555-01{rng.randrange(100):02d}-{rng.randrange(10_000):04d}"
    raise _unknown(kind)


def _unknown(kind: str) -> ValueError:
    return ValueError(f"kind must be one of {', '.join(TEMPLATES)}, got {kind!r}")


def draw_secrets(kind: str, n: int, rng: random.Random, exclude: Sequence[str] = ()
                 ) -> list[str]:
    """``n`` distinct secrets of ``kind``, none in ``exclude``."""
    space = {**{k: len(f) * len(la) for k, (f, la) in _NAME_POOLS.items()},
             "account": 10**ACCOUNT_DIGITS, "phone": 10**6}.get(kind)
    if space is None:
        raise _unknown(kind)
    if n + len(set(exclude)) > space:
        raise ValueError(f"{n} {kind} secrets besides {len(exclude)} excluded: the format "
                         f"holds only {space}")
    seen, out = set(exclude), []
    while len(out) < n:
        s = draw_secret(kind, rng)
        if s not in seen:
            seen.add(s)
            out.append(s)
    return out


@dataclass(frozen=True)
class Occurrence:
    """One planted copy: characters ``start:end`` of ``texts[row]`` are the secret."""

    row: int
    start: int
    end: int


@dataclass(frozen=True)
class Canary:
    """A secret of ``kind`` planted ``repeats`` times in one template sentence."""

    kind: str
    secret: str
    template: str
    repeats: int
    occurrences: tuple[Occurrence, ...]


@dataclass(frozen=True)
class Planted:
    """Training texts with canaries: the task's texts and the planted copies, shuffled;
    ``host[i]``: the task row text i copies (itself for an unplanted one)."""

    texts: list[str]
    canaries: list[Canary]
    host: list[int]


def plant(texts: Sequence[str], *, per_cell: int, repeats: Sequence[int] = (1, 4, 16),
          kinds: Sequence[str] = KINDS, seed: int = 0, lowercase: bool = False) -> Planted:
    """``per_cell`` secrets of every kind for every number of ``repeats``; each copy is a
    random task row with the secret's template sentence appended. The task rows stay as they
    are (a copy is an extra row, as a user's data holds a secret in rows of its own).
    ``lowercase``: names written in lower case, as in a lower-cased corpus (SST-2), where a
    named-entity recognizer finds them less often."""
    if not texts:
        raise ValueError("plant needs task texts to copy")
    rng = random.Random(seed)
    rows = [(t, i, None) for i, t in enumerate(texts)]
    found: list[tuple[str, str, str, int]] = []
    for kind in kinds:
        secrets = iter(draw_secrets(kind, per_cell * len(repeats), rng))
        for r in repeats:
            for _ in range(per_cell):
                secret, template = next(secrets), rng.choice(TEMPLATES[kind])
                secret = secret.lower() if lowercase else secret
                found.append((kind, secret, template, r))
                for _ in range(r):
                    host = rng.randrange(len(texts))
                    head = f"{texts[host]} {template[:template.index('{}')]}"
                    rows.append((head + secret + template[template.index("{}") + 2:], host,
                                 (len(found) - 1, len(head), len(head) + len(secret))))
    rng.shuffle(rows)
    occ: list[list[Occurrence]] = [[] for _ in found]
    for i, (_, _, at) in enumerate(rows):
        if at is not None:
            occ[at[0]].append(Occurrence(i, at[1], at[2]))
    canaries = [Canary(k, s, t, r, tuple(o)) for (k, s, t, r), o in zip(found, occ, strict=True)]
    return Planted([t for t, _, _ in rows], canaries, [h for _, h, _ in rows])


def secret_token_ids(tokenizer, text: str, start: int, end: int) -> tuple[list[int], list[int]]:
    """(indices among ``text``'s tokens, their ids) of the tokens inside characters
    ``start:end`` (specials not added; a fast tokenizer gives the offsets)."""
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    at = [i for i, (a, b) in enumerate(enc["offset_mapping"]) if a < end and start < b]
    return at, [int(enc["input_ids"][i]) for i in at]


def _find(row: Sequence[int], ids: Sequence[int]) -> int:
    n = len(ids)
    for s in range(len(row) - n + 1):
        if list(row[s:s + n]) == list(ids):
            return s
    return -1


def locate(tokenizer, planted: Planted, clean_rows: Sequence[Sequence[int]]
           ) -> list[list[list[int]]]:
    """Per canary, per occurrence: the row positions of the secret's tokens in ``clean_rows``
    (built from ``planted.texts``). ValueError where a row does not hold its text's tokens
    (cut to a maximum length before the secret)."""
    out = []
    for c in planted.canaries:
        per = []
        for o in c.occurrences:
            text = planted.texts[o.row]
            at, _ = secret_token_ids(tokenizer, text, o.start, o.end)
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            s = _find(clean_rows[o.row], ids)
            if s < 0 or not at:
                raise ValueError(f"row {o.row} does not hold the tokens of its text (cut to a "
                                 f"maximum length?): the secret {c.secret!r} cannot be placed")
            per.append([s + i for i in at])
        out.append(per)
    return out


def candidate_ids(tokenizer, template: str, candidates: Sequence[str]) -> list[list[int]]:
    """Token ids of each candidate secret in ``template``'s sentence (in context: a BPE
    tokenizer splits a word by what precedes it)."""
    at = template.index("{}")
    return [secret_token_ids(tokenizer, template.format(c), at, at + len(c))[1]
            for c in candidates]


def match_share(guess: Sequence[int], ids: Sequence[int]) -> float:
    """Share of ``ids`` that ``guess`` holds at the same index (an id past the guess's end
    misses)."""
    return _matches(guess, ids) / len(ids)


def _matches(guess: Sequence[int], ids: Sequence[int]) -> int:
    # lengths may differ: a candidate longer than the secret misses past the secret's end
    return sum(int(g) == int(t) for g, t in zip(guess, ids, strict=False))


def exposure(true_score: float, candidate_scores: Sequence[float]) -> float:
    """log2(R + 1) − log2(rank) of the true score among R candidate scores (higher is more
    likely), averaged over the orders of the ties: rank G + 1 + t for t = 0..T, G the
    candidates above, T those tied."""
    r = len(candidate_scores)
    above = sum(s > true_score for s in candidate_scores)
    tied = sum(s == true_score for s in candidate_scores)
    # mean of log2(above + 1 + t), t = 0..tied, through log-gamma (exact for integer ranks)
    mean_log_rank = (math.lgamma(above + tied + 2) - math.lgamma(above + 1)) / (tied + 1)
    return math.log2(r + 1) - mean_log_rank / math.log(2)


def _vote(guesses: Sequence[Sequence[int]]) -> list[int]:
    """The most common guess at each index over the occurrences (ties: the first seen)."""
    width = max(map(len, guesses))
    return [Counter(g[j] for g in guesses if j < len(g)).most_common(1)[0][0]
            for j in range(width)]


@dataclass(frozen=True)
class CanaryScore:
    """One canary against one attacker: ``exposure`` among ``candidates`` never-planted
    secrets; ``recovered``: share of its tokens the guesses match (mean over occurrences);
    ``voted``: the same after a per-position vote over the occurrences; ``exact``: some
    occurrence guessed whole; ``base_rate`` / ``base_voted``: the candidates' mean of those
    shares; ``p_value``: (candidates scoring at least the secret's + 1) / (R + 1)."""

    kind: str
    repeats: int
    secret: str
    exposure: float
    candidates: int
    recovered: float
    voted: float
    exact: bool
    base_rate: float
    base_voted: float
    p_value: float


def _one(c: Canary, guesses: list[list[int]], truth: list[list[int]],
         cands: list[list[int]]) -> CanaryScore:
    # One division of integer counts per score: equal shares compare equal (ties are exact).
    def score(ids: Sequence[int]) -> float:
        return sum(_matches(gs, ids) for gs in guesses) / (len(guesses) * len(ids))

    true = sum(_matches(gs, ts) for gs, ts in zip(guesses, truth, strict=True)) / sum(
        map(len, truth))
    scores = [score(ids) for ids in cands]
    vote = _vote(guesses)
    return CanaryScore(
        c.kind, c.repeats, c.secret, exposure(true, scores), len(cands), true,
        match_share(vote, truth[0]), any(g == t for g, t in zip(guesses, truth, strict=True)),
        sum(scores) / len(scores), sum(match_share(vote, ids) for ids in cands) / len(cands),
        (sum(s >= true for s in scores) + 1) / (len(scores) + 1))


def score_canaries(planted: Planted, positions: Sequence[Sequence[Sequence[int]]],
                   clean_rows: Sequence[Sequence[int]], guessed_rows: Sequence[Sequence[int]],
                   candidates: Mapping[str, Sequence[Sequence[int]]]) -> list[CanaryScore]:
    """Every canary against one attacker's ``guessed_rows``. ``positions``: from
    :func:`locate`; ``candidates``: template -> the candidates' token ids in it
    (:func:`candidate_ids`), never planted anywhere."""
    out = []
    for c, pos in zip(planted.canaries, positions, strict=True):
        rows = [o.row for o in c.occurrences]
        guesses = [[int(guessed_rows[r][p]) for p in ps] for r, ps in zip(rows, pos,
                                                                          strict=True)]
        truth = [[int(clean_rows[r][p]) for p in ps] for r, ps in zip(rows, pos, strict=True)]
        out.append(_one(c, guesses, truth, [list(x) for x in candidates[c.template]]))
    return out


def _mean_ci(xs: Sequence[float]) -> list[float]:
    from rapt.stats import mean_ci

    m, h = mean_ci(list(xs))
    return [m, max(0.0, m - h), min(1.0, m + h)]


def summarize(scores: Sequence[CanaryScore]) -> list[dict]:
    """Per (kind, repeats): exposure mean and max (with R), recovered and voted shares vs
    their base rates (mean over canaries, 95 % Student-t interval over canaries: [mean, lo,
    hi]), canaries guessed whole, and canaries whose p-value is at most 0.05 (about 5 % of
    them by chance when the attacker learns nothing)."""
    cells: dict[tuple[str, int], list[CanaryScore]] = {}
    for s in scores:
        cells.setdefault((s.kind, s.repeats), []).append(s)
    out = []
    for (kind, r), ss in sorted(cells.items(), key=lambda kv: (KINDS.index(kv[0][0])
                                                               if kv[0][0] in KINDS else 99,
                                                               kv[0][1])):
        ex = [s.exposure for s in ss]
        out.append({
            "kind": kind, "repeats": r, "canaries": len(ss), "candidates": ss[0].candidates,
            "exposure_mean": sum(ex) / len(ex), "exposure_max": max(ex),
            "exposure_ceiling": math.log2(ss[0].candidates + 1),
            "recovered": _mean_ci([s.recovered for s in ss]),
            "base_rate": _mean_ci([s.base_rate for s in ss]),
            "voted": _mean_ci([s.voted for s in ss]),
            "base_voted": _mean_ci([s.base_voted for s in ss]),
            "exact": sum(s.exact for s in ss),
            "above_base": sum(s.p_value <= 0.05 for s in ss)})
    return out


def class_shares(planted: Planted, positions: Sequence[Sequence[Sequence[int]]],
                 classes: Sequence[Sequence[int]], names: Sequence[str]) -> dict[str, dict]:
    """Per kind of secret: the share of its planted tokens in each class (``classes``: one
    class index into ``names`` per row position, e.g. :func:`rapt.privacy.by_kind.row_noise`'s),
    and the token count."""
    counts: dict[str, Counter[int]] = {}
    for c, pos in zip(planted.canaries, positions, strict=True):
        got = counts.setdefault(c.kind, Counter())
        for o, ps in zip(c.occurrences, pos, strict=True):
            got.update(int(classes[o.row][p]) for p in ps)
    return {k: {"tokens": sum(n.values()),
                **{name: n[i] / max(1, sum(n.values())) for i, name in enumerate(names)}}
            for k, n in counts.items()}


@dataclass(frozen=True)
class Release:
    """What a privatization gives the benchmark: the clean rows (for scoring only), the
    released rows the attackers read, and each position's class where the mechanism sorts
    tokens by kind (None: it does not)."""

    clean: list[list[int]]
    released: list[list[int]]
    classes: list[list[int]] | None = None


Privatize = Callable[[Sequence[str]], Release]
Guess = Callable[[list[list[int]]], list[list[int]]]


def draw_candidates(tokenizer, planted: Planted, r: int, seed: int = 1
                    ) -> dict[str, list[list[int]]]:
    """Template -> the token ids of ``r`` random secrets of its kind in it, none of them
    planted (the same ``r`` secrets for every template of a kind), written in the planted
    secrets' case."""
    rng = random.Random(seed)
    out = {}
    for kind in dict.fromkeys(c.kind for c in planted.canaries):
        here = [c.secret for c in planted.canaries if c.kind == kind]
        lower = all(s == s.lower() for s in here)
        secrets = draw_secrets(kind, r, rng, exclude=[s.title() if lower else s for s in here])
        secrets = [s.lower() for s in secrets] if lower else secrets
        for template in TEMPLATES[kind]:
            out[template] = candidate_ids(tokenizer, template, secrets)
    return out


def run_canaries(tokenizer, planted: Planted, privatize: Privatize,
                 attackers: Mapping[str, Guess], candidates: Mapping[str, Sequence[Sequence[int]]]
                 ) -> tuple[Release, dict[str, list[CanaryScore]]]:
    """Privatize ``planted.texts`` once; every attacker guesses the whole release and is
    scored on every canary. -> (the release, attacker -> its scores)."""
    release = privatize(planted.texts)
    if len(release.released) != len(planted.texts) or any(
            len(a) != len(b) for a, b in zip(release.clean, release.released, strict=True)):
        raise ValueError("the release must hold one row per text, each as long as its clean "
                         "row (a token-by-token mechanism)")
    positions = locate(tokenizer, planted, release.clean)
    return release, {name: score_canaries(planted, positions, release.clean,
                                          guess(release.released), candidates)
                     for name, guess in attackers.items()}
