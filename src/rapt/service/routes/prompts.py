"""Tuned prompts: list, read, delete (a job's result; created by the job worker), and the
output denoiser a job fitted for one, for its owner's machine."""

from __future__ import annotations

import json
import logging
import math
import shutil
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, Response

from rapt.service.deps import Owner, Svc, owner, prompt_of
from rapt.service.errors import ServiceError, errors
from rapt.service.schemas import DenoiserHead, DPGuarantee, OutputDenoiserInfo, PromptInfo

log = logging.getLogger("rapt.service")

# On the router, so a route added here cannot forget the key check.
router = APIRouter(prefix="/v1/prompts", dependencies=[Depends(owner)],
                   responses=errors(401, 429))


@router.get("", response_model=list[PromptInfo])
def list_prompts(svc: Svc, me: Owner) -> list[PromptInfo]:
    """The caller's own prompts only."""
    return [_info(p) for p in svc.store.list_prompts(me)]


@router.get("/{prompt_id}", response_model=PromptInfo, responses=errors(404, 422))
def get_prompt(row: Annotated[dict, Depends(prompt_of)]) -> PromptInfo:
    return _info(row)


def _info(row: dict) -> PromptInfo:
    """The row, with the head, training check and DP guarantee that the worker saved in the
    prompt's config (read from its folder: they are not store columns)."""
    meta = _saved_meta(row.get("path"))
    check = meta.get("training_check")
    return PromptInfo(**{**row, "head": meta.get("head"),
                         "training_warnings": check.get("warnings")
                         if isinstance(check, dict) else None,
                         "dp": _dp_guarantee(meta.get("dp")),
                         "output_denoiser": _has_denoiser(row.get("path"))})


def _has_denoiser(path: str | None) -> bool:
    from rapt.artifacts import output_denoiser_paths

    return bool(path) and all(p.is_file() for p in output_denoiser_paths(path))


@router.get("/{prompt_id}/output-denoiser", response_model=OutputDenoiserInfo,
            responses=errors(404, 422, 503))
def get_output_denoiser(row: Annotated[dict, Depends(prompt_of)]) -> OutputDenoiserInfo:
    """The prompt's output denoiser (fitted by its job on public text, `output_denoiser`) and
    its task head, which the owner runs on its own machine on the pooled states that
    ``POST /v1/predict`` returns with ``return_pooled``. 404 when the prompt has none."""
    import base64
    import hashlib

    from safetensors.torch import load_file, save

    from rapt.artifacts import ArtifactError, load_artifact, output_denoiser_paths

    if not _has_denoiser(row.get("path")):
        raise ServiceError(404, "not_found", f"prompt '{row['id']}' has no output denoiser "
                           "(tune it with output_denoiser: true)")
    try:
        tensors, config, meta = load_artifact(row["path"])
        js, st = output_denoiser_paths(row["path"])
        doc = json.loads(js.read_text())
        den = load_file(str(st))
    except (ArtifactError, OSError, ValueError) as e:  # the detail holds no server path
        log.warning("prompt %s: output denoiser unreadable: %s", row["id"], e)
        raise ServiceError(503, "prompt_unavailable", f"prompt '{row['id']}': its output "
                           "denoiser's stored files are missing or damaged (the server log "
                           "says which)") from None
    kind = meta.get("head")
    if kind not in ("linear", "label-description"):
        raise ServiceError(422, "no_pooled_state", f"prompt '{row['id']}': its {kind} head "
                           "reads no pooled state")
    out = {f"denoiser.{k}": v for k, v in den.items()}
    out |= {k: v for k, v in tensors.items() if k.startswith("head.")}
    data = save({k: v.contiguous() for k, v in out.items()})
    head = DenoiserHead(kind=kind, num_labels=int(row["num_labels"]),
                        temperature=float(config.get("head_temperature"))
                        if kind == "label-description" else None)
    return OutputDenoiserInfo(prompt_id=row["id"], denoiser=doc, head=head,
                              tensors=base64.b64encode(data).decode(),
                              sha256=hashlib.sha256(data).hexdigest())


def _dp_guarantee(record: object) -> DPGuarantee | None:
    """The DP engine's record as the API shows it; None without DP, and for the noise-free
    runs older servers accepted (ε = ∞: no guarantee)."""
    if not isinstance(record, dict) or not math.isfinite(record.get("epsilon", math.inf)):
        return None
    return DPGuarantee(**{k: record[k] for k in DPGuarantee.model_fields})


def _saved_meta(path: str | None) -> dict:
    """The ``meta`` of the prompt folder's config.json; {} when it cannot be read (a prompt
    whose files are gone answers with its row alone)."""
    from rapt.artifacts import read_config

    if not path:
        return {}
    try:
        return read_config(path)[1]["meta"]
    except (ValueError, OSError):  # ArtifactError is a ValueError
        return {}


@router.delete("/{prompt_id}", status_code=204, response_class=Response,
               responses=errors(404, 422),
               dependencies=[Depends(prompt_of)])
def delete_prompt(prompt_id: str, svc: Svc, me: Owner) -> Response:
    """Delete a prompt and its files."""
    path = svc.store.delete_prompt(prompt_id, me)
    svc.forget_prompt(prompt_id)
    root = (svc.store.files / "prompts").resolve()
    if path and Path(path).resolve().parent == root:  # only ever our own folders
        shutil.rmtree(path, ignore_errors=True)
    return Response(status_code=204)
