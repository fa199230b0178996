"""The console: server-rendered HTML pages over the same store queries and ownership checks as
the API (the API's own route functions are called), for people who would rather not read JSON.

Sign-in: a form posts the API key, which goes into an HttpOnly, SameSite=Strict cookie scoped
to ``/console`` (Secure over HTTPS), never into a URL. Only console routes read that cookie;
the API's routes take keys from headers only, so a browser's cookie cannot act on ``/v1``.
Every form carries a CSRF token that must equal the ``rapt_csrf`` cookie (double submit; the
SameSite=Strict cookies are a second guard). Pages are Jinja2 templates shipped in the package,
styled by one package-served stylesheet: no CDN, no build step, no script (a page with a job
in progress refreshes itself with a meta tag)."""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qsl

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import RedirectResponse
from fastapi.templating import Jinja2Templates

from rapt.service.curves import loss_svg
from rapt.service.deps import Svc, key_id, owned
from rapt.service.errors import ServiceError
from rapt.service.routes import admin, datasets, jobs, prompts

KEY_COOKIE, CSRF_COOKIE, PATH = "rapt_key", "rapt_csrf", "/console"
ASSETS = Path(__file__).resolve().parent.parent / "templates" / "console"
# Nothing from elsewhere, no script, no framing; pages hold a tenant's data: never cached.
HEADERS = {"Content-Security-Policy": "default-src 'none'; style-src 'self'; img-src 'self'; "
           "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
           "X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff",
           "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"}

router = APIRouter(prefix=PATH, include_in_schema=False)


class LoginRequired(Exception):
    """No valid key in the console's cookie: the app answers with a redirect to the login."""


def _duration(s: float | None) -> str:
    if s is None:
        return "–"
    s = int(round(s))
    if s < 60:
        return f"{s} s"
    return f"{s // 3600} h {s % 3600 // 60} min" if s >= 3600 else f"{s // 60} min {s % 60} s"


templates = Jinja2Templates(directory=str(ASSETS))  # autoescapes .html
templates.env.filters["duration"] = _duration
templates.env.filters["when"] = lambda t: time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t))


def console_owner(request: Request, svc: Svc) -> str:
    """The key id behind the console's cookie (the same check as the API's key header)."""
    kid = key_id(svc, request.cookies.get(KEY_COOKIE))
    if kid is None:
        raise LoginRequired()
    return kid


Me = Annotated[str, Depends(console_owner)]


async def _form(request: Request) -> dict[str, str]:
    """The urlencoded body of a console form (the request gate has bounded its size)."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "application/x-www-form-urlencoded":
        raise ServiceError(415, "unsupported_media_type",
                           "console forms are sent as application/x-www-form-urlencoded")
    body = (await request.body()).decode("utf-8", "replace")
    return dict(parse_qsl(body, keep_blank_values=True))


def check_csrf(request: Request, sent: str) -> None:
    """403 unless a form's CSRF token equals the browser's cookie (double submit)."""
    cookie = request.cookies.get(CSRF_COOKIE, "").encode()
    if not cookie or not secrets.compare_digest(cookie, sent.encode()):
        raise ServiceError(403, "csrf_failed", "the form's CSRF token does not match this "
                           "browser's; reload the page and submit it again")


def checked_form(request: Request, form: Annotated[dict, Depends(_form)]) -> dict[str, str]:
    """The form, if its CSRF token equals the cookie's; 403 otherwise."""
    check_csrf(request, form.get("csrf", ""))
    return form


Form = Annotated[dict, Depends(checked_form)]


def _set_cookie(request: Request, resp: Response, name: str, value: str,
                max_age: int | None = None) -> None:
    resp.set_cookie(name, value, max_age=max_age, path=PATH, httponly=True, samesite="strict",
                    secure=request.url.scheme == "https")


def render(request: Request, name: str, status: int = 200, **ctx: Any) -> Response:
    """A page, with the CSRF token its forms carry (a new one when the browser has none)."""
    token = request.cookies.get(CSRF_COOKIE) or secrets.token_urlsafe(32)
    resp = templates.TemplateResponse(request, name, {"csrf": token, **ctx},
                                      status_code=status, headers=HEADERS)
    if request.cookies.get(CSRF_COOKIE) != token:
        _set_cookie(request, resp, CSRF_COOKIE, token)
    return resp


def _page(request: Request, svc: Any, me: str, name: str, status: int = 200,
          **ctx: Any) -> Response:
    """A signed-in page: the caller's key name and whether to link the operator's page."""
    who = next((k["name"] for k in svc.store.list_keys() if k["id"] == me), me)
    return render(request, name, status=status, me=me, who=who,
                  is_admin=svc.store.is_admin(me), **ctx)


def error_page(request: Request, status: int, detail: str) -> Response:
    """A ServiceError raised under /console, as a page (the API answers JSON)."""
    return render(request, "error.html", status=status, code=status, detail=detail)


def redirect(to: str) -> RedirectResponse:
    return RedirectResponse(PATH + to, status_code=303, headers=HEADERS)


def login_redirect(request: Request, exc: LoginRequired) -> Response:
    resp = redirect("/login")
    if request.cookies.get(KEY_COOKIE):  # a revoked key: forget it
        _set_cookie(request, resp, KEY_COOKIE, "", max_age=0)
    return resp


@router.get("/static/console.css")
def stylesheet() -> Response:
    return Response((ASSETS / "console.css").read_bytes(), media_type="text/css",
                    headers={"Cache-Control": "max-age=3600"})


@router.get("/login")
def login_page(request: Request) -> Response:
    return render(request, "login.html")


@router.post("/login")
def login(request: Request, svc: Svc, form: Form) -> Response:
    key = form.get("key", "").strip()
    if key_id(svc, key) is None:
        return render(request, "login.html", status=401,
                      error="unknown or revoked API key (ask the operator for one)")
    resp = redirect("")
    _set_cookie(request, resp, KEY_COOKIE, key)
    _set_cookie(request, resp, CSRF_COOKIE, secrets.token_urlsafe(32))  # a new session's
    return resp


@router.post("/logout")
def logout(request: Request, form: Form) -> Response:
    resp = redirect("/login")
    for name in (KEY_COOKIE, CSRF_COOKIE):
        _set_cookie(request, resp, name, "", max_age=0)
    return resp


@router.get("")
def jobs_page(request: Request, svc: Svc, me: Me) -> Response:
    rows = jobs.list_jobs(svc, me)
    live = any(j.state in ("queued", "running") for j in rows)
    return _page(request, svc, me, "jobs.html", jobs=list(reversed(rows)), refresh=live)


@router.get("/jobs/{job_id}")
def job_page(job_id: str, request: Request, svc: Svc, me: Me) -> Response:
    job = jobs.job_status(svc, owned(svc, "job", job_id, me))
    svg, why = None, None
    if job.prompt_id is None:
        why = "The curves appear when the job has produced its prompt."
    else:
        prompt = svc.store.get_prompt(job.prompt_id, me)
        meta = prompts._saved_meta(prompt["path"]) if prompt else {}
        svg = loss_svg(meta.get("history") or [])
        if svg is None:
            why = ("No training history was kept: under DP it is computed on private "
                   "batches, so it stays out of the prompt." if job.epsilon is not None
                   else "The prompt's files hold no training history.")
    return _page(request, svc, me, "job.html", job=job, svg=svg, why=why,
                 refresh=job.state in ("queued", "running"))


@router.post("/jobs/{job_id}/cancel")
def cancel(job_id: str, request: Request, svc: Svc, me: Me, form: Form) -> Response:
    jobs.cancel_job(job_id, owned(svc, "job", job_id, me), svc, me)
    return redirect(f"/jobs/{job_id}" if form.get("back") == "job" else "")


@router.get("/datasets")
def datasets_page(request: Request, svc: Svc, me: Me) -> Response:
    return datasets_view(request, svc, me)


def datasets_view(request: Request, svc: Any, me: str, status: int = 200,
                  **ctx: Any) -> Response:
    """The datasets page with its upload and job forms (``ctx``: a form's error, its values)."""
    from rapt.config import TuneConfig

    mine = datasets.list_datasets(svc, me)
    return _page(request, svc, me, "datasets.html", status=status, datasets=mine,
                 privacy={d.id: table_privacy(d.backbone, d.privacy.eta) for d in mine
                          if d.privacy.mechanism != "none" and d.privacy.eta is not None},
                 backbones=list(svc.backbones), defaults=TuneConfig(), **ctx)


def table_privacy(backbone: str, eta: float) -> dict:
    """What rapt's attack table says of a declared (backbone, η): the table's P there, the
    empirical privacy (1 − the best recovery of the attackers we ran: an upper bound), which
    attacker sets it, and the privacy rule's verdict on η alone. The service never sees the
    clean text, so P and nearest neighbour on the rows themselves stay on the user's machine."""
    from rapt.privacy.attack_table import strongest_at
    from rapt.privacy.rule import judge

    ans = strongest_at(backbone, eta)
    verdict = judge(None, backbone=backbone, eta=eta)
    return {"p": ans.p, "ep": ans.empirical_privacy, "attacker": ans.attacker_name,
            "reason": ans.reason, "weak": verdict.weak, "min_p": verdict.min_p}


@router.get("/prompts")
def prompts_page(request: Request, svc: Svc, me: Me) -> Response:
    return _page(request, svc, me, "prompts.html", prompts=prompts.list_prompts(svc, me))


@router.get("/admin")
def admin_page(request: Request, svc: Svc, me: Me) -> Response:
    """Keys with their storage, and the queue (operator keys only)."""
    admin.admin(request, me)
    return _admin_page(request, svc, me)


def _admin_page(request: Request, svc: Any, me: str, new_key: str | None = None,
                status: int = 200) -> Response:
    store = svc.store
    keys = store.list_keys()
    names = {k["id"]: k["name"] for k in keys}
    queue = store.jobs_in_states("running", "queued")
    return _page(request, svc, me, "admin.html", keys=keys, names=names, now=time.time(),
                 stored=store.stored_bytes_by_owner(), counts=store.job_counts(),
                 queue=queue, config=svc.config, new_key=new_key, status=status)


@router.post("/admin/keys")
def admin_key_op(request: Request, svc: Svc, me: Me, form: Form) -> Response:
    """Create, revoke or purge a key; revoke and purge need its name typed again."""
    from rapt.service import auth

    admin.admin(request, me)
    op, ref = form.get("op"), form.get("key", "").strip()
    if op == "create":
        if not ref:
            raise ServiceError(422, "validation_error", "give the new key a name")
        key = auth.new_key()  # shown once, on this page only (no-store), never in a URL
        svc.store.add_key(ref, auth.hash_key(key), admin=form.get("admin") == "on")
        return _admin_page(request, svc, me, new_key=key, status=201)
    if op not in ("revoke", "purge"):
        raise ServiceError(422, "validation_error", "op is create, revoke or purge")
    keys = {k["id"]: k["name"] for k in svc.store.list_keys()}
    if form.get("confirm", "").strip() != keys.get(ref, "\0"):
        raise ServiceError(422, "not_confirmed", f"to {op} key '{ref}', type its name in the "
                           "confirmation box")
    if op == "revoke":
        admin.admin_revoke_key(ref, svc)
    else:
        admin.admin_purge_key(ref, svc)
    return redirect("/admin")
