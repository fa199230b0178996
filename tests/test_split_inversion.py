"""Attacks on split releases: the nearest-neighbour inversion through the embedding layer and
the optimisation inversion (Song & Raghunathan) through deeper bottoms, on tiny models."""

from __future__ import annotations

import pytest
import torch

from rapt.attacks.split_inversion import (
    candidate_hits,
    invert_by_optimization,
    invert_embedding_layer,
    score_inversion,
)
from rapt.split import SplitConfig, encode_texts, setup_split, split_backbone
from rapt.split.customer import _pad

TEXTS = ["the movie was good and fun", "bad plot and awful actors", "great story",
         "boring and dull film", "a brilliant and funny scene", "the worst movie ever"]


def _release(bb, n, eta=None):
    rows = encode_texts(bb.tokenizer, TEXTS, 16)
    customer, _ = setup_split(bb, SplitConfig(split_layer=n, eta=eta, noise_seed=0), 2, 1)
    acts = customer.encode(rows)
    orig, _ = _pad(rows, bb.tokenizer.pad_token_id)
    return acts, orig, customer


@pytest.mark.parametrize("kind", ["encoder", "causal"])
def test_nearest_neighbour_through_embedding_layer(tiny_bert, tiny_llama, kind):
    bb = tiny_bert if kind == "encoder" else tiny_llama
    acts, orig, _ = _release(bb, 0)
    bottom = split_backbone(bb, 0)[0]
    rec = invert_embedding_layer(bottom, acts.hidden, acts.mask)
    assert score_inversion(rec, orig, acts.mask, bb.special_ids).success_rate == 1.0
    # privatized release: the attack recovers exactly the tokens the mechanism kept
    acts, orig, customer = _release(bb, 0, eta=100.0)
    rec = invert_embedding_layer(bottom, acts.hidden, acts.mask)
    r = score_inversion(rec, orig, acts.mask, bb.special_ids)
    assert r.empirical_privacy == pytest.approx(customer.measured_p, abs=1e-9)
    assert 0.1 < r.empirical_privacy < 0.9
    with pytest.raises(ValueError, match="without blocks"):
        invert_embedding_layer(split_backbone(bb, 1)[0], acts.hidden, acts.mask)


def test_optimization_inversion_recovers_clean_tokens(tiny_bert):
    acts, orig, _ = _release(tiny_bert, 1)
    bottom = split_backbone(tiny_bert, 1)[0]
    special = torch.tensor(tiny_bert.special_ids)
    known = torch.where(torch.isin(orig, special), orig, torch.full_like(orig, -1))
    rec, cands = invert_by_optimization(bottom, acts.hidden, acts.mask, known=known, k=8,
                                        steps=60, lr=0.2)
    r = score_inversion(rec, orig, acts.mask, tiny_bert.special_ids,
                        candidate_hits(orig, cands))
    assert r.success_rate > 0.8 and r.candidate_recall >= r.success_rate
    assert (rec[~acts.mask.bool()] == -1).all()
    # the same attack on random vectors of the right shape recovers (almost) nothing
    noise = torch.randn_like(acts.hidden)
    rec2, _ = invert_by_optimization(bottom, noise, acts.mask, known=known, k=8, steps=20)
    assert score_inversion(rec2, orig, acts.mask, tiny_bert.special_ids).success_rate < 0.3
    # full vocabulary (k=None) runs too and reports no candidate set
    rec3, c3 = invert_by_optimization(bottom, acts.hidden, acts.mask, known=known, k=None,
                                      steps=40, lr=0.2)
    assert c3 is None
    assert score_inversion(rec3, orig, acts.mask, tiny_bert.special_ids).success_rate > 0.5
