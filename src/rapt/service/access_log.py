"""The server's access log without query strings.

The service reads API keys from headers only (``X-API-Key``, ``Authorization: Bearer``), never
from the URL. A client may still put one there (``GET /v1/datasets?api_key=...`` gets 401), and
uvicorn's access log would keep it, with the full target, in a file that operators copy and
ship. :class:`QueryScrubber` on the ``uvicorn.access`` logger replaces every query string with
``?[redacted]`` before any handler formats the line: no route takes a secret in its query, and
no query value is needed to read the log (the route and the status stay)."""

from __future__ import annotations

import logging

ACCESS_LOGGER = "uvicorn.access"
REDACTED = "[redacted]"


def scrub_query(target: str) -> str:
    """``/path?anything`` -> ``/path?[redacted]``; a target without a query is unchanged."""
    path, sep, _ = target.partition("?")
    return f"{path}?{REDACTED}" if sep else target


class QueryScrubber(logging.Filter):
    """Redacts the query string of every text argument of a log record (uvicorn passes the
    request target as one argument of its access line), and of a message logged preformatted."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(scrub_query(a) if isinstance(a, str) else a
                                for a in record.args)
        elif isinstance(record.msg, str) and not record.args:
            record.msg = " ".join(scrub_query(w) for w in record.msg.split(" "))
        return True


def scrub_access_log() -> None:
    """Put a :class:`QueryScrubber` on uvicorn's access logger (once; the app calls it at
    startup, after uvicorn configured its logging)."""
    logger = logging.getLogger(ACCESS_LOGGER)
    if not any(isinstance(f, QueryScrubber) for f in logger.filters):
        logger.addFilter(QueryScrubber())
