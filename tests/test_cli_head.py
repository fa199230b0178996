"""Issue 32 item 5: `--head auto` does what its help says and the head chosen is printed;
`--label-descriptions` takes NAME=description pairs instead of an unstated label order."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from rapt.cli import app
from rapt.cli.options import parse_label_descriptions

NAMES = ["neg", "pos"]


def test_descriptions_by_name_in_any_order_or_by_id():
    assert parse_label_descriptions("pos=a good film|neg=a bad film", NAMES) == (
        ["a bad film", "a good film"], True)
    assert parse_label_descriptions("a bad film|a good film", NAMES) == (
        ["a bad film", "a good film"], False)
    # '=' inside a plain description is not a name
    assert parse_label_descriptions("x = y is bad|fine", NAMES)[1] is False
    for text, msg in [("pos=a|neg=b|pos=c", "described twice"), ("pos=a good film", "no "
                      "description for neg"), ("pos=a|bad", "every description as NAME="),
                      ("good=a|neg=b", "no label named 'good'"), ("a|b|c", "3 given for 2")]:
        with pytest.raises(ValueError, match=msg):
            parse_label_descriptions(text, NAMES)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, toy_backbone):
    tmp = tmp_path_factory.mktemp("head")
    bb = toy_backbone
    data = tmp / "d.csv"
    data.write_text("text,label\n" + "good film,pos\nbad film,neg\n" * 3)
    return tmp, str(bb), data


def _tune(tiny, *extra):
    tmp, bb, data = tiny
    out = tmp / f"art{len(extra)}"
    r = CliRunner().invoke(app, ["tune", str(data), "--out", str(out), "--backbone", bb,
                                 "--epochs", "1", "--num-virtual-tokens", "2", *extra])
    assert r.exit_code == 0, r.output
    return r, json.loads((out / "config.json").read_text())


def test_auto_head_is_printed_with_its_reason(tiny):
    """Before: auto silently picked linear for a user file (visible only in config.json)."""
    r, doc = _tune(tiny)
    assert "head: linear (auto: no label descriptions for this data" in r.stderr
    assert doc["meta"]["head"] == "linear"
    r, doc = _tune(tiny, "--label-descriptions", "pos=a good film|neg=a bad film")
    assert "head: label-description (auto: label descriptions given)" in r.stderr
    assert doc["meta"]["head"] == "label-description" and doc["meta"]["label_names"] == NAMES
    # matched by name: id 0 (neg) gets the 'bad' description whatever order they were given
    assert doc["config"]["label_descriptions"] == ["a bad film", "a good film"]
    r, doc = _tune(tiny, "--label-descriptions", "a bad film|a good film", "--head", "linear")
    assert "read in label id order: neg = 'a bad film'; pos = 'a good film'" in r.stderr
    assert "head: linear\n" in r.stderr  # not auto: no reason given


def test_default_method_is_printed(tiny):
    """Issue 32 item 1: without --method the run says which method it defaulted to."""
    r, doc = _tune(tiny)
    assert "method: lora (default; --method" in r.stderr
    assert doc["config"]["method"] == "lora"
    r, doc = _tune(tiny, "--method", "prefix")
    assert "method:" not in r.stderr and doc["config"]["method"] == "prefix"
    r, doc = _tune(tiny, "--dp-noise", "0.5", "--batch-size", "2")
    assert "method: prefix (default under DP" in r.stderr and doc["config"]["method"] == "prefix"
