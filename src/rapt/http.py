"""HTTP plumbing of the user's side: the service's error type, one authenticated session with
its request, JSON call and retry, and the plain-http warning.

Below both :mod:`rapt.client.client` (the service's routes) and :mod:`rapt.split.remote` (SAP steps
over ``/v1/sap/...``), so neither imports the other. Only ``httpx``; no rapt import.
"""

from __future__ import annotations

import ipaddress
import time
import warnings
from typing import Any

import httpx

__all__ = ["HttpSession", "ServiceError", "warn_plain_http"]


class ServiceError(RuntimeError):
    """The service answered with an error body {"error", "detail"} (status 0: unreachable)."""

    def __init__(self, status: int, error: str, detail: str):
        super().__init__(f"HTTP {status} {error}: {detail}")
        self.status, self.error, self.detail = status, error, detail
        self.last_step: int | None = None  # a SAP session's last applied step (409s)


def warn_plain_http(url: str, category: type[Warning] = UserWarning, *,
                    stacklevel: int = 2) -> None:
    """Warn before the API key (and the privatized data) go over plain http to another
    machine: anyone on the network path can read them. Loopback is exempt."""
    u = httpx.URL(url)
    if u.scheme != "http" or u.host == "localhost":
        return
    try:
        if ipaddress.ip_address(u.host).is_loopback:
            return
    except ValueError:
        pass
    warnings.warn(f"sending the API key over plain http to {u.host}: anyone on the network path "
                  "can read it and your (privatized) data; use an https:// URL", category,
                  stacklevel=stacklevel + 1)


class HttpSession:
    """The service at ``url`` with the bearer ``api_key`` (or ``client``, an ``httpx.Client``
    already pointed at it, e.g. a FastAPI TestClient, which gets the key's header).
    ``timeout`` in seconds."""

    def __init__(self, url: str | None, api_key: str, *, timeout: float = 120.0,
                 client: httpx.Client | None = None) -> None:
        headers = {"Authorization": f"Bearer {api_key}"}
        if client is None:
            client = httpx.Client(base_url=url or "", timeout=timeout, headers=headers)
        else:
            client.headers.update(headers)
        self.client = client

    @property
    def base_url(self) -> httpx.URL:
        return self.client.base_url

    def close(self) -> None:
        self.client.close()

    def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        """One request (``kw``: httpx's json / content / params / headers); an error answer
        raises ServiceError with the service's code and detail, a transport failure
        ServiceError(0, "unreachable")."""
        try:
            r = self.client.request(method, path, **kw)
        except httpx.TransportError as e:
            raise ServiceError(0, "unreachable", f"{self.client.base_url}: {e}") from e
        if r.status_code >= 400:
            last = r.headers.get("x-rapt-last-step")
            try:
                body = r.json()
                err = ServiceError(r.status_code, body.get("error", "error"),
                                   body.get("detail", r.text))
            except ValueError:
                err = ServiceError(r.status_code, "error", r.text[:500])
            err.last_step = int(last) if last is not None else None
            raise err
        return r

    def call(self, method: str, path: str, json: Any = None) -> Any:
        """A JSON request and its decoded JSON answer."""
        return self.request(method, path, json=json).json()

    def request_retrying(self, method: str, path: str, *, retry_s: float,
                         **kw: Any) -> httpx.Response:
        """:meth:`request`, retrying transport failures (server restarting, connection
        dropped) and 429 ``sap_busy`` (the server's SAP sessions in memory are all in use)
        with backoff (0.1 s doubling to 2 s) for up to ``retry_s`` seconds. Only for requests
        the service makes harmless to repeat (SAP steps carry their step number)."""
        deadline = time.monotonic() + retry_s
        delay = 0.1
        while True:
            try:
                return self.request(method, path, **kw)
            except ServiceError as e:
                again = e.status == 0 or (e.status == 429 and e.error == "sap_busy")
                if not again or time.monotonic() > deadline:
                    raise
                time.sleep(delay)
                delay = min(2.0, delay * 2)
