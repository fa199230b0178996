"""Datasets: a user's privatized token rows (upload, list, read, delete)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Response

from rapt.service.deps import Owner, Svc, dataset_of, owner
from rapt.service.errors import ServiceError, errors
from rapt.service.schemas import DatasetInfo, DatasetUpload
from rapt.service.state import Service
from rapt.service.store import QuotaError

# On the router, so a route added here cannot forget the key check.
router = APIRouter(prefix="/v1/datasets", dependencies=[Depends(owner)],
                   responses=errors(401, 429))


@router.post("", status_code=201, response_model=DatasetInfo, responses=errors(422, 429))
def upload_dataset(body: DatasetUpload, svc: Svc, me: Owner) -> DatasetInfo:
    """Store a privatized dataset. Per-key quotas: max_datasets_per_key datasets and
    max_dataset_bytes_per_key bytes (429 quota_exceeded)."""
    name = svc.backbone_name(body.backbone)
    ids = svc.rows_of(name, body.input_ids, body.texts, svc.limits.max_examples,
                      "max_examples", text_pairs=body.text_pairs)
    if body.plain_ids is not None:
        _check_plain_ids(svc, name, body.plain_ids, ids)
    try:
        did = svc.store.create_dataset(
            me, name, ids, body.labels, body.num_labels, body.privacy.model_dump(),
            body.plain_ids, max_count=svc.limits.max_datasets_per_key,
            max_bytes=svc.limits.max_dataset_bytes_per_key)
    except QuotaError as e:
        raise ServiceError(429, "quota_exceeded", str(e)) from None
    svc.count_privatized("datasets", name, ids, body.privacy.model_dump())
    return DatasetInfo(**svc.store.get_dataset(did, me))


def _check_plain_ids(svc: Service, backbone: str, plain_ids: list[int],
                     ids: list[list[int]]) -> None:
    """422 unless ``plain_ids`` are token ids of ``backbone`` that fit every row of ``ids``."""
    vocab = int(svc.backbones[backbone].embeddings.shape[0])
    bad = [j for j, t in enumerate(plain_ids) if not 0 <= t < vocab]
    if bad:
        raise ServiceError(422, "invalid_token_id",
                           f"plain_ids[{bad[0]}] = {plain_ids[bad[0]]} is not a "
                           f"token id of backbone '{backbone}' (vocabulary size {vocab})")
    from rapt.tuning.reconstruction import plain_offset

    # The trainer reads row i's plain tokens at positions off .. off + m: a shorter
    # row would fail only when a job runs.
    need = plain_offset(svc.backbones[backbone].tokenizer) + len(plain_ids)
    short = next((i for i, r in enumerate(ids) if len(r) < need), None)
    if short is not None:
        raise ServiceError(422, "validation_error",
                           f"plain_ids: {len(plain_ids)} plain tokens (after "
                           f"{need - len(plain_ids)} leading special tokens) do "
                           f"not fit input_ids[{short}], which has "
                           f"{len(ids[short])} tokens")


@router.get("", response_model=list[DatasetInfo])
def list_datasets(svc: Svc, me: Owner) -> list[DatasetInfo]:
    """The caller's own datasets only."""
    return [DatasetInfo(**d) for d in svc.store.list_datasets(me)]


@router.get("/{dataset_id}", response_model=DatasetInfo, responses=errors(404, 422))
def get_dataset(row: Annotated[dict, Depends(dataset_of)]) -> DatasetInfo:
    return DatasetInfo(**row)


@router.delete("/{dataset_id}", status_code=204, response_class=Response,
               responses=errors(404, 409, 422),
               dependencies=[Depends(dataset_of)])
def delete_dataset(dataset_id: str, svc: Svc, me: Owner) -> Response:
    """Erase a dataset's data (409 while a queued or running job uses it). Prompts tuned
    on it stay until they are deleted themselves."""
    active = svc.store.delete_dataset(dataset_id, me)
    if active:
        raise ServiceError(409, "conflict", f"dataset '{dataset_id}' is in use by job(s) "
                           f"{', '.join(active)}; cancel them first")
    return Response(status_code=204)
