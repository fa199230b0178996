"""The user's side after a remote tune (rapt.pipeline.user_side_after_tune): held-out rows
privatized as queries and scored by the prompt, then the local model and the fusion weights."""

from __future__ import annotations

import numpy as np
import pytest

from rapt.config import TuneConfig
from rapt.local import holdout_split
from rapt.pipeline import Customization, Encoding, remote_proba, user_side_after_tune

POS = ["the movie was good and fun", "really great music", "it was a nice story",
       "a brilliant film with the best actors", "great fun and a good plot"]
NEG = ["a boring plot with bad actors", "the worst film ever", "dull and weak scene",
       "a terrible and sad movie", "awful music and a poor story"]
TEXTS = (POS + NEG) * 10
LABELS = [1] * 5 + [0] * 5
LABELS = LABELS * 10


def _tuned(bb, train_idx) -> Customization:
    cfg = TuneConfig(method="prompt", num_virtual_tokens=2, lr=3e-2, epochs=1, batch_size=16,
                     max_length=32, head="linear")
    custom = Customization.create(bb, Encoding(32), cfg, eta=120.0, noise_seed=0,
                                  privatizer_mode="exact")
    rows = custom.privatize(custom.rows([TEXTS[i] for i in train_idx]))
    custom.tune(rows, [LABELS[i] for i in train_idx], 2)
    return custom


def test_held_out_rows_are_privatized_as_queries_and_scored(tiny_bert, monkeypatch):
    train, held = holdout_split(LABELS, seed=0)
    assert len(held) == 20 and len(np.intersect1d(train, held)) == 0
    custom = _tuned(tiny_bert, train)
    report = custom.privacy
    seen = []
    real = Customization.privatize

    def spy(self, rows, *, measure=True, progress=None, **kw):
        seen.append((rows, measure, self.encoding.max_length))
        return real(self, rows, measure=measure, progress=progress, **kw)

    monkeypatch.setattr(Customization, "privatize", spy)
    local, fusion, comp = user_side_after_tune(custom, TEXTS, LABELS, 2, held, seed=0)
    # one privatization, of exactly the held-out texts in the query layout, not measured
    assert len(seen) == 1
    rows, measure, _ = seen[0]
    assert rows == custom.for_artifact(custom.artifact).rows([TEXTS[i] for i in held],
                                                             queries=True)
    assert measure is False
    assert custom.privacy is report  # the training release's report is left as it was
    assert local.n_rows == len(TEXTS)
    assert fusion is not None and fusion.n_rows == len(held)
    assert comp.n_rows == len(held) and comp.basis == "held-out"
    assert comp.remote == pytest.approx(fusion.accuracy["remote"])
    assert 0.0 <= comp.remote <= 1.0 and comp.local >= 0.9  # the words separate the classes


def test_no_held_out_rows_privatize_nothing(tiny_bert, monkeypatch):
    custom = _tuned(tiny_bert, range(len(TEXTS)))
    monkeypatch.setattr(Customization, "privatize",
                        lambda *a, **k: pytest.fail("nothing to privatize without a slice"))
    local, fusion, comp = user_side_after_tune(custom, TEXTS, LABELS, 2, np.arange(0))
    assert fusion is None and comp.remote is None and comp.basis.endswith("cross-validation")
    assert local.cv_accuracy is not None


def test_remote_proba_needs_a_prompt_and_is_float64(tiny_bert):
    bare = Customization.create(tiny_bert, Encoding(32), eta=120.0, noise_seed=0)
    with pytest.raises(ValueError, match="tune or load a prompt"):
        remote_proba(bare, TEXTS[:2])
    custom = _tuned(tiny_bert, range(20))
    p = remote_proba(custom, TEXTS[:3])
    assert p.dtype == np.float64 and p.shape == (3, 2)
    np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-5)
