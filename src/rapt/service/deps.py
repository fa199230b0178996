"""FastAPI dependencies of the routes: the process state, the caller's key, operator keys and
ownership of the caller's objects.

A route needs an API key when ``owner`` is anywhere in its dependency tree (``admin`` and the
``*_of`` ownership dependencies take it too, as may a router's ``dependencies=``);
``RequestGateMiddleware`` then checks the key before the body is read
(``rapt.service.middleware.keyed_routes``)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from rapt.service import auth
from rapt.service.errors import ServiceError
from rapt.service.state import Service

# Security schemes: they only document the two ways to send a key (OpenAPI); the check is
# ``owner``'s.
bearer = HTTPBearer(auto_error=False)
api_key_header = APIKeyHeader(name="X-API-Key", auto_error=False)


def svc_of(request: Request) -> Service:
    """The process's ``Service`` (built in the app's lifespan)."""
    return request.app.state.svc


async def _service(request: Request) -> Service:
    # async: a dependency this cheap should not take a threadpool hop
    return svc_of(request)


Svc = Annotated[Service, Depends(_service)]


def key_id(svc: Service, key: str | None) -> str | None:
    """The id of a valid API key; None for a missing, unknown or revoked one (the one check
    behind the API's headers and the console's cookie)."""
    return svc.store.owner_of_hash(auth.hash_key(key)) if key else None


def owner(request: Request,
          cred: HTTPAuthorizationCredentials | None = Depends(bearer),
          x_key: str | None = Depends(api_key_header)) -> str:
    """The caller's key id, checked by RequestGateMiddleware before the body was read (the
    security dependencies document the two ways to send the key)."""
    kid = request.scope.get("rapt.owner")
    if kid is None:  # not reached through the middleware
        kid = key_id(svc_of(request), x_key or (cred.credentials if cred else None))
        if kid is None:
            raise ServiceError(401, "unauthorized", "missing, unknown or revoked API key")
    return kid


Owner = Annotated[str, Depends(owner)]


def admin(request: Request, me: Owner) -> str:
    """The caller's key id if it is an operator key; 403 otherwise."""
    if not svc_of(request).store.is_admin(me):
        raise ServiceError(403, "forbidden", "this route is for operator keys (create one "
                           "with `rapt serve keys add NAME --admin`)")
    return me


def owned(svc: Any, kind: str, object_id: str, me: str) -> dict:
    """The caller's dataset, job or prompt row; 404 otherwise, so that another user's object
    looks exactly like a missing one."""
    row = getattr(svc.store, f"get_{kind}")(object_id, me)
    if row is None:
        raise ServiceError(404, "not_found", f"no {kind} '{object_id}'")
    return row


def dataset_of(dataset_id: str, svc: Svc, me: Owner) -> dict:
    """The caller's dataset named by the path's ``dataset_id`` (404 if not theirs)."""
    return owned(svc, "dataset", dataset_id, me)


def job_of(job_id: str, svc: Svc, me: Owner) -> dict:
    """The caller's job named by the path's ``job_id`` (404 if not theirs)."""
    return owned(svc, "job", job_id, me)


def prompt_of(prompt_id: str, svc: Svc, me: Owner) -> dict:
    """The caller's prompt named by the path's ``prompt_id`` (404 if not theirs)."""
    return owned(svc, "prompt", prompt_id, me)
