"""Real rows for the attackers' integration tests: MiniLM and public text disjoint from SST-2."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch


@dataclass
class MiniLMRows:
    backbone: object
    attacked: list[list[int]]  # the first 60 public rows, cut to 32 tokens
    public: list[list[int]]  # the other rows: the attacker's public text
    embeddings: torch.Tensor  # (V, d)
    candidates: torch.Tensor  # the tokenizer's real tokens
    flat: torch.Tensor  # the attacked rows' ids, concatenated


def minilm_rows(shared_data, monkeypatch) -> MiniLMRows:
    """Skips when the MiniLM package is not installed."""
    from rapt.channel.corpus import public_corpus_for
    from rapt.models import BackboneNotFoundError, load_backbone
    from rapt.privacy.mechanism import candidate_ids_from_tokenizer

    monkeypatch.setenv("RAPT_DATA_DIR", str(shared_data))
    try:
        bb = load_backbone("minilm")
    except BackboneNotFoundError as e:
        pytest.skip(str(e))
    rows = [list(r) for r in public_corpus_for("sst2", max_rows_per_source=60).tokenize(
        bb.tokenizer).rows if r]
    attacked = [r[:32] for r in rows[:60]]
    emb = bb.embeddings.detach()
    return MiniLMRows(bb, attacked, rows[60:], emb,
                      candidate_ids_from_tokenizer(bb.tokenizer, emb.shape[0]),
                      torch.tensor([i for r in attacked for i in r]))
