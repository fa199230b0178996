"""The console: server-rendered HTML pages over the same store queries and ownership checks as
the API (the API's own route functions are called), for people who would rather not read JSON.

Sign-in: a form posts the API key; the server answers with a session: a random token in an
HttpOnly, SameSite=Strict cookie scoped to ``/console`` (over HTTPS a ``__Host-`` cookie,
Secure, on ``/``), whose SHA-256 alone the store keeps. The key itself never goes into a
cookie or a URL. A session ends at sign-out, after ``console_idle_s`` without a request, at
``console_session_s`` after its sign-in, and when its key is revoked or purged. Failed
sign-ins count with failed API keys per client address (429 past the limit). Only console
routes read these cookies; the API's routes take keys from headers only, so a browser's cookie
cannot act on ``/v1``. Every form carries a CSRF token that must equal the CSRF cookie (double
submit), and every console POST must come from a page of this origin (``Sec-Fetch-Site``,
``Origin``): a cross-site post is refused even with a planted cookie. Pages are Jinja2
templates shipped in the package, styled by one package-served stylesheet: no CDN, no build
step, no script (a page with a job in progress refreshes itself with a meta tag)."""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qsl

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import RedirectResponse
from fastapi.templating import Jinja2Templates

from rapt.service import auth
from rapt.service.curves import loss_svg
from rapt.service.deps import Svc, key_id, owned, svc_of
from rapt.service.errors import ServiceError
from rapt.service.routes import admin, datasets, jobs, prompts
from rapt.service.store.keys import MAX_KEY_NAME
from rapt.service.throttle import client_address

SESSION_COOKIE, CSRF_COOKIE, PATH = "rapt_session", "rapt_csrf", "/console"
# The cookie of earlier releases, which held the API key itself: erased wherever it is seen.
OLD_KEY_COOKIE = "rapt_key"
# Sec-Fetch-Site values of a request a page of this origin made, or the user typed.
SAME_SITE_FETCH = ("same-origin", "none")
ASSETS = Path(__file__).resolve().parent.parent / "templates" / "console"
# Nothing from elsewhere, no script, no framing; pages hold a tenant's data: never cached.
HEADERS = {"Content-Security-Policy": "default-src 'none'; style-src 'self'; img-src 'self'; "
           "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
           "X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff",
           # same-origin, not no-referrer: under no-referrer a browser sends "Origin: null"
           # with the console's own form posts, which the origin check then refuses
           "Referrer-Policy": "same-origin", "Cache-Control": "no-store"}

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


def _https(request: Request) -> bool:
    return request.url.scheme == "https"


def cookie_name(request: Request, name: str) -> str:
    """Over HTTPS the ``__Host-`` name: the browser then takes the cookie only from this
    host, Secure and on ``/`` (another subdomain cannot plant it)."""
    return f"__Host-{name}" if _https(request) else name


def _session_hash(request: Request) -> str | None:
    token = request.cookies.get(cookie_name(request, SESSION_COOKIE))
    return auth.hash_key(token) if token else None


def console_owner(request: Request, svc: Svc) -> str:
    """The key id of the browser's live session (its last use becomes now)."""
    h = _session_hash(request)
    cfg = svc.config
    kid = h and svc.store.session_owner(h, svc.clock(), cfg.console_idle_s,
                                        cfg.console_session_s)
    if not kid:
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


def _check_origin(request: Request) -> None:
    """403 unless the browser says a page of this origin sent the form. Browsers set both
    headers themselves (a page cannot); a client that sends neither (a script, curl) is left
    to the CSRF token."""
    site = request.headers.get("sec-fetch-site")
    if site is not None and site.lower() not in SAME_SITE_FETCH:
        raise ServiceError(403, "cross_site", f"a console form sent from another site "
                           f"(Sec-Fetch-Site: {site}) is refused; open the console at "
                           f"{request.base_url}console and submit it there")
    origin = request.headers.get("origin")
    own = f"{request.url.scheme}://{request.url.netloc}".lower()
    if origin is not None and origin.lower() != own:
        raise ServiceError(403, "cross_site", f"a console form sent from {origin!r} is "
                           f"refused: only pages of {own} may post console forms")


def check_csrf(request: Request, sent: str | None) -> None:
    """403 unless a page of this origin sent the form (``_check_origin``) and the form's CSRF
    token, present and not empty, equals the browser's cookie (double submit)."""
    _check_origin(request)
    cookie = request.cookies.get(cookie_name(request, CSRF_COOKIE), "")
    if not sent or not cookie or not secrets.compare_digest(cookie.encode(), sent.encode()):
        raise ServiceError(403, "csrf_failed", "the form's CSRF token is missing or does not "
                           "match this browser's; reload the page and submit it again")


def checked_form(request: Request, form: Annotated[dict, Depends(_form)]) -> dict[str, str]:
    """The form, if a page of this origin sent it with the CSRF token of the cookie; 403
    otherwise."""
    check_csrf(request, form.get("csrf"))
    return form


Form = Annotated[dict, Depends(checked_form)]


def _set_cookie(request: Request, resp: Response, name: str, value: str,
                max_age: int | None = None) -> None:
    """Set (or with ``max_age`` 0, erase) a console cookie under its name for the scheme."""
    https = _https(request)
    resp.set_cookie(cookie_name(request, name), value, max_age=max_age,
                    path="/" if https else PATH, httponly=True, samesite="strict",
                    secure=https)


def render(request: Request, name: str, status: int = 200, **ctx: Any) -> Response:
    """A page, with the CSRF token its forms carry (a new one when the browser has none)."""
    have = request.cookies.get(cookie_name(request, CSRF_COOKIE))
    token = have or secrets.token_urlsafe(32)
    resp = templates.TemplateResponse(request, name, {"csrf": token, **ctx},
                                      status_code=status, headers=HEADERS)
    if have != token:
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
    if _session_hash(request):  # an ended session: forget it
        _set_cookie(request, resp, SESSION_COOKIE, "", max_age=0)
    if request.cookies.get(OLD_KEY_COOKIE):  # an earlier release's cookie held the key
        resp.delete_cookie(OLD_KEY_COOKIE, path=PATH)
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
    """Check the key (failed attempts count per address) and start a session."""
    addr = client_address(request.scope)
    wait = svc.auth_failures.retry_after(addr)
    if wait is not None:
        resp = render(request, "login.html", status=429, error=svc.auth_failures.refusal(wait))
        resp.headers["Retry-After"] = str(wait)
        return resp
    kid = key_id(svc, form.get("key", "").strip())
    if kid is None:
        svc.auth_failures.fail(addr)
        return render(request, "login.html", status=401,
                      error="unknown or revoked API key (ask the operator for one)")
    if (old := _session_hash(request)) is not None:
        svc.store.end_session(old)
    token = secrets.token_urlsafe(32)  # 256 random bits; the store keeps its hash only
    svc.store.create_session(kid, auth.hash_key(token), svc.clock(), svc.config.console_idle_s,
                             svc.config.console_session_s)
    resp = redirect("")
    _set_cookie(request, resp, SESSION_COOKIE, token)
    _set_cookie(request, resp, CSRF_COOKIE, secrets.token_urlsafe(32))  # a new session's
    return resp


@router.post("/logout")
def logout(request: Request, form: Form) -> Response:
    """End the session in the store (a copied cookie stops working too) and in the browser."""
    if (h := _session_hash(request)) is not None:
        svc_of(request).store.end_session(h)
    resp = redirect("/login")
    for name in (SESSION_COOKIE, CSRF_COOKIE):
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
    attacker sets it, the rare-word and personal-data privacy when the table holds them
    (``kinds``: one phrase, "" without), and the privacy rule's verdict on η alone. The
    service never sees the clean text, so P and nearest neighbour on the rows themselves stay
    on the user's machine (what the uploader declares of them is shown beside)."""
    from rapt.privacy.attack_table import strongest_at
    from rapt.privacy.rule import judge

    ans = strongest_at(backbone, eta)
    verdict = judge(None, backbone=backbone, eta=eta)
    return {"p": ans.p, "ep": ans.empirical_privacy, "attacker": ans.attacker_name,
            "reason": ans.reason, "weak": verdict.weak, "min_p": verdict.min_p,
            "kinds": verdict.kinds_phrase()}


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
                 queue=queue, config=svc.config, new_key=new_key, status=status,
                 max_name=MAX_KEY_NAME)


@router.post("/admin/keys")
def admin_key_op(request: Request, svc: Svc, me: Me, form: Form) -> Response:
    """Create, revoke or purge a key; revoke and purge need its name typed again."""
    admin.admin(request, me)
    op, ref = form.get("op"), form.get("key", "").strip()
    if op == "create":
        try:
            svc.store.check_key_name(ref)
        except ValueError as e:
            raise ServiceError(422, "validation_error", str(e)) from None
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
