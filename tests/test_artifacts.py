"""Tuned-prompt artifacts: a causal prompt with plain tokens and a verbalizer survives
save -> load with its plain tokens, label words and predictions unchanged."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from _tiny import make_llama

from rapt.tuning.reconstruction import build_rows, plain_offset, sample_plain_tokens
from rapt.tuning.tune import TuneConfig, TunedPrompt, tune

TEXTS = ["the movie was good", "a bad film", "great story and fun music", "boring plot",
         "the actor was very good", "awful and dull", "really fun film", "the worst scene"]
LABELS = [1, 0, 1, 0, 1, 0, 1, 0]


@pytest.mark.parametrize("method", ["prompt", "prefix"])
def test_round_trip_plain_tokens_and_verbalizer(tiny_tokenizer, tmp_path, method):
    """Save, then load onto a freshly built copy of the backbone (no cached model): plain ids,
    label words, row layout and class probabilities are identical (atol 0).
    Negative control: the same tensors with the label words swapped predict the swapped
    columns, so the comparison would see a lost or reordered verbalizer.

    Mutations tried (each made this test fail): ``save_artifact`` writing ``meta`` without
    ``plain_ids`` or the config with ``label_words = None``; ``load_artifact`` dropping
    ``plain_ids`` from meta or returning the label words reversed.
    """
    tok = tiny_tokenizer
    bb = make_llama(tok, max_positions=128)
    plain = sample_plain_tokens(tok, 3, seed=1)
    rows = build_rows(tok, TEXTS, 24, plain)
    words = ["bad", "good"]
    cfg = TuneConfig(method=method, num_virtual_tokens=2, lr=3e-2, epochs=2, batch_size=4,
                     max_length=24, reconstruction=True, rec_hidden=8, rec_vocab_size=12,
                     label_words=words)
    tuned = tune(bb, rows, LABELS, 2, cfg, plain_ids=plain)
    tuned.meta.update({"eta": 42.0, "label_names": ["neg", "pos"]})
    before = tuned.predict_proba(bb, tuned.encode(bb, TEXTS))

    tuned.save(tmp_path / "art")
    doc = json.loads((tmp_path / "art" / "config.json").read_text())
    assert doc["config"]["label_words"] == words and doc["meta"]["plain_ids"] == plain
    assert not any(k.startswith("rec_head") for k in tuned.tensors)  # discarded, not saved

    loaded = TunedPrompt.load(tmp_path / "art")
    assert loaded.plain_ids == plain and loaded.config.label_words == words
    assert loaded.config == tuned.config
    assert loaded.meta["eta"] == 42.0 and loaded.meta["label_names"] == ["neg", "pos"]
    assert set(loaded.tensors) == set(tuned.tensors)
    for k, v in tuned.tensors.items():
        assert torch.equal(loaded.tensors[k], v), k

    fresh = make_llama(tok, max_positions=128)  # same weights, a different model object
    enc = loaded.encode(fresh, TEXTS)
    off = plain_offset(tok)
    assert enc == rows and all(r[off:off + 3] == plain for r in enc)
    after = loaded.predict_proba(fresh, enc)
    torch.testing.assert_close(after, before, rtol=0, atol=0)
    assert loaded.predict(fresh, enc) == before.argmax(-1).tolist()

    swapped = TunedPrompt(replace(loaded.config, label_words=words[::-1]), loaded.tensors,
                          loaded.meta)
    flipped = swapped.predict_proba(fresh, enc)
    torch.testing.assert_close(flipped, before.flip(-1))
    assert not torch.allclose(flipped, before)  # the control can tell the two apart
