"""Operator routes (admin keys only): counters over all tenants, revoking and purging keys."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response

from rapt.service.deps import Svc, admin
from rapt.service.errors import ServiceError, errors
from rapt.service.metrics import CONTENT_TYPE
from rapt.service.state import Service

# On the router, so a route added here cannot forget the operator check.
router = APIRouter(prefix="/v1", dependencies=[Depends(admin)],
                   responses=errors(401, 403, 429))
# /metrics at the root, where Prometheus looks; operator keys only, as every route here
# (Prometheus sends one with `authorization: {credentials_file: ...}`).
metrics_router = APIRouter(dependencies=[Depends(admin)],
                           responses=errors(401, 403, 429))


@metrics_router.get("/metrics", response_class=Response,
                    responses={200: {"content": {CONTENT_TYPE: {}},
                                     "description": "Prometheus text format"}})
def metrics(request: Request) -> Response:
    """Prometheus metrics of this process: requests by route and status, latency, jobs by
    state, the queue, workers, micro-batching, storage and DP ε per key (operator keys only)."""
    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE)


@router.get("/stats")
def stats(svc: Svc) -> dict:
    """Micro-batching counters per backbone, over all tenants: operator (admin) keys only."""
    return {n: vars(b.stats) for n, b in svc.batchers.items()}


@router.post("/admin/keys/{key}/revoke", responses=errors(404, 409, 422))
def admin_revoke_key(key: str, svc: Svc) -> dict:
    """Revoke a key (id or name): its queued jobs are cancelled, its running ones stop at
    their next step without a prompt, its split sessions are deleted."""
    return _key_op(svc, key, purge=False)


@router.delete("/admin/keys/{key}", responses=errors(404, 409, 422))
def admin_purge_key(key: str, svc: Svc) -> dict:
    """Revoke a key (id or name) and delete everything it owns: datasets, jobs,
    prompts, split sessions and their files (as `rapt serve keys purge`)."""
    return _key_op(svc, key, purge=True)


def _key_op(svc: Service, key: str, purge: bool) -> dict:
    try:
        out = svc.revoke_key(key, purge)
    except LookupError as e:
        raise ServiceError(404, "not_found", str(e)) from None
    except ValueError as e:
        raise ServiceError(409, "conflict", str(e)) from None
    return {k: v for k, v in out.items() if k != "revoked"}
