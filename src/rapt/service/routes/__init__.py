"""The service's routes, one ``APIRouter`` per resource (FastAPI's "bigger applications"
layout). A new route goes into its resource's module; a new resource gets a module with a
``router`` and a line in ``ROUTERS``. Every route except those of ``meta`` and ``docs`` (the
documentation pages) needs an API key: take ``Owner`` (or an ``*_of`` ownership dependency)
from ``rapt.service.deps``. The console's HTML pages (``console``) take the key from their own
cookie instead, never the API's routes."""

from __future__ import annotations

from fastapi import APIRouter

from rapt.service.routes import (
    admin,
    console,
    console_forms,
    datasets,
    docs,
    jobs,
    meta,
    predict,
    prompts,
    sap,
)

# In the order they are matched and listed in the OpenAPI document.
ROUTERS: list[APIRouter] = [meta.router, docs.router, admin.router, admin.metrics_router,
                            datasets.router, jobs.router, prompts.router, predict.router,
                            sap.router, console.router, console_forms.router]
