"""Sentence pairs in a file whose columns have other names (MRPC's TSV: Quality, #1 ID, #2 ID,
#1 String, #2 String): the error names the columns that look like text or a label and every
option needed (text, pair, label); `rapt data check` proposes the columns it did not read.
Each test failed before ("choose one with --text-column" only)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from rapt.cli import app
from rapt.data import DataError, load_dataset
from rapt.data.columns import column_kinds, proposal

runner = CliRunner()
PAIRS = [
    ("1", "Amrozi accused his brother , whom he called the witness , of distorting evidence .",
     "Referring to him as only the witness , Amrozi accused his brother of distorting it ."),
    ("0", "Yucaipa owned Dominick 's before selling the chain to Safeway in 1998 .",
     "Yucaipa bought Dominick 's in 1995 for $ 693 million and sold it to Safeway ."),
    ("1", "They had published an advertisement on the Internet on June 10 , he added .",
     "On June 10 , the ship 's owners had published an advertisement on the Internet ."),
    ("0", "Around 0335 GMT , Tab shares were up 19 cents , or 4.4 % , at A $ 4.56 .",
     "Tab shares jumped 20 cents , or 4.6 % , to set a record closing high at A $ 4.57 ."),
]


@pytest.fixture()
def mrpc(tmp_path):
    """A small MRPC-like TSV (the layout of GLUE's msr_paraphrase_train.txt)."""
    f = tmp_path / "msr_paraphrase_train.tsv"
    lines = ["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"] + [
        f"{q}\t{7000 + 2 * i}\t{7001 + 2 * i}\t{a}\t{b}" for i, (q, a, b) in
        enumerate(PAIRS * 3)]
    f.write_text("\n".join(lines) + "\n")
    return f


def test_the_columns_that_look_like_text_and_like_a_label():
    cols = ["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"]
    rows = [[q, str(i), str(i + 1), a, b] for i, (q, a, b) in enumerate(PAIRS)]
    kinds = column_kinds(cols, rows)
    assert kinds == {"Quality": "label", "#1 ID": "other", "#2 ID": "other",
                     "#1 String": "text", "#2 String": "text"}
    assert proposal(kinds) == ("'#1 String', '#2 String' look like text, 'Quality' like a "
                               "label: text_column='#1 String' text_pair_column='#2 String' "
                               "label_column='Quality'")
    assert proposal(kinds, text="#1 String", pair="#2 String", label="Quality") == ""


def test_the_error_proposes_text_pair_and_label_columns(mrpc):
    with pytest.raises(DataError) as e:
        load_dataset(str(mrpc))
    msg = str(e.value)
    assert "line 1" in msg and "['Quality', '#1 ID', '#2 ID', '#1 String', '#2 String']" in msg
    assert "text_column='#1 String' text_pair_column='#2 String' label_column='Quality'" in msg
    r = runner.invoke(app, ["tune", str(mrpc), "--out", "never"])
    assert r.exit_code == 2
    assert ("--text-column '#1 String' --text-pair-column '#2 String' --label-column Quality"
            in r.stderr), r.stderr


def test_data_check_proposes_the_columns_it_did_not_read(mrpc):
    r = runner.invoke(app, ["data", "check", str(mrpc), "--text-column", "#1 String"])
    assert r.exit_code == 0, r.output
    assert "columns read: text '#1 String'; not read: 'Quality', '#1 ID', '#2 ID', " \
        "'#2 String'" in r.stdout
    assert "--text-pair-column '#2 String' --label-column Quality" in r.stdout
    r = runner.invoke(app, ["data", "check", str(mrpc), "--text-column", "#1 String",
                            "--text-pair-column", "#2 String", "--label-column", "Quality"])
    assert r.exit_code == 0, r.output
    assert "columns read: text '#1 String', pair '#2 String', label 'Quality'" in r.stdout
    assert "labels from 'Quality'" in r.stdout and "look like" not in r.stdout
    ds = load_dataset(str(mrpc), text_column="#1 String", text_pair_column="#2 String",
                      label_column="Quality")
    assert len(ds) == 12 and ds.text_pairs[0].startswith("Referring to him")
