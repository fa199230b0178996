"""The provider's HTTP API (FastAPI): datasets, tuning jobs, prompts, inference.

Every error is a JSON body ``{"error": code, "detail": message}``; an unexpected one is a 500
whose detail holds only an error id, under which the server log keeps the one traceback. Every
user object belongs to the API key that created it; any other key gets 404 for it, and nothing
lists other keys' objects; users list and delete their own datasets and prompts. The API key is
read from headers only, never from the URL (whose query the access log does not keep), and
checked before a request body is read. Backbones are loaded once per process at startup.

This module only wires the app: the routes are in ``rapt.service.routes`` (one router per
resource), their dependencies in ``rapt.service.deps``, the process state in
``rapt.service.state`` and the middlewares in ``rapt.service.middleware``.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import asynccontextmanager
from http import HTTPStatus
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi_offline import FastAPIOffline
from starlette.exceptions import HTTPException as StarletteHTTPException

from rapt import __version__
from rapt.service.access_log import scrub_access_log
from rapt.service.errors import ServiceError, error_response, errors, loc_text
from rapt.service.inference import Forward
from rapt.service.limits import ServiceConfig
from rapt.service.metrics import MetricsMiddleware, ServiceMetrics
from rapt.service.middleware import (
    InternalErrorMiddleware,
    RequestGateMiddleware,
    allowed_methods,
    keyed_routes,
)
from rapt.service.routes import ROUTERS, console
from rapt.service.split_sessions import SapError
from rapt.service.state import Service, default_prompt_loader
from rapt.service.worker import JobRunner

__all__ = ["Service", "ServiceError", "create_app", "default_prompt_loader"]


def create_app(config: ServiceConfig, *, backbones: dict[str, Any] | None = None,
               runner: JobRunner | None = None,
               prompt_loader: Callable[[Path], Any] | None = None,
               forward: Forward | None = None) -> FastAPI:
    """Build the app; backbones, runner, prompt loader and batch forward are injectable."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        scrub_access_log()  # after the server configured its logging: no query in its lines
        app.state.svc = Service(config, backbones, runner, prompt_loader, forward)
        app.state.metrics.bind(app.state.svc)
        try:
            yield
        finally:
            app.state.svc.close()

    # 413 (the request gate) and 500 can answer any route; each router and route adds its own.
    # The assets of /docs and /redoc from the fastapi-offline package, not a CDN: providers run
    # air-gapped, where the CDN's scripts never load and the pages stay blank. The pages are
    # routes.docs's (ReDoc's script fetched its logo from a CDN).
    app = FastAPIOffline(title="rapt provider service", version=__version__, lifespan=lifespan,
                         description="Prompt tuning and inference on privatized data (RAPT).",
                         responses=errors(413, 500), docs_url=None, redoc_url=None)
    # The last added is the outermost: metrics -> errors -> route, API key, body size -> routes.
    app.add_middleware(RequestGateMiddleware, limit=config.limits.max_upload_bytes)
    app.add_middleware(InternalErrorMiddleware)
    app.state.metrics = ServiceMetrics()  # outermost: counts every answer, 500s included
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)
    _add_error_handlers(app)
    for router in ROUTERS:
        app.include_router(router)
    # After every router is in: the gate checks the key of exactly these routes.
    app.state.key_routes = keyed_routes(app)
    return app


def _in_console(request: Request) -> bool:
    path = request.url.path
    return path == console.PATH or path.startswith(console.PATH + "/")


def _add_error_handlers(app: FastAPI) -> None:
    """Every error the app answers with becomes the JSON error body."""

    @app.exception_handler(ServiceError)
    async def _service_error(request: Request, exc: ServiceError) -> Response:
        if _in_console(request):  # a person reads it
            return console.error_page(request, exc.status, exc.detail)
        return error_response(exc.status, exc.error, exc.detail)

    app.add_exception_handler(console.LoginRequired, console.login_redirect)

    @app.exception_handler(SapError)
    async def _sap_error(request: Request, exc: SapError) -> JSONResponse:
        resp = error_response(exc.status, exc.error, exc.detail)
        if exc.last_step is not None:
            resp.headers["X-Rapt-Last-Step"] = str(exc.last_step)
        return resp

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        cause = exc.__cause__
        if exc.status_code == 400 and isinstance(cause, UnicodeDecodeError):
            # Bytes that are no text: the same 422 as any other body that is not JSON.
            return error_response(422, "validation_error", f"body is not valid JSON "
                                  f"({cause.encoding}: {cause.reason} at byte {cause.start})")
        code = HTTPStatus(exc.status_code).phrase.lower().replace(" ", "_")
        resp = (console.error_page(request, exc.status_code, str(exc.detail))
                if _in_console(request) else error_response(exc.status_code, code,
                                                            str(exc.detail)))
        resp.headers.update(exc.headers or {})
        if exc.status_code == 405:  # RFC 9110: the methods the path takes, all of them
            resp.headers["Allow"] = ", ".join(allowed_methods(request.scope))
        return resp

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        parts = []
        for e in exc.errors()[:10]:
            if e.get("type") == "json_invalid":
                parts.append(f"body is not valid JSON ({e.get('ctx', {}).get('error', '')})")
            else:
                parts.append(f"{loc_text(tuple(e['loc']))}: {e['msg']}")
        return error_response(422, "validation_error", "; ".join(parts))
