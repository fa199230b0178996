"""Shared fixtures: tiny random backbones built in code, and the shared data folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

# Tests share 2 cores with whatever else runs; more threads only add contention.
torch.set_num_threads(max(1, min(2, int(os.environ.get("OMP_NUM_THREADS", "2")))))

WORDS = (
    "the a movie film good bad great awful boring fun plot actor actors story love hate "
    "is was not very really it this that and but of to in with funny sad dull brilliant "
    "terrible best worst ever one two time scene music long short fine nice poor weak"
).split()
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory):
    """A BERT WordPiece tokenizer over ~50 words (vocabulary small enough for exact stats)."""
    from transformers import BertTokenizerFast

    d = tmp_path_factory.mktemp("tok")
    vocab = d / "vocab.txt"
    vocab.write_text("\n".join(SPECIALS + WORDS) + "\n")
    # transformers 5 ignores `vocab_file=` in the constructor (every word becomes [UNK]);
    # loading the folder reads the vocabulary.
    tok = BertTokenizerFast.from_pretrained(str(d), do_lower_case=True)
    assert len(tok) == len(SPECIALS) + len(WORDS), "tiny vocabulary was not loaded"
    return tok


def _tiny_bert(tokenizer, seed: int = 0):
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                     num_attention_heads=4, intermediate_size=64, max_position_embeddings=256)
    return BertModel(cfg).eval()


def _tiny_llama(tokenizer, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                      max_position_embeddings=256, pad_token_id=tokenizer.pad_token_id,
                      bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id)
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture()
def tiny_bert(tiny_tokenizer):
    """rapt Backbone around a random 2-layer, 32-dim BERT."""
    from rapt.models import from_model

    return from_model(_tiny_bert(tiny_tokenizer), tiny_tokenizer, name="tiny-bert", kind="encoder")


@pytest.fixture()
def tiny_llama(tiny_tokenizer):
    """rapt Backbone around a random 2-layer, 32-dim Llama causal LM."""
    from rapt.models import from_model

    return from_model(_tiny_llama(tiny_tokenizer), tiny_tokenizer, name="tiny-llama",
                      kind="causal")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data (or $RAPT_DATA_DIR); tests that need it skip when it is absent."""
    env = os.environ.get("RAPT_DATA_DIR")
    p = Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "data"
    if not p.exists():
        pytest.skip(f"shared data folder {p} not found")
    return p
