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


def test_attack_input_checks():
    with pytest.raises(ValueError, match="length"):
        attribute_attack(torch.zeros(3, 2), [0, 1], torch.zeros(2, 2), [0, 1])
    with pytest.raises(ValueError, match="non-empty"):
        attribute_attack(torch.zeros(0, 2), [], torch.zeros(2, 2), [0, 1])


def test_feature_extractors(tmp_path):
    from transformers import BertConfig, BertModel, BertTokenizerFast

    from rapt.models import from_model
    from rapt.trainer import TuneConfig, tune

    (tmp_path / "vocab.txt").write_text(
        "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "bad", "movie"]) + "\n")
    tok = BertTokenizerFast.from_pretrained(str(tmp_path))
    torch.manual_seed(0)
    bb = from_model(BertModel(BertConfig(vocab_size=len(tok), hidden_size=16,
                                         num_hidden_layers=1, num_attention_heads=2,
                                         intermediate_size=32)).eval(), tok, kind="encoder")
    rows = [tok(t)["input_ids"] for t in ["good movie", "bad", "good good movie"]]
    e = embedding_features(bb, rows)
    # row 1 is [CLS] bad [SEP]: the specials are left out of the mean
    torch.testing.assert_close(e[1], bb.embeddings[tok.convert_tokens_to_ids("bad")])
    assert hidden_features(bb, rows).shape == (3, 16)
    tuned = tune(bb, rows, [1, 0, 1], 2, TuneConfig(method="prompt", num_virtual_tokens=2,
                                                    epochs=1, batch_size=2))
    assert hidden_features(bb, rows, tuned).shape == (3, 16)
