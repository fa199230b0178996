"""`rapt privatize` on sentence pairs (CSV, JSONL), TREC and TrustPilot files, and with
--target-p: the output keeps the input's format record for record, only the texts change.

The tiny BERT's vocabulary is every word and punctuation mark of rapt's public text sample, so
--target-p (calibrated on that sample) sees real tokens, not [UNK].
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from importlib.resources import files

import pytest
from _tiny import SPECIALS, make_bert, make_tokenizer, save_backbone
from typer.testing import CliRunner

from rapt.cli import app
from rapt.data import load_dataset

PUBLIC = files("rapt").joinpath("resources/public_sample.txt").read_text(encoding="utf-8")
IDENTITY_ETA = "1e6"  # noise ~ d/η ≈ 2e-5, far below the embedding spacing: nothing replaced
STRONG_ETA = "40"  # most tokens replaced (P > 0.5 on this vocabulary)


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+|[^\sa-z0-9]", text.lower())


@pytest.fixture(scope="module")
def public_bb(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("privatize_cli")
    vocab = sorted(set(_words(PUBLIC)) - {w.lower() for w in SPECIALS})
    tok = make_tokenizer(tmp, vocab)
    return save_backbone(make_bert(tok, seed=3), tmp / "bb"), tok


def _privatize(public_bb, src, out, *extra: str) -> dict:
    """`rapt privatize` with uniform noise (--protect all): these tests are about formats and
    calibration, where every token must be noised alike."""
    folder, _ = public_bb
    r = CliRunner().invoke(app, ["privatize", str(src), str(out), "--backbone", str(folder),
                                 "--json-report", "--protect", "all", *extra])
    assert r.exit_code == 0, r.output
    return json.loads([line for line in r.output.splitlines() if line.startswith("{")][-1])


def _normalized(tok, text: str) -> str:
    """What the identity mechanism writes back: the text through the tokenizer and back."""
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.unk_token_id not in ids, text  # the test's texts stay inside the vocabulary
    return tok.decode(ids, clean_up_tokenization_spaces=True)


def _n_tokens(tok, text: str) -> int:
    return len(tok(text, add_special_tokens=False)["input_ids"])


# (file name, content, extra CLI options, load_dataset kwargs to read it back)
PAIRS_CSV = ("pairs.csv", "id,premise,hypothesis,label,note\n"
             "1,the film opens with a long shot,the film is slow,entailment,\"a, b\"\n"
             "2,\"they are comfortable, but the sole started to peel\",the shoes are new,"
             "neutral,x\n"
             "3,shares in the company fell sharply,the company did well,contradiction,y\n",
             ["--text-column", "premise", "--text-pair-column", "hypothesis"],
             {"text_column": "premise", "text_pair_column": "hypothesis"})
PAIRS_JSONL = ("pairs.jsonl", "".join(json.dumps(r) + "\n" for r in [
    {"premise": "the lead actor gives a warm, funny performance", "hypothesis": "he is funny",
     "label": "entailment", "idx": 0},
    {"premise": "the plan will add four routes", "hypothesis": "the plan will add no routes",
     "label": "contradiction", "idx": 1}]),
    ["--text-column", "premise", "--text-pair-column", "hypothesis"],
    {"text_column": "premise", "text_pair_column": "hypothesis"})
TREC = ("questions.txt", "DESC:manner how does the coffee maker work ?\n"
        "NUM:count how many drivers will the plan add ?\n\n"
        "LOC:city what town is on the northern edge ?\n", ["--format", "trec"],
        {"format": "trec"})
TRUSTPILOT = ("reviews.csv", "\"this is the best coffee maker i have owned, it heats up\",5,1,0,"
              "united_kingdom\nthe sole started to peel after three weeks,2,0,1,denmark\n"
              "customer service offered a refund,4,1,1,united_states\n",
              ["--format", "trustpilot"], {"format": "trustpilot"})
# issue 13: 'sentence@label' lines in a .txt are read (format guessed) and written as such
AT_LABEL = ("news.txt", "the film opens with a long shot@positive\n"
            "shares in the company fell sharply@negative\n\n"
            "customer service offered a refund@positive\n", [], {})
FORMATS = {"pairs-csv": PAIRS_CSV, "pairs-jsonl": PAIRS_JSONL, "trec": TREC,
           "trustpilot": TRUSTPILOT, "text-at-label": AT_LABEL}


def _raw_records(name: str, body: str) -> list[list[str]]:
    """The file's records as raw fields, parsed here without rapt: texts are compared through
    the tokenizer, everything else must be byte-identical."""
    if name.endswith(".jsonl"):
        return [[json.dumps({k: v for k, v in json.loads(line).items()
                             if k not in ("premise", "hypothesis")})]
                for line in body.splitlines() if line.strip()]
    if name == "news.txt":  # the label after the last '@'
        return [[line.rpartition("@")[2]] for line in body.splitlines() if line.strip()]
    if name.endswith(".txt"):  # TREC: the "COARSE:fine" tag
        return [[line.split(" ", 1)[0]] for line in body.splitlines() if line.strip()]
    rows = [r for r in csv.reader(io.StringIO(body)) if r]
    if name == "pairs.csv":  # keep id, label, note
        return [[r[0], r[3], r[4]] for r in rows]
    return [r[1:] for r in rows]  # TrustPilot: rating, gender, age, country


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_privatize_keeps_the_format(public_bb, tmp_path, fmt):
    """At η = 1e6 the output is the input (texts through the tokenizer), record for record;
    at a strong η the texts change, every text keeps its token count, and every other field,
    line and label is unchanged.

    Mutations tried (each made this test fail): ``_rewrite`` writing the pair texts into the
    text column (``row[ti] = pairs[k]``); ``_rewrite`` for TREC dropping the label tag
    (``prefix = ""``); the CLI passing the pair texts in reverse order (``out_pairs[::-1]``);
    the TrustPilot writer putting the review in the last column (``ti = -1``).
    """
    name, content, extra, read_kw = FORMATS[fmt]
    _, tok = public_bb
    src = tmp_path / name
    src.write_text(content)
    original = load_dataset(src, **read_kw)
    n_lines = len(content.splitlines())

    same = tmp_path / ("same_" + name)
    rep = _privatize(public_bb, src, same, "--eta", IDENTITY_ETA, "--seed", "0", *extra)
    assert rep["p"] == 0.0 and rep["examples"] == len(original)
    body = same.read_text()
    assert len(body.splitlines()) == n_lines
    assert _raw_records(name, body) == _raw_records(name, content)
    back = load_dataset(same, **read_kw)
    assert [e.text for e in back] == [_normalized(tok, e.text) for e in original]
    assert [e.text_pair for e in back] == [
        _normalized(tok, e.text_pair) if e.text_pair is not None else None for e in original]
    assert back.labels == original.labels and back.label_names == original.label_names
    assert [e.attrs for e in back] == [e.attrs for e in original]

    priv = tmp_path / ("priv_" + name)
    rep = _privatize(public_bb, src, priv, "--eta", STRONG_ETA, "--seed", "0", *extra)
    assert rep["p"] > 0.5, rep
    body = priv.read_text()
    assert len(body.splitlines()) == n_lines
    assert _raw_records(name, body) == _raw_records(name, content)
    back = load_dataset(priv, **read_kw)
    assert back.labels == original.labels and [e.attrs for e in back] == [
        e.attrs for e in original]
    for a, b in zip(original, back, strict=True):
        assert _n_tokens(tok, b.text) == _n_tokens(tok, a.text), (a.text, b.text)
        if a.text_pair is not None:
            assert _n_tokens(tok, b.text_pair) == _n_tokens(tok, a.text_pair)
    changed = [b.text != _normalized(tok, a.text) for a, b in zip(original, back, strict=True)]
    assert any(changed), body
    if original[0].text_pair is not None:
        assert any(b.text_pair != _normalized(tok, a.text_pair) for a, b in zip(
            original, back, strict=True))  # the second text is privatized too


def test_target_p_is_met_and_the_format_kept(public_bb, tmp_path):
    """--target-p calibrates η on rapt's public sample; on text drawn from that sample the P
    the command reports is the target within 4 standard errors (+ the calibration's own
    tolerance 0.005); both the calibration (one noise draw on the sample's n tokens) and this
    measurement (another draw on the same tokens) are binomial, hence the √2. P is the share
    of tokens that really changed in the output file, and the label-text file keeps its lines
    and labels.
    Negative control: the two targets give clearly different η and P.

    Mutations tried (each made this test fail): the CLI privatizing at ``eta * 2`` after
    calibrating; the CLI calling ``calibrate_eta_public(bb, 0.5, ...)`` whatever the target;
    the CLI skipping calibration (using the default --eta 100).
    """
    _, tok = public_bb
    sentences = [s.strip() for s in re.split(r"(?<=[.;])\s+", PUBLIC) if s.strip()]
    src = tmp_path / "public.txt"
    src.write_text("".join(f"{i % 2} {s}\n" for i, s in enumerate(sentences)))
    lines_in = src.read_text().splitlines()
    reports = []
    for target in (0.2, 0.6):
        out = tmp_path / f"out_{target}.txt"
        rep = _privatize(public_bb, src, out, "--target-p", str(target), "--seed", "1",
                         "--format", "label-text")
        n = rep["tokens"]
        assert n > 1000
        tol = 4 * math.sqrt(2 * target * (1 - target) / n) + 0.005  # ≈ 0.09 at P = 0.6
        assert abs(rep["p"] - target) <= tol, rep
        lines_out = out.read_text().splitlines()
        assert len(lines_out) == len(lines_in)
        assert [x.split(" ", 1)[0] for x in lines_out] == [x.split(" ", 1)[0] for x in lines_in]
        assert load_dataset(out, format="label-text").labels == load_dataset(
            src, format="label-text").labels
        # the reported P is the share of the input's tokens that changed, counted here
        changed = total = 0
        for a, b in zip(lines_in, lines_out, strict=True):
            ia = tok(a.split(" ", 1)[1], add_special_tokens=False)["input_ids"]
            ib = tok(b.split(" ", 1)[1], add_special_tokens=False)["input_ids"]
            assert len(ia) == len(ib), (a, b)
            changed += sum(x != y for x, y in zip(ia, ib, strict=True))
            total += len(ia)
        assert total == n and changed / n == pytest.approx(rep["p"], abs=1e-9)
        reports.append(rep)
    low, high = reports
    assert low["eta"] > high["eta"] and high["p"] - low["p"] > 0.3, reports
