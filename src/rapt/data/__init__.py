"""Dataset loaders (see :mod:`rapt.data.dataset`)."""

from rapt.data.dataset import (
    BUILTINS,
    FORMATS,
    PAIR_COLUMNS,
    DataError,
    Dataset,
    Example,
    Reader,
    ReadSpec,
    Record,
    cli_message,
    columns_of,
    data_dir,
    format_for,
    label_descriptions_for,
    load_dataset,
    register_format,
)

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
    "cli_message",
    "columns_of",
    "data_dir",
    "format_for",
    "label_descriptions_for",
    "load_dataset",
    "register_format",
]
