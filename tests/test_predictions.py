"""The one prediction format (issue 32 item 2): rows with text, label name, gold name and
probabilities keyed by label name; JSONL or CSV by suffix; accuracy and confusion table."""

from __future__ import annotations

import csv
import io
import json

import pytest

from rapt.predictions import Predictions, check_out_path, write_predictions

PROBS = [[0.9, 0.1, 0.0], [0.2, 0.7, 0.1], [0.1, 0.2, 0.7], [0.6, 0.3, 0.1]]
NAMES = ["negative", "neutral", "positive"]


def _preds(**kw) -> Predictions:
    return Predictions(NAMES, PROBS, texts=["a", "b", "c", "d"], **kw)


def test_records_name_labels_and_key_probabilities_by_name():
    recs = _preds(gold=[0, 1, 1, 2]).records()
    assert [r["label"] for r in recs] == ["negative", "neutral", "positive", "negative"]
    assert [r["gold"] for r in recs] == ["negative", "neutral", "neutral", "positive"]
    assert recs[1]["probabilities"] == {"negative": 0.2, "neutral": 0.7, "positive": 0.1}
    assert [r["row"] for r in recs] == [0, 1, 2, 3] and recs[2]["text"] == "c"
    assert "gold" not in _preds().records()[0] and "text_pair" not in recs[0]


def test_accuracy_and_confusion():
    p = _preds(gold=[0, 1, 1, 2])
    assert p.accuracy() == pytest.approx(0.5)
    assert p.confusion() == [[1, 0, 0], [0, 1, 1], [1, 0, 0]]
    table = p.confusion_table()
    assert table[0].startswith("confusion (rows: gold, columns: predicted)")
    neutral = next(line for line in table if line.startswith("neutral"))
    assert neutral.split() == ["neutral", "0", "1", "1", "0.500"]
    # a row without gold: no accuracy, no table
    assert _preds(gold=[0, None, 1, 2]).accuracy() is None
    assert _preds(gold=[0, None, 1, 2]).confusion_table() == []


def test_jsonl_and_csv_by_suffix(tmp_path):
    p = Predictions(NAMES, PROBS, texts=["a", "b", "c", "d"],
                    text_pairs=["x", None, "z", "w"], gold=[0, 1, 1, 2])
    assert write_predictions(tmp_path / "p.jsonl", p) == "jsonl"
    rows = [json.loads(x) for x in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert rows == p.records() and rows[1]["text_pair"] is None
    assert write_predictions(tmp_path / "p.CSV", p) == "csv"
    got = list(csv.DictReader(io.StringIO((tmp_path / "p.CSV").read_text())))
    assert list(got[0]) == ["row", "text", "text_pair", "label", "gold", "p(negative)",
                            "p(neutral)", "p(positive)"]
    assert [g["label"] for g in got] == [r["label"] for r in rows]
    assert float(got[2]["p(positive)"]) == pytest.approx(0.7) and got[1]["text_pair"] == ""
    for bad in ("p.json", "p.txt", "p"):
        with pytest.raises(ValueError, match=r"\*\.jsonl or \*\.csv"):
            check_out_path(tmp_path / bad)


def test_summary_shows_counts_and_only_the_first_rows():
    p = Predictions(["neg", "pos"], [[0.8, 0.2]] * 12 + [[0.1, 0.9]] * 3,
                    texts=[f"t{i}" for i in range(15)])
    assert p.summary() == "15 predictions: neg 12 (80.0 %), pos 3 (20.0 %)"
    rows = p.first_rows()
    assert rows[:2] == ["neg\tt0", "neg\tt1"] and len(rows) == 11
    assert rows[-1].startswith("... and 5 more")
    lines = p.report_lines()
    assert lines[0] == p.summary() and not any("accuracy" in x for x in lines)


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="row 1 has 2 probabilities for 3 labels"):
        Predictions(NAMES, [[0.2, 0.3, 0.5], [0.5, 0.5]])
    with pytest.raises(ValueError, match="texts: 1 entries for 2 predictions"):
        Predictions(["a", "b"], [[1, 0], [0, 1]], texts=["x"])
    with pytest.raises(ValueError, match="distinct"):
        Predictions(["a", "a"], [[1, 0]])


def test_sources_are_written_beside_the_prediction_and_scored():
    """A combined prediction keeps each model's probabilities: JSONL keys
    probabilities_SOURCE, CSV columns p_SOURCE(NAME), and each model's accuracy."""
    remote = [[0.6, 0.4], [0.3, 0.7], [0.8, 0.2]]
    local = [[0.1, 0.9], [0.2, 0.8], [0.9, 0.1]]
    fused = [[0.2, 0.8], [0.1, 0.9], [0.95, 0.05]]
    p = Predictions(["neg", "pos"], fused, texts=["a", "b", "c"], gold=[1, 1, 0],
                    sources={"remote": remote, "local": local, "fused": fused})
    assert p.accuracy() == 1.0 and p.accuracy("fused") == 1.0
    assert p.accuracy("remote") == pytest.approx(2 / 3) and p.accuracy("local") == 1.0
    rec = json.loads(p.render("jsonl").splitlines()[0])
    assert rec["probabilities"] == {"neg": 0.2, "pos": 0.8}
    assert rec["probabilities_remote"] == {"neg": 0.6, "pos": 0.4}
    assert rec["probabilities_local"] == {"neg": 0.1, "pos": 0.9}
    head, first, *_ = p.render("csv").splitlines()
    assert head == ("row,text,label,gold,p(neg),p(pos),p_remote(neg),p_remote(pos),"
                    "p_local(neg),p_local(pos),p_fused(neg),p_fused(pos)")
    assert first == "0,a,pos,pos,0.2,0.8,0.6,0.4,0.1,0.9,0.2,0.8"
    assert "accuracy by model: remote 66.7 %, local 100.0 %, fused 100.0 %" in p.report_lines()
    plain = Predictions(["neg", "pos"], fused, gold=[1, 1, 0])
    assert not any("by model" in line for line in plain.report_lines())
    with pytest.raises(ValueError, match=r"sources\['local'\]: not 3 rows of 2"):
        Predictions(["neg", "pos"], fused, sources={"local": local[:2]})
