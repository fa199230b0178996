"""Channel data (rapt.channel.corpus): public corpora disjoint from the task, privatized pairs."""

from __future__ import annotations

import pytest
import torch

from rapt.channel.corpus import (
    PUBLIC_SOURCES,
    ChannelCorpus,
    eta_band,
    privatize_channel,
    public_corpus_for,
    task_family,
)
from rapt.privacy.mechanism import Privatizer


def test_public_sources_exclude_the_task():
    assert {n for n, _ in PUBLIC_SOURCES["sst2"]} == {"trec", "financial_phrasebank", "cb",
                                                      "trustpilot"}
    assert {n for n, _ in PUBLIC_SOURCES["financial_phrasebank"]} == {"sst2-sentences", "trec",
                                                                      "cb", "trustpilot"}
    assert task_family("FP") == "financial_phrasebank"
    with pytest.raises(ValueError, match="unknown evaluation task"):
        task_family("imdb")


def test_public_corpus_refuses_the_task_text():
    with pytest.raises(ValueError, match="evaluation task's own text"):
        public_corpus_for("sst2", sources=[("trec", "train"), ("sst2-sentences", "dev")])
    with pytest.raises(ValueError, match="evaluation task's own text"):
        public_corpus_for("fp", sources=[("financial_phrasebank", "train")])


def test_public_corpus_for_sst2_reads_the_other_sets(shared_data, tiny_tokenizer):
    corpus = public_corpus_for("sst2", max_rows_per_source=5).tokenize(tiny_tokenizer)
    names = {s["name"] for s in corpus.sources}
    assert names == {"trec", "financial_phrasebank", "cb", "trustpilot"}
    assert all(s["rows"] == 5 for s in corpus.sources)
    # CB contributes premise and hypothesis
    cb = [s for s in corpus.sources if s["name"] == "cb"]
    assert all(s["texts"] == 10 for s in cb)
    meta = corpus.provenance()
    assert meta["disjoint_from"] == "sst2"
    assert meta["n_texts"] == len(corpus.texts) == sum(s["texts"] for s in corpus.sources)
    assert meta["n_tokens"] == sum(len(r) for r in corpus.rows) > 0


def _privatizer(seed: int = 0) -> Privatizer:
    emb = torch.randn(12, 4, generator=torch.Generator().manual_seed(0))
    return Privatizer(emb, 5.0, special_ids=[0], seed=seed)


def test_privatize_channel_aligns_pairs_over_a_band():
    rows = [[0, 3, 4, 5, 0], [0, 7, 0], [1, 2, 8, 9, 10, 11]] * 40
    pairs = privatize_channel(rows, _privatizer(), [2.0, 50.0], repeats=3)
    n = len(rows)
    assert len(pairs.clean) == len(pairs.private) == len(pairs.eta) == 6 * n
    assert pairs.meta["n_rows"] == 6 * n and pairs.meta["etas"] == [2.0, 50.0]
    for c, p, src in zip(pairs.clean, pairs.private, pairs.source_row, strict=True):
        assert c == rows[src] and len(p) == len(c)
        assert all(b == 0 for a, b in zip(c, p, strict=True) if a == 0)  # specials pass

    def p_at(eta: float) -> float:
        idx = [i for i, e in enumerate(pairs.eta) if e == eta]
        changed = sum(a != b for i in idx for a, b in zip(pairs.clean[i], pairs.private[i],
                                                           strict=True) if a != 0)
        return changed / sum(sum(a != 0 for a in pairs.clean[i]) for i in idx)

    assert p_at(2.0) > p_at(50.0) + 0.2  # less η, more replacements
    # repeats are fresh draws, not copies
    assert pairs.private[:n] != pairs.private[n:2 * n]
    clean, priv, lengths = pairs.padded(pad_id=0)
    assert clean.shape == priv.shape == (6 * n, 6) and lengths[:3].tolist() == [5, 3, 6]


def test_privatize_channel_is_seeded_and_defaults_to_the_privatizer_eta():
    rows = [[1, 2, 3], [4, 5]]
    a = privatize_channel(rows, _privatizer(3), repeats=2)
    b = privatize_channel(rows, _privatizer(3), repeats=2)
    assert a.private == b.private and a.eta == [5.0] * 4
    assert a.meta["seeded"] is True
    with pytest.raises(ValueError):
        privatize_channel(rows, _privatizer(), [0.0])


def test_eta_band_is_geometric():
    band = eta_band(10.0, 1000.0, 3)
    assert band == pytest.approx([10.0, 100.0, 1000.0])
    corpus = ChannelCorpus(("a b",), ({"name": "x", "split": "y", "rows": 1},), "sst2")
    assert corpus.provenance()["n_tokens"] is None


def test_check_disjoint_refuses_a_corpus_that_holds_the_task():
    """A denoiser trained on SST-2's public corpus (which holds FP) is fine for SST-2 and
    refused for FP, naming the splits; a hand-edited provenance that lies is caught too."""
    from rapt.channel.corpus import check_disjoint

    prov = {"disjoint_from": "sst2", "sources": [{"name": "financial_phrasebank",
                                                  "split": "train"}, {"name": "trec",
                                                                      "split": "train"}]}
    check_disjoint(prov, "sst-2")
    with pytest.raises(ValueError, match="financial_phrasebank/train"):
        check_disjoint(prov, "fp")
    with pytest.raises(ValueError, match="sst2-sentences/dev"):
        check_disjoint({"disjoint_from": "sst2",
                        "sources": [{"name": "sst2-sentences", "split": "dev"}]}, "sst2")
    with pytest.raises(ValueError, match="not from 'sst2'"):
        check_disjoint({}, "sst2")
