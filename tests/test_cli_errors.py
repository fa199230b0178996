"""User errors on `rapt tune`, `rapt predict` and `rapt attack attribute` with a tiny saved model:
each exits with status 2 and one `error:` line that names the problem (file, column, line,
label, folder), never a traceback.

Mutations tried (each made the parametrized test fail on the cases it covers):
``_app.load_data_or_fail`` catching ``FileNotFoundError`` only (DataError escapes: traceback,
exit 1 for bad file / column / label); ``_app.load_backbone_or_fail`` not catching
``BackboneNotFoundError`` (exit 1 for the missing model folder); ``_app.fail`` exiting with
status 1; ``predict`` not catching ``ArtifactError``.
"""

from __future__ import annotations

import json

import pytest
from _tiny import TOY_WORDS, make_bert, make_tokenizer, save_backbone
from typer.testing import CliRunner

from rapt.cli import app


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """A tiny BERT folder, a few small data files and a prompt tuned on them by `rapt tune`."""
    tmp = tmp_path_factory.mktemp("cli_errors")
    tok = make_tokenizer(tmp, TOY_WORDS)
    files = {
        "bb": save_backbone(make_bert(tok), tmp / "bb"),
        "missing": tmp / "no_such.csv",
        "nomodel": tmp / "no_model_here",
        "noart": tmp / "no_artifact_here",
        "art": tmp / "artifact",
    }
    contents = {
        "good": "text,label\ngood film,pos\nbad film,neg\nfun plot,pos\nboring plot,neg\n",
        "nolabel": "text,label\ngood film,pos\nbad film,\n",  # line 3: empty label
        "unknown": "text,label\ngood film,pos\nfun film,maybe\n",  # a label the prompt lacks
        "onlypos": "text,label\ngood film,pos\nfun film,pos\ngreat plot,pos\n",
        "attr": "text,gender\ngood film,0\nbad film,1\nfun plot,0\nboring plot,1\n",
        "attrbad": "text,gender\ngood film,0\nbad film,\n",
        "nolabelcol": "text,stars\ngood film,pos\nbad film,neg\n",  # label column not named
        "notext": "review,label\ngood film,pos\nbad film,neg\n",
    }
    for name, text in contents.items():
        files[name] = tmp / f"{name}.csv"
        files[name].write_text(text)
    words = ["good", "bad", "fun", "boring", "great", "awful", "nice", "dull", "fine", "poor"]
    line_files = {
        "lines.txt": "good film\nbad film\n",  # unlabelled: normal for inference
        "at.txt": "good film@pos\nbad film@neg\nfun plot@pos\nboring plot@neg\n",
        "manyat.data": "".join(f"{w} film@{'pos' if i % 2 else 'neg'}\n"
                               for i, w in enumerate(words)),
        "ones.csv": "text,label\ngood film,1\nfun plot,1\n",
        "onebased.csv": "text,label\ngood film,2\nbad film,1\nfun plot,2\nboring plot,1\n",
        # no rows: a header only, nothing, blank lines
        "header.csv": "text,label\n", "headertab.tsv": "text\tlabel\n", "empty.jsonl": "",
        "blank.txt": "\n\n",
    }
    for fname, text in line_files.items():
        files[fname.split(".")[0]] = tmp / fname
        files[fname.split(".")[0]].write_text(text)
    r = CliRunner().invoke(app, ["tune", str(files["good"]), "--out", str(files["art"]),
                                 "--backbone", str(files["bb"]), "--epochs", "1",
                                 "--no-reconstruction", "--num-virtual-tokens", "2"])
    assert r.exit_code == 0, r.output  # positive control: the valid call works
    return files


def _run(env, argv):
    return CliRunner().invoke(app, [str(env.get(a, a)) if isinstance(a, str) else str(a)
                                    for a in argv])


B = ["--backbone", "bb"]
CASES = {
    # name: (argv with env keys for paths, substrings the error line must hold)
    "tune bad file": (["tune", "missing", "--out", "out", *B], ["no_such.csv", "no such file"]),
    "tune bad text column": (["tune", "good", "--out", "out", *B, "--text-column", "review"],
                             ["good.csv", "missing column 'review'", "--text-column"]),
    # issue 13: flag names, not Python keywords; no traceback when no label column is found
    "tune no text column": (["tune", "notext", "--out", "out", *B],
                            ["notext.csv", "choose one with --text-column"]),
    "tune no label column": (["tune", "nolabelcol", "--out", "out", *B],
                             ["nolabelcol.csv", "stars", "--label-column"]),
    "tune unlabelled lines": (["tune", "lines", "--out", "out", *B],
                              ["lines.txt", "--format text-at-label"]),
    "tune bad format": (["tune", "good", "--out", "out", *B, "--format", "xml"],
                        ["unknown format 'xml'"]),
    "tune label-text misread": (["tune", "manyat", "--out", "out", *B, "--format", "label-text"],
                                ["manyat.data", "distinct labels", "--format text-at-label"]),
    "tune ambiguous label ids": (["tune", "ones", "--out", "out", *B, "--label-names",
                                  "neg,pos"], ["ones.csv", "--label-base 0", "--label-base 1"]),
    "tune bad label column": (["tune", "good", "--out", "out", *B, "--label-column", "stars"],
                              ["good.csv", "missing column 'stars'"]),
    "tune bad label": (["tune", "nolabel", "--out", "out", *B],
                       ["nolabel.csv", "line 3", "empty label"]),
    "tune missing model folder": (["tune", "good", "--out", "out", "--backbone", "nomodel"],
                                  ["no_model_here", "cannot load backbone"]),
    "predict missing artifact": (["predict", "noart", "good"], ["no_artifact_here", "missing"]),
    "predict bad file": (["predict", "art", "missing"], ["no_such.csv", "no such file"]),
    "predict bad text column": (["predict", "art", "good", "--text-column", "review"],
                                ["good.csv", "missing column 'review'"]),
    "predict missing model folder": (["predict", "art", "good", "--backbone", "nomodel"],
                                     ["no_model_here", "cannot load backbone"]),
    # Old behaviour: predict on a header-only CSV or an empty JSONL ended in an IndexError
    # (exit 1); privatize on an empty or header-only file exited 0 with an empty output.
    "predict header-only csv": (["predict", "art", "header"], ["header.csv", "no rows"]),
    "predict header-only tsv": (["predict", "art", "headertab"], ["headertab.tsv", "no rows"]),
    "predict empty jsonl": (["predict", "art", "empty"], ["empty.jsonl", "no rows"]),
    "predict blank txt": (["predict", "art", "blank"], ["blank.txt", "no rows"]),
    "privatize header-only csv": (["privatize", "header", "out", *B, "--eta", "20"],
                                  ["header.csv", "no rows"]),
    "privatize empty jsonl": (["privatize", "empty", "out", *B, "--eta", "20"],
                              ["empty.jsonl", "no rows"]),
    "privatize blank txt": (["privatize", "blank", "out", *B, "--eta", "20"],
                            ["blank.txt", "no rows"]),
    "tune header-only csv": (["tune", "header", "--out", "out", *B], ["header.csv", "no rows"]),
    "client predict header-only csv": (
        ["client", "predict", "p1", "header", "--label-names", "neg,pos", *B, "--url",
         "http://127.0.0.1:9", "--key", "k", "--eta", "20"], ["header.csv", "no rows"]),
    "client upload empty jsonl": (
        ["client", "upload", "empty", *B, "--url", "http://127.0.0.1:9", "--key", "k", "--eta",
         "20"], ["empty.jsonl", "no rows"]),
    "attribute bad file": (["attack", "attribute", "--data", "missing", *B],
                           ["no_such.csv", "no such file"]),
    "attribute bad column": (["attack", "attribute", "--data", "good", *B],
                             ["good.csv", "missing column 'gender'"]),
    "attribute bad label": (["attack", "attribute", "--data", "attrbad", *B],
                            ["attrbad.csv", "line 3", "empty label"]),
    "attribute bad attribute": (["attack", "attribute", "--data", "attr", *B, "--attribute",
                                 "race"], ["--attribute", "race"]),
    "attribute missing model folder": (["attack", "attribute", "--data", "attr", "--backbone",
                                        "nomodel"], ["no_model_here", "cannot load backbone"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_user_errors_exit_2_naming_the_problem(env, case, tmp_path):
    argv, needles = CASES[case]
    argv = [str(tmp_path / "out") if a == "out" else a for a in argv]
    r = _run(env, argv)
    assert r.exit_code == 2, (r.exit_code, r.output, r.exception)
    errors = [line for line in r.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in r.output, r.output
    for needle in needles:
        assert needle in errors[0], (needle, errors[0])
    assert not (tmp_path / "out").exists()


def test_valid_calls_succeed(env, tmp_path):
    """Negative control for the error cases: the same commands with good inputs exit 0."""
    preds = tmp_path / "preds.jsonl"
    r = _run(env, ["predict", "art", "good", "--no-privacy", "--out", str(preds)])
    assert r.exit_code == 0, r.output
    assert "accuracy" in r.output and len(preds.read_text().splitlines()) == 4
    r = _run(env, ["attack", "attribute", "--data", "attr", *B])
    assert r.exit_code == 0, r.output
    assert "| input embeddings |" in r.output


def test_attribute_missing_artifact_exits_2(env):
    r = _run(env, ["attack", "attribute", "--data", "attr", *B, "--artifact", "noart"])
    assert r.exit_code == 2 and "no_artifact_here" in r.output, (r.exit_code, r.exception)


def test_predict_unknown_label_exits_2(env):
    r = _run(env, ["predict", "art", "unknown", "--no-privacy"])
    assert r.exit_code == 2 and "maybe" in r.output, r.output


def test_predict_accuracy_uses_the_prompts_label_names(env, tmp_path):
    """The accuracy printed must agree with the predictions written (by name) next to it.
    Negative control: on a file holding both labels the two agree."""
    for name in ("good", "onlypos"):
        preds = tmp_path / f"{name}.jsonl"
        r = _run(env, ["predict", "art", name, "--no-privacy", "--out", str(preds)])
        assert r.exit_code == 0, r.output
        gold = [line.split(",")[1] for line in env[name].read_text().splitlines()[1:]]
        pred = [json.loads(line)["label"] for line in preds.read_text().splitlines()]
        acc = sum(a == b for a, b in zip(pred, gold, strict=True)) / len(gold)
        assert f"accuracy {100 * acc:.1f} %" in r.output, (name, pred, gold, r.output)


def test_predict_unlabelled_file_prints_label_names(env, tmp_path):
    """Issue 13 item 1: predicting needs no labels. Without --out the predictions are printed
    by name; with --out they are written; no accuracy, exit 0, no traceback."""
    for data in ("lines", "nolabelcol"):
        r = _run(env, ["predict", "art", data, "--no-privacy"])
        assert r.exit_code == 0, (data, r.output, r.exception)
        printed = [line.split("\t") for line in r.stdout.splitlines() if "\t" in line]
        assert [t for _, t in printed] == ["good film", "bad film"], r.stdout
        assert {p for p, _ in printed} <= {"neg", "pos"}, r.stdout
        assert "accuracy" not in r.output and "Traceback" not in r.output
    preds = tmp_path / "p.jsonl"
    r = _run(env, ["predict", "art", "lines", "--no-privacy", "--out", str(preds)])
    assert r.exit_code == 0, (r.output, r.exception)
    rows = [json.loads(line) for line in preds.read_text().splitlines()]
    assert [x["text"] for x in rows] == ["good film", "bad film"]
    assert {x["label"] for x in rows} <= {"neg", "pos"} and "accuracy" not in r.output


def test_predict_label_names_must_match_the_artifact(env):
    r = _run(env, ["predict", "art", "good", "--no-privacy", "--label-names", "a,b"])
    assert r.exit_code == 2 and "--label-names" in r.output and "neg,pos" in r.output, r.output
    r = _run(env, ["predict", "art", "good", "--no-privacy", "--label-names", "neg,pos"])
    assert r.exit_code == 0 and "accuracy" in r.output, r.output


def test_tune_text_at_label_file_then_predict(env, tmp_path):
    """Issue 13 item 2: a .txt of 'sentence@label' lines is tuned on as labelled data."""
    art = tmp_path / "art"
    r = _run(env, ["tune", "at", "--out", str(art), *B, "--epochs", "1", "--no-reconstruction",
                   "--num-virtual-tokens", "2"])
    assert r.exit_code == 0, (r.output, r.exception)
    assert "text-at-label" in r.output  # the guess is announced
    meta = json.loads((art / "config.json").read_text())["meta"]
    assert meta["label_names"] == ["neg", "pos"]
    r = _run(env, ["predict", str(art), "at", "--no-privacy"])
    assert r.exit_code == 0 and "accuracy" in r.output and "on 4 examples" in r.output, r.output


def test_tune_one_based_label_ids_with_label_names(env, tmp_path):
    """Issue 13 item 4: labels 1..K with K --label-names are read 1-based, with a note; the
    artifact keeps names and base, so predict needs neither again."""
    art = tmp_path / "art"
    r = _run(env, ["tune", "onebased", "--out", str(art), *B, "--epochs", "1",
                   "--no-reconstruction", "--num-virtual-tokens", "2", "--label-names",
                   "neg,pos"])
    assert r.exit_code == 0, (r.output, r.exception)
    assert "1-based" in r.output and "1=neg" in r.output and "--label-base 0" in r.output
    meta = json.loads((art / "config.json").read_text())["meta"]
    assert meta["label_names"] == ["neg", "pos"] and meta["label_base"] == 1
    preds = tmp_path / "p.jsonl"
    r = _run(env, ["predict", str(art), "onebased", "--no-privacy", "--out", str(preds)])
    assert r.exit_code == 0 and "on 4 examples" in r.output, (r.output, r.exception)
    gold = ["pos", "neg", "pos", "neg"]
    pred = [json.loads(line)["label"] for line in preds.read_text().splitlines()]
    acc = sum(a == b for a, b in zip(pred, gold, strict=True)) / 4
    assert f"accuracy {100 * acc:.1f} %" in r.output, (pred, r.output)


def test_predict_prints_a_summary_and_the_first_rows_or_writes_csv(env, tmp_path):
    """Issue 32 item 2: without --out, `rapt predict` prints counts per label, the first 10
    rows and how many more there are, then accuracy and a confusion table; --out FILE.csv
    writes every row by label name; any other suffix is refused before work."""
    r = _run(env, ["predict", "art", "manyat", "--no-privacy"])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines[0].startswith("10 predictions: neg ") and "pos " in lines[0]
    assert len([x for x in lines if "\t" in x]) == 10 and "more" not in r.stdout
    assert "confusion (rows: gold, columns: predicted)" in r.stdout
    out = tmp_path / "p.csv"
    # --no-local: the prompt alone (the local model `rapt tune` saved adds its own columns)
    r = _run(env, ["predict", "art", "good", "--no-privacy", "--no-local", "--out", str(out)])
    assert r.exit_code == 0 and f"wrote 4 predictions to {out} (csv)" in r.output, r.output
    head, *rows = out.read_text().splitlines()
    assert head == "row,text,label,gold,p(neg),p(pos)" and len(rows) == 4
    assert [x.split(",")[3] for x in rows] == ["pos", "neg", "pos", "neg"]
    r = _run(env, ["predict", "art", "good", "--no-privacy", "--out", str(tmp_path / "p.txt")])
    errors = [x for x in r.output.splitlines() if x.startswith("error:")]
    assert r.exit_code == 2 and len(errors) == 1 and "*.jsonl or *.csv" in errors[0], r.output
