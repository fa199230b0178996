"""ASGI middlewares of the service: unexpected errors become a 500 with an error id, and the
request gate checks the route, the API key and the body size before a route reads the body."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Sequence
from typing import Any

from fastapi.dependencies.models import Dependant
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.routing import BaseRoute, Match

from rapt.service.deps import key_id, owner
from rapt.service.errors import error_response as _error
from rapt.service.routes import console
from rapt.service.state import Service
from rapt.service.throttle import client_address

log = logging.getLogger("rapt.service")


def _api_key(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The key from ``X-API-Key`` or ``Authorization: Bearer``."""
    h = {k.lower(): v for k, v in headers}
    if h.get(b"x-api-key"):
        return h[b"x-api-key"].decode("latin-1")
    scheme, _, cred = h.get(b"authorization", b"").decode("latin-1").partition(" ")
    if scheme.lower() != "bearer":
        return None
    return cred.strip() or None


def _answer(scope: dict, status: int, error: str, detail: str) -> Any:
    """The gate's refusal: the JSON error body, or under /console the console's error page
    (a person sent the form)."""
    path = scope.get("path", "")
    if path == console.PATH or path.startswith(console.PATH + "/"):
        return console.error_page(Request(scope), status, detail)
    return _error(status, error, detail)


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
    2. the API key, for routes with ``owner`` in their dependency tree
       (``app.state.key_routes``, from ``keyed_routes``): a missing, unknown or
       revoked key gets 401 with the body unread (one indexed lookup); the key id goes into
       ``scope["rapt.owner"]`` for that dependency. An address with too many failed keys
       lately gets 429 with Retry-After, its keys unchecked (``Service.auth_failures``);
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
        scope["rapt.route"] = getattr(route, "path", None)  # for the metrics, even on a 401
        if _route_key(route) in scope["app"].state.key_routes:
            svc: Service = scope["app"].state.svc
            key = _api_key(scope.get("headers") or [])
            if not key:
                return await _error(401, "unauthorized", "missing API key: send 'Authorization: "
                                    "Bearer <key>'")(scope, receive, send)
            addr = client_address(scope)
            wait = svc.auth_failures.retry_after(addr)
            if wait is not None:  # every key refused, or a guess would learn from the answer
                resp = _error(429, "too_many_auth_failures", svc.auth_failures.refusal(wait))
                resp.headers["Retry-After"] = str(wait)
                return await resp(scope, receive, send)
            kid = await run_in_threadpool(key_id, svc, key)
            if kid is None:
                svc.auth_failures.fail(addr)
                return await _error(401, "unauthorized",
                                    "unknown or revoked API key")(scope, receive, send)
            scope["rapt.owner"] = kid
        too_large = _answer(scope, 413, "payload_too_large",
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


def flat_routes(routes: Sequence[BaseRoute]) -> list[Any]:
    """Every route under ``routes``, with its full path, through included routers. Newer
    FastAPI includes a router lazily (the app's list holds the router, not its routes) and
    offers ``iter_route_contexts``; older FastAPI copies the routes into the app's list."""
    try:
        from fastapi.routing import iter_route_contexts
    except ImportError:
        return list(routes)
    return list(iter_route_contexts(routes))


def _route_key(route: Any) -> tuple[int, str | None]:
    # One route object may be included under several prefixes: the path tells them apart.
    return id(getattr(route, "original_route", route)), getattr(route, "path", None)


def _takes_key(dep: Dependant | None) -> bool:
    return dep is not None and (dep.call is owner
                                or any(_takes_key(d) for d in dep.dependencies))


def keyed_routes(app: Any) -> frozenset[tuple[int, str | None]]:
    """The routes of ``app`` whose dependency tree holds ``owner`` (declared on the route, on
    its router, where the router is included, or inside another dependency such as
    ``admin``), for ``app.state.key_routes``."""
    return frozenset(_route_key(r) for r in flat_routes(app.router.routes)
                     if _takes_key(getattr(r, "dependant", None)))


def allowed_methods(scope: dict) -> list[str]:
    """Every method some route takes at the request's path, for a 405's ``Allow`` (the router
    names only the first route it tried there, and a path may have several)."""
    methods: set[str] = set()
    for route in flat_routes(scope["app"].router.routes):
        match, _ = route.matches(scope)
        if match != Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
    return sorted(methods)


def _route_of(scope: dict) -> Any | None:
    """The route that fully matches the request (path and method), if any."""
    for route in flat_routes(scope["app"].router.routes):
        match, _ = route.matches(scope)
        if match == Match.FULL:
            return route
    return None
