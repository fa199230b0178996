"""HFLabelScorer: KV-cache path == naive path, label-word validation, cache not mutated."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _tiny import make_word_llama

from rapt.llm import HFLabelScorer, LabelScorer, LabelWordError, label_token_ids, normalize


@pytest.fixture()
def word_llama():
    return make_word_llama()


PREFIXES = [
    "the movie was good it was good the plot was bad it was bad ",
    "a film with a fun story it was good ",
]
SUFFIXES = [
    "the actor was awful it was",
    "fun it was",
    "this is not a very good movie and the music was poor it was",
    "it was",
    "the best film ever it was",
]


def test_cached_matches_naive(word_llama):
    fast = HFLabelScorer(word_llama, ["bad", "good"], batch_size=2)  # batches with padding
    naive = HFLabelScorer(word_llama, ["bad", "good"], naive=True)
    assert isinstance(fast, LabelScorer)
    for prefix in PREFIXES:
        a = fast.label_probs(prefix, SUFFIXES)
        b = naive.label_probs(prefix, SUFFIXES)
        assert a.shape == (len(SUFFIXES), 2)
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
        np.testing.assert_array_equal(fast.top_labels(prefix, SUFFIXES),
                                      naive.top_labels(prefix, SUFFIXES))
    assert fast.n_prefix_encodings == 2  # once per prefix, reused across calls
    assert naive.n_prefix_encodings == 4 * len(SUFFIXES)


def test_probabilities_match_full_softmax(word_llama):
    """Independent check: direct forward of the concatenated ids, softmax over the vocabulary."""
    sc = HFLabelScorer(word_llama, ["bad", "good"], batch_size=4)
    p = sc.label_probs(PREFIXES[0], SUFFIXES[:3])
    tok = word_llama.tokenizer
    for i, s in enumerate(SUFFIXES[:3]):
        ids = tok(PREFIXES[0], add_special_tokens=False)["input_ids"] + \
            tok(s, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = word_llama.model(torch.tensor([ids])).logits[0, -1]
        full = torch.softmax(logits, -1)[sc.label_ids].numpy()
        np.testing.assert_allclose(p[i], full, rtol=1e-4, atol=1e-7)
    assert np.all(p.sum(axis=1) <= 1 + 1e-6)


def test_cache_not_mutated_by_batches(word_llama):
    sc = HFLabelScorer(word_llama, ["bad", "good"], batch_size=3)
    first = sc.label_probs(PREFIXES[0], SUFFIXES)
    k0 = [k.clone() for k, _ in sc._cached_kv]
    again = sc.label_probs(PREFIXES[0], list(reversed(SUFFIXES)))
    np.testing.assert_allclose(first, again[::-1], rtol=1e-5, atol=1e-7)
    for k, (k1, _) in zip(k0, sc._cached_kv, strict=True):
        assert k1.shape == k.shape and torch.equal(k1, k)


def test_label_words_must_differ(word_llama):
    with pytest.raises(LabelWordError, match="share the first token"):
        HFLabelScorer(word_llama, ["good", "good fun"])
    with pytest.raises(LabelWordError, match="at least 2"):
        label_token_ids(word_llama.tokenizer, ["good"])
    with pytest.raises(LabelWordError, match="unknown token"):
        label_token_ids(word_llama.tokenizer, ["zzzqqq", "good"])


def test_rejects_encoder(tiny_bert):
    with pytest.raises(ValueError, match="causal"):
        HFLabelScorer(tiny_bert, ["bad", "good"])


def test_empty_prefix_and_empty_query(word_llama):
    sc = HFLabelScorer(word_llama, ["bad", "good"])
    assert sc.label_probs("", ["it was"]).shape == (1, 2)  # zero-shot without instruction
    with pytest.raises(ValueError, match="empty query"):
        sc.label_probs("it was", [""])


def test_normalize_rows():
    p = normalize(np.array([[0.1, 0.3], [0.2, 0.2]]))
    np.testing.assert_allclose(p, [[0.25, 0.75], [0.5, 0.5]])


@pytest.mark.integration
def test_smollm2_cached_matches_naive():
    from rapt.models import load_backbone

    bb = load_backbone("smollm2-135m")
    fast = HFLabelScorer(bb, [" negative", " positive"], batch_size=4)
    naive = HFLabelScorer(bb, [" negative", " positive"], naive=True)
    prefix = "Review: a gorgeous, witty film\nSentiment: positive\n\n"
    qs = ["Review: dull and long\nSentiment:", "Review: great fun\nSentiment:",
          "Review: the plot never comes together , and the actors seem bored\nSentiment:"]
    np.testing.assert_allclose(fast.label_probs(prefix, qs), naive.label_probs(prefix, qs),
                               rtol=1e-3, atol=1e-6)
