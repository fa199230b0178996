"""The API's documentation pages, /docs (Swagger UI) and /redoc (ReDoc), served entirely from
this server: the scripts and styles of the ``fastapi-offline`` package (under
``/static-offline-docs``), and ReDoc's script with its one outside address, the Redocly logo
on cdn.redoc.ly, replaced by an empty picture. Providers run air-gapped, and a docs page that
reached a CDN would tell it who reads the API, and when. A Content-Security-Policy keeps any
other request on this origin (no key needed: the pages hold only the public OpenAPI document)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import fastapi_offline
from fastapi import APIRouter, Request, Response
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html

STATIC = "/static-offline-docs"  # where FastAPIOffline mounts its package's assets
REDOC_JS = "/docs-assets/redoc.standalone.js"
# In ReDoc's script: the picture of its "API docs by Redocly" footer, fetched from the CDN.
REDOC_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"
EMPTY_SVG = "data:image/svg+xml,%3Csvg%20xmlns='http://www.w3.org/2000/svg'/%3E"
# Swagger UI starts from an inline script and both draw with inline styles; ReDoc's search
# runs in a worker made from a blob.
HEADERS = {"Content-Security-Policy": "default-src 'self'; script-src 'self' 'unsafe-inline'; "
           "style-src 'self' 'unsafe-inline'; img-src 'self' data:; worker-src 'self' blob:; "
           "frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
           "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}

router = APIRouter(include_in_schema=False)


@lru_cache(maxsize=1)
def redoc_script() -> bytes:
    """The package's ReDoc script with the CDN logo replaced by an empty picture; fails loudly
    if a new release moved the address (the browser test checks no other is left)."""
    path = Path(fastapi_offline.__file__).parent / "static" / "redoc.standalone.js"
    text = path.read_text(encoding="utf-8")
    if REDOC_LOGO not in text:
        raise RuntimeError(f"{path}: ReDoc's logo is no longer at {REDOC_LOGO}; find what it "
                           "fetches now and serve it from here")
    return text.replace(REDOC_LOGO, EMPTY_SVG).encode("utf-8")


def _root(request: Request) -> str:
    return request.scope.get("root_path", "")


@router.get("/docs")
def swagger_ui(request: Request) -> Response:
    root, app = _root(request), request.app
    page = get_swagger_ui_html(openapi_url=root + app.openapi_url,
                               title=app.title + " - Swagger UI",
                               swagger_js_url=f"{root}{STATIC}/swagger-ui-bundle.js",
                               swagger_css_url=f"{root}{STATIC}/swagger-ui.css",
                               swagger_favicon_url=f"{root}{STATIC}/favicon.png",
                               swagger_ui_parameters=app.swagger_ui_parameters)
    page.headers.update(HEADERS)
    return page


@router.get("/redoc")
def redoc(request: Request) -> Response:
    root, app = _root(request), request.app
    page = get_redoc_html(openapi_url=root + app.openapi_url, title=app.title + " - ReDoc",
                          redoc_js_url=root + REDOC_JS, with_google_fonts=False,
                          redoc_favicon_url=f"{root}{STATIC}/favicon.png")
    page.headers.update(HEADERS)
    return page


@router.get(REDOC_JS)
def redoc_js() -> Response:
    return Response(redoc_script(), media_type="text/javascript",
                    headers={"Cache-Control": "max-age=3600", **HEADERS})
