"""Financial PhraseBank loader (SAP's FP task): SENTENCE@LABEL, the paper's split sizes."""

from __future__ import annotations

import pytest

from rapt.data import DataError, load_dataset


def test_financial_phrasebank_split(shared_data):
    if not (shared_data / "financial_phrasebank" / "Sentences_AllAgree.txt").is_file():
        pytest.skip("Financial PhraseBank not in the shared data folder")
    parts = {s: load_dataset("financial_phrasebank", s) for s in ("train", "dev", "test")}
    assert [len(parts[s]) for s in ("train", "dev", "test")] == [1812, 226, 226]
    lines = [{e.line for e in d} for d in parts.values()]
    assert not (lines[0] & lines[1]) and not (lines[0] & lines[2]) and not (lines[1] & lines[2])
    assert sum(len(x) for x in lines) == parts["train"].report["read"] == 2264
    assert parts["train"].label_names == ["negative", "neutral", "positive"]
    again = load_dataset("financial_phrasebank", "validation")
    assert again.texts == parts["dev"].texts  # a fixed split, the same every time
    with pytest.raises(DataError, match="no split 'a'"):
        load_dataset("financial_phrasebank", "a")


def test_text_at_label_format(tmp_path):
    f = tmp_path / "fp.txt"
    f.write_text("Profit rose @ 5 % .@positive\nSales fell .@negative\n\n")
    d = load_dataset(f, format="text-at-label")
    assert d.texts == ["Profit rose @ 5 % .", "Sales fell ."]  # label after the LAST @
    assert d.labels == [1, 0] and d.label_names == ["negative", "positive"]
    f.write_text("Profit rose .@positive\nno label here\n")
    with pytest.raises(DataError, match=r"fp.txt, line 2.*no '@'"):
        load_dataset(f, format="text-at-label")
    f.write_text("Profit rose .@positive\n@negative\n")
    with pytest.raises(DataError, match=r"line 2, field 'text'.*empty"):
        load_dataset(f, format="text-at-label")
    f.write_text("Profit rose .@\n")
    with pytest.raises(DataError, match=r"line 1, field 'label'.*empty label"):
        load_dataset(f, format="text-at-label")


def test_limit_on_fp_samples_every_class(shared_data):
    """FP's training split is stored in label order: ``--limit 300`` must not train on one
    class. Same seed, same rows; the command's --seed picks another sample."""
    import json

    from typer.testing import CliRunner

    from rapt.cli import app

    if not (shared_data / "financial_phrasebank" / "Sentences_AllAgree.txt").is_file():
        pytest.skip("Financial PhraseBank not in the shared data folder")
    full = load_dataset("financial_phrasebank").report["per_label"]
    share = {k: n / sum(full.values()) for k, n in full.items()}
    head = load_dataset("financial_phrasebank", limit=300, limit_seed=None).report["per_label"]
    assert head["positive"] / 300 > share["positive"] + 0.4  # why a sample: the head is skewed
    r = CliRunner().invoke(app, ["data", "check", "financial_phrasebank", "--limit", "300",
                                 "--json"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["kept"] == 300 and all(n > 0 for n in report["per_label"].values())
    for k, n in report["per_label"].items():  # the split's proportions, within sampling noise
        assert abs(n / 300 - share[k]) < 0.08, (k, n, share)
    a = load_dataset("financial_phrasebank", limit=300, limit_seed=7)
    assert a.texts == load_dataset("financial_phrasebank", limit=300, limit_seed=7).texts
    assert a.texts != load_dataset("financial_phrasebank", limit=300).texts
    assert [e.line for e in a] == sorted(e.line for e in a)
