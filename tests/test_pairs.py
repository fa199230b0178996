"""Sentence pairs end to end (issue 13 item 2): column detection, row encoding (BERT template,
newline join for tokenizers without one, longest-first truncation), segment ids, `rapt tune` /
`rapt predict` on pair files (with RAPT rows and DP), the artifact's recorded columns, errors.
The client and service side is in test_client.py.

Mutations tried (each failed a test here): single-text columns guessed before the pairs
(question/sentence read as one text); `build_rows` ignoring ``text_pairs``;
``truncation="only_first"`` in the BERT path (a long second text is not cut); the newline path
dropping the separator; segment ids counting the first [SEP] itself as segment 1; the prompt
tuner or the service's mixed batch not passing segment ids; `predict` not passing the stored
columns (the custom-column file then has no text column: exit 2).
"""

from __future__ import annotations

import json

import pytest
import torch
from _tiny import TOY_WORDS, make_bert, save_backbone
from typer.testing import CliRunner

from rapt.cli import app
from rapt.data import DataError, load_dataset
from rapt.tuning.reconstruction import build_rows, plain_offset

PAIRS = [("good film", "fun plot", "same"), ("bad film", "good plot", "diff"),
         ("boring story", "boring film", "same"), ("great music", "awful music", "diff"),
         ("fun movie", "fine movie", "same"), ("bad actor", "great actor", "diff")]


def write(path, text):
    path.write_text(text)
    return path


def pair_csv(path, a="sentence1", b="sentence2"):
    return write(path, f"{a},{b},label\n" + "".join(f"{x},{y},{z}\n" for x, y, z in PAIRS))


def pair_jsonl(path, a="premise", b="hypothesis"):
    return write(path, "".join(json.dumps({a: x, b: y, "label": z}) + "\n"
                               for x, y, z in PAIRS))


# --------------------------------------------------------------------------- detection


@pytest.mark.parametrize("a,b", [("sentence1", "sentence2"), ("premise", "hypothesis"),
                                 ("question1", "question2"), ("question", "sentence")])
def test_pair_columns_are_detected(tmp_path, a, b):
    for path in (pair_csv(tmp_path / "p.csv", a, b), pair_jsonl(tmp_path / "p.jsonl", a, b)):
        ds = load_dataset(path)
        assert ds.texts[0] == "good film" and ds.text_pairs[0] == "fun plot", path
        assert ds.report["text_column"] == a and ds.report["text_pair_column"] == b
        assert ds.report["pair_detected"] is True
        assert any(f"'{a}'" in n and f"'{b}'" in n for n in ds.report["notes"])
        assert ds.label_names == ["diff", "same"]


def test_pair_detection_needs_both_columns_and_no_flags(tmp_path):
    # one column of a pair only: no pair (and no text column to guess)
    p = write(tmp_path / "one.csv", "sentence1,label\ngood film,a\n")
    with pytest.raises(DataError, match="missing column"):
        load_dataset(p)
    # 'sentence' alone is still a single text
    q = write(tmp_path / "single.jsonl", '{"sentence": "good film", "label": 1}\n')
    assert load_dataset(q).report["text_pair_column"] is None
    # a given text column turns detection off
    csv = pair_csv(tmp_path / "p.csv")
    ds = load_dataset(csv, text_column="sentence2")
    assert ds.text_pairs[0] is None and ds.texts[0] == "fun plot"
    assert not ds.report["pair_detected"] and not ds.report["notes"]
    # a given pair column alone takes its partner as the first text
    ds = load_dataset(csv, text_pair_column="sentence2")
    assert ds.texts[0] == "good film" and ds.text_pairs[0] == "fun plot"
    with pytest.raises(DataError, match="both the text and the text_pair_column"):
        load_dataset(csv, text_column="sentence1", text_pair_column="sentence1")


def test_missing_pair_column_names_file_and_column(tmp_path):
    csv = pair_csv(tmp_path / "p.csv")
    with pytest.raises(DataError, match=r"p\.csv.*missing column 'nope' given as "
                                        "text_pair_column"):
        load_dataset(csv, text_pair_column="nope")
    js = pair_jsonl(tmp_path / "p.jsonl")
    with pytest.raises(DataError, match=r"p\.jsonl, line 1, field 'nope': missing field given "
                                        "as text_pair_column"):
        load_dataset(js, text_column="premise", text_pair_column="nope")


# --------------------------------------------------------------------------- rows


def test_bert_rows_hold_both_texts_between_two_seps(tok):
    from rapt.tuning.reconstruction import pairs_separated

    k = tok.convert_tokens_to_ids(["music", "plot"])
    ids = {w: tok.convert_tokens_to_ids(w) for w in TOY_WORDS}
    rows = build_rows(tok, ["good film"], 16, k, text_pairs=["bad plot"])
    cls, sep = tok.cls_token_id, tok.sep_token_id
    assert rows[0] == [cls, *k, ids["good"], ids["film"], sep, ids["bad"], ids["plot"], sep]
    assert plain_offset(tok) == 1 and pairs_separated(tok)
    # longest first: a long first text is cut, the short second one stays whole
    long = " ".join(["very"] * 30)
    row = build_rows(tok, [long], 12, k, text_pairs=["bad plot"])[0]
    assert len(row) == 12 and row.count(sep) == 2 and row[-3:] == [ids["bad"], ids["plot"], sep]
    # and a long second text is cut, never dropped
    row = build_rows(tok, ["good film"], 12, k, text_pairs=[long])[0]
    assert len(row) == 12 and row.count(sep) == 2 and row[3:6] == [ids["good"], ids["film"], sep]
    # all-None pairs (Dataset.text_pairs of single texts) are single texts
    assert build_rows(tok, ["good film"], 16, text_pairs=[None]) == build_rows(tok, ["good film"],
                                                                               16)
    with pytest.raises(ValueError, match="second text"):
        build_rows(tok, ["good", "bad"], 16, text_pairs=["fun", None])


def _bpe_like_tokenizer():
    """A word-level tokenizer whose pair template just concatenates (as GPT-2 BPE does) and
    that keeps '\\n' as a token."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<pad>", "<unk>", "</s>", "\n", *TOY_WORDS])}
    t = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"[ \t]+"), behavior="removed"),
        pre_tokenizers.Split(Regex("\n"), behavior="isolated")])
    return PreTrainedTokenizerFast(tokenizer_object=t, pad_token="<pad>", unk_token="<unk>",
                                   eos_token="</s>")


def test_tokenizer_without_pair_separator_joins_with_a_newline():
    from rapt.tuning.reconstruction import encode_texts, pairs_separated

    tok = _bpe_like_tokenizer()
    assert not pairs_separated(tok)
    w = tok.convert_tokens_to_ids
    nl = w("\n")
    assert encode_texts(tok, ["good film"], ["bad plot"]) == [
        [w("good"), w("film"), nl, w("bad"), w("plot")]]
    k = [w("music")]
    row = build_rows(tok, [" ".join(["very"] * 20)], 8, k, text_pairs=["bad plot"])[0]
    assert row == [w("music"), *[w("very")] * 4, nl, w("bad"), w("plot")]


def test_segment_ids_follow_the_tokenizer_and_reach_the_body(tok):
    """The tuners give BERT bodies the token type ids the tokenizer gives pairs (recomputed from
    the [SEP]s of padded, plain-token rows), and all zeros to single texts."""
    from rapt.tuning.tune import pad_batch
    from rapt.tuning.tuners import build_tuner, segment_ids

    enc = tok(["good film", "the plot was very long"], ["bad plot", "fun"], padding=True)
    ids, mask = torch.tensor(enc["input_ids"]), torch.tensor(enc["attention_mask"])
    assert segment_ids(ids, mask, tok.sep_token_id).tolist() == enc["token_type_ids"]
    single = tok(["good film", "the plot was very long"], padding=True)
    assert not segment_ids(torch.tensor(single["input_ids"]), torch.tensor(
        single["attention_mask"]), tok.sep_token_id).any()

    bb = make_bert(tok)
    rows = build_rows(tok, ["good film", "boring story"], 16, [5, 6], text_pairs=["fun", "bad"])
    ids, mask = pad_batch(rows, tok.pad_token_id)
    types = segment_ids(ids, mask, tok.sep_token_id)
    assert types[0].tolist() == [0, 0, 0, 0, 0, 0, 1, 1]  # [CLS] k k good film [SEP] fun [SEP]
    tuner = build_tuner(bb, "full")
    with torch.no_grad():
        want = tuner.body(input_ids=ids, attention_mask=mask,
                          token_type_ids=types).last_hidden_state
        zeros = tuner.body(input_ids=ids, attention_mask=mask).last_hidden_state
        got = tuner(ids, mask)
    assert torch.allclose(got, want, atol=1e-6) and not torch.allclose(got, zeros, atol=1e-4)
    for method in ("prompt", "prefix"):  # they pass them too (prompt positions: type 0)
        t = build_tuner(bb, method, num_virtual_tokens=2)
        seen = {}
        h = t.body.embeddings.register_forward_hook(
            lambda m, args, kw, out, seen=seen: seen.update(kw), with_kwargs=True)
        with torch.no_grad():
            t(ids, mask)
        h.remove()
        expect = types if method == "prefix" else torch.cat([torch.zeros(2, 2).long(), types], 1)
        assert torch.equal(seen["token_type_ids"], expect), method


def test_service_mixed_batch_of_pair_rows_matches_each_prompt(tok):
    """The service's shared forward pass gives pair rows their segment ids too."""
    from rapt.service import mixed
    from rapt.tuning.tune import TuneConfig, tune

    bb = make_bert(tok)
    rows = build_rows(tok, [a for a, _, _ in PAIRS], 24, text_pairs=[b for _, b, _ in PAIRS])
    prompts = [tune(bb, rows, [i % 2 for i in range(len(rows))], 2,
                    TuneConfig(num_virtual_tokens=2, epochs=1, batch_size=4, seed=seed))
               for seed in (0, 1)]
    items = [(p, rows) for p in prompts]
    assert all(mixed.mixable(bb, p) is not None for p in prompts)
    for (p, r), probs in zip(items, mixed.forward(bb, items), strict=True):
        assert torch.allclose(probs, p.predict_proba(bb, r), atol=1e-5)


# --------------------------------------------------------------------------- CLI


@pytest.fixture(scope="module")
def env(tmp_path_factory, tok):
    tmp = tmp_path_factory.mktemp("pairs_cli")
    return {"tmp": tmp, "bb": save_backbone(make_bert(tok), tmp / "bb"),
            "csv": write(tmp / "custom.csv", "first,second,label\n" + "".join(
                f"{x},{y},{z}\n" for x, y, z in PAIRS)),
            "jsonl": pair_jsonl(tmp / "nli.jsonl"),
            "single": write(tmp / "single.csv", "text,label\ngood film,same\nbad film,diff\n")}


def run(*argv):
    return CliRunner().invoke(app, [str(a) for a in argv])


TUNE = ["--epochs", "1", "--batch-size", "4", "--num-virtual-tokens", "2", "--max-length", "24"]


@pytest.fixture(scope="module")
def csv_art(env):
    """`rapt tune` with explicit pair columns, privatized RAPT rows (plain tokens)."""
    art = env["tmp"] / "art_csv"
    r = run("tune", env["csv"], "--out", art, "--backbone", env["bb"], "--text-column", "first",
            "--text-pair-column", "second", "--eta", "5", "--noise-seed", "0",
            "--reconstruction", "--plain-len", "3", "--rec-vocab-size", "20", *TUNE)
    assert r.exit_code == 0, r.output
    return art


def test_cli_tune_predict_custom_pair_columns(env, csv_art):
    """Explicit columns at tune time are recorded in the artifact; predict needs no flags."""
    art = csv_art
    meta = json.loads((art / "config.json").read_text())["meta"]
    assert meta["text_column"] == "first" and meta["text_pair_column"] == "second"
    out = env["tmp"] / "preds.jsonl"
    r = run("predict", art, env["csv"], "--out", out, "--noise-seed", "1")
    assert r.exit_code == 0, r.output
    lines = [json.loads(s) for s in out.read_text().splitlines()]
    assert [(d["text"], d["text_pair"]) for d in lines] == [(x, y) for x, y, _ in PAIRS]
    assert "accuracy" in r.output
    # a single-text file for a pair prompt: one clear error
    r = run("predict", art, env["single"])
    assert r.exit_code == 2 and "tuned on sentence pairs" in r.output
    assert "single.csv" in r.output and "Traceback" not in r.output


def test_cli_tune_predict_detected_pairs_jsonl_with_dp(env):
    """premise/hypothesis keys are detected (the CLI says so), DP training accepts the pair
    rows, and predict prints both texts."""
    art = env["tmp"] / "art_jsonl"
    r = run("tune", env["jsonl"], "--out", art, "--backbone", env["bb"], "--eta", "5",
            "--noise-seed", "0", "--dp-noise", "1.0", "--method", "prefix", *TUNE)
    assert r.exit_code == 0, r.output
    assert "'premise'" in r.output and "'hypothesis'" in r.output and "detected" in r.output
    meta = json.loads((art / "config.json").read_text())["meta"]
    assert meta["text_pair_column"] == "hypothesis" and meta["dp"]["epsilon"] > 0
    r = run("predict", art, env["jsonl"], "--noise-seed", "1")
    assert r.exit_code == 0, r.output
    printed = [s.split("\t") for s in r.stdout.splitlines() if "\t" in s]
    assert [p[1:] for p in printed] == [[x, y] for x, y, _ in PAIRS]
    assert {p[0] for p in printed} <= {"diff", "same"}


@pytest.mark.parametrize("cmd", ["tune", "predict"])
@pytest.mark.parametrize("kind", ["csv", "jsonl"])
def test_cli_missing_pair_column_exits_2(env, csv_art, tmp_path, cmd, kind):
    argv = (["tune", env[kind], "--out", tmp_path / "o", "--backbone", env["bb"]]
            if cmd == "tune" else ["predict", csv_art, env[kind]])
    r = run(*argv, "--text-column", "first" if kind == "csv" else "premise",
            "--text-pair-column", "nope")
    errors = [s for s in r.output.splitlines() if s.startswith("error:")]
    assert r.exit_code == 2 and len(errors) == 1 and "Traceback" not in r.output, r.output
    assert f"{env[kind].name}" in errors[0] and "'nope'" in errors[0]
    assert "--text-pair-column" in errors[0]
