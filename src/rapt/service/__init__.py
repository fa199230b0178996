"""The provider service: HTTP API, SQLite store, job worker, API keys."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rapt.service.app import ServiceError, create_app
    from rapt.service.limits import Limits, ServiceConfig

__all__ = ["Limits", "ServiceConfig", "ServiceError", "create_app"]
_HOME = {"ServiceError": "rapt.service.app", "create_app": "rapt.service.app",
         "Limits": "rapt.service.limits", "ServiceConfig": "rapt.service.limits"}


def __getattr__(name: str) -> Any:
    # Lazy: the model-side modules (mixed, inference) are used without the web stack, e.g. by
    # a benchmark on a GPU machine that has no FastAPI or SQLAlchemy.
    if name in _HOME:
        return getattr(importlib.import_module(_HOME[name]), name)
    raise AttributeError(f"module 'rapt.service' has no attribute {name!r}")
