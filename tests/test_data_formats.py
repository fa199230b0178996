"""The format registry of rapt.data: readers found by name, suffix or sniffing, duplicates refused,
and one validation pass naming file, line and field for any reader's records."""

from __future__ import annotations

from pathlib import Path

import pytest

from rapt import data
from rapt.data import DataError, Reader, Record, format_for, load_dataset, register_format


@pytest.fixture
def registry():
    """FORMATS for the test to register into; its entries are restored afterwards (the same dict,
    since every module of rapt.data reads that one)."""
    saved = dict(data.FORMATS)
    yield data.FORMATS
    data.FORMATS.clear()
    data.FORMATS.update(saved)


def _read_pipes(text: str, path: Path, spec) -> list[Record | None]:
    """``label|text`` per line; blank lines are None."""
    out: list[Record | None] = []
    for i, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            out.append(None)
            continue
        label, _, body = line.partition("|")
        out.append(Record(i, body, label=label.strip()))
    return out


def test_builtin_formats_are_registered_with_their_suffixes():
    assert set(data.FORMATS) == {"csv", "tsv", "jsonl", "label-text", "text-at-label", "trec",
                                 "trustpilot", "lines"}
    assert [format_for(f"x{s}") for s in (".csv", ".TSV", ".ndjson", ".txt", ".dat")] == [
        "csv", "tsv", "jsonl", "lines", None]


def test_registry_refuses_a_duplicate_name_or_suffix(registry):
    with pytest.raises(ValueError, match="format 'csv' is already registered"):
        register_format(Reader("csv", _read_pipes))
    with pytest.raises(ValueError, match=r"suffix '\.tsv' already reads as format 'tsv'"):
        register_format(Reader("pipes", _read_pipes, suffixes=(".tsv",)))
    with pytest.raises(ValueError, match="lower-case and start with '.'"):
        register_format(Reader("pipes", _read_pipes, suffixes=("psv",)))
    assert "pipes" not in registry  # a refused reader is not half-registered


def test_a_new_reader_is_used_by_suffix_and_by_name(registry, tmp_path):
    register_format(Reader("pipes", _read_pipes, suffixes=(".psv",)))
    f = tmp_path / "reviews.psv"
    f.write_text("pos| a fine film \n\nneg|dull\n")
    ds = load_dataset(f)
    assert ds.texts == ["a fine film", "dull"] and ds.label_names == ["neg", "pos"]
    assert ds.labels == [1, 0] and [e.line for e in ds] == [1, 3]
    assert ds.report["format"] == "pipes" and ds.report["blank_lines"] == 1
    other = tmp_path / "reviews.dat"
    other.write_text("pos|good\n")
    assert load_dataset(other, format="pipes").texts == ["good"]
    with pytest.raises(DataError, match="formats: .*'pipes'"):
        load_dataset(other, format="pipe")


def test_the_validation_pass_checks_a_new_readers_records(registry, tmp_path):
    """The reader only splits lines; empty texts and unknown labels are caught for it, with the
    file, line and field."""
    register_format(Reader("pipes", _read_pipes, suffixes=(".psv",)))
    f = tmp_path / "bad.psv"
    f.write_text("pos|fine\nneg|   \n")
    with pytest.raises(DataError) as e:
        load_dataset(f)
    assert (e.value.path, e.value.line, e.value.field) == (str(f), 2, "text")
    assert "empty text" in str(e.value)
    f.write_text("pos|fine\nmeh|so so\n")
    with pytest.raises(DataError) as e:
        load_dataset(f, label_names=["neg", "pos"])
    assert (e.value.line, e.value.field) == (2, "label") and "unknown label 'meh'" in str(e.value)


def test_a_sniffer_claims_a_txt_file_and_is_reported_as_guessed(registry, tmp_path):
    register_format(Reader("pipes", _read_pipes,
                           sniff=lambda text: all("|" in s for s in text.splitlines() if s)))
    f = tmp_path / "notes.txt"
    f.write_text("pos|good\nneg|bad\n")
    ds = load_dataset(f)
    assert ds.report["format"] == "pipes" and ds.report["format_guessed"]
    assert load_dataset(f, format="lines").texts == ["pos|good", "neg|bad"]
