"""Tuning jobs: create (checked before anything is stored), list, read, cancel."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Depends

from rapt.config import DP_METHODS, tune_config
from rapt.service.deps import Owner, Svc, job_of, owned, owner
from rapt.service.errors import ServiceError, errors
from rapt.service.inference import backbone_positions, positions_used
from rapt.service.schemas import JobCreate, JobStatus
from rapt.service.state import Service
from rapt.service.store import QueueFullError
from rapt.service.worker import planned_steps

# On the router, so a route added here cannot forget the key check.
router = APIRouter(prefix="/v1/jobs", dependencies=[Depends(owner)],
                   responses=errors(401, 429))


def job_status(svc: Service, job: dict) -> JobStatus:
    """A job row as the API shows it, with live progress and an ETA (s) while it runs."""
    live = svc.jobs.live_progress(job["id"]) if job["state"] == "running" else None
    cur = {**job, **live} if live else job
    step, total = int(cur["step"] or 0), cur["total_steps"]
    elapsed = float(cur["elapsed"] or 0.0)
    eta = None
    if job["state"] == "running" and total and step > 0:
        # Average rate over all runs (a resumed job's elapsed includes earlier runs).
        eta = elapsed / step * (total - step)
    elif job["state"] == "succeeded":
        eta = 0.0
    stage = cur.get("stage")
    if job["state"] == "running" and stage and 0 < stage["done"] < stage["total"]:
        # after the training steps: the stage's own rate (the training's says nothing of it)
        eta = (time.time() - stage["started"]) / stage["done"] * (stage["total"] - stage["done"])
    return JobStatus(id=job["id"], dataset_id=job["dataset_id"], backbone=job["backbone"],
                     state=job["state"], method=job["params"].get("method", "prompt"),
                     step=step, total_steps=total, loss=cur["loss"], epoch=cur["epoch"],
                     epsilon=cur.get("epsilon"),
                     delta=(job["params"].get("dp") or {}).get("delta"),
                     elapsed_s=elapsed, eta_s=eta, resumed_from_step=job["resumed_from_step"],
                     prompt_id=job["prompt_id"], error=job["error"], created=job["created"],
                     channel=job["params"].get("channel"), stage=stage)


@router.post("", status_code=202, response_model=JobStatus,
             responses=errors(404, 422, 429, 503))
def create_job(body: JobCreate, svc: Svc, me: Owner) -> JobStatus:
    ds = owned(svc, "dataset", body.dataset_id, me)
    svc.require_backbone("dataset", ds)
    _check_job(svc, body, ds)
    # Rows are at most max_seq_len long already (checked at upload).
    params = body.model_dump()
    params["max_length"] = min(body.max_length, svc.limits.max_seq_len)
    # The prompt keeps the data's declared η, so queries default to it even after the
    # dataset is deleted (which erases the dataset's own copy).
    params["privacy"] = ds["privacy"]
    params["channel"] = _job_channel(svc, body, ds)
    if params["dp"] is not None:  # the δ it trains with, recorded for every status to show
        params["dp"]["delta"] = tune_config(params).dp.resolve_delta(ds["n_examples"])
    try:  # queue capacity checked and the row inserted in one transaction: a 429 leaves
        # no row, and API processes sharing the store cannot overfill the queue together
        jid = svc.store.create_job(me, ds["id"], ds["backbone"], params,
                                   max_queued=svc.limits.max_queued_jobs,
                                   max_queued_per_key=svc.limits.max_queued_jobs_per_key)
    except QueueFullError as e:
        raise ServiceError(429, "queue_full", f"{e}; retry later") from e
    except LookupError as e:  # deleted since it was read above
        raise ServiceError(404, "not_found", f"no dataset '{body.dataset_id}'") from e
    svc.jobs.submit(jid)
    return job_status(svc, svc.store.get_job(jid, me))


def _job_channel(svc: Service, body: JobCreate, ds: dict) -> dict | None:
    """The channel model the job will read its rows back through (what the job records, and
    its worker checks it holds): the server's for the dataset's backbone when the rows were
    privatized, unless ``use_channel`` is false; 422 when ``use_channel`` is true and there is
    none to use."""
    info = svc.channel_info(ds["backbone"])
    privatized = (ds["privacy"] or {}).get("mechanism", "none") != "none"
    if body.use_channel is False:
        return None
    if body.use_channel and (info is None or not privatized):
        why = (f"this server holds no channel model for backbone '{ds['backbone']}'"
               if info is None else f"dataset '{ds['id']}' was uploaded unprivatized "
               "(mechanism 'none'): there is nothing to read back")
        raise ServiceError(422, "channel_unavailable", f"use_channel: {why}; leave "
                           "use_channel out or false")
    return info if privatized else None


def _check_job(svc: Service, body: JobCreate, ds: dict) -> None:
    """422 for a job that would fail, or run for days, only once it runs."""
    used = positions_used(body.method, body.num_virtual_tokens)
    limit, why = svc.row_limit(ds["backbone"], used)
    if ds["max_row_len"] > limit:
        pos = backbone_positions(svc.backbones[ds["backbone"]]) or 0
        room = pos - ds["max_row_len"]
        fix = (f"use num_virtual_tokens <= {room}" if used and room >= 1 else
               "upload shorter rows")
        raise ServiceError(422, "limit_exceeded",
                           f"num_virtual_tokens={body.num_virtual_tokens}: dataset "
                           f"'{ds['id']}' has rows of up to {ds['max_row_len']} tokens, "
                           f"more than the limit of {why}; {fix}")
    if body.reconstruction and not ds["plain_ids"]:
        raise ServiceError(422, "validation_error",
                           "reconstruction needs a dataset uploaded with plain_ids")
    if body.label_descriptions is not None and len(body.label_descriptions) != \
            ds["num_labels"]:
        raise ServiceError(422, "validation_error",
                           f"label_descriptions: {len(body.label_descriptions)} given, "
                           f"dataset '{ds['id']}' has {ds['num_labels']} labels")
    if body.output_denoiser:
        _check_output_denoiser(svc, body, ds)
    if body.dp is not None and body.method not in DP_METHODS:
        raise ServiceError(422, "validation_error",
                           f"dp: PromptDPSGD covers prompt and prefix tuning only "
                           f"(method={body.method!r})")
    try:
        tune_config(body.model_dump())  # the trainer's own checks, before anything is stored
    except ImportError as e:
        raise ServiceError(422, "unsupported", f"this server cannot run that job: {e}") from e
    except (TypeError, ValueError) as e:
        raise ServiceError(422, "validation_error", str(e)) from e
    try:
        steps = planned_steps(body.model_dump(), ds["n_examples"])
    except ValueError as e:
        raise ServiceError(422, "validation_error", str(e)) from e
    if steps > svc.limits.max_steps_per_job:
        knobs = ("epochs, dp.sample_rate or batch_size" if body.dp is not None
                 else "epochs or batch_size")
        raise ServiceError(422, "limit_exceeded",
                           f"this job would take {steps} steps over dataset '{ds['id']}' "
                           f"({ds['n_examples']} rows); the limit is max_steps_per_job="
                           f"{svc.limits.max_steps_per_job} (change {knobs})")
    if body.dp is not None:
        try:
            _check_dp(body, ds["n_examples"], steps)
        except ValueError as e:
            raise ServiceError(422, "validation_error", str(e)) from e


def _check_output_denoiser(svc: Service, body: JobCreate, ds: dict) -> None:
    """422 for an output denoiser that could not be fitted: it corrects privatized queries'
    pooled states, so it needs a privatized dataset (an η to privatize public text at) and a
    head that reads a pooled state."""
    from rapt.tuning.tune import resolve_head

    decl = ds["privacy"] or {}
    if decl.get("mechanism") != "dchi-text2text" or not decl.get("eta"):
        raise ServiceError(422, "validation_error",
                           f"output_denoiser: dataset '{ds['id']}' was uploaded unprivatized "
                           "(mechanism 'none'); the denoiser corrects privatized queries: "
                           "leave output_denoiser out, or upload privatized rows")
    try:
        head = resolve_head(svc.backbones[ds["backbone"]].kind, tune_config(body.model_dump()))
    except ValueError:
        return  # the config's own error follows, from tune_config below
    if head == "verbalizer":
        raise ServiceError(422, "validation_error",
                           "output_denoiser: the verbalizer head of a causal LM reads no pooled "
                           "state; leave output_denoiser out (or use head 'linear')")


def _check_dp(body: JobCreate, n_examples: int, steps: int) -> None:
    """ValueError for a DP job whose guarantee would say nothing (rapt.dp.accounting's
    check_plan: δ of at least 1/N, a σ above the ε_max bound, a target no noise reaches)."""
    from rapt.dp.accounting import check_plan

    check_plan(tune_config(body.model_dump()).dp, n_examples, steps, body.batch_size,
               ("dp.delta", "dp.noise_multiplier"))


@router.get("", response_model=list[JobStatus])
def list_jobs(svc: Svc, me: Owner) -> list[JobStatus]:
    """The caller's own jobs only."""
    return [job_status(svc, j) for j in svc.store.list_jobs(me)]


@router.get("/{job_id}", response_model=JobStatus, responses=errors(404, 422))
def get_job(job: Annotated[dict, Depends(job_of)], svc: Svc) -> JobStatus:
    return job_status(svc, job)


@router.post("/{job_id}/cancel", response_model=JobStatus, responses=errors(404, 409, 422))
def cancel_job(job_id: str, job: Annotated[dict, Depends(job_of)], svc: Svc,
               me: Owner) -> JobStatus:
    if job["state"] not in ("queued", "running"):
        raise ServiceError(409, "conflict", f"job '{job_id}' already {job['state']}")
    svc.jobs.cancel(job_id)
    return job_status(svc, svc.store.get_job(job_id, me))
