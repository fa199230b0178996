"""Tuned-prompt artifacts on disk: ``prompt.safetensors`` (tensors) + ``config.json``.

The JSON holds ``{"format", "version", "config", "meta"}``: the tuning config (method, prompt
length, ...) and the metadata (backbone, η, plain tokens, seed, label names, DP record, ...).
The reconstruction head is never saved (RAPT discards it after training).
"""

from __future__ import annotations

import json
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


def save_artifact(folder: str | Path, tensors: dict[str, torch.Tensor], config: dict,
                  meta: dict) -> Path:
    """Write the artifact; returns the folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()},
              str(folder / TENSORS_FILE), metadata={"format": FORMAT})
    doc = {"format": FORMAT, "version": VERSION, "config": _jsonable(config),
           "meta": _jsonable(meta)}
    (folder / CONFIG_FILE).write_text(json.dumps(doc, indent=2, allow_nan=True) + "\n")
    return folder


def load_artifact(folder: str | Path) -> tuple[dict[str, torch.Tensor], dict, dict]:
    """-> (tensors, config dict, meta dict); raises :class:`ArtifactError` with the file name."""
    folder = Path(folder)
    cfg_path, t_path = folder / CONFIG_FILE, folder / TENSORS_FILE
    for p in (cfg_path, t_path):
        if not p.is_file():
            raise ArtifactError(f"{p}: missing (not a tuned-prompt folder?)")
    try:
        doc = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as e:
        raise ArtifactError(f"{cfg_path}: line {e.lineno}: invalid JSON ({e.msg})") from e
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ArtifactError(f"{cfg_path}: field 'format' must be {FORMAT!r}")
    if int(doc.get("version", 0)) > VERSION:
        raise ArtifactError(f"{cfg_path}: version {doc.get('version')} is newer than this rapt "
                            f"reads ({VERSION})")
    for key in ("config", "meta"):
        if not isinstance(doc.get(key), dict):
            raise ArtifactError(f"{cfg_path}: field {key!r} missing or not an object")
    try:
        tensors = load_file(str(t_path))
    except Exception as e:  # safetensors raises its own error types
        raise ArtifactError(f"{t_path}: cannot read tensors ({e})") from e
    return tensors, doc["config"], doc["meta"]
