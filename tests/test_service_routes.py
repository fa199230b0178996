"""The service's routers: every route under /v1 but health and backbones needs an API key, and
the request gate recognizes a keyed route however its ``owner`` dependency is declared.

Derived from the app's own route list (its OpenAPI document), so a route added later is covered
without touching this file."""

from __future__ import annotations

import json
import re

import pytest
from fastapi import APIRouter, Depends, FastAPI
from fastapi.testclient import TestClient

from rapt.service import Limits, ServiceConfig, auth, create_app
from rapt.service.deps import Owner, admin, owner
from rapt.service.middleware import _route_key, flat_routes, keyed_routes
from rapt.service.store import Store

OPEN = {"/v1/health", "/v1/backbones"}
# The gate's own 401 (the route's body unread); the owner dependency's fallback says
# "missing, unknown or revoked API key" instead.
GATE_NO_KEY = "missing API key: send 'Authorization: Bearer <key>'"


@pytest.fixture()
def client(tmp_path, tiny_bert):
    # Every route gets a wrong key below: more failures from one address than the default
    # limit lets through (tests/test_console_sessions.py tests the limit).
    cfg = ServiceConfig(db_path=tmp_path / "svc.db", backbones=["tiny"],
                        limits=Limits(max_upload_bytes=1000, max_auth_failures=0))
    with TestClient(create_app(cfg, backbones={"tiny": tiny_bert})) as c:
        yield c


def _operations(app: FastAPI) -> list[tuple[str, str]]:
    """(method, path) of every documented operation, path parameters filled in."""
    return [(method.upper(), re.sub(r"\{[^}]+\}", "x", path))
            for path, ops in app.openapi()["paths"].items() for method in ops]


def test_every_v1_route_but_health_and_backbones_needs_a_key(client):
    ops = _operations(client.app)
    assert len(ops) >= 20 and ("DELETE", "/v1/admin/keys/x") in ops
    for method, path in ops:
        if not path.startswith("/v1") or path in OPEN:
            continue
        # Invalid JSON: a route whose key were checked only after the body was read would
        # answer 422 here, not 401.
        r = client.request(method, path, content=b"{not json",
                           headers={"Content-Type": "application/json"})
        assert r.status_code == 401, (method, path, r.status_code, r.text)
        assert r.json() == {"error": "unauthorized", "detail": GATE_NO_KEY}, (method, path)
        r = client.request(method, path, headers={"Authorization": "Bearer rapt_wrong"})
        assert r.status_code == 401 and r.json()["detail"] == "unknown or revoked API key"
        # Over the body limit: the key still comes first.
        r = client.request(method, path, content=b"x" * 5000)
        assert r.status_code == 401, (method, path, r.status_code)
    for path in OPEN:
        assert client.get(path).status_code == 200


def test_admin_routes_need_an_operator_key(client, tmp_path):
    store = Store(tmp_path / "svc.db")
    user = auth.new_key()
    store.add_key("alice", auth.hash_key(user))
    store.close()
    for method, path in (("GET", "/v1/stats"), ("POST", "/v1/admin/keys/alice/revoke"),
                         ("DELETE", "/v1/admin/keys/alice")):
        r = client.request(method, path, headers={"X-API-Key": user})
        assert r.status_code == 403 and r.json()["error"] == "forbidden", (path, r.text)
    assert client.get("/v1/datasets", headers={"X-API-Key": user}).json() == []


def test_keyed_routes_finds_owner_wherever_it_is_declared():
    def nested(me: Owner) -> str:
        return me

    on_route = APIRouter(prefix="/r")

    @on_route.get("/param")
    def param(me: Owner) -> str:
        return me

    @on_route.get("/decorator", dependencies=[Depends(owner)])
    def decorator() -> None: ...

    @on_route.get("/nested")
    def via_nested(me: str = Depends(nested)) -> str:
        return me

    @on_route.get("/admin", dependencies=[Depends(admin)])
    def via_admin() -> None: ...

    @on_route.get("/open")
    def open_() -> None: ...

    on_router = APIRouter(prefix="/router", dependencies=[Depends(owner)])

    @on_router.get("/a")
    def a() -> None: ...

    at_include = APIRouter()

    @at_include.get("/b")
    def b() -> None: ...

    app = FastAPI()
    app.include_router(on_route)
    app.include_router(on_router)
    app.include_router(at_include, prefix="/included", dependencies=[Depends(owner)])

    @app.get("/direct")
    def direct(me: Owner) -> str:
        return me

    keyed = keyed_routes(app)
    paths = {r.path: _route_key(r) in keyed for r in flat_routes(app.router.routes)
             if r.path.startswith(("/r/", "/router", "/included", "/direct"))}
    assert paths == {"/r/param": True, "/r/decorator": True, "/r/nested": True,
                     "/r/admin": True, "/r/open": False, "/router/a": True,
                     "/included/b": True, "/direct": True}


def test_every_rapt_name_in_the_openapi_document_exists(client):
    """A description that names rapt's code (``rapt.split.wire``, ``rapt.dp.DPConfig``) names
    a module or attribute that exists: a move of the code must not leave the HTTP API's
    document pointing nowhere (the pair encoder's move from rapt.reconstruction did, so the
    text_pairs field now says how pairs are encoded instead of naming the function)."""
    import importlib

    names = set(re.findall(r"\brapt(?:\.[A-Za-z_]\w*)+", json.dumps(client.app.openapi())))
    assert "rapt.split.wire" in names
    for name in sorted(names):
        parts = name.split(".")
        for cut in range(len(parts), 0, -1):  # the longest importable module, then attributes
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            for attr in parts[cut:]:
                assert hasattr(obj, attr), f"{name}: {'.'.join(parts[:cut])} has no {attr}"
                obj = getattr(obj, attr)
            break


@pytest.mark.parametrize(("page", "assets"), [
    ("/docs", ("swagger-ui-bundle.js", "swagger-ui.css")),
    ("/redoc", ("redoc.standalone.js",))])
def test_docs_pages_load_their_scripts_from_the_service_not_a_cdn(client, page, assets):
    """Air-gapped providers: every script and style the page names is served by the service
    itself, without a key."""
    import re

    html = client.get(page)
    assert html.status_code == 200
    urls = re.findall(r"""(?:src|href)=["']([^"']+)["']""", html.text)
    urls += re.findall(r"""url: *["']([^"']+)["']""", html.text)
    assert not [u for u in urls if u.startswith(("http://", "https://", "//"))], urls
    for name in assets:
        url = next(u for u in urls if u.endswith(name))
        got = client.get(url)
        assert got.status_code == 200 and len(got.content) > 10_000, (url, got.status_code)


def test_docs_pages_name_no_other_host(client):
    """/docs and /redoc load only this server's assets; ReDoc's script is served with its
    CDN logo replaced (old behaviour: it fetched cdn.redoc.ly/redoc/logo-mini.svg). The
    browser test records the pages' network log; this one reads what they are made of."""
    import re as _re

    for page in ("/docs", "/redoc"):
        r = client.get(page)
        assert r.status_code == 200 and "default-src 'self'" in \
            r.headers["content-security-policy"]
        for url in _re.findall(r'(?:src|href|url)\s*[=:]\s*["\']([^"\']+)', r.text):
            assert url.startswith("/"), (page, url)
    js = client.get("/docs-assets/redoc.standalone.js")
    assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")
    assert "cdn.redoc.ly" not in js.text and "data:image/svg+xml" in js.text
