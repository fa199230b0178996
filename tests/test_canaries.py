"""Planted secrets: the generator, planting, the exposure formula and an end-to-end run on a
tiny backbone under a by-kind policy."""

from __future__ import annotations

import math
import random
import re

import pytest

from rapt.attacks.canaries import (
    FIRST_NAMES,
    KINDS,
    LAST_NAMES,
    TEMPLATES,
    UNLISTED_FIRST_NAMES,
    UNLISTED_LAST_NAMES,
    Release,
    class_shares,
    draw_candidates,
    draw_secrets,
    exposure,
    locate,
    plant,
    run_canaries,
    summarize,
)

TASK = ["the movie was fun", "a boring plot", "great music and a nice story", "awful film",
        "it is not very good", "the actor was fine"]
FORMATS = {"name": r"[A-Z][a-z]+ [A-Z][a-z]+", "account": r"\d{8}",
           "phone": r"555-01\d\d-\d{4}"}


def _expected_random(r: int) -> float:
    """E[log2(R + 1) − log2(rank)] for a rank uniform on 1..R + 1."""
    return math.log2(r + 1) - math.lgamma(r + 2) / math.log(2) / (r + 1)


@pytest.mark.parametrize("kind", KINDS)
def test_secrets_are_seeded_distinct_and_of_their_format(kind):
    a = draw_secrets(kind, 200, random.Random(5))
    assert a == draw_secrets(kind, 200, random.Random(5))
    assert a != draw_secrets(kind, 200, random.Random(6))
    assert len(set(a)) == 200
    assert all(re.fullmatch(FORMATS[kind], s) for s in a)
    if kind == "name":
        assert all(f.lower() in FIRST_NAMES and la.lower() in LAST_NAMES
                   for f, la in (s.split() for s in a))
    assert not set(draw_secrets(kind, 50, random.Random(5), exclude=a[:50])) & set(a[:50])


def test_unlisted_names_are_outside_what_the_name_lists_mark():
    from rapt.privacy.name_list import MIN_FIRST_SHARE, load_census_names

    census = load_census_names()
    assert all(census.first.get(f, 0.0) < MIN_FIRST_SHARE for f in UNLISTED_FIRST_NAMES)
    assert not set(UNLISTED_LAST_NAMES) & set(census.last)
    a = draw_secrets("unlisted_name", 300, random.Random(0))
    assert all(re.fullmatch(FORMATS["name"], s) and s.split()[0].lower() in UNLISTED_FIRST_NAMES
               for s in a)
    p = plant(TASK, per_cell=2, repeats=(1,), kinds=("unlisted_name",), seed=0)
    assert {c.kind for c in p.canaries} == {"unlisted_name"}


def test_draw_refuses_an_unknown_kind_and_more_than_the_format_holds():
    with pytest.raises(ValueError, match="kind must be one of"):
        draw_secrets("email", 1, random.Random(0))
    with pytest.raises(ValueError, match="holds only 2500"):
        draw_secrets("name", 2501, random.Random(0))


def test_planting_puts_each_secret_exactly_repeats_times():
    p = plant(TASK, per_cell=3, repeats=(1, 4, 16), seed=2)
    assert len(p.canaries) == 3 * 3 * 3
    assert len(p.texts) == len(TASK) + 3 * 3 * (1 + 4 + 16)
    assert sorted(t for t in p.texts if t in TASK) == sorted(TASK)  # the task rows stay
    for c in p.canaries:
        assert sum(t.count(c.secret) for t in p.texts) == c.repeats
        assert len(c.occurrences) == c.repeats == len({o.row for o in c.occurrences})
        assert c.template in TEMPLATES[c.kind]
        for o in c.occurrences:
            text = p.texts[o.row]
            assert text[o.start:o.end] == c.secret
            assert text == f"{TASK[p.host[o.row]]} {c.template.format(c.secret)}"
    assert plant(TASK, per_cell=3, seed=2) == p


def test_lower_case_names_and_their_candidates():
    p = plant(TASK, per_cell=4, repeats=(1,), kinds=("name",), seed=1, lowercase=True)
    assert all(re.fullmatch(r"[a-z]+ [a-z]+", c.secret) for c in p.canaries)

    class Chars:  # a "tokenizer" whose ids are the characters: candidates readable back
        def __call__(self, text, add_special_tokens=False, return_offsets_mapping=False):
            return {"input_ids": [ord(ch) for ch in text],
                    "offset_mapping": [(i, i + 1) for i in range(len(text))]}

    cands = draw_candidates(Chars(), p, 300, seed=2)
    names = {"".join(map(chr, ids)) for ids in cands[TEMPLATES["name"][0]]}
    assert len(names) == 300 and all(n == n.lower() for n in names)
    assert not names & {c.secret for c in p.canaries}


def test_exposure_of_a_perfect_attacker_is_log2_r_plus_1():
    for r in (1, 10, 999):
        assert exposure(1.0, [0.75] * r) == pytest.approx(math.log2(r + 1))
    assert exposure(0.0, [1.0] * 7) == pytest.approx(0.0)  # last of 8: log2(8) − log2(8)


@pytest.mark.parametrize("r", [3, 1000])
def test_exposure_of_a_random_attacker_is_its_expectation(r):
    """Scores drawn iid: the rank is uniform, so the mean exposure is log2(R + 1) −
    log2((R + 1)!)/(R + 1) (0.85 bits at R = 3, 1.44 at R = 1,000). A natural log (1.0 at
    large R), log2(R) for log2(R + 1) (0.44 at R = 3) or a rank from 0 all miss the tolerance."""
    rng = random.Random(r)
    trials = 6000 if r < 10 else 4000  # 3 standard errors inside the tolerance
    got = sum(exposure(rng.random(), [rng.random() for _ in range(r)])
              for _ in range(trials)) / trials
    assert got == pytest.approx(_expected_random(r), abs=0.07)


def test_ties_count_as_every_order_of_them():
    """All tied: the average over the orders is exactly the random attacker's expectation."""
    assert exposure(0.5, [0.5] * 3) == pytest.approx(_expected_random(3))
    # 2 above, 2 tied: ranks 3, 4, 5 averaged
    want = math.log2(6) - (math.log2(3) + math.log2(4) + math.log2(5)) / 3
    assert exposure(0.5, [0.9, 0.8, 0.5, 0.5, 0.1]) == pytest.approx(want)


# -- end to end on a tiny backbone ---------------------------------------------------------

@pytest.fixture(scope="module")
def canary_backbone(tmp_path_factory):
    """A random tiny BERT whose vocabulary holds the task words, the names, the digits and the
    templates' words (an unknown word would come out as [UNK] and match every candidate)."""
    from tests._tiny import WORDS, make_bert, make_tokenizer

    words = {w for t in TASK for w in t.split()} | set(WORDS) | set(FIRST_NAMES)
    words |= set(LAST_NAMES) | {w for ts in TEMPLATES.values() for t in ts
                                for w in t.replace("{}", "").split()}
    digits = [str(d) for d in range(10)] + [f"##{d}" for d in range(10)]
    tok = make_tokenizer(tmp_path_factory.mktemp("canary"), sorted(words) + digits + ["-"])
    return make_bert(tok, max_positions=128)


def _by_kind_privatize(bb, planted, eta: float, protect: str):
    from rapt.pipeline import Customization
    from rapt.privacy.by_kind import KindPolicy
    from rapt.privacy.personal_data import PersonalSpan

    # Spans given ahead (no Presidio in this test): each planted secret is personal data.
    spans: dict[str, list] = {t: [] for t in planted.texts}
    for c in planted.canaries:
        for o in c.occurrences:
            spans[planted.texts[o.row]] = [PersonalSpan(o.start, o.end, "TEST", 1.0, "test")]
    custom = Customization.create(bb, eta=eta, noise_seed=3, kind_policy=KindPolicy(protect),
                                  personal_spans=spans)

    def privatize(texts):
        rows = custom.rows(texts)
        classes = custom.kind_noise(rows, texts)[2]
        return Release(rows, custom.privatize(rows, texts=texts, measure=False), classes)

    return privatize


@pytest.mark.parametrize("protect", ["rare", "personal"])
def test_a_by_kind_canary_run_goes_end_to_end(canary_backbone, protect):
    from rapt.privacy.by_kind import CLASSES

    bb = canary_backbone
    planted = plant(TASK, per_cell=2, repeats=(1, 4), seed=4)
    cands = draw_candidates(bb.tokenizer, planted, 30, seed=9)
    release, scores = run_canaries(bb.tokenizer, planted,
                                   _by_kind_privatize(bb, planted, 0.5, protect),
                                   {"nn": lambda rows: rows}, cands)
    _, perfect = run_canaries(bb.tokenizer, planted, lambda texts: release,
                              {"oracle": lambda rows: release.clean}, cands)
    ceiling = math.log2(31)
    assert all(s.exposure == pytest.approx(ceiling) and s.exact for s in perfect["oracle"])
    assert all(0 <= s.exposure <= ceiling + 1e-9 for s in scores["nn"])
    cells = summarize(scores["nn"])
    assert [(c["kind"], c["repeats"]) for c in cells] == [(k, r) for k in KINDS for r in (1, 4)]
    assert all(c["canaries"] == 2 and c["candidates"] == 30 for c in cells)
    shares = class_shares(planted, locate(bb.tokenizer, planted, release.clean),
                          release.classes, CLASSES)
    # every secret token lies in a personal span: classed personal, so noised under both
    assert all(s["personal"] == 1.0 and s["tokens"] > 0 for s in shares.values())
    # the template's frequent words pass in clear under a by-kind policy
    row = planted.canaries[0].occurrences[0].row
    assert any(c == CLASSES.index("frequent") for c in release.classes[row])


def test_a_row_cut_before_its_secret_cannot_be_placed(canary_backbone):
    bb = canary_backbone
    planted = plant(TASK, per_cell=1, repeats=(1,), kinds=("phone",), seed=0)
    rows = [r[:4] for r in bb.tokenizer(planted.texts)["input_ids"]]
    with pytest.raises(ValueError, match="cannot be placed"):
        locate(bb.tokenizer, planted, rows)


def test_the_results_pages_are_rendered_from_their_json():
    """Every benchmarks/results/canaries*.md is markdown() of its JSON: its numbers come from
    the data (runs from before names were carried over included)."""
    import json
    from pathlib import Path

    from benchmarks.bench_canaries import markdown

    results = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
    pages = sorted(results.glob("canaries*.json"))
    assert len(pages) >= 5
    for page in pages:
        doc = json.loads(page.read_text())
        assert markdown(doc) == page.with_suffix(".md").read_text(), page.name


def test_the_denoiser_reads_a_long_text_in_windows_that_keep_its_end(canary_backbone):
    """A text longer than the denoiser's max_length is read in windows from its end: every
    position is guessed (before, those beyond 46 tokens came back as received, so a secret
    appended to a long sentence met nearest neighbour only), and the specials stay."""
    from types import SimpleNamespace

    from benchmarks.bench_canaries import attackers_for

    bb = canary_backbone
    seen: list[list[int]] = []

    def guess(rows):  # marks every token it was given
        seen.extend(list(r) for r in rows)
        return [[-1] * len(r) for r in rows]

    den = SimpleNamespace(config=SimpleNamespace(max_length=6), guess=guess)
    rows = [bb.tokenizer(t)["input_ids"] for t in (" ".join(TASK), "awful film")]
    out = attackers_for(bb, None, den)["denoiser"](rows)
    special = set(bb.special_ids)
    for r, o in zip(rows, out, strict=True):
        assert [t == -1 for t in o] == [t not in special for t in r]
    assert all(len(w) <= 4 for w in seen)  # 6 minus [CLS] and [SEP]
    assert seen[0] == rows[0][-5:-1]  # the first window is the text's end
