"""Hugging Face `datasets` input (issue 13 item 11): a dataset saved with save_to_disk in the
test is read like a user's file, ClassLabel names included, and bad input names the problem."""

from __future__ import annotations

import pytest

from rapt.data import DataError, load_dataset

datasets = pytest.importorskip("datasets")  # a dev dependency: CI always has it


@pytest.fixture()
def saved(tmp_path):
    feats = datasets.Features({
        "sentence": datasets.Value("string"),
        "label": datasets.ClassLabel(names=["bad", "okay", "good"]),
        "author": datasets.Value("string"),
    })
    train = datasets.Dataset.from_dict(
        {"sentence": ["awful film", "fine film", "great film", "dull"],
         "label": [0, 1, 2, 0], "author": ["a", "b", "c", "d"]}, features=feats)
    test = datasets.Dataset.from_dict(
        {"sentence": ["lovely", "unseen"], "label": [-1, -1], "author": ["e", "f"]},
        features=feats)
    path = tmp_path / "reviews"
    datasets.DatasetDict({"train": train, "validation": test}).save_to_disk(str(path))
    return path


def test_saved_dataset_dict_reads_rows_labels_and_class_names(saved):
    ds = load_dataset(saved, "train")
    assert ds.texts == ["awful film", "fine film", "great film", "dull"]
    assert ds.label_names == ["bad", "okay", "good"]
    assert ds.labels == [0, 1, 2, 0]
    assert ds.examples[1].attrs == {"author": "b"}
    assert ds.examples[2].line == 3  # rows are numbered like lines


def test_split_aliases_and_unlabelled_minus_one(saved, tmp_path):
    ds = load_dataset(saved, "dev")  # dev -> validation; ClassLabel -1 = no label
    assert ds.texts == ["lovely", "unseen"]
    assert [e.label for e in ds] == [None, None]
    assert ds.label_names == ["bad", "okay", "good"]
    # Half-labelled rows are refused as in a JSONL file, naming the row.
    mixed = datasets.Dataset.from_dict(
        {"sentence": ["a", "b"], "label": [1, -1]},
        features=datasets.Features({"sentence": datasets.Value("string"),
                                    "label": datasets.ClassLabel(names=["n", "p"])}))
    mixed.save_to_disk(str(tmp_path / "mixed"))
    with pytest.raises(DataError, match="missing label") as e:
        load_dataset(tmp_path / "mixed")
    assert e.value.line == 2


def test_single_saved_dataset_and_columns(tmp_path):
    d = datasets.Dataset.from_dict({"premise": ["p1", "p2"], "hypothesis": ["h1", "h2"],
                                    "y": ["yes", "no"]})
    d.save_to_disk(str(tmp_path / "nli"))
    ds = load_dataset(tmp_path / "nli", text_column="premise", text_pair_column="hypothesis",
                      label_column="y")
    assert [(e.text, e.text_pair) for e in ds] == [("p1", "h1"), ("p2", "h2")]
    assert ds.label_names == ["no", "yes"] and ds.labels == [1, 0]


def test_missing_split_and_column_are_named(saved):
    with pytest.raises(DataError, match=r"no split 'test' \(splits: \['train', 'validation'\]\)"):
        load_dataset(saved, "test")
    with pytest.raises(DataError, match="missing field") as e:
        load_dataset(saved, "train", text_column="review")
    assert e.value.line == 1 and e.value.field == "review"


def test_plain_folder_is_a_clear_error(tmp_path):
    (tmp_path / "notes").mkdir()
    with pytest.raises(DataError, match="is a folder, not a data file"):
        load_dataset(tmp_path / "notes")


def test_hub_ids_go_to_the_hub_and_failures_are_data_errors(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # no local file of that name
    calls = []

    def offline(*args, **kw):  # what the hub answers on a machine without network
        calls.append(args)
        raise ConnectionError("Couldn't reach the Hugging Face Hub")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(DataError, match="cannot load this Hugging Face dataset: ConnectionError"):
        load_dataset("no-such-owner/no-such-dataset")
    with pytest.raises(DataError, match="cannot load"):
        load_dataset("hf:nyu-mll/glue:sst2", "dev")
    assert calls == [("no-such-owner/no-such-dataset", None), ("nyu-mll/glue", "sst2")]
    # Not hub ids: a missing file stays a missing-file error.
    with pytest.raises(DataError, match="no such file"):
        load_dataset("reviews.csv")
