"""The service's error bodies: every error is JSON ``{"error": code, "detail": message}``."""

from __future__ import annotations

from fastapi.responses import JSONResponse

from rapt.service.schemas import ErrorBody

_WHEN = {
    401: "missing, unknown or revoked API key (checked before the body is read)",
    403: "the key is not an operator (admin) key",
    404: "no such object among the caller's own (another key's objects look missing too)",
    409: "the request conflicts with the object's state",
    413: "the request body is over the limit max_upload_bytes (or a stored-size limit)",
    422: "the request is refused by validation: the schema's, or a rule it cannot state "
         "(exactly one of two fields, labels below num_labels, rows the backbone can hold, ...)",
    429: "a quota or queue of this key or of the server is full, or this address sent too "
         "many unknown keys lately (Retry-After: the seconds to wait)",
    500: "unexpected error; the detail holds only an id the operator finds in the server log",
    503: "a backbone or stored files that the request needs are not available here",
}


def errors(*codes: int) -> dict[int | str, dict]:
    """OpenAPI ``responses=`` for the error ``codes`` a route (or router, or the app) answers
    with, each with the JSON error body and when it happens."""
    return {code: {"model": ErrorBody, "description": _WHEN[code]} for code in codes}


class ServiceError(Exception):
    """An error the client caused (or must know about), returned as JSON."""

    def __init__(self, status: int, error: str, detail: str):
        super().__init__(detail)
        self.status, self.error, self.detail = status, error, detail


def error_response(status: int, error: str, detail: str) -> JSONResponse:
    """The JSON error body with HTTP ``status``."""
    # A detail may quote what the client sent (a field name, a backbone name), which can hold
    # lone surrogates that UTF-8 cannot encode: escape those.
    detail = detail.encode("utf-8", "backslashreplace").decode("utf-8")
    return JSONResponse({"error": error, "detail": detail}, status_code=status)


def loc_text(loc: tuple) -> str:
    """A validation error's location as a path: ``("body", "rows", 3)`` -> ``body.rows[3]``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out
