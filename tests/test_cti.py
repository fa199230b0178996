"""rapt.privacy.cti: utility importance (SAP eq. 5), the <= 1% coverage rule, and eta_scale."""

from __future__ import annotations

import math

import pytest
import torch

from rapt.privacy.cti import (
    DEFAULT_ETA_MULTIPLIER,
    contributing_tokens,
    eta_scale,
    token_class_counts,
    utility_importance,
)


def test_counts_by_class_and_special_zeroed():
    ids = [[0, 2, 2, 3], [0, 3], [1, 4, 0]]
    counts = token_class_counts(ids, [0, 1, 0], num_classes=2, vocab_size=5, special_ids=[0])
    assert counts.tolist() == [[0, 1, 2, 1, 1], [0, 0, 0, 1, 0]]
    with pytest.raises(ValueError, match="labels"):
        token_class_counts(ids, [0, 2, 0], num_classes=2, vocab_size=5)
    with pytest.raises(ValueError, match="token ids"):
        token_class_counts([[7]], [0], num_classes=2, vocab_size=5)
    with pytest.raises(ValueError, match="labels"):
        token_class_counts(ids, [0, 1], num_classes=2, vocab_size=5)


@pytest.mark.parametrize("alpha", [1.0, 0.1, 0.01])
def test_utility_importance_matches_equation_5_with_laplace(alpha):
    counts = torch.tensor([[5.0, 0.0, 3.0, 9.0], [1.0, 4.0, 3.0, 0.0], [0.0, 0.0, 2.0, 7.0]])
    ui = utility_importance(counts, smoothing=alpha, special_ids=[3])
    v_eff = 3  # token 3 is special: left out of the counts and of the smoothing denominator
    n = [8.0, 8.0, 2.0]  # per-class totals without token 3
    for c in range(3):
        for t in range(3):
            p = [(counts[k, t].item() + alpha) / (n[k] + alpha * v_eff) for k in range(3)]
            want = sum(math.log(p[c] / p[k]) for k in range(3) if k != c)
            assert ui[c, t].item() == pytest.approx(want, rel=1e-12)
    assert torch.isinf(ui[:, 3]).all() and (ui[:, 3] < 0).all()
    # smoothing keeps tokens absent from a class finite
    assert torch.isfinite(ui[:, :3]).all()


def test_alpha_is_a_documented_parameter_that_moves_the_ranking():
    """Issue 28 item 2: α (``smoothing``) defaults to 1 everywhere, and it decides whether a
    frequent, moderately indicative token outranks a rare token seen in one class only."""
    import inspect

    from rapt.privacy.cti import DEFAULT_SMOOTHING
    from rapt.split import SplitConfig

    assert DEFAULT_SMOOTHING == 1.0 and SplitConfig().cti_smoothing == 1.0
    for fn in (utility_importance, contributing_tokens):
        assert inspect.signature(fn).parameters["smoothing"].default == 1.0
        assert "α" in fn.__doc__
    # token 0: 100 vs 20 occurrences; token 1: 3 occurrences, class 0 only; token 2 filler
    counts = torch.tensor([[100.0, 3.0, 897.0, 0.0], [20.0, 0.0, 980.0, 0.0]])
    best = {a: utility_importance(counts, smoothing=a)[0].argmax().item() for a in (1.0, 0.01)}
    assert best == {1.0: 0, 0.01: 1}
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="cti_smoothing"):
            SplitConfig(cti_smoothing=bad)
    assert SplitConfig.from_dict(SplitConfig(cti_smoothing=0.1).to_dict()).cti_smoothing == 0.1


def test_alpha_reaches_the_customer_cti(tiny_tokenizer):
    from rapt.split import SplitConfig, encode_texts, setup_split
    from tests._tiny import make_bert

    bb = make_bert(tiny_tokenizer)
    texts = ["good fun film", "bad dull film", "good great fun", "bad awful plot"] * 3
    rows, labels = encode_texts(bb.tokenizer, texts, 8), [1, 0, 1, 0] * 3
    scores = {}
    for a in (1.0, 0.01):
        cust, _ = setup_split(bb, SplitConfig(eta=5.0, cti=True, cti_smoothing=a, noise_seed=0),
                              2, len(rows))
        res = cust.fit_cti(rows, labels)
        want = contributing_tokens(rows, labels, num_classes=2, vocab_size=len(bb.tokenizer),
                                   special_ids=cust.special_ids, smoothing=a)
        assert torch.equal(res.scores, want.scores)
        scores[a] = res.scores
    assert not torch.equal(scores[1.0], scores[0.01])


def _synthetic(seed: int = 0, n: int = 400, vocab: int = 300, length: int = 20):
    """Random Zipf-like text over `vocab` ids (0-2 special), two classes; token 250 is planted
    in 40% of class-1 examples, token 251 appears exactly once (in class 1)."""
    g = torch.Generator().manual_seed(seed)
    weights = 1.0 / torch.arange(1, vocab - 3 + 1, dtype=torch.float64)
    weights[250 - 3:] = 0.0  # ids >= 250 only where planted
    ids, labels = [], []
    for i in range(n):
        y = i % 2
        body = (torch.multinomial(weights, length, replacement=True, generator=g) + 3).tolist()
        if y == 1 and torch.rand(1, generator=g).item() < 0.4:
            body[int(torch.randint(length, (1,), generator=g))] = 250
        if i == 1:
            body[0] = 251
        # [CLS]=1 ... [SEP]=2; a special id (0) correlated with class 0 must never be chosen
        ids.append([1] + body + [2] + ([0, 0] if y == 0 else []))
        labels.append(y)
    return ids, labels


def test_planted_token_ranks_first():
    ids, labels = _synthetic()
    res = contributing_tokens(ids, labels, num_classes=2, vocab_size=300, special_ids=[0, 1, 2],
                              k=5)
    assert res.per_class[1][0] == 250
    assert 250 in res.token_ids and 250 not in res.per_class[0]
    # seen once, in class 1 only: smoothing keeps it below the frequent indicative token
    assert res.scores[1, 251] < res.scores[1, 250]
    assert not {0, 1, 2} & set(res.token_ids)
    assert res.ranking[1, 0].item() == 250


def _multi_planted(seed: int = 1, n: int = 1000, length: int = 20):
    """Zipf background shared by both classes; class c has 8 planted ids (200+8c ...), one of
    which replaces a word in half of its examples (each planted id ~0.15% of tokens)."""
    g = torch.Generator().manual_seed(seed)
    weights = 1.0 / torch.arange(1, 200 - 3 + 1, dtype=torch.float64)
    ids, labels = [], []
    for i in range(n):
        y = i % 2
        body = (torch.multinomial(weights, length, replacement=True, generator=g) + 3).tolist()
        if torch.rand(1, generator=g).item() < 0.5:
            body[0] = 200 + 8 * y + int(torch.randint(8, (1,), generator=g))
        ids.append([1] + body + [2])
        labels.append(y)
    return ids, labels


def test_coverage_rule_picks_largest_k_within_one_percent():
    ids, labels = _multi_planted()
    special = [0, 1, 2]
    res = contributing_tokens(ids, labels, num_classes=2, vocab_size=300, special_ids=special)
    counts = token_class_counts(ids, labels, 2, 300, special).sum(0)
    total = counts.sum().item()

    def cov(k: int) -> float:  # brute force from the ranking
        sel = {int(t) for t in res.ranking[:, :k].reshape(-1) if t >= 0}
        return sum(counts[t].item() for t in sel) / total

    assert res.k >= 1
    # the chosen tokens are the planted ones, each with its own class
    assert all(200 <= t < 208 for t in res.per_class[0])
    assert all(208 <= t < 216 for t in res.per_class[1])
    assert res.coverage == pytest.approx(cov(res.k)) and res.coverage <= 0.01
    assert cov(res.k + 1) > 0.01  # maximal
    assert res.token_ids == sorted({t for row in res.per_class for t in row})
    assert all(len(row) == res.k for row in res.per_class)
    # a looser budget gives a superset
    loose = contributing_tokens(ids, labels, num_classes=2, vocab_size=300, special_ids=special,
                                coverage=0.05)
    assert loose.k > res.k and set(res.token_ids) <= set(loose.token_ids)
    assert loose.coverage <= 0.05


def test_per_class_rule_fills_the_budget_past_a_frequent_token():
    # Class 0's best-ranked token (290) is frequent (like FP's neutral "is"): the paper's uniform
    # k stops at 0 for every class; the per-class rule skips it and keeps filling.
    ids, labels = _multi_planted()
    ids = [([1, 290, 290, 290] + row[1:]) if y == 0 else row for row, y in zip(ids, labels,
                                                                          strict=True)]
    special = [0, 1, 2]
    uni = contributing_tokens(ids, labels, num_classes=2, vocab_size=300, special_ids=special)
    res = contributing_tokens(ids, labels, num_classes=2, vocab_size=300, special_ids=special,
                              rule="per-class")
    counts = token_class_counts(ids, labels, 2, 300, special).sum(0)
    total = counts.sum().item()
    assert res.ranking[0, 0].item() == 290 and uni.k == 0
    assert 290 not in res.token_ids and len(res.token_ids) > len(uni.token_ids)
    used = sum(counts[t].item() for t in res.token_ids)
    assert res.coverage == pytest.approx(used / total) and res.coverage <= 0.01
    for c in range(2):
        order = [t for t in res.ranking[c].tolist() if t >= 0]
        pos = [order.index(t) for t in res.per_class[c]]
        assert pos == sorted(pos)  # taken in UI order
        assert all(200 + 8 * c <= t < 208 + 8 * c for t in res.per_class[c])
        # maximal: every ranked token left out is chosen by another class or would overflow
        for t in order:
            if t not in res.token_ids:
                assert used + counts[t].item() > 0.01 * total
    assert res.token_ids == sorted({t for row in res.per_class for t in row})
    with pytest.raises(ValueError, match="rule"):
        contributing_tokens(ids, labels, num_classes=2, vocab_size=300, rule="greedy")


def test_k_zero_when_top_tokens_too_frequent():
    # every class's best token is ~half the text: no k >= 1 fits in 1%
    ids = [[3, 3, 5]] * 10 + [[4, 4, 5]] * 10
    res = contributing_tokens(ids, [0] * 10 + [1] * 10, num_classes=2, vocab_size=6)
    assert res.k == 0 and res.token_ids == [] and res.coverage == 0.0
    forced = contributing_tokens(ids, [0] * 10 + [1] * 10, num_classes=2, vocab_size=6, k=1)
    assert forced.per_class == [[3], [4]] and forced.coverage == pytest.approx(40 / 60)


def test_eta_scale():
    ids = torch.tensor([[101, 7, 9, 7], [101, 8, 102, 0]])
    s = eta_scale(ids, [7, 8])
    assert s.shape == ids.shape and s.dtype == torch.float32
    assert s.tolist() == [[1, 2, 1, 2], [1, 2, 1, 1]]
    assert DEFAULT_ETA_MULTIPLIER == 2.0
    assert eta_scale(ids, torch.tensor([9]), multiplier=3.5)[0, 2].item() == 3.5
    assert (eta_scale(ids, []) == 1).all()
    for bad in (0.5, float("nan")):
        with pytest.raises(ValueError, match="multiplier"):
            eta_scale(ids, [7], multiplier=bad)
    # SAP Algorithm 1: no noise on contributing tokens (privatize_with_scale passes them)
    assert torch.isinf(eta_scale(ids, [7], multiplier=float("inf"))[0, 1])


def test_result_eta_scale_and_privatizer_weaker_noise():
    ids, labels = _synthetic()
    res = contributing_tokens(ids, labels, num_classes=2, vocab_size=300, special_ids=[0, 1, 2],
                              k=3)
    x = torch.tensor([250, 5, 250, 6])
    assert res.eta_scale(x).tolist() == [2.0, 1.0, 2.0, 1.0]

    priv = pytest.importorskip("rapt.privacy.mechanism")
    g = torch.Generator().manual_seed(0)
    emb = torch.randn(300, 8, generator=g)
    p = priv.Privatizer(emb, eta=4.0, special_ids=[0, 1, 2], seed=0)
    batch = torch.full((4000,), 250)
    plain = p.privatize_ids(batch)
    weak = p.privatize_ids(batch, eta_scale=eta_scale(batch, [250], multiplier=4.0))
    changed_plain = (plain != batch).float().mean().item()
    changed_weak = (weak != batch).float().mean().item()
    assert changed_weak < changed_plain


@pytest.mark.parametrize("multiplier", [math.inf, 2.0])
def test_sap_and_cti_share_the_noise_of_every_other_position(multiplier):
    """Issue 28: with one seed, SAP and SAP-CTI draw each position's noise from the same slot
    of the stream, so they agree wherever the token is not contributing (the old code skipped
    contributing positions and shifted every later draw onto another token)."""
    from rapt.privacy.cti import privatize_with_scale
    from rapt.privacy.mechanism import Privatizer

    g = torch.Generator().manual_seed(1)
    emb = torch.randn(80, 8, generator=g)
    ids = torch.randint(3, 80, (6, 40), generator=g)
    ids[:, 0], ids[3, 30:] = 1, 0  # specials (a CLS-like id and padding) take no slot
    contrib = [5, 17, 33, 60]
    ids[:, 5] = 17  # every row has a contributing token early on
    is_c = torch.isin(ids, torch.tensor(contrib))
    other = ~is_c & ~torch.isin(ids, torch.tensor([0, 1]))

    def privatizer(seed):  # a small chunk so that passed-through positions straddle chunks
        return Privatizer(emb, eta=3.0, special_ids=[0, 1], seed=seed, chunk_size=7)

    sap = privatize_with_scale(privatizer(4), ids)
    cti = privatize_with_scale(privatizer(4), ids, eta_scale(ids, contrib, multiplier))
    assert (sap[other] != ids[other]).float().mean() > 0.3  # the noise really moves tokens
    assert torch.equal(sap[other], cti[other])
    if math.isinf(multiplier):
        assert torch.equal(cti[is_c], ids[is_c])
    # another seed gives another release, so the agreement above is not a constant output
    assert not torch.equal(privatize_with_scale(privatizer(5), ids)[other], sap[other])


def test_cli_data_cti(tmp_path):
    from transformers import BertTokenizerFast
    from typer.testing import CliRunner

    from rapt.cli import app

    # Built from its own vocab file: with transformers 5.x, BertTokenizerFast(vocab_file=...)
    # (the tiny_tokenizer fixture) ignores the file and maps every word to [UNK].
    src = tmp_path / "vocab"
    src.mkdir()
    words = "the movie was a film of story with one scene and music brilliant".split()
    (src / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
                                             + words) + "\n")
    tok_dir = tmp_path / "tok"
    BertTokenizerFast.from_pretrained(src).save_pretrained(tok_dir)
    rows = ["text,label"]
    filler = "the movie was a film of the story with one scene and music".split()
    for i in range(200):
        words = [filler[(i * 7 + j) % len(filler)] for j in range(12)]
        if i % 2 == 1:
            words[i % 12] = "brilliant"
        rows.append(f"{' '.join(words)},{'pos' if i % 2 else 'neg'}")
    data = tmp_path / "d.csv"
    data.write_text("\n".join(rows) + "\n")
    r = CliRunner().invoke(app, ["data", "cti", str(data), "--backbone", str(tok_dir),
                                 "--top", "3", "--k", "1"])
    assert r.exit_code == 0, r.output
    pos = r.output.split("class pos:")[1]
    assert pos.splitlines()[1].split()[:3] == ["*", "1", "brilliant"]
    assert "k = 1 (fixed k, α = 1)" in r.output
    r = CliRunner().invoke(app, ["data", "cti", str(data), "--backbone", str(tok_dir),
                                 "--smoothing", "0"])
    assert r.exit_code == 2 and "--smoothing" in r.output
    r = CliRunner().invoke(app, ["data", "cti", str(tmp_path / "none.csv"), "--backbone",
                                 str(tok_dir)])
    assert r.exit_code == 2 and "none.csv" in r.output
