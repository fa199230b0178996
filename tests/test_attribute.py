"""Attribute inference attack: the MLP finds a signal when there is one, and only then."""

from __future__ import annotations

import pytest
import torch

from rapt.attacks.attribute import attribute_attack, embedding_features, hidden_features


def _data(n: int, signal: float, seed: int):
    g = torch.Generator().manual_seed(seed)
    y = (torch.rand(n, generator=g) < 0.3).long()  # 70 % majority class
    x = torch.randn(n, 16, generator=g)
    x[:, 0] += signal * (2 * y - 1)
    return x, y.tolist()


def test_attack_finds_signal():
    xtr, ytr = _data(400, 3.0, 0)
    xte, yte = _data(200, 3.0, 1)
    r = attribute_attack(xtr, ytr, xte, yte, attribute="gender", epochs=20, hidden=64)
    assert r.accuracy > 0.9
    assert r.empirical_privacy == pytest.approx(1 - r.accuracy)
    assert 0.6 < r.majority_rate < 0.8 and r.n_train == 400 and r.n_test == 200


def test_attack_without_signal_is_near_majority():
    xtr, ytr = _data(400, 0.0, 0)
    xte, yte = _data(200, 0.0, 1)
    r = attribute_attack(xtr, ytr, xte, yte, epochs=20, hidden=64)
    assert r.accuracy < r.majority_rate + 0.08
    assert abs(r.balanced_accuracy - 0.5) < 0.1  # no signal: a blind attacker's 1 / classes


def test_balanced_accuracy_is_mean_per_class_recall():
    """An attacker that always answers the majority class scores its rate in accuracy but
    exactly 1 / classes in balanced accuracy; with a signal both are high."""
    xtr, ytr = _data(400, 3.0, 0)
    xte, yte = _data(200, 3.0, 1)
    r = attribute_attack(xtr, ytr, xte, yte, epochs=20, hidden=64)
    yt = torch.tensor(yte)
    assert r.balanced_accuracy > 0.85 and r.balanced_accuracy <= 1.0
    # a constant attacker (zero features, so the MLP can only learn the prior)
    r0 = attribute_attack(torch.zeros(400, 16), ytr, torch.zeros(200, 16), yte, epochs=20,
                          hidden=64)
    assert r0.accuracy == pytest.approx(float((yt == 0).float().mean()))
    assert r0.balanced_accuracy == pytest.approx(0.5)


def test_attack_input_checks():
    with pytest.raises(ValueError, match="length"):
        attribute_attack(torch.zeros(3, 2), [0, 1], torch.zeros(2, 2), [0, 1])
    with pytest.raises(ValueError, match="non-empty"):
        attribute_attack(torch.zeros(0, 2), [], torch.zeros(2, 2), [0, 1])


def _hand_mean(vectors, keep) -> torch.Tensor:
    """Mean of ``vectors[j]`` over the positions j with ``keep[j]``, with an explicit loop."""
    total, count = torch.zeros(vectors.shape[-1], dtype=torch.float64), 0
    for j in range(len(keep)):
        if keep[j]:
            total += vectors[j].double()
            count += 1
    return (total / count).float()


def test_feature_extractors(tmp_path):
    """Both feature extractors equal a mean pooled by hand, row by row, with no padding.

    Rows have different lengths (so the batch is padded) and one holds a special token in the
    middle. embedding_features averages the non-special tokens; hidden_features averages every
    real position of the bare backbone's last layer (each row run alone, so padding cannot
    enter), or, with a tuned prompt, every position except the plain tokens.

    Mutations tried (each made this test fail): embedding_features without the
    ``~torch.isin(ids, special)`` mask (specials averaged in); dividing by the padded length
    instead of ``m.sum(1)``; hidden_features weighting padded positions (``w`` all ones);
    hidden_features not excluding the plain-token positions of a tuned prompt.
    """
    from transformers import BertConfig, BertModel, BertTokenizerFast

    from rapt.models import from_model
    from rapt.tuning.reconstruction import build_rows
    from rapt.tuning.tune import TuneConfig, tune
    from rapt.tuning.tuners import base_model

    (tmp_path / "vocab.txt").write_text(
        "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "bad", "movie", "a"])
        + "\n")
    tok = BertTokenizerFast.from_pretrained(str(tmp_path))
    torch.manual_seed(0)
    bb = from_model(BertModel(BertConfig(vocab_size=len(tok), hidden_size=16,
                                         num_hidden_layers=1, num_attention_heads=2,
                                         intermediate_size=32)).eval(), tok, kind="encoder")
    rows = [tok(t)["input_ids"] for t in ["good movie", "bad", "good good movie bad movie"]]
    rows.append(tok("good movie", "bad")["input_ids"])  # [CLS] good movie [SEP] bad [SEP]
    special = set(bb.special_ids)
    e = embedding_features(bb, rows)
    h = hidden_features(bb, rows)
    assert e.shape == h.shape == (4, 16)
    emb = bb.embeddings.detach()
    for i, r in enumerate(rows):
        torch.testing.assert_close(e[i], _hand_mean(emb[r], [t not in special for t in r]))
        with torch.no_grad():
            states = base_model(bb.model)(input_ids=torch.tensor([r])).last_hidden_state[0]
        torch.testing.assert_close(h[i], _hand_mean(states, [True] * len(r)))
    # row 1 is [CLS] bad [SEP]: its feature is the embedding of "bad" itself
    torch.testing.assert_close(e[1], emb[tok.convert_tokens_to_ids("bad")])

    plain = tok.convert_tokens_to_ids(["movie", "bad"])
    prow = build_rows(tok, ["good movie", "bad", "good good movie bad movie"], 16, plain)
    tuned = tune(bb, prow, [1, 0, 1], 2, TuneConfig(method="prompt", num_virtual_tokens=2,
                                                    epochs=1, batch_size=2,
                                                    reconstruction=True, rec_vocab_size=4),
                 plain_ids=plain)
    assert prow[1] == [tok.cls_token_id, *plain, tok.convert_tokens_to_ids("bad"),
                       tok.sep_token_id]
    ht = hidden_features(bb, prow, tuned)
    model = tuned.build(bb)
    for i, r in enumerate(prow):
        ids = torch.tensor([r])
        with torch.no_grad():
            states = model.tuner(ids, torch.ones_like(ids))[0]
        keep = [not 1 <= j < 1 + len(plain) for j in range(len(r))]  # plain tokens after [CLS]
        torch.testing.assert_close(ht[i], _hand_mean(states, keep))
