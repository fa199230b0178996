"""The provider's HTTP API (FastAPI): datasets, tuning jobs, prompts, inference.

Every error is a JSON body ``{"error": code, "detail": message}``. Every user object belongs
to the API key that created it; any other key gets 404 for it, and nothing lists other keys'
objects. Backbones are loaded once per process at startup.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import asynccontextmanager
from http import HTTPStatus
from pathlib import Path
from typing import Any

import torch
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException

from rapt import __version__
from rapt.service import auth
from rapt.service.inference import Forward, InferenceQueueFullError, MicroBatcher, default_forward
from rapt.service.limits import ServiceConfig
from rapt.service.schemas import (
    BackboneInfo,
    DatasetInfo,
    DatasetUpload,
    ErrorBody,
    JobCreate,
    JobStatus,
    PredictRequest,
    PredictResponse,
    PromptInfo,
)
from rapt.service.store import Store
from rapt.service.worker import (
    JobRunner,
    JobWorker,
    QueueFullError,
    default_runner,
    tune_config,
)

log = logging.getLogger("rapt.service")

ERRORS = {code: {"model": ErrorBody} for code in (400, 401, 404, 409, 413, 422, 429)}


class ServiceError(Exception):
    """An error the client caused (or must know about), returned as JSON."""

    def __init__(self, status: int, error: str, detail: str):
        super().__init__(detail)
        self.status, self.error, self.detail = status, error, detail


def _error(status: int, error: str, detail: str) -> JSONResponse:
    return JSONResponse({"error": error, "detail": detail}, status_code=status)


def _loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def default_prompt_loader(folder: Path) -> Any:
    from rapt.trainer import TunedPrompt

    return TunedPrompt.load(folder)


class BodyLimitMiddleware:
    """Rejects request bodies over ``limit`` bytes with 413 before any route parses them."""

    def __init__(self, app: Any, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        too_large = _error(413, "payload_too_large",
                           f"request body exceeds the limit max_upload_bytes={self.limit}")
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            return await too_large(scope, receive, send)
        chunks, size, more = [], 0, True
        while more:  # buffer (bounded) so chunked bodies are limited too
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                return await too_large(scope, receive, send)
            chunks.append(chunk)
            more = msg.get("more_body", False)
        body, sent = b"".join(chunks), [False]

        async def replay() -> dict:
            if not sent[0]:
                sent[0] = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class Service:
    """Process-wide state: store, backbones, job worker, micro-batchers, prompt cache."""

    def __init__(self, config: ServiceConfig, backbones: dict[str, Any] | None,
                 runner: JobRunner | None, prompt_loader: Callable[[Path], Any] | None,
                 forward: Forward | None):
        self.config = config
        self.limits = config.limits
        self.store = Store(config.db_path)
        if backbones is None:
            from rapt.models import load_backbone

            backbones = {name: load_backbone(name, device=config.device)
                         for name in config.backbones}
        self.backbones = backbones
        for bb in backbones.values():
            bb.model.eval()
        self.prompt_loader = prompt_loader or default_prompt_loader
        self.worker = JobWorker(self.store, backbones, runner or default_runner,
                                max_queued=self.limits.max_queued_jobs,
                                threads=config.job_threads,
                                progress_interval_s=config.progress_interval_s)
        self.batchers = {
            name: MicroBatcher(bb, forward or default_forward,
                               max_wait_s=config.batch_wait_ms / 1000,
                               max_rows=config.max_batch_rows,
                               max_pending_rows=self.limits.max_inference_queue)
            for name, bb in backbones.items()}
        self._prompts: collections.OrderedDict[str, Any] = collections.OrderedDict()
        self._prompt_lock = threading.Lock()
        self.job_lock = threading.Lock()
        self.worker.start()

    def close(self) -> None:
        self.worker.stop()
        for b in self.batchers.values():
            b.close()
        self.store.close()

    def prompt(self, row: dict) -> Any:
        """The loaded prompt for a store row. LRU cache: 256 prompts, of which at most 4 LoRA /
        full ones (each of those holds a whole copy of the backbone)."""
        with self._prompt_lock:
            if row["id"] in self._prompts:
                self._prompts.move_to_end(row["id"])
                return self._prompts[row["id"]]
        obj = self.prompt_loader(Path(row["path"]))
        with self._prompt_lock:
            self._prompts[row["id"]] = obj
            while len(self._prompts) > 256:
                self._prompts.popitem(last=False)
            heavy = [k for k, p in self._prompts.items()
                     if getattr(getattr(p, "config", None), "method", "prompt")
                     in ("lora", "full")]
            for k in heavy[:-4]:
                del self._prompts[k]
        return obj

    def check_rows(self, backbone: str, rows: list[list[int]], field: str,
                   max_rows: int, max_rows_name: str) -> None:
        """Row count, length and vocabulary checks for token id rows."""
        if len(rows) > max_rows:
            raise ServiceError(422, "limit_exceeded",
                               f"{field} has {len(rows)} rows; the limit is "
                               f"{max_rows_name}={max_rows}")
        vocab = int(self.backbones[backbone].embeddings.shape[0])
        max_len = self.limits.max_seq_len
        for i, row in enumerate(rows):
            if len(row) > max_len:
                raise ServiceError(422, "limit_exceeded",
                                   f"{field}[{i}] has {len(row)} tokens; the limit is "
                                   f"max_seq_len={max_len}")
            if row and (min(row) < 0 or max(row) >= vocab):
                j = next(j for j, t in enumerate(row) if not 0 <= t < vocab)
                raise ServiceError(422, "invalid_token_id",
                                   f"{field}[{i}][{j}] = {row[j]} is not a token id of backbone "
                                   f"'{backbone}' (vocabulary size {vocab})")

    def rows_of(self, backbone: str, input_ids: list[list[int]] | None,
                texts: list[str] | None, max_rows: int, max_rows_name: str
                ) -> list[list[int]]:
        """Checked token id rows, tokenizing (privatized) texts with the backbone's tokenizer."""
        field = "input_ids"
        if texts is not None:
            if len(texts) > max_rows:
                raise ServiceError(422, "limit_exceeded", f"texts has {len(texts)} rows; the "
                                   f"limit is {max_rows_name}={max_rows}")
            tok = self.backbones[backbone].tokenizer
            input_ids = [list(r) for r in tok(texts, add_special_tokens=True)["input_ids"]]
            field = "texts (tokenized)"
        self.check_rows(backbone, input_ids, field, max_rows, max_rows_name)
        return input_ids

    def backbone_name(self, name: str) -> str:
        if name not in self.backbones:
            raise ServiceError(422, "unknown_backbone",
                               f"backbone '{name}' is not loaded here; available: "
                               f"{', '.join(self.backbones)}")
        return name


def job_status(svc: Service, job: dict) -> JobStatus:
    live = svc.worker.live_progress(job["id"]) if job["state"] == "running" else None
    cur = {**job, **live} if live else job
    step, total = int(cur["step"] or 0), cur["total_steps"]
    elapsed = float(cur["elapsed"] or 0.0)
    eta = None
    if job["state"] == "running" and total and step > 0:
        # Average rate over all runs (a resumed job's elapsed includes earlier runs).
        eta = elapsed / step * (total - step)
    elif job["state"] == "succeeded":
        eta = 0.0
    return JobStatus(id=job["id"], dataset_id=job["dataset_id"], backbone=job["backbone"],
                     state=job["state"], method=job["params"].get("method", "prompt"),
                     step=step, total_steps=total, loss=cur["loss"], epoch=cur["epoch"],
                     epsilon=cur.get("epsilon"),
                     elapsed_s=elapsed, eta_s=eta, resumed_from_step=job["resumed_from_step"],
                     prompt_id=job["prompt_id"], error=job["error"], created=job["created"])


def _owned(svc: Any, kind: str, object_id: str, me: str) -> dict:
    """The caller's dataset, job or prompt row; 404 otherwise, so that another user's object
    looks exactly like a missing one."""
    row = getattr(svc.store, f"get_{kind}")(object_id, me)
    if row is None:
        raise ServiceError(404, "not_found", f"no {kind} '{object_id}'")
    return row


def create_app(config: ServiceConfig, *, backbones: dict[str, Any] | None = None,
               runner: JobRunner | None = None,
               prompt_loader: Callable[[Path], Any] | None = None,
               forward: Forward | None = None) -> FastAPI:
    """Build the app; backbones, runner, prompt loader and batch forward are injectable."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.svc = Service(config, backbones, runner, prompt_loader, forward)
        try:
            yield
        finally:
            app.state.svc.close()

    app = FastAPI(title="rapt provider service", version=__version__, lifespan=lifespan,
                  description="Prompt tuning and inference on privatized data (RAPT).")
    app.add_middleware(BodyLimitMiddleware, limit=config.limits.max_upload_bytes)

    @app.exception_handler(ServiceError)
    async def _service_error(request: Request, exc: ServiceError) -> JSONResponse:
        return _error(exc.status, exc.error, exc.detail)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = HTTPStatus(exc.status_code).phrase.lower().replace(" ", "_")
        return _error(exc.status_code, code, str(exc.detail))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        parts = []
        for e in exc.errors()[:10]:
            if e.get("type") == "json_invalid":
                parts.append(f"body is not valid JSON ({e.get('ctx', {}).get('error', '')})")
            else:
                parts.append(f"{_loc(tuple(e['loc']))}: {e['msg']}")
        return _error(422, "validation_error", "; ".join(parts))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s", request.url.path)
        return _error(500, "internal_error", f"{type(exc).__name__}: {exc}")

    bearer = HTTPBearer(auto_error=False)
    api_key_header = APIKeyHeader(name="X-API-Key", auto_error=False)

    def svc_of(request: Request) -> Service:
        return request.app.state.svc

    def owner(request: Request,
              cred: HTTPAuthorizationCredentials | None = Depends(bearer),
              x_key: str | None = Depends(api_key_header)) -> str:
        key = x_key or (cred.credentials if cred else None)
        if not key:
            raise ServiceError(401, "unauthorized",
                               "missing API key: send 'Authorization: Bearer <key>'")
        kid = svc_of(request).store.owner_of_hash(auth.hash_key(key))
        if kid is None:
            raise ServiceError(401, "unauthorized", "unknown API key")
        return kid

    @app.get("/v1/health")
    def health(request: Request) -> dict:
        svc = svc_of(request)
        return {"status": "ok", "version": __version__, "backbones": list(svc.backbones)}

    @app.get("/v1/backbones", response_model=list[BackboneInfo])
    def list_backbones(request: Request) -> list[BackboneInfo]:
        return [BackboneInfo(name=n, kind=bb.kind, vocab_size=int(bb.embeddings.shape[0]),
                             hidden_size=bb.hidden_size, special_ids=bb.special_ids)
                for n, bb in svc_of(request).backbones.items()]

    @app.get("/v1/stats")
    def stats(request: Request, me: str = Depends(owner)) -> dict:
        """Aggregate micro-batching counters per backbone (no per-user data)."""
        return {n: vars(b.stats) for n, b in svc_of(request).batchers.items()}

    @app.post("/v1/datasets", status_code=201, response_model=DatasetInfo, responses=ERRORS)
    def upload_dataset(body: DatasetUpload, request: Request,
                       me: str = Depends(owner)) -> DatasetInfo:
        svc = svc_of(request)
        name = svc.backbone_name(body.backbone)
        ids = svc.rows_of(name, body.input_ids, body.texts, svc.limits.max_examples,
                          "max_examples")
        if body.plain_ids is not None:
            vocab = int(svc.backbones[name].embeddings.shape[0])
            bad = [j for j, t in enumerate(body.plain_ids) if not 0 <= t < vocab]
            if bad:
                raise ServiceError(422, "invalid_token_id",
                                   f"plain_ids[{bad[0]}] = {body.plain_ids[bad[0]]} is not a "
                                   f"token id of backbone '{name}' (vocabulary size {vocab})")
        did = svc.store.create_dataset(me, name, ids, body.labels, body.num_labels,
                                       body.privacy.model_dump(), body.plain_ids)
        return DatasetInfo(**svc.store.get_dataset(did, me))

    @app.get("/v1/datasets/{dataset_id}", response_model=DatasetInfo, responses=ERRORS)
    def get_dataset(dataset_id: str, request: Request, me: str = Depends(owner)) -> DatasetInfo:
        row = _owned(svc_of(request), "dataset", dataset_id, me)
        return DatasetInfo(**row)

    @app.post("/v1/jobs", status_code=202, response_model=JobStatus, responses=ERRORS)
    def create_job(body: JobCreate, request: Request, me: str = Depends(owner)) -> JobStatus:
        svc = svc_of(request)
        ds = _owned(svc, "dataset", body.dataset_id, me)
        if body.reconstruction and not ds["plain_ids"]:
            raise ServiceError(422, "validation_error",
                               "reconstruction needs a dataset uploaded with plain_ids")
        if body.dp is not None and body.method not in ("prompt", "prefix"):
            raise ServiceError(422, "validation_error",
                               f"dp: PromptDPSGD covers prompt and prefix tuning only "
                               f"(method={body.method!r})")
        try:
            tune_config(body.model_dump())  # the trainer's own checks, before anything is stored
        except ImportError as e:
            raise ServiceError(422, "unsupported", f"this server cannot run that job: {e}") from e
        except (TypeError, ValueError) as e:
            raise ServiceError(422, "validation_error", str(e)) from e
        with svc.job_lock:  # capacity check and insert together, so a 429 leaves no row
            if not svc.worker.has_room():
                raise ServiceError(429, "queue_full",
                                   f"the job queue is full (limit max_queued_jobs="
                                   f"{svc.limits.max_queued_jobs} waiting jobs); retry later")
            # Rows are at most max_seq_len long already (checked at upload).
            params = body.model_dump()
            params["max_length"] = min(body.max_length, svc.limits.max_seq_len)
            jid = svc.store.create_job(me, ds["id"], ds["backbone"], params)
            try:
                svc.worker.submit(jid)
            except QueueFullError as e:
                svc.store.delete_job(jid)
                raise ServiceError(429, "queue_full", str(e)) from e
        return job_status(svc, svc.store.get_job(jid, me))

    @app.get("/v1/jobs", response_model=list[JobStatus])
    def list_jobs(request: Request, me: str = Depends(owner)) -> list[JobStatus]:
        """The caller's own jobs only."""
        svc = svc_of(request)
        return [job_status(svc, j) for j in svc.store.list_jobs(me)]

    @app.get("/v1/jobs/{job_id}", response_model=JobStatus, responses=ERRORS)
    def get_job(job_id: str, request: Request, me: str = Depends(owner)) -> JobStatus:
        svc = svc_of(request)
        job = _owned(svc, "job", job_id, me)
        return job_status(svc, job)

    @app.post("/v1/jobs/{job_id}/cancel", response_model=JobStatus, responses=ERRORS)
    def cancel_job(job_id: str, request: Request, me: str = Depends(owner)) -> JobStatus:
        svc = svc_of(request)
        job = _owned(svc, "job", job_id, me)
        if job["state"] not in ("queued", "running"):
            raise ServiceError(409, "conflict", f"job '{job_id}' already {job['state']}")
        svc.worker.cancel(job_id)
        return job_status(svc, svc.store.get_job(job_id, me))

    @app.get("/v1/prompts/{prompt_id}", response_model=PromptInfo, responses=ERRORS)
    def get_prompt(prompt_id: str, request: Request, me: str = Depends(owner)) -> PromptInfo:
        row = _owned(svc_of(request), "prompt", prompt_id, me)
        return PromptInfo(**row)

    @app.post("/v1/predict", response_model=PredictResponse, responses=ERRORS)
    def predict(body: PredictRequest, request: Request,
                me: str = Depends(owner)) -> PredictResponse:
        svc = svc_of(request)
        row = _owned(svc, "prompt", body.prompt_id, me)
        if row["backbone"] not in svc.backbones:
            raise ServiceError(503, "backbone_unavailable",
                               f"prompt '{row['id']}' needs backbone '{row['backbone']}', which "
                               "this server did not load (start it with --backbone for it)")
        ids = svc.rows_of(row["backbone"], body.input_ids, body.texts,
                          svc.limits.max_predict_rows, "max_predict_rows")
        prompt = svc.prompt(row)
        try:
            fut = svc.batchers[row["backbone"]].submit(prompt, ids)
        except InferenceQueueFullError as e:
            raise ServiceError(429, "queue_full", str(e)) from e
        try:
            probs: torch.Tensor = fut.result(timeout=300)
        except FutureTimeout as e:
            raise ServiceError(503, "timeout", "inference took longer than 300 s") from e
        probs = probs.float().cpu()
        return PredictResponse(prompt_id=row["id"], labels=probs.argmax(-1).tolist(),
                               probabilities=probs.tolist())

    return app


