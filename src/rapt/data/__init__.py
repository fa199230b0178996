"""Dataset loaders: the shared benchmark files and a user's own CSV / TSV / JSONL / text files.

Every loader reads the whole file, validates every record and either returns all of them or
raises :class:`DataError` naming the file, the 1-based line and the problem. Nothing is dropped
silently: blank lines (which are not records) are counted in ``Dataset.report``, and ``limit``
keeps a seeded random sample of rows (file order kept) only after the whole file has been read
and checked, so label ids never depend on ``limit``.

Built-in names (files under :func:`data_dir`):

========================  ==============================================  ====================
name                      splits                                          format
========================  ==============================================  ====================
``sst2``                  train, dev (``train.tsv``, ``dev.tsv``)         GLUE TSV with header
``sst2-sentences``        train, dev, test (``stsa.binary.*``)            ``LABEL sentence``
``trec``                  train, test                                     ``COARSE:fine text``
``cb``                    train, val, test (test has no labels)           JSONL pairs
``trustpilot``            a / train (``www2015_a.csv``), b / test (``_b``) CSV, no header
``financial_phrasebank``  train, dev, test (seeded split of one file)     ``SENTENCE@LABEL``
========================  ==============================================  ====================

``validation`` and ``dev`` are accepted for each other (``val`` too).

A name is opened as a built-in, then as a Hugging Face dataset, then as a file. A file's format
is a :class:`Reader` in :data:`FORMATS`, chosen by ``format=``, by suffix or by sniffing the
text; :func:`register_format` adds one. Readers only find records; one validation pass checks
every record's texts and labels.

The package, one job per module: :mod:`.dataset` (the dataset model and :class:`DataError`),
:mod:`.formats` (readers, the format registry, validation), :mod:`.labels` (raw labels to ids),
:mod:`.sources` (built-ins, Hugging Face, files), :mod:`.load` (:func:`load_dataset`) and
:mod:`.messages` (how errors name load_dataset's keywords).
"""

from rapt.data.dataset import DataError, Dataset, Example
from rapt.data.formats import (
    FORMATS,
    PAIR_COLUMNS,
    Reader,
    ReadSpec,
    Record,
    format_for,
    register_format,
)
from rapt.data.load import columns_of, load_dataset
from rapt.data.sources import BUILTINS, data_dir, label_descriptions_for

__all__ = [
    "BUILTINS",
    "FORMATS",
    "PAIR_COLUMNS",
    "DataError",
    "Dataset",
    "Example",
    "ReadSpec",
    "Reader",
    "Record",
    "columns_of",
    "data_dir",
    "format_for",
    "label_descriptions_for",
    "load_dataset",
    "register_format",
]
