"""rapt.pipeline.Customization: privatize → rows → calibrate → tune → predict on a tiny BERT."""

from __future__ import annotations

import pytest
import torch

from rapt.config import TuneConfig
from rapt.pipeline import Customization, Encoding

TEXTS = ["the movie was good and fun", "a boring plot with bad actors", "really great music",
         "the worst film ever", "it was a nice story", "dull and weak scene"] * 4
LABELS = [1, 0, 1, 0, 1, 0] * 4


def _config(**kw) -> TuneConfig:
    return TuneConfig(method="prompt", num_virtual_tokens=2, lr=3e-2, epochs=1, batch_size=8,
                      max_length=32, head="linear", **kw)


def _run(bb, noise_seed: int, encoding: Encoding | None = None, **cfg):
    """Privatize, tune and predict through one Customization -> (it, private rows, probs)."""
    custom = Customization.create(bb, encoding or Encoding(32), _config(**cfg), eta=120.0,
                                  noise_seed=noise_seed, privatizer_mode="exact")
    rows = custom.privatize(custom.rows(TEXTS))
    custom.tune(rows, LABELS, 2)
    queries = custom.for_artifact(custom.artifact)
    probs = queries.predict_proba(queries.privatize(queries.rows(TEXTS[:6], queries=True)))
    return custom, rows, probs


def test_privatize_tune_predict(tiny_bert):
    custom, rows, probs = _run(tiny_bert, noise_seed=0)
    clean = custom.rows(TEXTS)
    assert len(rows) == len(TEXTS) and [len(r) for r in rows] == [len(r) for r in clean]
    assert rows != clean  # privatized: some tokens replaced
    assert custom.artifact is not None and custom.artifact.meta["num_labels"] == 2
    assert custom.artifact.meta["steps"] == 3  # 24 rows / batch 8, 1 epoch
    assert probs.shape == (6, 2)
    assert torch.allclose(probs.sum(-1), torch.ones(6))
    meta = custom.privacy_meta()
    assert meta["eta"] == 120.0 and meta["privatizer_mode"] == "exact" and meta["seeded"]
    assert meta["privacy"] is custom.privacy


def test_privacy_report_counts_text_positions_only(tiny_bert):
    """P and inversion are measured where the private text is: plain tokens k are public, so
    they are left out of the count; the report's P is the share of changed text tokens."""
    tok = tiny_bert.tokenizer
    enc = Encoding.sampled(tok, 32 + 5, 5, 1, len(TEXTS), seed=0)
    custom = Customization.create(tiny_bert, enc, eta=120.0, noise_seed=1,
                                  privatizer_mode="exact")
    clean = custom.rows(TEXTS)
    private = custom.privatize(clean)
    rep = custom.privacy
    special = set(tiny_bert.special_ids.tolist() if hasattr(tiny_bert.special_ids, "tolist")
                  else tiny_bert.special_ids)
    text_clean, text_priv = enc.text_only(tok, clean), enc.text_only(tok, private)
    pairs = [(a, b) for r, s in zip(text_clean, text_priv, strict=True)
             for a, b in zip(r, s, strict=True) if a not in special]
    assert rep["n_tokens"] == len(pairs)  # k's 5 tokens per row left out
    assert rep["n_tokens"] == sum(len(r) for r in clean) - len(TEXTS) * (5 + 2)
    changed = sum(a != b for a, b in pairs) / len(pairs)
    assert rep["replacement_probability"] == pytest.approx(changed)
    assert 0.05 < changed < 0.95
    # the attacker's nearest neighbour of an output token is that token: it recovers exactly
    # the unreplaced ones
    assert rep["inversion_success"] == pytest.approx(1 - changed)
    assert rep["eta"] == 120.0 and rep["target_p"] is None and rep["seeded"]
    assert {"mode", "eta_calibrated_on"} <= set(rep)


def test_target_p_calibrates_eta_and_is_reported(tiny_bert):
    from rapt.privacy.mechanism import calibrate_eta_public

    custom = Customization.create(tiny_bert, Encoding(32), target_p=0.5, noise_seed=0)
    assert custom.eta == pytest.approx(calibrate_eta_public(tiny_bert, 0.5))
    custom.privatize(custom.rows(TEXTS))
    assert custom.privacy["target_p"] == 0.5
    with pytest.raises(ValueError, match="not both"):
        Customization.create(tiny_bert, eta=10.0, target_p=0.5)
    clean = Customization.create(tiny_bert, Encoding(32))
    assert clean.privatizer is None and clean.eta is None
    rows = clean.rows(TEXTS)
    assert clean.privatize(rows) == rows and clean.privacy is None


def test_from_artifact_keeps_the_target_only_at_the_training_eta(tiny_bert):
    custom, _, _ = _run(tiny_bert, noise_seed=0)
    tuned = custom.artifact
    tuned.meta.update(custom.privacy_meta())
    tuned.meta["privacy"] = {**custom.privacy, "target_p": 0.4}
    same = Customization.from_artifact(tiny_bert, tuned, eta=120.0, noise_seed=0)
    other = Customization.from_artifact(tiny_bert, tuned, eta=60.0, noise_seed=0)
    none = Customization.from_artifact(tiny_bert, tuned, eta=None)
    assert (same.target_p, other.target_p) == (0.4, None)
    assert none.privatizer is None and same.privatizer_mode == "exact"
    assert same.encoding == Encoding.of(tuned) and same.artifact is tuned


def test_seeded_runs_repeat(tiny_bert):
    """The same noise seed and config seed give the same privatized rows, prompt and
    predictions; another noise seed gives other rows."""
    a, rows_a, probs_a = _run(tiny_bert, noise_seed=3)
    b, rows_b, probs_b = _run(tiny_bert, noise_seed=3)
    _, rows_c, _ = _run(tiny_bert, noise_seed=4)
    assert rows_a == rows_b and a.privacy == b.privacy
    assert rows_a != rows_c
    for k, v in a.artifact.tensors.items():
        assert torch.equal(v, b.artifact.tensors[k]), k
    assert torch.equal(probs_a, probs_b)


def test_several_plain_sequences_queries_use_the_first(tiny_bert):
    tok = tiny_bert.tokenizer
    enc = Encoding.sampled(tok, 40, 4, 3, len(TEXTS), seed=0)
    assert enc.plain_len == 4 and len(enc.plain) == 3 and len(enc.plain_index) == len(TEXTS)
    train, queries = enc.rows(tok, TEXTS), enc.rows(tok, TEXTS, queries=True)
    assert [r[1:5] for r in train] == [list(enc.plain[i]) for i in enc.plain_index]
    assert all(r[1:5] == list(enc.plain[0]) for r in queries)
    assert enc.text_only(tok, train) == Encoding(40 - 4).rows(tok, TEXTS)
