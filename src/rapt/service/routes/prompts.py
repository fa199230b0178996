"""Tuned prompts: list, read, delete (a job's result; created by the job worker)."""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, Response

from rapt.service.deps import Owner, Svc, owner, prompt_of
from rapt.service.errors import errors
from rapt.service.schemas import DPGuarantee, PromptInfo

# On the router, so a route added here cannot forget the key check.
router = APIRouter(prefix="/v1/prompts", dependencies=[Depends(owner)], responses=errors(401))


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
                         "dp": _dp_guarantee(meta.get("dp"))})


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
