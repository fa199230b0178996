"""Shared fixtures: tiny random backbones built in code, and the shared data folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from _tiny import WORDS, make_bert, make_llama, make_tokenizer

# Tests share 2 cores with whatever else runs; more threads only add contention.
torch.set_num_threads(max(1, min(2, int(os.environ.get("OMP_NUM_THREADS", "2")))))

@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory):
    """A BERT WordPiece tokenizer over ~50 words (vocabulary small enough for exact stats)."""
    return make_tokenizer(tmp_path_factory.mktemp("tok"), WORDS)


@pytest.fixture()
def tiny_bert(tiny_tokenizer):
    """rapt Backbone around a random 2-layer, 32-dim BERT."""
    return make_bert(tiny_tokenizer, max_positions=256)


@pytest.fixture()
def tiny_llama(tiny_tokenizer):
    """rapt Backbone around a random 2-layer, 32-dim Llama causal LM."""
    return make_llama(tiny_tokenizer, max_positions=256)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data (or $RAPT_DATA_DIR); tests that need it skip when it is absent."""
    env = os.environ.get("RAPT_DATA_DIR")
    p = Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "data"
    if not p.exists():
        pytest.skip(f"shared data folder {p} not found")
    return p
