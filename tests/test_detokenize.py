"""Privatized text is written from the released ids alone: a WordPiece "##" piece is glued to
the word token before it (the tokenizer's own decoding) or, with --pieces split, written as a
word of its own; a piece with no word before it never shows its "##". Before: the tokenizer's
decode wrote "##ing" at a text's start and glued pieces to punctuation ("it.ing")."""

from __future__ import annotations

import pytest
from _tiny import TOY_WORDS, make_bert, make_tokenizer, save_backbone
from typer.testing import CliRunner

from rapt.cli import app
from rapt.privacy.mechanism import (
    Privatizer,
    candidate_ids_from_tokenizer,
    detokenize,
    privatize_texts_detailed,
)

PIECES = ["##ing", "##aint", "##s"]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("detok"), [*TOY_WORDS, "play", ".", *PIECES])


def _ids(tok, tokens: list[str]) -> list[int]:
    ids = tok.convert_tokens_to_ids(tokens)
    assert tok.unk_token_id not in ids
    return ids


RELEASED = ["##ing", "play", "##ing", "great", "##aint", ".", "##s", "fun"]


def test_join_glues_a_piece_to_its_word_and_never_writes_hashes(tok):
    text = detokenize(tok, _ids(tok, RELEASED), "join")
    assert text == "ing playing greataint. s fun"
    # what the tokenizer reads back is what was released, except the stray pieces
    back = tok.convert_ids_to_tokens(tok(text, add_special_tokens=False)["input_ids"])
    assert back[1:5] == RELEASED[1:5]


def test_split_writes_every_piece_as_a_word(tok):
    assert detokenize(tok, _ids(tok, RELEASED), "split") == "ing play ing great aint. s fun"
    with pytest.raises(ValueError, match="pieces must be one of join, split"):
        detokenize(tok, _ids(tok, RELEASED), "glue")


def test_privatized_texts_are_rendered_from_the_released_ids_only(tok):
    """Two texts with the same released ids get the same text, whatever was replaced: the
    writer never sees the original (spacing from it would point at the kept tokens)."""
    bb = make_bert(tok)
    emb = bb.embeddings.detach()
    priv = Privatizer(emb, 30.0, special_ids=bb.special_ids, seed=0,
                      candidate_ids=candidate_ids_from_tokenizer(tok, emb.shape[0]))
    res = privatize_texts_detailed(["the playing film was great", "fun plot ."], tok, priv,
                                   pieces="split")
    assert res.texts == [detokenize(tok, r, "split") for r in res.private_ids]
    assert not any("##" in t for t in res.texts)


def test_cli_pieces_option(tok, tmp_path):
    folder = save_backbone(make_bert(tok), tmp_path / "bb")
    src = tmp_path / "in.txt"
    src.write_text("the playing film was great\nfun plot .\n" * 20)
    runner = CliRunner()
    for pieces in ("join", "split"):
        out = tmp_path / f"{pieces}.txt"
        r = runner.invoke(app, ["privatize", str(src), str(out), "--backbone", str(folder),
                                "--eta", "20", "--pieces", pieces, "--noise-seed", "0"])
        assert r.exit_code == 0, r.output
        assert "##" not in out.read_text()
    r = runner.invoke(app, ["privatize", str(src), str(tmp_path / "x.txt"), "--backbone",
                            str(folder), "--eta", "20", "--pieces", "glue"])
    assert r.exit_code == 2 and "--pieces must be join or split" in r.output
