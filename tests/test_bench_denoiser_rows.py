"""The denoiser benchmark never trains on a text the shipped attack table attacks."""

from benchmarks.bench_channel_denoiser import drop_attacked


def test_long_attacked_texts_are_left_out_whatever_the_cut():
    long_text = list(range(100, 160))  # 60 tokens: longer than both cuts
    short_text = [5, 6, 7]
    other = list(range(200, 260))
    attacked = [long_text[:48], short_text]  # the table cuts its texts to 48 tokens
    kept = drop_attacked([long_text, short_text, other, long_text[:40]], attacked, 48)
    assert kept == [other, long_text[:40]]  # a shorter text that is a prefix is another text
    # Cut to the denoiser's 46 tokens first, the long text would no longer match: the bug this
    # guards against.
    assert long_text[:46] in drop_attacked([r[:46] for r in [long_text]], attacked, 48)


def test_domain_rows_never_hold_a_dev_text():
    """The domain attacker trains on the attacked family's other splits, never on a row equal
    to one of its dev rows (FP repeats sentences across its splits)."""
    from benchmarks.bench_channel_denoiser import DOMAIN_SPLITS, EVAL_SET, domain_rows
    from rapt.data import load_dataset
    from rapt.models import load_backbone
    from rapt.privacy.mechanism import tokenize_texts

    bb = load_backbone("minilm")
    rows, record = domain_rows(["financial_phrasebank"], bb, 0)
    dev = {tuple(r) for r in tokenize_texts(
        list(load_dataset(*EVAL_SET["financial_phrasebank"]).texts), bb.tokenizer)}
    assert rows and not any(tuple(r) in dev for r in rows)
    assert {(s["name"], s["split"]) for s in record} == set(DOMAIN_SPLITS["financial_phrasebank"])
    assert sum(s["texts"] for s in record) == len(rows)
    assert all(split != "dev" for _, split in DOMAIN_SPLITS["financial_phrasebank"])


def test_gain_ci_is_the_paired_difference():
    import pytest

    from benchmarks.bench_channel_denoiser import gain_ci

    clean = [[1, 2, 3, 4], [5, 6], [7, 8, 9]]
    private = [[1, 0, 3, 0], [5, 0], [7, 8, 0]]  # 4 replaced tokens of 9
    nn = private
    same = gain_ci(clean, private, nn, nn)
    assert same["all"]["gain_pp"] == 0 and same["all"]["ci95_pp"] == [0, 0]
    guess = [[1, 2, 3, 0], [5, 6], [7, 8, 9]]  # 3 of the 4 replaced recovered
    g = gain_ci(clean, private, nn, guess)
    assert g["all"]["gain_pp"] == pytest.approx(100 * 3 / 9)
    assert g["replaced_only"]["gain_pp"] == pytest.approx(75)
    lo, hi = g["all"]["ci95_pp"]
    assert 0 < lo <= g["all"]["gain_pp"] <= hi
    # a guess that breaks a kept token loses points: the gain can be negative
    worse = [[1, 0, 3, 0], [9, 0], [7, 8, 0]]
    assert gain_ci(clean, private, nn, worse)["all"]["gain_pp"] < 0


def test_near_duplicate_share_matches_brute_force():
    import random

    from benchmarks.bench_channel_denoiser import near_duplicate_share

    rng = random.Random(0)
    train = [[rng.randrange(40) for _ in range(rng.randrange(3, 25))] for _ in range(300)]
    # dev: edited copies of training rows (a few tokens swapped) and fresh rows
    dev = [[t if rng.random() > 0.1 else rng.randrange(40) for t in train[i]] for i in range(50)]
    dev += [[rng.randrange(40, 400) for _ in range(12)] for _ in range(50)]
    for th in (0.5, 0.8, 0.9):
        brute = sum(any(len(set(d) & set(t)) / len(set(d) | set(t)) >= th for t in train)
                    for d in dev) / len(dev)
        assert near_duplicate_share(dev, train, th) == brute
    assert near_duplicate_share(dev[50:], train, 0.8) == 0
