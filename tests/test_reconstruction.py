"""Plain tokens, row layout, user-side privatization of rows, reconstruction vocabulary/loss."""

from __future__ import annotations

import math

import pytest
import torch
from _tiny import TOY_WORDS, make_tokenizer

from rapt.noise import NoiseSource
from rapt.tuning.reconstruction import (
    ReconstructionHead,
    build_rows,
    candidate_plain_ids,
    parse_plain_tokens,
    plain_offset,
    privatize_rows,
    rec_vocabulary,
    reconstruction_loss,
    sample_plain_tokens,
)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("rec_tok"), ["[unused0]"] + TOY_WORDS)


def test_plain_tokens_seeded_and_never_special(tok):
    a = sample_plain_tokens(tok, 40, seed=3)
    assert a == sample_plain_tokens(tok, 40, seed=3)
    assert a != sample_plain_tokens(tok, 40, seed=4)
    bad = set(tok.all_special_ids) | {tok.convert_tokens_to_ids("[unused0]")}
    assert len(a) == 40 and not bad & set(a)
    assert not bad & set(candidate_plain_ids(tok))
    seqs = sample_plain_tokens(tok, 5, seed=0, num_sequences=3)
    assert len(seqs) == 3 and all(len(s) == 5 for s in seqs)
    assert parse_plain_tokens(tok, "good movie") == tok.convert_tokens_to_ids(["good", "movie"])


def test_row_layout_cls_k_x_sep(tok):
    k = tok.convert_tokens_to_ids(["music", "plot", "story"])
    rows = build_rows(tok, ["good film", "the movie was very very long and boring"], 10, k)
    assert plain_offset(tok) == 1
    assert rows[0] == [tok.cls_token_id, *k, *tok.convert_tokens_to_ids(["good", "film"]),
                       tok.sep_token_id]
    assert len(rows[1]) == 10 and rows[1][1:4] == k and rows[1][-1] == tok.sep_token_id
    assert build_rows(tok, ["good film"], 10) == [[2, *tok.convert_tokens_to_ids(
        ["good", "film"]), 3]]
    with pytest.raises(ValueError, match="no room"):
        build_rows(tok, ["good"], 5, k)


def test_privatize_rows_keeps_specials_and_layout(tok):
    from rapt.privacy.mechanism import Privatizer

    torch.manual_seed(0)
    emb = torch.randn(len(tok), 16)
    rows = build_rows(tok, ["good film", "the plot was boring"], 16,
                      sample_plain_tokens(tok, 4, seed=0))
    special = tok.all_special_ids
    strong = Privatizer(emb, 0.5, special_ids=special, seed=0)
    out = privatize_rows(rows, strong, NoiseSource(0))
    assert [len(r) for r in out] == [len(r) for r in rows]
    for r, o in zip(rows, out, strict=True):
        assert o[0] == r[0] == tok.cls_token_id and o[-1] == r[-1] == tok.sep_token_id
    changed = sum(a != b for r, o in zip(rows, out, strict=True) for a, b in zip(r, o,
                                                                                 strict=True))
    assert changed > 0
    weak = Privatizer(emb, 1e6, special_ids=special, seed=0)
    assert privatize_rows(rows, weak) == rows  # η -> ∞: nothing replaced
    # the same noise seed -> the same privatized rows (repeatable only when asked for)
    assert privatize_rows(rows, strong, NoiseSource(0)) == privatize_rows(rows, strong,
                                                                          NoiseSource(0))


def test_rec_vocabulary_plain_first_then_frequent(tok):
    k = [10, 11, 10]
    rows = [[2, 20, 20, 21, 3], [2, 20, 22, 11, 3]]
    v = rec_vocabulary(rows, k, size=4, special_ids=[2, 3])
    assert v == [10, 11, 20, 21] or v == [10, 11, 20, 22]
    assert rec_vocabulary(rows, k, size=100, special_ids=[2, 3])[:2] == [10, 11]
    assert len(rec_vocabulary(rows, k, size=100, special_ids=[2, 3])) == 5


def test_head_and_loss_shapes():
    head = ReconstructionHead(32, 8, 50)
    assert head.down.weight.shape == (8, 32) and head.up.weight.shape == (50, 8)
    assert head.down.bias is None and head.up.bias is None  # eq. 6 has no bias
    logits = head(torch.randn(3, 4, 32))
    assert logits.shape == (3, 4, 50)
    tgt = torch.randint(50, (3, 4))
    s, m = reconstruction_loss(logits, tgt, "sum"), reconstruction_loss(logits, tgt, "mean")
    assert s.shape == (3,)
    torch.testing.assert_close(s, 4 * m)
    perfect = torch.full((1, 2, 5), -1e4)
    perfect[0, 0, 1] = perfect[0, 1, 3] = 1e4
    assert reconstruction_loss(perfect, torch.tensor([[1, 3]])).item() < 1e-6


def test_loss_values_against_hand_computed_cross_entropy():
    """Eq. 7 checked against numbers computed by hand, not against the shapes alone.

    Mutations tried (each made this test fail): ``reconstruction_loss`` returning
    ``torch.zeros(B)``; dropping the ``transpose(1, 2)`` (classes read along m); ``sum``
    and ``mean`` swapped.
    """
    # Uniform logits: every softmax is 1/|T|, so each position costs log |T| whatever the target.
    T, m = 7, 3
    for c in (0.0, 5.0, -2.5):
        uniform = torch.full((2, m, T), c)
        tgt = torch.tensor([[0, 3, 6], [1, 1, 5]])
        torch.testing.assert_close(reconstruction_loss(uniform, tgt, "mean"),
                                   torch.full((2,), math.log(T)))
        torch.testing.assert_close(reconstruction_loss(uniform, tgt, "sum"),
                                   torch.full((2,), m * math.log(T)))
    # A hand-computed case: CE = −z_target + log Σ_j exp(z_j) at each position.
    z = [[1.0, 2.0, 0.5], [0.0, -1.0, 3.0]]
    targets = [1, 0]
    by_hand = [-row[t] + math.log(sum(math.exp(v) for v in row)) for row, t in zip(
        z, targets, strict=True)]
    # position 0: −2 + log(e¹ + e² + e^0.5) = 0.46437; position 1: 0 + log(1 + e⁻¹ + e³)
    assert by_hand == pytest.approx([0.46437, 3.06588], abs=1e-5)
    logits = torch.tensor([z], dtype=torch.float64)
    tgt = torch.tensor([targets])
    assert reconstruction_loss(logits, tgt, "sum").item() == pytest.approx(sum(by_hand),
                                                                           rel=1e-12)
    assert reconstruction_loss(logits, tgt, "mean").item() == pytest.approx(sum(by_hand) / 2,
                                                                            rel=1e-12)
    # The degenerate answer is far off: a loss of 0 (or log |T|) is not what eq. 7 gives here.
    assert sum(by_hand) > 0.5 and abs(sum(by_hand) / 2 - math.log(3)) > 0.1


def test_plain_offset_without_the_probe_word(tmp_path):
    """Plain tokens go right after [CLS] whatever the vocabulary (found while checking
    attribute features by hand: with a vocabulary lacking "a", build_rows put k after the
    first two text tokens). Negative control: the same vocabulary plus "a" gives 1."""
    from rapt.tuning.reconstruction import plain_offset

    (tmp_path / "with_a").mkdir()
    assert plain_offset(make_tokenizer(tmp_path / "with_a", ["good", "movie", "a"])) == 1
    tok = make_tokenizer(tmp_path, ["good", "movie"])
    k = tok.convert_tokens_to_ids(["movie"])
    rows = build_rows(tok, ["good movie"], 16, k)
    assert plain_offset(tok) == 1
    assert rows[0] == [tok.cls_token_id, *k, *tok.convert_tokens_to_ids(["good", "movie"]),
                       tok.sep_token_id]
