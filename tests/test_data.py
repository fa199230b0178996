"""rapt.data: every format, every error path (file, line, field in the message), real files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rapt.data import BUILTINS, DataError, Dataset, data_dir, load_dataset


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def expect_error(match_parts: list[str], fn, *args, **kwargs) -> DataError:
    with pytest.raises(DataError) as ei:
        fn(*args, **kwargs)
    msg = str(ei.value)
    for part in match_parts:
        assert part in msg, f"{part!r} not in {msg!r}"
    return ei.value


# --------------------------------------------------------------------------- a fake data dir


@pytest.fixture()
def fake_data(tmp_path, monkeypatch) -> Path:
    """A miniature copy of the shared data layout, with RAPT_DATA_DIR pointing at it."""
    d = tmp_path / "data"
    write(d / "sst2" / "train.tsv", 'sentence\tlabel\nhide new "secretions" \t0\ngood fun \t1\n'
          "nice\t1\n")
    write(d / "sst2" / "dev.tsv", "sentence\tlabel\nok film\t1\n")
    write(d / "sst2" / "stsa.binary.train", "1 a stirring , funny film\n0 apparently bad .\n")
    write(d / "sst2" / "stsa.binary.dev", "0 dull\n")
    write(d / "sst2" / "stsa.binary.test", "1 fine\n\n")
    write(d / "trec" / "train.txt", "DESC:manner How did it develop ?\nHUM:ind Who was he ?\n"
          "NUM:date When was it ?\n")
    write(d / "trec" / "test.txt", "LOC:city Where is it ?\n")
    cb = [{"premise": "It rained.", "hypothesis": "it was wet", "label": "entailment", "idx": 0},
          {"premise": "No.", "hypothesis": "yes", "label": "contradiction", "idx": 1},
          {"premise": "Maybe.", "hypothesis": "perhaps", "label": "neutral", "idx": 2}]
    write(d / "cb" / "train.jsonl", "".join(json.dumps(r) + "\n" for r in cb))
    write(d / "cb" / "val.jsonl", json.dumps(cb[0]) + "\n")
    write(d / "cb" / "test.jsonl", "".join(
        json.dumps({k: v for k, v in r.items() if k != "label"}) + "\n" for r in cb))
    write(d / "trustpilot" / "www2015_a.csv",
          'great shop,5,1,0,united_states\n"slow,\nbut fine",3,0,1,united_kingdom\n'
          "awful,1,1,1,denmark\n")
    write(d / "trustpilot" / "www2015_b.csv", "ok,4,0,0,france\n")
    monkeypatch.setenv("RAPT_DATA_DIR", str(d))
    return d


def test_data_dir_env(fake_data):
    assert data_dir() == fake_data


def test_data_dir_env_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("RAPT_DATA_DIR", str(tmp_path / "nope"))
    expect_error(["RAPT_DATA_DIR", "nope"], data_dir)


def test_data_dir_searches_upward_from_cwd(tmp_path, monkeypatch):
    monkeypatch.delenv("RAPT_DATA_DIR", raising=False)
    (tmp_path / "shared" / "data").mkdir(parents=True)
    deep = tmp_path / "repo" / "sub"
    deep.mkdir(parents=True)
    monkeypatch.chdir(deep)
    assert data_dir() == tmp_path / "shared" / "data"


def test_builtin_sst2_tsv(fake_data):
    ds = load_dataset("sst2")
    assert ds.texts == ['hide new "secretions"', "good fun", "nice"]
    assert ds.labels == [0, 1, 1]
    assert ds.label_names == ["negative", "positive"]
    assert ds.report["read"] == 3 and ds.report["per_label"] == {"negative": 1, "positive": 2}
    assert [e.line for e in ds] == [2, 3, 4]
    assert len(load_dataset("sst2", "validation")) == 1  # alias of dev
    expect_error(["sst2", "no split 'test'"], load_dataset, "sst2", "test")


def test_builtin_sst2_sentences(fake_data):
    ds = load_dataset("sst2-sentences")
    assert ds.labels == [1, 0] and ds.texts[0] == "a stirring , funny film"
    test = load_dataset("sst2-sentences", "test")
    assert len(test) == 1 and test.report["blank_lines"] == 1


def test_builtin_trec(fake_data):
    ds = load_dataset("trec")
    assert ds.label_names == ["ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM"]
    assert ds.labels == [1, 3, 5]
    assert ds[0].attrs == {"fine": "manner"} and ds[0].text == "How did it develop ?"
    assert load_dataset("trec", "test").labels == [4]


def test_builtin_cb_pairs_and_unlabelled_test(fake_data):
    ds = load_dataset("cb")
    assert ds.label_names == ["entailment", "contradiction", "neutral"]
    assert ds.labels == [0, 1, 2]
    assert ds[0].text == "It rained." and ds[0].text_pair == "it was wet"
    assert ds[0].attrs == {"idx": 0}
    test = load_dataset("cb", "test")
    assert len(test) == 3 and test.report["unlabelled"] == 3
    assert all(e.label is None for e in test)
    expect_error(["no label", "line 1"], lambda: test.labels)
    assert len(load_dataset("cb", "dev")) == 1  # dev -> val


def test_builtin_trustpilot(fake_data):
    ds = load_dataset("trustpilot", "a")
    assert ds.label_names == ["1", "2", "3", "4", "5"]
    assert ds.labels == [4, 2, 0]
    # the quoted review spans two physical lines; the next record starts on line 4
    assert ds[1].text == "slow,\nbut fine" and [e.line for e in ds] == [1, 2, 4]
    assert ds[1].attrs == {"rating": 3, "gender": 0, "age": 1, "country": "united_kingdom"}
    assert len(load_dataset("trustpilot", "train")) == 3
    assert load_dataset("trustpilot", "test").labels == [3]
    g = load_dataset("trustpilot", "a", attribute="gender")
    assert g.label_names == ["female", "male"] and g.labels == [1, 0, 1]
    assert g[0].attrs["rating"] == 5
    age = load_dataset("trustpilot", "b", attribute="age")
    assert age.labels == [0] and age.report["label_source"] == "age"
    expect_error(["no attribute 'country'"], load_dataset, "trustpilot", attribute="country")
    expect_error(["no attribute 'gender'"], load_dataset, "sst2", attribute="gender")


def test_builtin_rejects_user_options(fake_data):
    expect_error(["text_column", "built-in"], load_dataset, "sst2", text_column="x")


def test_builtin_missing_file(fake_data):
    (fake_data / "trec" / "test.txt").unlink()
    expect_error(["test.txt", "missing"], load_dataset, "trec", "test")


def test_limit_reads_everything_and_keeps_label_ids(tmp_path):
    p = write(tmp_path / "d.csv", "text,label\nx,zeta\ny,alpha\nz,beta\n")
    full = load_dataset(p)
    lim = load_dataset(p, limit=1, limit_seed=None)  # the first row
    assert full.label_names == lim.label_names == ["alpha", "beta", "zeta"]
    assert lim.labels == [2] and lim.report["read"] == 3 and lim.report["kept"] == 1
    assert lim.report["per_label"] == {"alpha": 0, "beta": 0, "zeta": 1}
    assert load_dataset(p, limit=1).label_names == full.label_names  # a sample: same ids


def test_limit_is_a_seeded_sample_in_file_order(tmp_path):
    # Stored in label order, as financial_phrasebank's splits are: the first N would be one class.
    rows = [f"text {i},{'abc'[i // 100]}" for i in range(300)]
    p = write(tmp_path / "sorted.csv", "text,label\n" + "\n".join(rows) + "\n")
    a, b = load_dataset(p, limit=30), load_dataset(p, limit=30, limit_seed=0)
    assert a.texts == b.texts and len(a) == 30  # default seed 0: same seed, same rows
    assert set(a.labels) == {0, 1, 2}
    order = [int(t.split()[1]) for t in a.texts]
    assert order == sorted(order)  # file order among the chosen rows
    other = load_dataset(p, limit=30, limit_seed=1)
    assert other.texts != a.texts and set(other.labels) == {0, 1, 2}
    assert a.report["limit_seed"] == 0 and other.report["limit_seed"] == 1
    assert load_dataset(p, limit=30, limit_seed=None).labels == [0] * 30  # the head: one class
    assert load_dataset(p, limit=500).texts == load_dataset(p).texts  # N >= rows: every row


# --------------------------------------------------------------------------- user files


def test_user_csv_header_quoted_multiline(tmp_path):
    p = write(tmp_path / "mine.csv",
              'review,stars,who\n"line one\nline two, with comma",good,a\nplain,bad,b\n')
    ds = load_dataset(p, text_column="review", label_column="stars")
    assert ds.texts == ["line one\nline two, with comma", "plain"]
    assert ds.label_names == ["bad", "good"] and ds.labels == [1, 0]
    assert [e.line for e in ds] == [2, 4]
    assert ds[0].attrs == {"who": "a"}
    assert ds.name == "mine" and ds.report["format"] == "csv"


def test_user_csv_defaults_and_unlabelled(tmp_path):
    p = write(tmp_path / "u.csv", "\ufefftext,other\nhello,1\n")  # BOM is skipped
    ds = load_dataset(p)
    assert ds.texts == ["hello"] and ds[0].label is None
    assert ds.report["unlabelled"] == 1 and ds.report["label_source"] is None


def test_user_labels_numeric_order_and_label_names(tmp_path):
    p = write(tmp_path / "n.tsv", "sentence\tlabel\na\t10\nb\t9\nc\t2\n")
    assert load_dataset(p).label_names == ["2", "9", "10"]
    assert load_dataset(p).labels == [2, 1, 0]
    q = write(tmp_path / "q.csv", "text,label\na,pos\nb,neg\nc,1\n")
    ds = load_dataset(q, label_names=["neg", "pos"])
    assert ds.labels == [1, 0, 1]  # "1" is accepted as an index into label_names
    r = write(tmp_path / "r.csv", "text,label\na,pos\nb,neg\nc,maybe\n")
    expect_error(["r.csv", "line 4", "'label'", "unknown label 'maybe'"],
                 load_dataset, r, label_names=["neg", "pos"])
    s = write(tmp_path / "s.csv", "text,label\na,pos\nb,2\n")
    expect_error(["s.csv", "line 3", "unknown label '2'"], load_dataset, s,
                 label_names=["neg", "pos"])


def test_user_jsonl(tmp_path):
    rows = [{"q": "first", "a": "one", "y": 1}, {"q": "second", "a": "two", "y": 0}]
    p = write(tmp_path / "p.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n\n")
    ds = load_dataset(p, text_column="q", text_pair_column="a", label_column="y")
    assert ds.texts == ["first", "second"] and ds.text_pairs == ["one", "two"]
    assert ds.labels == [1, 0] and ds.report["blank_lines"] == 1


def test_user_attribute_column(tmp_path):
    p = write(tmp_path / "a.csv", "text,label,gender\nx,pos,f\ny,neg,m\n")
    ds = load_dataset(p, attribute="gender")
    assert ds.label_names == ["f", "m"] and ds.labels == [0, 1]
    assert ds[0].attrs == {"label": "pos"}


def test_user_lines_and_explicit_formats(tmp_path):
    ds = load_dataset(write(tmp_path / "t.txt", "one\n\ntwo\n"))
    assert ds.texts == ["one", "two"] and ds.report["blank_lines"] == 1
    lt = load_dataset(write(tmp_path / "s.data", "pos great\nneg bad\n"), format="label-text")
    assert lt.label_names == ["neg", "pos"] and lt.labels == [1, 0]
    tr = load_dataset(write(tmp_path / "t.q", "LOC:city Where ?\n"), format="trec")
    assert tr.labels == [4]
    tp = load_dataset(write(tmp_path / "tp.dat", "ok,2,1,0,x\n"), format="trustpilot")
    assert tp.labels == [1]


# --------------------------------------------------------------------------- errors


def test_missing_csv_column(tmp_path):
    p = write(tmp_path / "m.csv", "text,label\na,1\n")
    expect_error(["m.csv", "line 1", "missing column 'body'"], load_dataset, p,
                 text_column="body")
    expect_error(["m.csv", "line 1", "missing column 'y'"], load_dataset, p, label_column="y")
    q = write(tmp_path / "n.csv", "body,label\na,1\n")
    expect_error(["n.csv", "line 1", "missing column", "text_column"], load_dataset, q)


def test_missing_jsonl_field(tmp_path):
    p = write(tmp_path / "m.jsonl", '{"text": "a", "label": 1}\n{"txt": "b", "label": 0}\n')
    expect_error(["m.jsonl", "line 2", "'text'", "missing field"], load_dataset, p,
                 text_column="text")
    q = write(tmp_path / "q.jsonl", '{"text": "a", "label": 1}\n{"text": "b"}\n')
    expect_error(["q.jsonl", "line 2", "'label'", "missing label"], load_dataset, q)
    r = write(tmp_path / "r.jsonl", '{"text": "a"}\n{"text": "b", "label": 1}\n')
    expect_error(["r.jsonl", "line 2", "'label'"], load_dataset, r)


def test_unknown_label(tmp_path, fake_data):
    write(fake_data / "trec" / "train.txt", "DESC:manner ok ?\nFOO:bar what ?\n")
    expect_error(["train.txt", "line 2", "'label'", "unknown label 'FOO'"], load_dataset, "trec")
    write(fake_data / "sst2" / "stsa.binary.dev", "1 fine\n2 odd\n")
    expect_error(["stsa.binary.dev", "line 2", "unknown label '2'"], load_dataset,
                 "sst2-sentences", "dev")
    write(fake_data / "cb" / "val.jsonl", '{"premise": "a", "hypothesis": "b", "label": "x"}\n')
    expect_error(["val.jsonl", "line 1", "'label'", "unknown label 'x'"], load_dataset, "cb",
                 "val")
    write(fake_data / "trec" / "test.txt", "DESC what ?\n")
    expect_error(["test.txt", "line 1", "COARSE:fine"], load_dataset, "trec", "test")


def test_empty_text(tmp_path, fake_data):
    p = write(tmp_path / "e.csv", "text,label\na,1\n  ,0\n")
    expect_error(["e.csv", "line 3", "'text'", "empty text"], load_dataset, p)
    write(fake_data / "sst2" / "stsa.binary.train", "1 ok\n0 \n")
    expect_error(["stsa.binary.train", "line 2", "empty text"], load_dataset, "sst2-sentences")
    write(fake_data / "cb" / "val.jsonl",
          '{"premise": "a", "hypothesis": "", "label": "neutral"}\n')
    expect_error(["val.jsonl", "line 1", "'hypothesis'", "empty text"], load_dataset, "cb", "val")
    write(fake_data / "trustpilot" / "www2015_b.csv", 'ok,4,0,0,uk\n"",4,0,0,uk\n')
    expect_error(["www2015_b.csv", "line 2", "'review'", "empty"], load_dataset, "trustpilot",
                 "b")


def test_bad_encoding(tmp_path):
    p = write(tmp_path / "enc.csv", "text,label\nok,1\ncaf\xe9,0\n".encode("latin-1"))
    expect_error(["enc.csv", "line 3", "UTF-8", "0xe9"], load_dataset, p)


def test_wrong_field_count(tmp_path, fake_data):
    p = write(tmp_path / "w.csv", "text,label\na,1\nb,0,extra\n")
    expect_error(["w.csv", "line 3", "expected 2", "got 3"], load_dataset, p)
    write(fake_data / "sst2" / "dev.tsv", "sentence\tlabel\ngood\t1\nstray\ttab\t1\n")
    expect_error(["dev.tsv", "line 3", "expected 2", "got 3"], load_dataset, "sst2", "dev")
    write(fake_data / "trustpilot" / "www2015_a.csv", "ok,4,0,0,uk\n\"a,\nb\",4,0,0\n")
    expect_error(["www2015_a.csv", "line 2", "expected 5", "got 4"], load_dataset,
                 "trustpilot")


def test_trustpilot_bad_values(fake_data):
    f = fake_data / "trustpilot" / "www2015_a.csv"
    write(f, "ok,6,0,0,uk\n")
    expect_error(["www2015_a.csv", "line 1", "'rating'", "1-5"], load_dataset, "trustpilot")
    write(f, "ok,5,0,0,uk\nfine,5,2,0,uk\n")
    expect_error(["line 2", "'gender'", "0 or 1"], load_dataset, "trustpilot")
    write(f, "ok,5,0,x,uk\n")
    expect_error(["line 1", "'age'"], load_dataset, "trustpilot")
    write(f, "ok,5,0,1, \n")
    expect_error(["line 1", "'country'"], load_dataset, "trustpilot")


def test_bad_json(tmp_path):
    p = write(tmp_path / "b.jsonl", '{"text": "a", "label": 1}\n{"text": "b", "label": }\n')
    expect_error(["b.jsonl", "line 2", "bad JSON"], load_dataset, p)
    q = write(tmp_path / "l.jsonl", '["text", 1]\n')
    expect_error(["l.jsonl", "line 1", "JSON object"], load_dataset, q)
    r = write(tmp_path / "v.jsonl", '{"text": 5, "label": 1}\n')
    expect_error(["v.jsonl", "line 1", "'text'", "expected text"], load_dataset, r)


def test_malformed_csv_quote(tmp_path):
    p = write(tmp_path / "q.csv", 'text,label\na,1\n"broken "quote,0\n')
    expect_error(["q.csv", "line 3", "malformed CSV"], load_dataset, p)


def test_path_and_format_errors(tmp_path):
    expect_error(["nothere.csv", "no such file"], load_dataset, tmp_path / "nothere.csv")
    p = write(tmp_path / "x.parquet", "x")
    expect_error(["x.parquet", "format="], load_dataset, p)
    expect_error(["unknown format"], load_dataset, p, format="xml")
    expect_error(["empty"], load_dataset, write(tmp_path / "e.csv", ""))
    expect_error(["limit must be >= 0"], load_dataset, tmp_path / "e.csv", limit=-1)


# --------------------------------------------------------------------------- Dataset


def _toy(n: int = 20) -> Dataset:
    from rapt.data import Example

    ex = [Example(text=f"t{i}", label=int(i % 4 == 0), line=i + 1) for i in range(n)]
    return Dataset("toy", ex, ["a", "b"], "mem", {"read": n, "kept": n})


def test_subset_is_seeded_and_reported():
    ds = _toy()
    a, b, c = ds.subset(5, seed=1), ds.subset(5, seed=1), ds.subset(5, seed=2)
    assert a.texts == b.texts and a.texts != c.texts and len(a) == 5
    assert [e.line for e in a] == sorted(e.line for e in a)
    assert a.report["kept"] == 5 and sum(a.report["per_label"].values()) == 5
    assert a.report["read"] == 20
    assert len(ds.subset(100)) == 20


def test_split_partitions_and_stratifies():
    ds = _toy()
    x, y = ds.split(0.25, seed=0)
    assert len(x) == 5 and len(y) == 15
    assert sorted(x.texts + y.texts) == sorted(ds.texts)
    sx, sy = ds.split(0.4, seed=3, stratify=True)
    # 5 of label b and 15 of label a: 2 and 6 go to the first part
    assert sx.report["per_label"] == {"a": 6, "b": 2}
    assert sy.report["per_label"] == {"a": 9, "b": 3}
    assert ds.split(0.4, seed=3, stratify=True)[0].texts == sx.texts


# --------------------------------------------------------------------------- real files

REAL_COUNTS = {
    ("sst2", "train"): 67349, ("sst2", "dev"): 872,
    ("sst2-sentences", "train"): 6920, ("sst2-sentences", "dev"): 872,
    ("sst2-sentences", "test"): 1821,
    ("trec", "train"): 5452, ("trec", "test"): 500,
    ("cb", "train"): 250, ("cb", "val"): 56, ("cb", "test"): 250,
    # The data README says 2,031 / 2,033: the files hold 2,032 / 2,034 records (one per line,
    # no header; the first line is a review), i.e. the README counted line 1 as a header.
    ("trustpilot", "a"): 2032, ("trustpilot", "b"): 2034,
}


@pytest.mark.parametrize("name,split", sorted(REAL_COUNTS))
def test_real_shared_data(shared_data, monkeypatch, name, split):
    monkeypatch.setenv("RAPT_DATA_DIR", str(shared_data))
    ds = load_dataset(name, split)
    assert len(ds) == ds.report["read"] == REAL_COUNTS[(name, split)]
    assert ds.report["blank_lines"] == 0
    assert len(ds.label_names) == {"sst2": 2, "sst2-sentences": 2, "trec": 6, "cb": 3,
                                   "trustpilot": 5}[name]
    if (name, split) == ("cb", "test"):
        assert ds.report["unlabelled"] == len(ds)
    else:
        assert ds.report["unlabelled"] == 0
        assert sum(ds.report["per_label"].values()) == len(ds)
        assert all(v > 0 for v in ds.report["per_label"].values())
    assert set(BUILTINS) == {"sst2", "sst2-sentences", "trec", "cb", "trustpilot",
                             "financial_phrasebank"}


def test_real_trustpilot_attributes(shared_data, monkeypatch):
    monkeypatch.setenv("RAPT_DATA_DIR", str(shared_data))
    g = load_dataset("trustpilot", "a", attribute="gender")
    raw = Path(shared_data / "trustpilot" / "www2015_a.csv").read_text(encoding="utf-8")
    males = sum(1 for line in raw.splitlines() if line.rsplit(",", 4)[2] == "1")
    assert g.report["per_label"]["male"] == males


# --------------------------------------------------------------------------- CLI


def test_cli_data_check(tmp_path):
    from typer.testing import CliRunner

    from rapt.cli import app

    good = write(tmp_path / "g.csv", "text,label\na,x\nb,y\nc,y\n")
    r = CliRunner().invoke(app, ["data", "check", str(good)])
    assert r.exit_code == 0, r.output
    assert "read 3" in r.output and "y" in r.output
    r = CliRunner().invoke(app, ["data", "check", str(good), "--json"])
    assert json.loads(r.output)["per_label"] == {"x": 1, "y": 2}
    bad = write(tmp_path / "b.csv", "text,label\na,x\n,y\n")
    r = CliRunner().invoke(app, ["data", "check", str(bad)])
    assert r.exit_code == 2
    assert "b.csv" in r.output and "line 3" in r.output and "empty text" in r.output


# --------------------------------------------------------------------------- issue 13: user path


def test_text_at_label_user_files_explicit_and_guessed(tmp_path):
    """'sentence@label' lines (issue 13 item 2): selectable with format=, and guessed for .txt
    files whose lines end in '@word' (before: read silently as unlabelled text)."""
    body = "great movie@positive\nawful plot@negative\nan @ sign inside@positive\n"
    ds = load_dataset(write(tmp_path / "r.data", body), format="text-at-label")
    assert ds.texts[2] == "an @ sign inside" and ds.label_names == ["negative", "positive"]
    g = load_dataset(write(tmp_path / "r.txt", body))
    assert g.report["format"] == "text-at-label" and g.report["format_guessed"]
    assert g.labels == [1, 0, 1] and g.texts == ds.texts
    # Negative control: plain lines (an e-mail address inside one) stay unlabelled lines.
    plain = load_dataset(write(tmp_path / "p.txt", "mail me at a@b.com please\nhello\n"))
    assert plain.report["format"] == "lines" and not plain.report["format_guessed"]
    assert plain.report["unlabelled"] == 2
    # A line without '@' in a guessed file names the way out.
    bad = write(tmp_path / "b.txt", "good@pos\nbad@neg\nfun@pos\nok@pos\nno label here\n")
    expect_error(["b.txt", "line 5", "format='lines'"], load_dataset, bad)


def test_line_formats_with_too_many_distinct_labels_are_rejected(tmp_path):
    """'great movie@positive' read as label-text gives one label per line: a clear error
    naming the likely format instead of a silent 12-class dataset."""
    words = ["great", "awful", "fine", "bad", "nice", "dull", "fun", "poor", "good", "weak",
             "cool", "meh"]
    p = write(tmp_path / "s.data", "".join(f"{w} movie@{'positive' if i % 2 else 'negative'}\n"
                                           for i, w in enumerate(words)))
    expect_error(["s.data", "12 distinct labels in 12 lines", "format='text-at-label'"],
                 load_dataset, p, format="label-text")
    # Negative control: the right format loads, and a real label-text file is fine.
    assert load_dataset(p, format="text-at-label").num_labels == 2
    q = write(tmp_path / "q.data", "".join(f"{'pos' if i % 2 else 'neg'} {w} movie\n"
                                           for i, w in enumerate(words)))
    assert load_dataset(q, format="label-text").label_names == ["neg", "pos"]


def test_label_names_one_based_ids_are_explicit(tmp_path):
    """Integer labels 1..K with K names are read 1-based (with a note), not shifted silently
    into an 'unknown label K' error or the wrong class; ambiguous files ask for label_base."""
    one = write(tmp_path / "one.csv", "text,label\na,2\nb,1\nc,2\n")
    ds = load_dataset(one, label_names=["neg", "pos"])
    assert ds.labels == [1, 0, 1] and ds.report["label_base"] == 1
    assert ds.report["notes"] and "1-based" in ds.report["notes"][0]
    zero = write(tmp_path / "zero.csv", "text,label\na,1\nb,0\n")
    z = load_dataset(zero, label_names=["neg", "pos"])
    assert z.labels == [1, 0] and z.report["label_base"] == 0 and not z.report["notes"]
    amb = write(tmp_path / "amb.csv", "text,label\na,1\nb,1\n")
    expect_error(["amb.csv", "could be 0-based or 1-based", "label_base=0", "label_base=1"],
                 load_dataset, amb, label_names=["neg", "pos"])
    assert load_dataset(amb, label_names=["neg", "pos"], label_base=1).labels == [0, 0]
    assert load_dataset(amb, label_names=["neg", "pos"], label_base=0).labels == [1, 1]
    expect_error(["zero.csv", "line 3", "unknown label '0'", "1-based"], load_dataset, zero,
                 label_names=["neg", "pos"], label_base=1)


def test_cli_messages_speak_load_datasets_keywords_as_flags():
    from rapt.cli._app import flag_words

    assert flag_words("x; choose one with text_column=") == "x; choose one with --text-column"
    assert flag_words("pass format= one of ['csv']") == "pass --format one of ['csv']"
    assert flag_words("say which with label_base=0") == "say which with --label-base 0"
    assert flag_words("pass format='lines' to") == "pass --format lines to"
    assert (flag_words("'a' given as label_column (columns")
            == "'a' given as --label-column (columns")
    # paths and words that merely contain the names are left alone
    path = "/tmp/test_label_column0/f.csv: format"
    assert flag_words(path) == path


@pytest.mark.parametrize("argv", [
    ["tune", "d.csv", "--seed", "5", "--limit", "10"],
    ["sap", "tune", "d.csv", "--seed", "5", "--limit", "10"],
    ["attack", "attribute", "--data", "d.csv", "--seed", "5", "--limit", "10"],
])
def test_limit_sample_follows_the_commands_seed(argv, monkeypatch, tmp_path):
    """Commands whose --seed picks data order sample --limit's rows with it (load_dataset's
    limit_seed); the read stops there (a DataError), before any model is loaded."""
    from typer.testing import CliRunner

    import rapt.data
    from rapt.cli import app

    seen = []

    def record(*args, **kw):
        seen.append(kw)
        raise DataError("stopped after reading the options")

    monkeypatch.setattr(rapt.data, "load_dataset", record)
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, argv)
    assert r.exit_code == 2 and "stopped after reading" in r.output, r.output
    assert seen and seen[0]["limit"] == 10 and seen[0]["limit_seed"] == 5
