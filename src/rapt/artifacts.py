"""Tuned-prompt artifacts on disk: ``prompt.safetensors`` (tensors) + ``config.json``.

The JSON holds ``{"format", "version", "config", "meta"}``: the tuning config (method, prompt
length, ...) and the metadata (backbone, η, plain tokens, seed, label names, DP record, ...).
The reconstruction head is never saved (RAPT discards it after training).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

FORMAT = "rapt-tuned-prompt"
VERSION = 1
TENSORS_FILE = "prompt.safetensors"
CONFIG_FILE = "config.json"


class ArtifactError(ValueError):
    """A tuned-prompt folder is missing, incomplete or malformed (message names the file)."""


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    if isinstance(x, torch.Tensor):
        return x.tolist()
    if isinstance(x, float) and x != x:  # NaN is not JSON
        return None
    if hasattr(x, "to_dict"):
        return _jsonable(x.to_dict())
    return x


@dataclass(frozen=True)
class Kind:
    """One kind of rapt artifact folder: its ``format`` tag, newest readable ``version`` and
    tensor file name (the JSON is always ``config.json``)."""

    format: str
    version: int
    tensors_file: str
    what: str  # named in errors: "tuned-prompt", "denoiser"


TUNED_PROMPT = Kind(FORMAT, VERSION, TENSORS_FILE, "tuned-prompt")


def save_artifact(folder: str | Path, tensors: dict[str, torch.Tensor], config: dict,
                  meta: dict, kind: Kind = TUNED_PROMPT) -> Path:
    """Write the artifact; returns the folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()},
              str(folder / kind.tensors_file), metadata={"format": kind.format})
    doc = {"format": kind.format, "version": kind.version, "config": _jsonable(config),
           "meta": _jsonable(meta)}
    (folder / CONFIG_FILE).write_text(json.dumps(doc, indent=2, allow_nan=True) + "\n")
    return folder


def read_config(folder: str | Path, kinds: tuple[Kind, ...] = (TUNED_PROMPT,)
                ) -> tuple[Kind, dict]:
    """(the folder's kind among ``kinds``, its config.json {"format", "version", "config",
    "meta"}), checked without reading the tensors; :class:`ArtifactError` names the file."""
    cfg_path = Path(folder) / CONFIG_FILE
    if not cfg_path.is_file():
        raise ArtifactError(f"{cfg_path}: missing (not a {' or '.join(k.what for k in kinds)} "
                            "folder?)")
    try:
        doc = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as e:
        raise ArtifactError(f"{cfg_path}: line {e.lineno}: invalid JSON ({e.msg})") from e
    kind = next((k for k in kinds if isinstance(doc, dict) and doc.get("format") == k.format),
                None)
    if kind is None:
        raise ArtifactError(f"{cfg_path}: field 'format' must be "
                            + " or ".join(repr(k.format) for k in kinds))
    if int(doc.get("version", 0)) > kind.version:
        raise ArtifactError(f"{cfg_path}: version {doc.get('version')} is newer than this rapt "
                            f"reads ({kind.version})")
    for key in ("config", "meta"):
        if not isinstance(doc.get(key), dict):
            raise ArtifactError(f"{cfg_path}: field {key!r} missing or not an object")
    return kind, doc


def load_artifact(folder: str | Path, kind: Kind = TUNED_PROMPT
                  ) -> tuple[dict[str, torch.Tensor], dict, dict]:
    """-> (tensors, config dict, meta dict); raises :class:`ArtifactError` with the file name."""
    folder = Path(folder)
    cfg_path, t_path = folder / CONFIG_FILE, folder / kind.tensors_file
    for p in (cfg_path, t_path):
        if not p.is_file():
            raise ArtifactError(f"{p}: missing (not a {kind.what} folder?)")
    _, doc = read_config(folder, (kind,))
    try:
        tensors = load_file(str(t_path))
    except Exception as e:  # safetensors raises its own error types
        raise ArtifactError(f"{t_path}: cannot read tensors ({e})") from e
    return tensors, doc["config"], doc["meta"]
