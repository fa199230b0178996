"""The provider's HTTP API (FastAPI): datasets, tuning jobs, prompts, inference.

Every error is a JSON body ``{"error": code, "detail": message}``; an unexpected one is a 500
whose detail holds only an error id, under which the server log keeps the one traceback. Every
user object belongs to the API key that created it; any other key gets 404 for it, and nothing
lists other keys' objects; users list and delete their own datasets and prompts. The API key is
checked before a request body is read. Backbones are loaded once per process at startup.
"""

from __future__ import annotations

import collections
import logging
import os
import secrets
import shutil
import threading
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import asynccontextmanager
from http import HTTPStatus
from pathlib import Path
from typing import Any

import torch
from fastapi import Depends, FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from rapt import __version__
from rapt.service import auth
from rapt.service.inference import (
    Forward,
    InferenceQueueFullError,
    MicroBatcher,
    backbone_positions,
    default_forward,
    per_prompt_forward,
    positions_used,
    prompt_positions,
)
from rapt.service.jobs import make_job_backend
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
    SapSessionCreate,
    SapSessionInfo,
)
from rapt.service.split_sessions import SapError, SplitSessions
from rapt.service.store import QueueFullError, QuotaError, Store
from rapt.service.worker import JobRunner, planned_steps, tune_config

log = logging.getLogger("rapt.service")

ERRORS = {code: {"model": ErrorBody}
          for code in (400, 401, 403, 404, 409, 413, 422, 429, 500, 503)}


class ServiceError(Exception):
    """An error the client caused (or must know about), returned as JSON."""

    def __init__(self, status: int, error: str, detail: str):
        super().__init__(detail)
        self.status, self.error, self.detail = status, error, detail


def _error(status: int, error: str, detail: str) -> JSONResponse:
    # A detail may quote what the client sent (a field name, a backbone name), which can hold
    # lone surrogates that UTF-8 cannot encode: escape those.
    detail = detail.encode("utf-8", "backslashreplace").decode("utf-8")
    return JSONResponse({"error": error, "detail": detail}, status_code=status)


def _api_key(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The key from ``X-API-Key`` or ``Authorization: Bearer``."""
    h = {k.lower(): v for k, v in headers}
    if h.get(b"x-api-key"):
        return h[b"x-api-key"].decode("latin-1")
    scheme, _, cred = h.get(b"authorization", b"").decode("latin-1").partition(" ")
    if scheme.lower() != "bearer":
        return None
    return cred.strip() or None


class InternalErrorMiddleware:
    """Turns an unexpected exception into a 500 that carries only an error id, and logs one
    traceback under that id. Nothing is re-raised to the server, which would log it again and
    close the keep-alive connection (Starlette's ServerErrorMiddleware re-raises)."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = [False]

        async def tracked(msg: dict) -> None:
            started[0] = started[0] or msg["type"] == "http.response.start"
            await send(msg)

        try:
            await self.app(scope, receive, tracked)
        except Exception:
            eid = secrets.token_hex(8)
            log.exception("internal error id %s on %s %s", eid, scope.get("method"),
                          scope.get("path"))
            if not started[0]:
                await _error(500, "internal", f"internal server error; the operator can find it "
                             f"in the server log under id {eid}")(scope, receive, send)


class RequestGateMiddleware:
    """What a request passes before any route reads its body, cheapest first:

    1. the route: an unknown path or method goes straight to the router (404 / 405, body
       unread);
    2. the API key, for routes that take the ``owner`` dependency: a missing, unknown or
       revoked key gets 401 with the body unread (one indexed lookup); the key id goes into
       ``scope["rapt.owner"]`` for that dependency;
    3. the size: a Content-Length over ``limit`` gets 413 unread; otherwise the body is read up
       to the limit (chunked bodies too) and 413 the moment it passes it.
    """

    def __init__(self, app: Any, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        route = _route_of(scope)
        if route is None:
            return await self.app(scope, receive, send)
        if id(route) in scope["app"].state.key_routes:
            svc: Service = scope["app"].state.svc
            key = _api_key(scope.get("headers") or [])
            if not key:
                return await _error(401, "unauthorized", "missing API key: send 'Authorization: "
                                    "Bearer <key>'")(scope, receive, send)
            kid = await run_in_threadpool(svc.store.owner_of_hash, auth.hash_key(key))
            if kid is None:
                return await _error(401, "unauthorized",
                                    "unknown or revoked API key")(scope, receive, send)
            scope["rapt.owner"] = kid
        too_large = _error(413, "payload_too_large",
                           f"request body exceeds the limit max_upload_bytes={self.limit}")
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            return await too_large(scope, receive, send)
        chunks, size, more = [], 0, True
        while more:  # bounded buffer, so chunked bodies are limited too
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


def _route_of(scope: dict) -> Any | None:
    """The route that fully matches the request (path and method), if any."""
    for route in scope["app"].router.routes:
        match, _ = route.matches(scope)
        if match == Match.FULL:
            return route
    return None


def _loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def default_prompt_loader(folder: Path) -> Any:
    from rapt.trainer import TunedPrompt

    return TunedPrompt.load(folder)


class Service:
    """Process-wide state: store, backbones, job backend, micro-batchers, prompt cache."""

    def __init__(self, config: ServiceConfig, backbones: dict[str, Any] | None,
                 runner: JobRunner | None, prompt_loader: Callable[[Path], Any] | None,
                 forward: Forward | None):
        self.config = config
        self.limits = config.limits
        # Everything this process writes under the store's folder (checkpoints, prompts,
        # split-session state and releases) is a tenant's data: 0600 files, 0700 folders.
        # Process-wide; restored by close() for processes that host a service among others.
        self._umask = os.umask(0o077)
        self.store = Store(config.store_url or config.db_path, files=config.files_dir)
        # Ray actors load backbones by name themselves; injected ones are sent to them.
        job_backbones = ({n: n for n in config.backbones} if backbones is None
                         else backbones)
        if backbones is None:
            from rapt.models import load_backbone

            backbones = {name: load_backbone(name, device=config.device)
                         for name in config.backbones}
        self.backbones = backbones
        for bb in backbones.values():
            bb.model.eval()
        self.prompt_loader = prompt_loader or default_prompt_loader
        self.jobs = make_job_backend(
            config.jobs, self.store, backbones if config.jobs == "inprocess" else job_backbones,
            runner, max_queued=self.limits.max_queued_jobs, threads=config.job_threads,
            progress_interval_s=config.progress_interval_s, lease_s=config.lease_s,
            heartbeat_s=config.heartbeat_s, actors=config.ray_actors,
            address=config.ray_address, actor_options=config.ray_actor_options,
            device=config.device)
        self.worker = self.jobs  # the name older code used
        forward = forward or (default_forward if config.mixed_passes else per_prompt_forward)
        self.batchers = {
            name: MicroBatcher(bb, forward,
                               max_wait_s=config.batch_wait_ms / 1000,
                               max_rows=config.max_batch_rows,
                               max_pending_rows=self.limits.max_inference_queue)
            for name, bb in backbones.items()}
        self._prompts: collections.OrderedDict[str, Any] = collections.OrderedDict()
        self._prompt_lock = threading.Lock()
        self.sap = SplitSessions(self.store, backbones, self.limits)
        self.jobs.start()

    def close(self) -> None:
        self.jobs.stop()
        for b in self.batchers.values():
            b.close()
        self.store.close()
        os.umask(self._umask)

    def revoke_key(self, ref: str, purge: bool) -> dict:
        """Revoke (and with ``purge`` delete everything of) a key; its running jobs here stop
        at their next step, its split sessions leave this process's memory."""
        kid = self.store.find_key_id(ref, live_only=not purge)
        sessions = 0
        for sid in self.store.owned_sap_sessions(kid):
            try:
                self.sap.delete(kid, sid)  # waits for a message in flight, then drops it
                sessions += 1
            except SapError:
                pass  # deleted meanwhile
        out = self.store.purge_key(kid) if purge else self.store.revoke_key(kid)
        out["sessions"] += sessions
        for jid in out.get("stopping", []):
            self.jobs.cancel(jid)
        return out

    def prompt(self, row: dict) -> Any:
        """The loaded prompt for a store row, built on its backbone. LRU cache: 256 prompts, of
        which at most 4 LoRA / full ones (each of those holds a whole copy of the backbone).
        Files that are missing or damaged give 503 and nothing is cached, so restoring them
        is enough."""
        with self._prompt_lock:
            if row["id"] in self._prompts:
                self._prompts.move_to_end(row["id"])
                return self._prompts[row["id"]]
        try:
            obj = self.prompt_loader(Path(row["path"]))
            if hasattr(obj, "build"):  # tensors that load but do not fit fail here, not later
                obj.build(self.backbones[row["backbone"]])
        except Exception as e:
            log.warning("prompt %s cannot be loaded from %s: %s: %s", row["id"], row["path"],
                        type(e).__name__, e)
            raise ServiceError(503, "prompt_unavailable",
                               f"prompt '{row['id']}' cannot be loaded: its stored files are "
                               "missing or damaged (the server log says which). Retry once "
                               "the operator has restored them, or tune it again") from None
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

    def forget_prompt(self, prompt_id: str) -> None:
        with self._prompt_lock:
            self._prompts.pop(prompt_id, None)

    def row_limit(self, backbone: str, prompt_tokens: int = 0) -> tuple[int, str]:
        """The longest row accepted for ``backbone`` under a prompt that takes
        ``prompt_tokens`` positions, and the words naming that limit in an error."""
        limit, why = self.limits.max_seq_len, f"max_seq_len={self.limits.max_seq_len}"
        pos = backbone_positions(self.backbones[backbone])
        if pos is not None and pos - prompt_tokens < limit:
            limit = pos - prompt_tokens
            why = f"{limit} tokens (backbone '{backbone}' has {pos} positions"
            why += (f", of which the prompt's {prompt_tokens} virtual tokens take "
                    f"{prompt_tokens})" if prompt_tokens else ")")
        return limit, why

    def check_rows(self, backbone: str, rows: list[list[int]], field: str,
                   max_rows: int, max_rows_name: str, prompt_tokens: int = 0) -> None:
        """Row count, length and vocabulary checks for token id rows."""
        if len(rows) > max_rows:
            raise ServiceError(422, "limit_exceeded",
                               f"{field} has {len(rows)} rows; the limit is "
                               f"{max_rows_name}={max_rows}")
        vocab = int(self.backbones[backbone].embeddings.shape[0])
        max_len, why = self.row_limit(backbone, prompt_tokens)
        for i, row in enumerate(rows):
            if len(row) > max_len:
                raise ServiceError(422, "limit_exceeded",
                                   f"{field}[{i}] has {len(row)} tokens; the limit is {why}")
            if row and (min(row) < 0 or max(row) >= vocab):
                j = next(j for j, t in enumerate(row) if not 0 <= t < vocab)
                raise ServiceError(422, "invalid_token_id",
                                   f"{field}[{i}][{j}] = {row[j]} is not a token id of backbone "
                                   f"'{backbone}' (vocabulary size {vocab})")

    def rows_of(self, backbone: str, input_ids: list[list[int]] | None,
                texts: list[str] | None, max_rows: int, max_rows_name: str,
                prompt_tokens: int = 0, text_pairs: list[str] | None = None
                ) -> list[list[int]]:
        """Checked token id rows, tokenizing (privatized) texts, or sentence pairs, with the
        backbone's tokenizer as the user side does (rapt.reconstruction.encode_texts)."""
        from rapt.padding import dedicated_pad_id, strip_padding
        from rapt.reconstruction import encode_texts

        field = "input_ids"
        if texts is not None:
            if len(texts) > max_rows:
                raise ServiceError(422, "limit_exceeded", f"texts has {len(texts)} rows; the "
                                   f"limit is {max_rows_name}={max_rows}")
            input_ids = encode_texts(self.backbones[backbone].tokenizer, texts, text_pairs)
            field = "texts (tokenized)"
        else:  # rows a client padded to a length bucket (rapt.padding): the real rows only
            pad = dedicated_pad_id(self.backbones[backbone].tokenizer)
            input_ids = strip_padding(input_ids, pad)
        self.check_rows(backbone, input_ids, field, max_rows, max_rows_name, prompt_tokens)
        return input_ids

    def backbone_name(self, name: str) -> str:
        if name not in self.backbones:
            raise ServiceError(422, "unknown_backbone",
                               f"backbone '{name}' is not loaded here; available: "
                               f"{', '.join(self.backbones)}")
        return name

    def require_backbone(self, kind: str, row: dict) -> None:
        """503 when a stored object needs a backbone this process did not load."""
        if row["backbone"] not in self.backbones:
            raise ServiceError(503, "backbone_unavailable",
                               f"{kind} '{row['id']}' needs backbone '{row['backbone']}', which "
                               "this server did not load (start it with --backbone for it)")


def job_status(svc: Service, job: dict) -> JobStatus:
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
    return JobStatus(id=job["id"], dataset_id=job["dataset_id"], backbone=job["backbone"],
                     state=job["state"], method=job["params"].get("method", "prompt"),
                     step=step, total_steps=total, loss=cur["loss"], epoch=cur["epoch"],
                     epsilon=cur.get("epsilon"),
                     elapsed_s=elapsed, eta_s=eta, resumed_from_step=job["resumed_from_step"],
                     prompt_id=job["prompt_id"], error=job["error"], created=job["created"])


def _admin_key_op(svc: Service, key: str, purge: bool) -> dict:
    try:
        out = svc.revoke_key(key, purge)
    except LookupError as e:
        raise ServiceError(404, "not_found", str(e)) from None
    except ValueError as e:
        raise ServiceError(409, "conflict", str(e)) from None
    return {k: v for k, v in out.items() if k != "revoked"}


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
    # The last added is the outermost: errors -> route, API key, body size -> routes.
    app.add_middleware(RequestGateMiddleware, limit=config.limits.max_upload_bytes)
    app.add_middleware(InternalErrorMiddleware)

    @app.exception_handler(ServiceError)
    async def _service_error(request: Request, exc: ServiceError) -> JSONResponse:
        return _error(exc.status, exc.error, exc.detail)

    @app.exception_handler(SapError)
    async def _sap_error(request: Request, exc: SapError) -> JSONResponse:
        resp = _error(exc.status, exc.error, exc.detail)
        if exc.last_step is not None:
            resp.headers["X-Rapt-Last-Step"] = str(exc.last_step)
        return resp

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

    bearer = HTTPBearer(auto_error=False)
    api_key_header = APIKeyHeader(name="X-API-Key", auto_error=False)

    def svc_of(request: Request) -> Service:
        return request.app.state.svc

    def owner(request: Request,
              cred: HTTPAuthorizationCredentials | None = Depends(bearer),
              x_key: str | None = Depends(api_key_header)) -> str:
        """The caller's key id, checked by RequestGateMiddleware before the body was read (the
        security dependencies document the two ways to send the key)."""
        kid = request.scope.get("rapt.owner")
        if kid is None:  # not reached through the middleware
            key = x_key or (cred.credentials if cred else None)
            kid = svc_of(request).store.owner_of_hash(auth.hash_key(key)) if key else None
            if kid is None:
                raise ServiceError(401, "unauthorized", "missing, unknown or revoked API key")
        return kid

    def admin(request: Request, me: str = Depends(owner)) -> str:
        if not svc_of(request).store.is_admin(me):
            raise ServiceError(403, "forbidden", "this route is for operator keys (create one "
                               "with `rapt serve keys add NAME --admin`)")
        return me

    @app.get("/v1/health")
    def health(request: Request) -> dict:
        svc = svc_of(request)
        return {"status": "ok", "version": __version__, "backbones": list(svc.backbones)}

    @app.get("/v1/backbones", response_model=list[BackboneInfo])
    def list_backbones(request: Request) -> list[BackboneInfo]:
        return [BackboneInfo(name=n, kind=bb.kind, vocab_size=int(bb.embeddings.shape[0]),
                             hidden_size=bb.hidden_size, special_ids=bb.special_ids)
                for n, bb in svc_of(request).backbones.items()]

    @app.get("/v1/stats", responses=ERRORS)
    def stats(request: Request, me: str = Depends(admin)) -> dict:
        """Micro-batching counters per backbone, over all tenants: operator (admin) keys only."""
        return {n: vars(b.stats) for n, b in svc_of(request).batchers.items()}

    @app.post("/v1/admin/keys/{key}/revoke", responses=ERRORS)
    def admin_revoke_key(key: str, request: Request, me: str = Depends(admin)) -> dict:
        """Revoke a key (id or name): its queued jobs are cancelled, its running ones stop at
        their next step without a prompt, its split sessions are deleted."""
        return _admin_key_op(svc_of(request), key, purge=False)

    @app.delete("/v1/admin/keys/{key}", responses=ERRORS)
    def admin_purge_key(key: str, request: Request, me: str = Depends(admin)) -> dict:
        """Revoke a key (id or name) and delete everything it owns: datasets, jobs,
        prompts, split sessions and their files (as `rapt serve keys purge`)."""
        return _admin_key_op(svc_of(request), key, purge=True)

    @app.post("/v1/datasets", status_code=201, response_model=DatasetInfo, responses=ERRORS)
    def upload_dataset(body: DatasetUpload, request: Request,
                       me: str = Depends(owner)) -> DatasetInfo:
        """Store a privatized dataset. Per-key quotas: max_datasets_per_key datasets and
        max_dataset_bytes_per_key bytes (429 quota_exceeded)."""
        svc = svc_of(request)
        name = svc.backbone_name(body.backbone)
        ids = svc.rows_of(name, body.input_ids, body.texts, svc.limits.max_examples,
                          "max_examples", text_pairs=body.text_pairs)
        if body.plain_ids is not None:
            vocab = int(svc.backbones[name].embeddings.shape[0])
            bad = [j for j, t in enumerate(body.plain_ids) if not 0 <= t < vocab]
            if bad:
                raise ServiceError(422, "invalid_token_id",
                                   f"plain_ids[{bad[0]}] = {body.plain_ids[bad[0]]} is not a "
                                   f"token id of backbone '{name}' (vocabulary size {vocab})")
            from rapt.reconstruction import plain_offset

            # The trainer reads row i's plain tokens at positions off .. off + m: a shorter
            # row would fail only when a job runs.
            need = plain_offset(svc.backbones[name].tokenizer) + len(body.plain_ids)
            short = next((i for i, r in enumerate(ids) if len(r) < need), None)
            if short is not None:
                raise ServiceError(422, "validation_error",
                                   f"plain_ids: {len(body.plain_ids)} plain tokens (after "
                                   f"{need - len(body.plain_ids)} leading special tokens) do "
                                   f"not fit input_ids[{short}], which has "
                                   f"{len(ids[short])} tokens")
        try:
            did = svc.store.create_dataset(
                me, name, ids, body.labels, body.num_labels, body.privacy.model_dump(),
                body.plain_ids, max_count=svc.limits.max_datasets_per_key,
                max_bytes=svc.limits.max_dataset_bytes_per_key)
        except QuotaError as e:
            raise ServiceError(429, "quota_exceeded", str(e)) from None
        return DatasetInfo(**svc.store.get_dataset(did, me))

    @app.get("/v1/datasets", response_model=list[DatasetInfo])
    def list_datasets(request: Request, me: str = Depends(owner)) -> list[DatasetInfo]:
        """The caller's own datasets only."""
        return [DatasetInfo(**d) for d in svc_of(request).store.list_datasets(me)]

    @app.get("/v1/datasets/{dataset_id}", response_model=DatasetInfo, responses=ERRORS)
    def get_dataset(dataset_id: str, request: Request, me: str = Depends(owner)) -> DatasetInfo:
        row = _owned(svc_of(request), "dataset", dataset_id, me)
        return DatasetInfo(**row)

    @app.delete("/v1/datasets/{dataset_id}", status_code=204, response_class=Response,
                responses=ERRORS)
    def delete_dataset(dataset_id: str, request: Request, me: str = Depends(owner)) -> Response:
        """Erase a dataset's data (409 while a queued or running job uses it). Prompts tuned
        on it stay until they are deleted themselves."""
        svc = svc_of(request)
        _owned(svc, "dataset", dataset_id, me)
        active = svc.store.delete_dataset(dataset_id, me)
        if active:
            raise ServiceError(409, "conflict", f"dataset '{dataset_id}' is in use by job(s) "
                               f"{', '.join(active)}; cancel them first")
        return Response(status_code=204)

    @app.post("/v1/jobs", status_code=202, response_model=JobStatus, responses=ERRORS)
    def create_job(body: JobCreate, request: Request, me: str = Depends(owner)) -> JobStatus:
        svc = svc_of(request)
        ds = _owned(svc, "dataset", body.dataset_id, me)
        svc.require_backbone("dataset", ds)
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
        try:  # what would otherwise fail, or run for days, only once the job runs
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
        # Rows are at most max_seq_len long already (checked at upload).
        params = body.model_dump()
        params["max_length"] = min(body.max_length, svc.limits.max_seq_len)
        # The prompt keeps the data's declared η, so queries default to it even after the
        # dataset is deleted (which erases the dataset's own copy).
        params["privacy"] = ds["privacy"]
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
        svc.jobs.cancel(job_id)
        return job_status(svc, svc.store.get_job(job_id, me))

    @app.get("/v1/prompts", response_model=list[PromptInfo])
    def list_prompts(request: Request, me: str = Depends(owner)) -> list[PromptInfo]:
        """The caller's own prompts only."""
        return [PromptInfo(**p) for p in svc_of(request).store.list_prompts(me)]

    @app.get("/v1/prompts/{prompt_id}", response_model=PromptInfo, responses=ERRORS)
    def get_prompt(prompt_id: str, request: Request, me: str = Depends(owner)) -> PromptInfo:
        row = _owned(svc_of(request), "prompt", prompt_id, me)
        return PromptInfo(**row)

    @app.delete("/v1/prompts/{prompt_id}", status_code=204, response_class=Response,
                responses=ERRORS)
    def delete_prompt(prompt_id: str, request: Request, me: str = Depends(owner)) -> Response:
        """Delete a prompt and its files."""
        svc = svc_of(request)
        _owned(svc, "prompt", prompt_id, me)
        path = svc.store.delete_prompt(prompt_id, me)
        svc.forget_prompt(prompt_id)
        root = (svc.store.files / "prompts").resolve()
        if path and Path(path).resolve().parent == root:  # only ever our own folders
            shutil.rmtree(path, ignore_errors=True)
        return Response(status_code=204)

    @app.post("/v1/predict", response_model=PredictResponse, responses=ERRORS)
    def predict(body: PredictRequest, request: Request,
                me: str = Depends(owner)) -> PredictResponse:
        svc = svc_of(request)
        row = _owned(svc, "prompt", body.prompt_id, me)
        svc.require_backbone("prompt", row)
        prompt = svc.prompt(row)
        ids = svc.rows_of(row["backbone"], body.input_ids, body.texts,
                          svc.limits.max_predict_rows, "max_predict_rows",
                          prompt_tokens=prompt_positions(prompt), text_pairs=body.text_pairs)
        try:
            fut = svc.batchers[row["backbone"]].submit(prompt, ids)
        except InferenceQueueFullError as e:
            raise ServiceError(429, "queue_full", str(e)) from e
        try:
            probs: torch.Tensor = fut.result(timeout=300)
        except FutureTimeout as e:
            raise ServiceError(503, "timeout", "inference took longer than 300 s") from e
        except Exception:
            svc.forget_prompt(row["id"])  # a prompt that failed is loaded afresh next time
            raise
        probs = probs.float().cpu()
        return PredictResponse(prompt_id=row["id"], labels=probs.argmax(-1).tolist(),
                               probabilities=probs.tolist())

    # -- SAP split training (issue 11); semantics in rapt.service.split_sessions ------------
    octet = "application/octet-stream"
    binary = {200: {"content": {octet: {}}, "description": "a safetensors message"}}

    @app.get("/v1/sap/bottom", response_class=Response, responses={**ERRORS, **binary})
    def sap_bottom(request: Request, backbone: str, split_layer: int = 0,
                   me: str = Depends(owner)) -> Response:
        """The customer's bottom (embedding layer + ``split_layer`` blocks) as safetensors,
        with its SHA-256 in ``X-Content-SHA256`` and the ETag (``If-None-Match`` -> 304).
        Nothing of the top is in it."""
        data, sha = svc_of(request).sap.bottom(backbone, split_layer)
        headers = {"X-Content-SHA256": sha, "ETag": f'"{sha}"'}
        if request.headers.get("if-none-match", "").strip('"') == sha:
            return Response(status_code=304, headers=headers)
        return Response(data, media_type=octet, headers=headers)

    @app.post("/v1/sap/sessions", status_code=201, response_model=SapSessionInfo,
              responses=ERRORS)
    def sap_create(body: SapSessionCreate, request: Request,
                   me: str = Depends(owner)) -> SapSessionInfo:
        """Create a split-training session (per-key quota max_sap_sessions_per_key)."""
        sap = svc_of(request).sap
        row = sap.create(me, body.backbone, body.model_dump(), body.n_examples)
        return SapSessionInfo(**sap.info(me, row["id"]))

    @app.get("/v1/sap/sessions/{session_id}", response_model=SapSessionInfo, responses=ERRORS)
    def sap_get(session_id: str, request: Request, me: str = Depends(owner)) -> SapSessionInfo:
        return SapSessionInfo(**svc_of(request).sap.info(me, session_id))

    @app.delete("/v1/sap/sessions/{session_id}", status_code=204, response_class=Response,
                responses=ERRORS)
    def sap_delete(session_id: str, request: Request, me: str = Depends(owner)) -> Response:
        """Delete a session, its top state and its uploaded release."""
        svc_of(request).sap.delete(me, session_id)
        return Response(status_code=204)

    @app.post("/v1/sap/sessions/{session_id}/release", response_model=SapSessionInfo,
              responses=ERRORS)
    async def sap_release(session_id: str, request: Request,
                          me: str = Depends(owner)) -> SapSessionInfo:
        """Frozen bottom: a ``Release`` chunk (safetensors body), contiguous from row 0."""
        data = await request.body()
        info = await run_in_threadpool(svc_of(request).sap.upload_release, me, session_id, data)
        return SapSessionInfo(**info)

    @app.post("/v1/sap/sessions/{session_id}/forward", response_class=Response,
              responses={**ERRORS, **binary})
    async def sap_forward(session_id: str, request: Request,
                          me: str = Depends(owner)) -> Response:
        """Training step ``last_step + 1``: ``Activations`` (unfrozen bottom) or ``BatchRef``
        (frozen) in, ``TopOutput`` g out (safetensors)."""
        data = await request.body()
        out = await run_in_threadpool(svc_of(request).sap.forward, me, session_id, data)
        return Response(out, media_type=octet)

    @app.post("/v1/sap/sessions/{session_id}/backward", response_class=Response,
              responses={**ERRORS, **binary})
    async def sap_backward(session_id: str, request: Request,
                           me: str = Depends(owner)) -> Response:
        """``OutputGrad`` ∂l/∂g in; the update is applied exactly once (a repeat of the last
        applied step is answered from the saved reply, ``X-Rapt-Replayed: 1``). Out:
        ``ActivationGrad`` (unfrozen bottom) or JSON ``{"step", "last_step"}``."""
        data = await request.body()
        out, replayed, last = await run_in_threadpool(svc_of(request).sap.backward, me,
                                                      session_id, data)
        headers = {"X-Rapt-Replayed": str(int(replayed)), "X-Rapt-Last-Step": str(last)}
        if out is None:
            return JSONResponse({"step": last, "last_step": last, "replayed": replayed},
                                headers=headers)
        return Response(out, media_type=octet, headers=headers)

    @app.post("/v1/sap/sessions/{session_id}/predict", response_class=Response,
              responses={**ERRORS, **binary})
    async def sap_predict(session_id: str, request: Request,
                          me: str = Depends(owner)) -> Response:
        """Inference: ``Activations`` of privatized queries in, ``TopOutput`` g out; the
        customer applies its own output layer."""
        data = await request.body()
        out = await run_in_threadpool(svc_of(request).sap.predict, me, session_id, data)
        return Response(out, media_type=octet)

    app.state.key_routes = frozenset(
        id(r) for r in app.routes if isinstance(r, APIRoute)
        and any(d.call in (owner, admin) for d in r.dependant.dependencies))
    return app


