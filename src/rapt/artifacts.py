"""Tuned-prompt artifacts on disk: ``prompt.safetensors`` (tensors) + ``config.json``.

The JSON holds ``{"format", "version", "config", "meta"}``: the tuning config (method, prompt
length, ...) and the metadata (backbone, η, plain tokens, seed, label names, DP record, ...).
The reconstruction head is never saved (RAPT discards it after training).

An output folder is meant to be handed on, so it holds only what may be shared: the weights, the
config, and the *level* of the release's privacy (:func:`shareable_privacy`). What is computed on
the private rows outside any guarantee -- the privacy measured on them, a per-step training log, a
resume checkpoint -- goes *beside* the folder (:func:`beside`: ``OUT.<what>.NOT-PRIVATE.<ext>``),
readable by its owner only (:func:`write_private`, mode 0600; the service's store writes its
files with it too, so this module imports neither torch nor safetensors until a function needs
them).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

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
    torch = sys.modules.get("torch")  # a tensor means torch is loaded: never load it here
    if torch is not None and isinstance(x, torch.Tensor):
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
    from safetensors.torch import save_file

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
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(t_path))
    except Exception as e:  # safetensors raises its own error types
        raise ArtifactError(f"{t_path}: cannot read tensors ({e})") from e
    return tensors, doc["config"], doc["meta"]


# --------------------------------------------------------------------------- sharing a folder

TRAIN_LOG = "train-log.NOT-PRIVATE.json"  # per-step losses on private batches
LOCAL = "local.NOT-PRIVATE"  # + .json / .safetensors: the user's local model
LOCAL_FORMAT = "rapt-local-model"
MEASURED = "measured.NOT-PRIVATE.json"  # privacy (and loss) measured on the private rows
# A release's privacy report: these fields are its level (chosen before any row was seen); the
# others (measured P, inversion success, token count, a channel model's recovery) are
# statistics of the private rows, outside what the dχ guarantee covers.
SHAREABLE_PRIVACY = ("eta", "target_p", "eta_calibrated_on", "mode", "seeded")


def beside(out: str | Path, what: str) -> Path:
    """``OUT.<what>``: a file next to the output folder ``out``, never inside it, so the folder
    can be handed on as it is."""
    out = Path(out)
    if not out.name or out.name in (".", ".."):
        out = out.resolve()
    return out.with_name(f"{out.name}.{what}")


def write_private(path: str | Path, data: str | bytes) -> Path:
    """Write ``data`` to ``path`` atomically, readable and writable by its owner only (0600)
    from the first byte on (never a moment at the umask's mode)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    raw = data.encode() if isinstance(data, str) else data
    with os.fdopen(os.open(tmp, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600), "wb") as f:
        f.write(raw)
    os.chmod(tmp, 0o600)  # an existing .tmp keeps its old mode through O_CREAT
    os.replace(tmp, path)
    return path


def shareable_privacy(report: dict | None, backbone: str) -> dict | None:
    """The privacy of a release as a shared folder may state it: its level (η, the P η was
    calibrated for on public text, the search mode, seeded) and the shipped attack table's
    figures at that η (public text: P there and the best recovery of the attackers we ran). What was
    measured on the private rows is left out; :func:`write_private` puts it beside the folder."""
    if report is None:
        return None
    out = {k: report[k] for k in SHAREABLE_PRIVACY if k in report}
    if report.get("eta") is not None:
        from rapt.privacy.attack_table import SOURCE_NOTE, strongest_at

        ans = strongest_at(backbone, float(report["eta"]))
        out["table"] = {"source": SOURCE_NOTE, "p": ans.p, "strongest_attacker": ans.attacker_name,
                        "recovery": ans.recovery, "empirical_privacy": ans.empirical_privacy,
                        "reason": ans.reason}
    return out


def write_measured(out: str | Path, measured: dict) -> Path:
    """``OUT.measured.NOT-PRIVATE.json`` (0600): what was measured on the private rows (the
    release's full privacy report, a final loss), kept local."""
    doc = {"warning": "measured on the private rows, outside the privacy guarantee: keep "
           "local, never publish", **_jsonable(measured)}
    return write_private(beside(out, MEASURED), json.dumps(doc, indent=2) + "\n")


def write_train_log(out: str | Path, history: list[dict]) -> Path:
    """``OUT.train-log.NOT-PRIVATE.json`` (0600): per-step losses on private batches."""
    doc = {"warning": "per-step losses and accuracies on private batches: not covered by the "
           "privacy guarantee, keep local, never publish", "history": _jsonable(history)}
    return write_private(beside(out, TRAIN_LOG), json.dumps(doc) + "\n")


def write_local_model(out: str | Path, baseline: Any, fusion: Any = None) -> list[Path]:
    """``OUT.local.NOT-PRIVATE.json`` (metadata, vocabulary, fusion weights) and
    ``OUT.local.NOT-PRIVATE.safetensors`` (idf, coefficients), both 0600: the user's local model
    (a :class:`rapt.local.LocalBaseline`) and the weights that fuse it with the prompt. Its
    vocabulary holds words of the private rows: never inside ``out``, never uploaded."""
    from safetensors.numpy import save

    meta, arrays = baseline.state()
    doc = {"warning": "a model of the private rows (its vocabulary holds their words): keep "
           "local, never publish", "format": LOCAL_FORMAT, "baseline": meta,
           "fusion": fusion.to_dict() if fusion is not None else None}
    return [write_private(beside(out, LOCAL + ".safetensors"), save(arrays)),
            write_private(beside(out, LOCAL + ".json"), json.dumps(_jsonable(doc)) + "\n")]


def read_local_model(out: str | Path) -> tuple[Any, Any] | None:
    """(LocalBaseline, Fusion or None) saved beside ``out`` by :func:`write_local_model`; None
    when there is none. ArtifactError naming the file when one is there but unreadable."""
    from safetensors.numpy import load_file as load_np

    from rapt.local import Fusion, LocalBaseline

    js, st = beside(out, LOCAL + ".json"), beside(out, LOCAL + ".safetensors")
    try:
        doc = _read_pair(js, st, LOCAL_FORMAT, "the local model")
        if doc is None:
            return None
        baseline = LocalBaseline.from_state(doc["baseline"], load_np(str(st)))
        fusion = Fusion.from_dict(doc["fusion"]) if doc.get("fusion") else None
    except ArtifactError:
        raise
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error types
        raise ArtifactError(f"{js}: not a local model rapt can read: {e}") from e
    return baseline, fusion


def _read_pair(js: Path, st: Path, fmt: str, what: str) -> dict | None:
    """The JSON half of a (json, safetensors) pair, checked for its ``format``; None when
    neither file is there. ArtifactError when only one is; ValueError on another format."""
    if not js.exists() and not st.exists():
        return None
    for f in (js, st):
        if not f.exists():
            raise ArtifactError(f"{f}: missing ({what} is saved as two files)")
    doc = json.loads(js.read_text())
    if doc.get("format") != fmt:
        raise ValueError(f"field 'format' is {doc.get('format')!r}, not {fmt!r}")
    return doc


# ------------------------------------------------------------------ the output denoiser
# A user-side output denoiser is fitted on public text only (the provider's tuned prompt run on
# public sentences, clean and privatized): it may live inside the folder one shares, with the
# prompt it belongs to.
OUTPUT_DENOISER = "output_denoiser"  # OUT/output_denoiser.safetensors + .json
OUTPUT_DENOISER_FORMAT = "rapt-output-denoiser"
OUTPUT_DENOISER_VERSION = 1


def prompt_fingerprint(out: str | Path) -> str:
    """sha256 of ``OUT/prompt.safetensors``: the prompt an output denoiser was fitted for."""
    import hashlib

    return hashlib.sha256((Path(out) / TENSORS_FILE).read_bytes()).hexdigest()


def output_denoiser_paths(out: str | Path) -> tuple[Path, Path]:
    """(the JSON, the tensors) of the output denoiser inside ``out``."""
    out = Path(out)
    return out / f"{OUTPUT_DENOISER}.json", out / f"{OUTPUT_DENOISER}.safetensors"


def write_output_denoiser(out: str | Path, denoiser: Any, record: dict) -> list[Path]:
    """``OUT/output_denoiser.safetensors`` (its weights) and ``OUT/output_denoiser.json`` (its
    shape, the fingerprint of the prompt in ``out`` it was fitted for, and ``record``: the
    public corpus, η, rows and fit curve), beside the saved prompt."""
    from safetensors.torch import save_file

    js, st = output_denoiser_paths(out)
    state = {k: v.detach().cpu().contiguous().clone() for k, v in denoiser.state_dict().items()}
    save_file(state, str(st), metadata={"format": OUTPUT_DENOISER_FORMAT})
    doc = {"format": OUTPUT_DENOISER_FORMAT, "version": OUTPUT_DENOISER_VERSION,
           "note": "fitted on public text only (the tuned prompt's states on public sentences, "
           "clean and privatized): no private row went into it; it runs on the user's side, "
           "on the pooled states the provider returns for privatized queries",
           "hidden": int(denoiser.hidden), "width": int(denoiser.net[0].out_features),
           "prompt_sha256": prompt_fingerprint(out), "record": _jsonable(record)}
    js.write_text(json.dumps(doc, indent=2) + "\n")
    return [st, js]


def remove_output_denoiser(out: str | Path) -> list[Path]:
    """Delete an output denoiser left in ``out`` (it belongs to the prompt saved there before);
    the files removed."""
    gone = [p for p in output_denoiser_paths(out) if p.exists()]
    for p in gone:
        p.unlink()
    return gone


def read_output_denoiser(out: str | Path) -> tuple[Any, dict] | None:
    """(OutputDenoiser, its JSON document) saved in ``out`` by :func:`write_output_denoiser`;
    None when there is none. ArtifactError naming the file when it is incomplete, unreadable,
    or fitted for another prompt than the one in ``out``."""
    from safetensors.torch import load_file

    from rapt.local.denoise import OutputDenoiser

    js, st = output_denoiser_paths(out)
    try:
        doc = _read_pair(js, st, OUTPUT_DENOISER_FORMAT, "the output denoiser")
        if doc is None:
            return None
        den = OutputDenoiser(int(doc["hidden"]), int(doc["width"]))
        den.load_state_dict(load_file(str(st)))
    except ArtifactError:
        raise
    except Exception as e:  # noqa: BLE001 - safetensors and torch raise their own error types
        raise ArtifactError(f"{js}: not an output denoiser rapt can read: {e}") from e
    if doc.get("prompt_sha256") != prompt_fingerprint(out):
        raise ArtifactError(f"{js}: fitted for another prompt than {Path(out) / TENSORS_FILE} "
                            "(the folder's prompt was replaced); fit it again with `rapt tune "
                            "--output-denoiser`, or delete the two output_denoiser files")
    return den.eval(), doc
