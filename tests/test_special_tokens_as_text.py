"""A literal special-token string in user text ("[CLS]", "[MASK]") is ordinary text: special
tokens pass the dχ mechanism unprivatized, so text that could spell them would choose tokens
that are released unchanged. Every backbone's tokenizer reads them as text
(rapt.models.text_as_text), so every command, the client and the service do."""

from __future__ import annotations

import warnings

import pytest
from _tiny import WORDS, make_bert, make_tokenizer

from rapt.tuning.reconstruction import encode_texts

TEXT = "[MASK] [CLS] good film [SEP] [PAD]"


def _framing_only(tok, row: list[int]) -> None:
    """The row's special ids are the tokenizer's own frame ([CLS] first, [SEP] last) only."""
    special = set(tok.all_special_ids)
    assert row[0] == tok.cls_token_id and row[-1] == tok.sep_token_id, row
    inner = [t for t in row[1:-1] if t in special]
    assert not inner, tok.convert_ids_to_tokens(row)


@pytest.fixture(scope="module")
def bracket_bert(tmp_path_factory):
    """A tiny BERT whose vocabulary can spell the specials' names as ordinary word pieces."""
    tok = make_tokenizer(tmp_path_factory.mktemp("brackets"),
                         WORDS + ["[", "]", "mask", "cls", "sep", "pad"])
    return make_bert(tok)


def test_minilm_reads_a_special_token_string_as_word_pieces():
    """Old behaviour: MiniLM's tokenizer turned "[MASK] [CLS]" into the ids 103 and 101."""
    from rapt.models import load_embeddings

    tok = load_embeddings("minilm").tokenizer
    row = encode_texts(tok, [TEXT])[0]
    _framing_only(tok, row)
    assert tok.convert_ids_to_tokens(row)[1:8] == ["[", "mask", "]", "[", "cl", "##s", "]"]
    pair = encode_texts(tok, ["good [SEP] film"], ["[CLS] bad"])[0]
    assert [t for t in pair if t in set(tok.all_special_ids)] == [101, 102, 102], pair


def test_the_tiny_tokenizer_reads_them_as_text_and_the_release_keeps_no_special(bracket_bert):
    """The client's release (what upload and predict send) of such text holds no special id
    but the frame; the tokens spelling "[MASK]" are privatized like any other."""
    from rapt.client.client import RaptClient

    tok = bracket_bert.tokenizer
    row = encode_texts(tok, [TEXT])[0]
    _framing_only(tok, row)
    assert tok.convert_ids_to_tokens(row)[1:4] == ["[", "mask", "]"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # plain http, a seed: a test's client
        client = RaptClient("http://127.0.0.1:9", "k", backbone=bracket_bert, eta=1.0,
                            seed=0)
        released = client.encode([TEXT] * 20)
    for r in released:
        _framing_only(tok, r)
    assert any(r[1:4] != row[1:4] for r in released)  # η = 1: the spelled tokens are noised
