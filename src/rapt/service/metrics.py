"""Prometheus metrics of one API process, for operators (``GET /metrics``, operator keys only).

Requests by route and status and their latency are counted by ``MetricsMiddleware`` as they
pass; the rest is read at scrape time: jobs by state, the queue's length and oldest wait, the
job workers, micro-batching counters, the privatized tokens received, storage bytes and DP ε
per key (grouped store queries, so a scrape costs a handful of queries whatever the number of
keys). Each app has its own
registry: two apps in one process (tests) never share counters."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
JOB_STATES = ("queued", "running", "succeeded", "failed", "cancelled")
# The request methods counted under their own name (RFC 9110's and PATCH); any other method a
# client makes up counts as "other", so no request can add a series (the route is a template
# or "unmatched", the status one of the app's own codes).
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE",
                     "PATCH"})
# Seconds: from a cached /v1/health to a predict that waits for its micro-batch.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class ServiceMetrics:
    """The registry of one app: request counters filled by the middleware, and a collector
    that reads the service's state when scraped (bound once the service exists)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("rapt_http_requests", "HTTP requests answered, by route "
                                "template, method and status", ["route", "method", "status"],
                                registry=self.registry)
        self.latency = Histogram("rapt_http_request_duration_seconds", "Time to answer a "
                                 "request, by route template", ["route"],
                                 buckets=LATENCY_BUCKETS, registry=self.registry)
        self._collector: _ServiceCollector | None = None

    def bind(self, svc: Any) -> None:
        """Report the state of ``svc`` (the app's ``Service``) from now on."""
        if self._collector is not None:
            self.registry.unregister(self._collector)
        self._collector = _ServiceCollector(svc)
        self.registry.register(self._collector)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _ServiceCollector(Collector):
    def __init__(self, svc: Any):
        self.svc = svc

    def collect(self) -> Iterator[Metric]:
        store, cfg = self.svc.store, self.svc.config
        counts = store.job_counts()
        jobs = GaugeMetricFamily("rapt_jobs", "Tuning jobs in the store, by state",
                                 labels=["state"])
        for state in sorted(set(JOB_STATES) | set(counts)):
            jobs.add_metric([state], counts.get(state, 0))
        yield jobs
        yield GaugeMetricFamily("rapt_queue_length", "Jobs waiting for a worker",
                                value=counts.get("queued", 0))
        oldest = store.oldest_queued_created()
        yield GaugeMetricFamily("rapt_queue_oldest_wait_seconds", "How long the "
                                "longest-waiting queued job has waited (0: queue empty)",
                                value=max(0.0, time.time() - oldest) if oldest else 0.0)
        workers = cfg.ray_actors if cfg.jobs == "ray" else cfg.job_threads
        w = GaugeMetricFamily("rapt_job_workers", "Job workers this process started (threads "
                              "in process, or Ray actors)", labels=["backend"])
        w.add_metric([cfg.jobs], workers)
        yield w
        yield from self._batching()
        tokens = CounterMetricFamily("rapt_privatized_tokens", "Privatized tokens this process "
                                     "received (special tokens left out), by route family: "
                                     "datasets (uploads declared privatized), predict (queries)",
                                     labels=["route"])
        counts = dict(self.svc.privatized_tokens)
        for family in sorted({"datasets", "predict"} | set(counts)):
            tokens.add_metric([family], counts.get(family, 0))
        yield tokens
        yield from self._per_key()

    def _batching(self) -> Iterator[Metric]:
        """The micro-batchers' counters per backbone: rows / batches is the mean batch."""
        fams = {f: CounterMetricFamily(f"rapt_microbatch_{f}", f"Micro-batcher {f} since "
                                       "start, by backbone", labels=["backbone"])
                for f in ("requests", "rows", "batches", "forward_passes")}
        for name, b in self.svc.batchers.items():
            for f, fam in fams.items():
                fam.add_metric([name], getattr(b.stats, f))
        yield from fams.values()

    def _per_key(self) -> Iterator[Metric]:
        store = self.svc.store
        names = {k["id"]: k["name"] for k in store.list_keys()}
        stored = GaugeMetricFamily("rapt_key_stored_bytes", "Bytes a key stores, as its quota "
                                   "counts them (datasets, SAP files)", labels=["key", "name"])
        for kid, n in sorted(store.stored_bytes_by_owner().items()):
            stored.add_metric([kid, names.get(kid, "")], n)
        yield stored
        eps = GaugeMetricFamily("rapt_key_dp_epsilon_sum", "Sum of the ε of a key's DP jobs "
                                "(basic composition: a bound for jobs on the same data)",
                                labels=["key", "name"])
        for kid, e in sorted(store.epsilon_by_owner().items()):
            eps.add_metric([kid, names.get(kid, "")], e)
        yield eps


class MetricsMiddleware:
    """Counts every HTTP request by route template (never the raw path: ids would make a
    series per object), method and status, and times it. Unknown paths count as
    ``unmatched``, unknown methods as ``other``: every label comes from a bounded set."""

    def __init__(self, app: Any, metrics: ServiceMetrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status, t0 = [500], time.perf_counter()

        async def tracked(msg: dict) -> None:
            if msg["type"] == "http.response.start":
                status[0] = msg["status"]
            await send(msg)

        try:
            await self.app(scope, receive, tracked)
        finally:
            route = scope.get("rapt.route") or getattr(scope.get("route"), "path", None)
            route = route or "unmatched"
            method = scope.get("method", "")
            method = method if method in METHODS else "other"
            self.metrics.requests.labels(route, method, str(status[0])).inc()
            self.metrics.latency.labels(route).observe(time.perf_counter() - t0)
