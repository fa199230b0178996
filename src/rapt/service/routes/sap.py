"""SAP split training: the customer's bottom, sessions, and their messages.
Semantics in ``rapt.service.split_sessions``; the message routes are async so the body is read
on the event loop and the work runs in the thread pool."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from rapt.service.deps import Owner, Svc, owner, svc_of
from rapt.service.errors import errors
from rapt.service.schemas import SapSessionCreate, SapSessionInfo

# On the router, so a route added here cannot forget the key check.
router = APIRouter(prefix="/v1/sap", dependencies=[Depends(owner)],
                   responses=errors(401, 429))

OCTET = "application/octet-stream"
BINARY = {200: {"content": {OCTET: {}}, "description": "a safetensors message"}}
# A message of a session: its own (404), in step order (409), well formed (422), room for
# it in memory (429 sap_busy), on a backbone this server loaded (503).
MESSAGE = {**errors(404, 409, 422, 429, 503), **BINARY}
# The message routes read the body themselves: the document still says what it is.
BODY = {"requestBody": {"required": True, "description": "a safetensors message "
                        "(rapt.split.wire)", "content": {OCTET: {"schema": {
                            "type": "string", "format": "binary"}}}}}


@router.get("/bottom", response_class=Response,
            responses={**errors(422), **BINARY, 304: {"description": "If-None-Match holds the "
                                                                  "bottom's SHA-256"}})
def sap_bottom(request: Request, svc: Svc, backbone: str, split_layer: int = 0) -> Response:
    """The customer's bottom (embedding layer + ``split_layer`` blocks) as safetensors,
    with its SHA-256 in ``X-Content-SHA256`` and the ETag (``If-None-Match`` -> 304).
    Nothing of the top is in it."""
    data, sha = svc.sap.bottom(backbone, split_layer)
    headers = {"X-Content-SHA256": sha, "ETag": f'"{sha}"'}
    if request.headers.get("if-none-match", "").strip('"') == sha:
        return Response(status_code=304, headers=headers)
    return Response(data, media_type=OCTET, headers=headers)


@router.post("/sessions", status_code=201, response_model=SapSessionInfo,
             responses=errors(422, 429))
def sap_create(body: SapSessionCreate, svc: Svc, me: Owner) -> SapSessionInfo:
    """Create a split-training session (per-key quota max_sap_sessions_per_key)."""
    row = svc.sap.create(me, body.backbone, body.model_dump(), body.n_examples)
    return SapSessionInfo(**svc.sap.info(me, row["id"]))


@router.get("/sessions/{session_id}", response_model=SapSessionInfo, responses=errors(404, 422))
def sap_get(session_id: str, svc: Svc, me: Owner) -> SapSessionInfo:
    return SapSessionInfo(**svc.sap.info(me, session_id))


@router.delete("/sessions/{session_id}", status_code=204, response_class=Response,
               responses=errors(404, 422))
def sap_delete(session_id: str, svc: Svc, me: Owner) -> Response:
    """Delete a session, its top state and its uploaded release."""
    svc.sap.delete(me, session_id)
    return Response(status_code=204)


@router.post("/sessions/{session_id}/release", response_model=SapSessionInfo,
             responses=errors(404, 409, 413, 422, 429, 503),
             openapi_extra=BODY)
async def sap_release(session_id: str, request: Request, me: Owner) -> SapSessionInfo:
    """Frozen bottom: a ``Release`` chunk (safetensors body), contiguous from row 0."""
    data = await request.body()
    info = await run_in_threadpool(svc_of(request).sap.upload_release, me, session_id, data)
    return SapSessionInfo(**info)


@router.post("/sessions/{session_id}/forward", response_class=Response, responses=MESSAGE,
             openapi_extra=BODY)
async def sap_forward(session_id: str, request: Request, me: Owner) -> Response:
    """Training step ``last_step + 1``: ``Activations`` (unfrozen bottom) or ``BatchRef``
    (frozen) in, ``TopOutput`` g out (safetensors)."""
    data = await request.body()
    out = await run_in_threadpool(svc_of(request).sap.forward, me, session_id, data)
    return Response(out, media_type=OCTET)


@router.post("/sessions/{session_id}/backward", response_class=Response,
             responses={**MESSAGE, 200: {
                 "description": "an ActivationGrad (unfrozen bottom), or JSON (frozen)",
                 "content": {OCTET: {}, "application/json": {"schema": {
                     "type": "object", "required": ["step", "last_step", "replayed"],
                     "properties": {"step": {"type": "integer"},
                                    "last_step": {"type": "integer"},
                                    "replayed": {"type": "boolean"}}}}}}},
             openapi_extra=BODY)
async def sap_backward(session_id: str, request: Request, me: Owner) -> Response:
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
    return Response(out, media_type=OCTET, headers=headers)


@router.post("/sessions/{session_id}/predict", response_class=Response,
             responses={**errors(404, 422, 429, 503), **BINARY},
             openapi_extra=BODY)
async def sap_predict(session_id: str, request: Request, me: Owner) -> Response:
    """Inference: ``Activations`` of privatized queries in, ``TopOutput`` g out; the
    customer applies its own output layer."""
    data = await request.body()
    out = await run_in_threadpool(svc_of(request).sap.predict, me, session_id, data)
    return Response(out, media_type=OCTET)
