"""HFLabelScorer: KV-cache path == naive path, joint tokenization of prefix + query across
merging boundaries (byte-level BPE), the start token, label-word validation, cache not mutated."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _tiny import make_llama, make_word_llama

from rapt.pate.scorer import HFLabelScorer, LabelScorer, LabelWordError, label_token_ids, normalize


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
    """Independent check: direct forward of the concatenated ids, softmax over the vocabulary.
    A BERT tokenizer prepends [CLS] with add_special_tokens=True, so the prompt starts with it."""
    sc = HFLabelScorer(word_llama, ["bad", "good"], batch_size=4)
    p = sc.label_probs(PREFIXES[0], SUFFIXES[:3])
    tok = word_llama.tokenizer
    for i, s in enumerate(SUFFIXES[:3]):
        ids = [tok.cls_token_id] + tok(PREFIXES[0] + s, add_special_tokens=False)["input_ids"]
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


# -- joint tokenization across merging boundaries (byte-level BPE, as SmolLM2) ----------------

BPE_CORPUS = [
    "Review: a gorgeous, witty film\nSentiment: positive\n\n",
    "Review: dull and long\nSentiment: negative\n\n",
    "Review: great fun\nSentiment: positive\n\nReview: the plot never comes together\n",
    "it was good  it was bad \n\n\n the end",
]
# (prefix, queries): each prefix ends where the byte-level pre-tokenizer joins or splits tokens
# differently once the query follows ("\n\n" is ĊĊ alone but Ċ Ċ before a letter; a trailing
# space is Ġ alone but merges into the next word; a word cut in two merges back).
BOUNDARY_CASES = [
    ("Review: a gorgeous, witty film\nSentiment: positive\n\n",
     ["Review: dull and long\nSentiment:", "Review: great fun\nSentiment:",
      "Review: the plot never comes together , and the actors seem bored\nSentiment:"]),
    ("it was good it was ", ["bad", "good and fun", " dull"]),
    ("it was good  ", [" it was", "it was", "\n\nit was"]),
    ("Review: gorge", ["ous film\nSentiment:", "d\nSentiment:"]),
    ("Review: great fun\nSentiment: positive\n", ["\nReview: dull\nSentiment:"]),  # no merge
]
BPE_LABELS = [" negative", " positive"]


def make_bpe_llama(start_token: bool = False, seed: int = 0):
    """Tiny random Llama over a byte-level BPE tokenizer trained here on a few strings (the
    WordPiece test tokenizer splits on whitespace, so it cannot merge tokens across a newline or
    a space). ``bos_token`` is set to a chat marker the tokenizer never prepends, as SmolLM2's
    ``<|im_start|>``; with ``start_token`` a post-processor prepends ``<s>``, as Llama-2's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<pad>", "<|im_start|>", "<s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(BPE_CORPUS * 5, trainer)
    if start_token:
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>",
                                   bos_token="<|im_start|>")
    return make_llama(fast, seed=seed, name="bpe-llama", max_positions=256)


@pytest.fixture(scope="module")
def bpe_llama():
    return make_bpe_llama()


def _joint_forward(bb, ids: list[int]) -> torch.Tensor:
    """Reference: the plain model on the whole token sequence, next-token logits (V,)."""
    with torch.no_grad():
        return bb.model(torch.tensor([ids])).logits[0, -1].float()


def test_bpe_boundaries_really_merge(bpe_llama):
    """Guard for the tests below: in most cases separate tokenization differs from the joint."""
    tok = bpe_llama.tokenizer
    differ, total = 0, sum(len(q) for _, q in BOUNDARY_CASES)
    for prefix, queries in BOUNDARY_CASES:
        for q in queries:
            apart = tok(prefix, add_special_tokens=False)["input_ids"] + \
                tok(q, add_special_tokens=False)["input_ids"]
            differ += apart != tok(prefix + q, add_special_tokens=False)["input_ids"]
    assert differ >= total / 2, (differ, total)
    nl = tok.convert_ids_to_tokens(tok(BOUNDARY_CASES[0][0] + "Review:")["input_ids"])
    assert nl[-5:] == ["Ġpositive", "Ċ", "Ċ", "Review", ":"]  # the SmolLM2 case of issue 15


@pytest.mark.parametrize("mode", ["cached", "batched", "naive"])
def test_scoring_equals_joint_string_across_merging_boundaries(bpe_llama, mode):
    """Every mode scores exactly the joint string: label probabilities and the logits over the
    whole vocabulary equal the plain model on tokenize(prefix + query), to ~1e-5.

    Mutations caught: tokenizing prefix and query apart (the code before issue 15: label
    probabilities off by far more than 1e-5); using the cached prefix beyond the longest common
    token prefix (the stale ĊĊ / Ġ token stays in the cache); prepending ``bos_token``
    (<|im_start|>, which this tokenizer never prepends)."""
    tok = bpe_llama.tokenizer
    sc = HFLabelScorer(bpe_llama, BPE_LABELS, batch_size=2, mode=mode)  # batches with padding
    label_ids = sc.label_ids
    for prefix, queries in BOUNDARY_CASES:
        ref = torch.stack([_joint_forward(bpe_llama, tok(prefix + q)["input_ids"])
                           for q in queries])
        p = sc.label_probs(prefix, queries)
        np.testing.assert_allclose(p, torch.softmax(ref, -1)[:, label_ids].numpy(),
                                   rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(sc.next_token_logits(prefix, queries), ref,
                                   rtol=0, atol=1e-5)


def test_cache_is_reused_up_to_the_common_token_prefix(bpe_llama):
    """The prefix's last token does not survive the join ("\n\n" + a letter), yet the cache is
    built once and serves every query (re-split at the longest common token prefix).
    Mutation caught: falling back to running the whole prompt whenever the cached prefix ids are
    not an exact prefix of the joint ids (n_prefix_encodings would grow by one per query)."""
    prefix, queries = BOUNDARY_CASES[0]
    sc = HFLabelScorer(bpe_llama, BPE_LABELS, batch_size=2)
    p_ids = sc.encode_prefix(prefix)
    joint = [sc.encode(prefix, q) for q in queries]
    assert all(ids[:len(p_ids)] != p_ids for ids in joint)  # the last prefix token is split
    assert all(ids[:len(p_ids) - 1] == p_ids[:-1] for ids in joint)
    sc.label_probs(prefix, queries)
    sc.label_probs(prefix, queries[:1])
    assert sc.n_prefix_encodings == 1
    batched = HFLabelScorer(bpe_llama, BPE_LABELS, mode="batched")
    batched.label_probs(prefix, queries)
    assert batched.n_prefix_encodings == len(queries)  # the no-cache baseline re-encodes


def test_start_ids_are_what_the_tokenizer_prepends(bpe_llama, word_llama):
    """The prompt starts with what ``tokenizer(text, add_special_tokens=True)`` puts first, not
    with ``bos_token``: nothing for a SmolLM2-like tokenizer whose bos_token is the chat marker
    <|im_start|>, <s> for a Llama-2-like one, [CLS] for BERT's.
    Mutation caught: prepending ``tokenizer.bos_token_id`` (the code before issue 15)."""
    tok = bpe_llama.tokenizer
    assert tok.bos_token == "<|im_start|>"
    sc = HFLabelScorer(bpe_llama, BPE_LABELS)
    assert sc.start_ids == []
    prefix, queries = BOUNDARY_CASES[1]
    assert sc.encode(prefix, queries[0]) == tok(prefix + queries[0])["input_ids"]

    llama2_like = make_bpe_llama(start_token=True)
    s_id = llama2_like.tokenizer.convert_tokens_to_ids("<s>")
    sc2 = HFLabelScorer(llama2_like, BPE_LABELS, batch_size=2)
    assert sc2.start_ids == [s_id]
    ids = [s_id] + llama2_like.tokenizer(prefix + queries[0],
                                         add_special_tokens=False)["input_ids"]
    assert sc2.encode(prefix, queries[0]) == ids
    torch.testing.assert_close(sc2.next_token_logits(prefix, queries[:1])[0],
                               _joint_forward(llama2_like, ids), rtol=0, atol=1e-5)
    # An empty prefix still gets the start token (and needs no cache).
    torch.testing.assert_close(sc2.next_token_logits("", ["it was"])[0],
                               _joint_forward(llama2_like, sc2.encode("", "it was")),
                               rtol=0, atol=1e-5)

    bert_tok = word_llama.tokenizer
    assert HFLabelScorer(word_llama, ["bad", "good"]).start_ids == [bert_tok.cls_token_id]


def test_mode_validation(bpe_llama):
    assert HFLabelScorer(bpe_llama, BPE_LABELS, naive=True).mode == "naive"
    assert HFLabelScorer(bpe_llama, BPE_LABELS).mode == "cached"
    with pytest.raises(ValueError, match="mode must be one of"):
        HFLabelScorer(bpe_llama, BPE_LABELS, mode="fast")
    with pytest.raises(ValueError, match="contradicts"):
        HFLabelScorer(bpe_llama, BPE_LABELS, naive=True, mode="cached")


@pytest.mark.integration
def test_smollm2_cached_matches_naive(smollm2):
    """SmolLM2: the issue-15 boundary ("…positive\n\n" + "Review:") is scored as the joint
    tokenization (Ċ Ċ Review, not ĊĊ Review), without <|im_start|> in front, and the cached,
    batched and naive paths give the same label probabilities."""
    bb = smollm2
    tok = bb.tokenizer
    fast = HFLabelScorer(bb, [" negative", " positive"], batch_size=4)
    batched = HFLabelScorer(bb, [" negative", " positive"], batch_size=4, mode="batched")
    naive = HFLabelScorer(bb, [" negative", " positive"], naive=True)
    prefix = "Review: a gorgeous, witty film\nSentiment: positive\n\n"
    qs = ["Review: dull and long\nSentiment:", "Review: great fun\nSentiment:",
          "Review: the plot never comes together , and the actors seem bored\nSentiment:"]
    assert fast.start_ids == []  # SmolLM2's tokenizer prepends nothing; <|im_start|> is chat
    for q in qs:
        ids = fast.encode(prefix, q)
        assert ids == tok(prefix + q, add_special_tokens=False)["input_ids"]
        assert tok.bos_token_id not in ids
    boundary = tok.convert_ids_to_tokens(fast.encode(prefix, qs[0]))[10:14]
    assert boundary == [":", "Ġpositive", "Ċ", "Ċ"], boundary
    p = fast.label_probs(prefix, qs)
    np.testing.assert_allclose(p, naive.label_probs(prefix, qs), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(p, batched.label_probs(prefix, qs), rtol=1e-4, atol=1e-6)
    assert fast.n_prefix_encodings == 1


def test_cached_scoring_raises_no_future_warning(word_llama):
    """Issue 32 item 6: the cached path passes its KV cache under the keyword the body takes
    (no ``past_key_values is deprecated`` FutureWarning)."""
    import warnings

    sc = HFLabelScorer(word_llama, ["bad", "good"], batch_size=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        sc.label_probs(PREFIXES[0], SUFFIXES[:2])
