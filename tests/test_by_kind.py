"""Noise by kind of token (rapt.privacy.by_kind): the classes, their alignment to rows, and the
noise each class gets (tested against its distribution)."""

from __future__ import annotations

import pytest
import torch
from scipy import stats

from rapt.pipeline import Customization, Encoding
from rapt.privacy.by_kind import (
    CLASSES,
    FREQUENT,
    PERSONAL,
    RARE,
    KindPolicy,
    align_classes,
    row_noise,
)
from rapt.privacy.personal_data import PersonalSpan

TEXTS = ["the film was good but caulfield hated it",
         "call 555 about the account of zbigniew"]
# Personal data given ahead (what a machine without Presidio passes): "caulfield" and the number
SPANS = {TEXTS[0]: [PersonalSpan(22, 31, "PERSON", 0.85, "test")],
         TEXTS[1]: [PersonalSpan(5, 8, "NUMBER", 0.6, "test")]}


def _custom(bb, policy, seed=5, eta=40.0):
    return Customization.create(bb, Encoding(), eta=eta, noise_seed=seed, kind_policy=policy,
                                personal_spans=SPANS)


def _classes(bb, policy=KindPolicy("rare")):
    c = _custom(bb, policy)
    rows = c.rows(TEXTS)
    return c, rows, c.kind_noise(rows, TEXTS)[2]


def test_classes_follow_the_public_word_list_and_the_spans(small_bert):
    c, rows, classes = _classes(small_bert)
    tok = small_bert.tokenizer
    words = [tok.convert_ids_to_tokens(r) for r in rows]
    got = {w: CLASSES[k] for ws, ks in zip(words, classes, strict=True)
           for w, k in zip(ws, ks, strict=True) if w not in ("[CLS]", "[SEP]")}
    assert got["the"] == got["was"] == got["about"] == "frequent"
    assert got["555"] == "personal"
    # every piece of a word outside the 1,000 most frequent public words is rare
    z_pieces = [w for w in words[1] if w not in ("[CLS]", "[SEP]")][-3:]
    assert len(tok.tokenize("zbigniew")) >= 2 and all(got[w] == "rare" for w in z_pieces[-1:])
    cau = tok.tokenize("caulfield")
    assert all(got[p] == "personal" for p in cau)


def test_protected_tokens_get_the_uniform_release_and_frequent_ones_pass_in_clear(small_bert):
    uni = _custom(small_bert, None)
    rows = uni.rows(TEXTS)
    u = uni.privatize(rows, measure=False)
    by = _custom(small_bert, KindPolicy("rare"))
    b = by.privatize(rows, measure=False, texts=TEXTS)
    _, _, classes = by.kind_noise(rows, TEXTS)
    special = set(by._special_ids())
    n_prot = n_freq = 0
    for r, ur, br, ks in zip(rows, u, b, classes, strict=True):
        for x, y_u, y_b, k in zip(r, ur, br, ks, strict=True):
            if x in special:
                continue
            if k == FREQUENT:
                assert y_b == x
                n_freq += 1
            else:  # the same noise slot as the uniform mechanism's: the same output
                assert y_b == y_u
                n_prot += 1
    assert n_prot >= 5 and n_freq >= 5
    # uniform at η stays exactly today's mechanism
    again = _custom(small_bert, KindPolicy("all"))
    assert again.privatize(rows, measure=False, texts=TEXTS) == u


@pytest.mark.parametrize("eta,eta_other", [(40.0, 160.0)])
def test_each_class_gets_its_own_eta(small_bert, eta, eta_other):
    """‖z‖ of each class follows Gamma(d, scale 1/η_class) (KS), and not the other class's."""
    c = _custom(small_bert, KindPolicy("rare", eta_other=eta_other), eta=eta)
    rows = c.rows(TEXTS)
    scales, clear, classes = c.kind_noise(rows, TEXTS)
    assert not any(bool(x.any()) for x in clear)  # eta_other given: nothing in clear
    ids = torch.tensor(rows[0])
    reps = 600
    ids_r, scale_r = ids.repeat(reps), scales[0].repeat(reps)
    noised = c.privatizer.noised_embeddings(ids_r, eta_scale=scale_r)
    norms = (noised - c.privatizer.embeddings[ids_r]).norm(dim=1).double()
    cls = torch.tensor(classes[0]).repeat(reps)
    special = torch.isin(ids_r, c.privatizer.special_ids)
    d = small_bert.embeddings.shape[1]
    for k, e, other in ((FREQUENT, eta_other, eta), (RARE, eta, eta_other),
                        (PERSONAL, eta, eta_other)):
        sel = norms[(cls == k) & ~special].numpy()
        assert len(sel) >= 500
        assert stats.kstest(sel, stats.gamma(d, scale=1 / e).cdf).pvalue > 1e-3
        assert stats.kstest(sel, stats.gamma(d, scale=1 / other).cdf).pvalue < 1e-6


def test_align_classes_gives_unplaced_tokens_the_strong_noise():
    special = {101, 102}
    # a pair row: [CLS] a b [SEP] c d [SEP], the first segment truncated to its first token
    row = [101, 7, 102, 9, 10, 102]
    got = align_classes(row, [[7, 8], [9, 10]], [[FREQUENT, RARE], [FREQUENT, FREQUENT]],
                        special)
    assert got[1] == FREQUENT and got[3] == FREQUENT and got[4] == FREQUENT
    # an id that is not the next one of its segment, and positions before ``start``
    got = align_classes([101, 5, 7, 102], [[7]], [[FREQUENT]], special, start=2)
    assert got[1] == PERSONAL and got[2] == FREQUENT
    got = align_classes([101, 99, 102], [[7]], [[FREQUENT]], special)
    assert got[1] == PERSONAL


def test_policy_is_checked():
    with pytest.raises(ValueError, match="protect"):
        KindPolicy("names")
    with pytest.raises(ValueError, match="frequent_rank"):
        KindPolicy("rare", frequent_rank=500)
    with pytest.raises(ValueError, match="eta_other"):
        KindPolicy("rare", eta_other=-1.0)
    with pytest.raises(ValueError, match="below"):
        KindPolicy("rare", eta_other=10.0).check_against(40.0)
    rec = KindPolicy("personal", eta_other=80.0).record(40.0)
    assert rec["class_eta"] == {"personal": 40.0, "rare": 80.0, "frequent": 80.0}


def test_by_kind_needs_the_texts_and_their_spans(small_bert):
    c = _custom(small_bert, KindPolicy("rare"))
    rows = c.rows(TEXTS)
    with pytest.raises(ValueError, match="texts"):
        c.privatize(rows, measure=False)
    with pytest.raises(KeyError, match="no personal-data spans"):
        c.privatize(c.rows(["an unknown text"]), measure=False, texts=["an unknown text"])
    with pytest.raises(ValueError, match="rows for"):
        row_noise(rows, TEXTS[:1], None, small_bert.tokenizer, KindPolicy("rare"), 40.0,
                  special=set(), spans=SPANS)
    c.privatize(rows, measure=False, texts=TEXTS)
    meta = c.privacy_meta()["by_kind"]
    assert meta["protect"] == "rare" and meta["class_eta"]["frequent"] is None
    assert _custom(small_bert, None).privacy_meta()["by_kind"] is None


def _kind(ep, n=400):
    return {"empirical_privacy": ep, "attacker": "nearest neighbour", "n_tokens": n}


def test_the_rule_judges_a_by_kind_release_on_its_protected_tokens():
    """Frequent words in clear make the all-token figure low by design: the rule reads rare
    words and personal data, and says so; the uniform release is still judged on all tokens."""
    from rapt.privacy.rule import judge

    base = {"eta": None, "replacement_probability": 0.2, "inversion_success": 0.8,
            "n_tokens": 2000}
    ok = {**base, "protected_kinds": ["rare", "personal"],
          "by_kind": {"rare": _kind(0.62), "personal": _kind(0.66)}}
    v = judge(ok, backbone="none", min_p=0.5)
    assert not v.weak and v.judged_on == ("rare", "personal")
    assert v.empirical_privacy == pytest.approx(0.2)  # the all-token figure, kept for printing
    weak = {**ok, "by_kind": {"rare": _kind(0.62), "personal": _kind(0.3)}}
    v = judge(weak, backbone="none", min_p=0.5)
    assert v.weak and "protected tokens" in v.message() and "all tokens: 0.200" in v.message()
    # only what the policy protects: --protect personal leaves rare words to the weaker noise
    v = judge({**ok, "protected_kinds": ["personal"],
               "by_kind": {"rare": _kind(0.1), "personal": _kind(0.66)}}, backbone="none",
              min_p=0.5)
    assert not v.weak
    # uniform: the same figures, judged on all tokens
    assert judge({**ok, "protected_kinds": None}, backbone="none", min_p=0.5).weak


def test_personal_eta_0_releases_a_uniform_draw_whatever_the_token(small_bert):
    """η 0 on personal data: with noise too small to move a token, the release of "good" and of
    "hated" alike is a uniform draw over the output vocabulary (chi-square over 20 bins of it),
    and "good" comes out no more often for "good" than for "hated"; at the full η it does."""
    from rapt.config import ETA_MAX
    from rapt.privacy.mechanism import Privatizer, candidate_ids_from_tokenizer

    emb = small_bert.embeddings.detach()
    cand = candidate_ids_from_tokenizer(small_bert.tokenizer, emb.shape[0])
    priv = Privatizer(emb, ETA_MAX, special_ids=small_bert.special_ids, candidate_ids=cand,
                      seed=3)
    a, b = (small_bert.tokenizer.convert_tokens_to_ids(w) for w in ("good", "hated"))
    n = 4000
    pos = {int(c): i for i, c in enumerate(priv.candidate_ids.tolist())}

    def release(tok: int, scale: float) -> torch.Tensor:
        return priv.privatize_ids(torch.full((n,), tok),
                                  eta_scale=torch.full((n,), scale, dtype=torch.float64))

    assert float((release(a, 1.0) == a).float().mean()) > 0.99  # this η keeps tokens
    for tok in (a, b):
        out = release(tok, 0.0)
        bins = torch.bincount(torch.tensor([pos[int(t)] * 20 // len(pos) for t in out]),
                              minlength=20)
        assert stats.chisquare(bins.numpy()).pvalue > 1e-3
    same = [int((release(t, 0.0) == a).sum()) for t in (a, b)]
    assert max(same) <= 10  # about n / |vocabulary| each


def test_personal_eta_0_swaps_only_personal_tokens_and_keeps_the_noise_stream(small_bert):
    """Under eta_personal 0 a personal token's release differs from the strong-η one, while every
    other token's is exactly that of the same policy without it (same noise slot)."""
    plain = _custom(small_bert, KindPolicy("rare"))
    rows = plain.rows(TEXTS)
    base = plain.privatize(rows, measure=False, texts=TEXTS)
    zero = _custom(small_bert, KindPolicy("rare", eta_personal=0.0))
    got = zero.privatize(rows, measure=False, texts=TEXTS)
    scales, _, classes = zero.kind_noise(rows, TEXTS)
    n_personal = 0
    for r, b, g, ks, sc in zip(rows, base, got, classes, scales, strict=True):
        for x, yb, yg, k, s in zip(r, b, g, ks, sc.tolist(), strict=True):
            if k == PERSONAL and x not in set(zero._special_ids()) and s == 0:
                n_personal += 1
            else:
                assert yg == yb
    assert n_personal >= 2
    assert zero.kind_policy.class_etas(40.0)["personal"] == 0.0


def test_personal_level_is_checked_recorded_and_read_back():
    from rapt.privacy.by_kind import make_policy

    with pytest.raises(ValueError, match="eta_personal"):
        KindPolicy("rare", eta_personal=-1.0)
    with pytest.raises(ValueError, match="above") as e:
        make_policy(40.0, "rare", personal_eta=50.0)
    assert e.value.level == "personal"  # KindLevelError: the caller names --personal-*
    with pytest.raises(ValueError, match="below") as e:
        make_policy(40.0, "rare", other_eta=10.0)
    assert e.value.level == "other"
    # --personal-p 1 is η 0, and a personal level alone makes the uniform mechanism by-kind
    pol = make_policy(40.0, "all", personal_p=1.0)
    assert pol is not None and not pol.uniform and pol.eta_personal == 0.0
    assert pol.protected_kinds(40.0) == ["rare", "personal"]
    assert make_policy(40.0, "all") is None
    rec = KindPolicy("rare", eta_personal=10.0).record(40.0)
    assert rec["class_eta"] == {"personal": 10.0, "rare": 40.0, "frequent": None}
    assert KindPolicy.from_record(rec) == KindPolicy("rare", eta_personal=10.0)
    assert make_policy(40.0, "rare", personal_p=0.9, calibrate=lambda p: 20.0).eta_personal == 20.0


def test_a_name_found_in_one_text_is_personal_in_every_text_and_pair(small_bert):
    """Presidio found "caulfield" in TEXTS[0] only: row_noise marks it in the other texts too,
    text pairs included, and its record says which entities are carried so."""
    texts = [TEXTS[0], "caulfield was right", "nothing to see"]
    pairs = ["a", "b", "ask caulfield"]
    spans = {**SPANS, **{t: [] for t in [*texts[1:], *pairs]}}
    c = Customization.create(small_bert, Encoding(), eta=40.0, noise_seed=5,
                             kind_policy=KindPolicy("rare"), personal_spans=spans)
    rows = c.rows(texts, pairs)
    classes = c.kind_noise(rows, texts, pairs)[2]
    tok = small_bert.tokenizer
    marked = [[w for w, k in zip(tok.convert_ids_to_tokens(r), ks, strict=True)
               if k == PERSONAL and w not in ("[CLS]", "[SEP]")]  # specials: never placed
              for r, ks in zip(rows, classes, strict=True)]
    cau = tok.tokenize("caulfield")
    assert marked == [cau, cau, cau]  # the third in its second text
    assert KindPolicy("rare").record(40.0)["personal_data_propagated"] == [
        "PERSON", "LOCATION", "ORGANIZATION"]


def test_rare_words_beyond_personal_rank_get_personal_noise_and_stay_rare(small_bert):
    """personal_rank 10,000 with η 0 on personal data: every token of a word outside the 10,000
    most frequent public words gets scale 0 (as personal data does) and is still reported RARE;
    a rare word inside them keeps the strong η; other tokens' release is unchanged."""
    from rapt.privacy.kinds import load_word_frequencies, token_kinds

    plain = _custom(small_bert, KindPolicy("rare", eta_personal=0.0))
    rows = plain.rows(TEXTS)
    beyond = _custom(small_bert, KindPolicy("rare", eta_personal=0.0, personal_rank=10_000))
    s0, _, c0 = plain.kind_noise(rows, TEXTS)
    s1, _, c1 = beyond.kind_noise(rows, TEXTS)
    assert c0 == c1  # what a token is does not change with its noise
    kinds = token_kinds(TEXTS, small_bert.tokenizer, load_word_frequencies(),
                        spans=[SPANS[t] for t in TEXTS])
    special = set(plain._special_ids())
    seen = {"rarer": 0, "1k-10k": 0}
    for row, a, b, ks, bands in zip(rows, s0, s1, c1, kinds.bands, strict=True):
        text_pos = [i for i, t in enumerate(row) if t not in special]
        assert len(text_pos) == len(bands)
        for i, band in zip(text_pos, bands, strict=True):
            if ks[i] == RARE and band == 3:
                seen["rarer"] += 1
                assert a[i] == 1.0 and b[i] == 0.0
            else:
                seen["1k-10k"] += ks[i] == RARE
                assert a[i] == b[i]
    assert seen["rarer"] >= 2 and seen["1k-10k"] >= 1
    got = beyond.privatize(rows, measure=False, texts=TEXTS)
    base = plain.privatize(rows, measure=False, texts=TEXTS)
    for g, b0, sc in zip(got, base, s1, strict=True):
        assert all(x == y for x, y, s in zip(g, b0, sc.tolist(), strict=True) if s != 0.0)


def test_personal_rank_is_checked_recorded_and_read_back():
    from rapt.privacy.by_kind import make_policy

    with pytest.raises(ValueError, match="personal_rank"):
        KindPolicy("rare", personal_rank=5000)
    with pytest.raises(ValueError, match="no smaller than frequent_rank"):
        KindPolicy("rare", frequent_rank=1000, personal_rank=100)
    pol = make_policy(40.0, "rare", personal_p=1.0, personal_rank=10_000)
    rec = pol.record(40.0)
    assert rec["personal_rank"] == 10_000 and KindPolicy.from_record(rec) == pol
    assert "personal_rank" not in KindPolicy("rare").record(40.0)
    # 0 is the users' "off" (--personal-rank 0, DemoConfig), as None
    assert make_policy(40.0, "rare", personal_p=1.0, personal_rank=0).personal_rank is None
    # without a personal level or protection the rank changes nothing: still uniform
    assert make_policy(40.0, "all", personal_rank=10_000) is None
