"""The provider service: HTTP API, SQLite store, job worker, API keys."""

from rapt.service.app import ServiceError, create_app
from rapt.service.limits import Limits, ServiceConfig

__all__ = ["Limits", "ServiceConfig", "ServiceError", "create_app"]
