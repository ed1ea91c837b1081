"""What operators see: Prometheus metrics, one registry per application.

Under `--workers N` the supervisor gives its workers one `PROMETHEUS_MULTIPROC_DIR`:
each worker's values go to files there, and `/metrics`, whichever worker the kernel hands
the scrape to, answers the sum over all of them (counters and histograms of workers that
have died included, gauges of the live ones only).
"""

from __future__ import annotations

import os
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

_LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    300,
)

# The request methods a label may name; any other is "other". A parser that takes any
# token as a method (aiohttp's pure-Python one does) must not grow /metrics per request.
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

CONTENT_TYPE = CONTENT_TYPE_LATEST
MULTIPROC_DIR = "PROMETHEUS_MULTIPROC_DIR"  # read by prometheus_client when imported


class Metrics:
    """The gateway's counters, gauges and histograms (`GET /metrics`)."""

    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry(auto_describe=True)
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self.requests = Counter(
            "streamer_http_requests",
            "HTTP requests by route and status.",
            ("method", "route", "status"),
            registry=registry,
        )
        self.active_streams = Gauge(
            "streamer_active_streams",
            "Responses being streamed now (SSE, JSON, WebSocket).",
            ("transport",),
            registry=registry,
            multiprocess_mode="livesum",  # --workers: the sum over the live workers
        )
        self.active_sockets = Gauge(
            "streamer_active_websockets",
            "Open WebSocket connections.",
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.events = Counter(
            "streamer_events_sent",
            "Responses events sent to clients.",
            ("transport",),
            registry=registry,
        )
        self.first_event = Histogram(
            "streamer_time_to_first_event_seconds",
            "From request to the first event sent.",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.duration = Histogram(
            "streamer_response_duration_seconds",
            "From request to the terminal event.",
            ("status",),
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.backend_errors = Counter(
            "streamer_backend_errors",
            "Backend failures by kind (HTTP status or error code).",
            ("kind",),
            registry=registry,
        )
        self.store_operations = Counter(
            "streamer_store_operations", "Store operations by operation and outcome.",
            ("operation", "outcome"), registry=registry,
        )  # fmt: skip
        self._store_outcomes(registry)

    def _store_outcomes(self, registry: CollectorRegistry) -> None:
        """What the store lost or could not keep (docs/stores.md)."""
        self.store_incomplete = Counter(
            "streamer_store_incomplete",
            "Records or event logs the store held only in part (evicted), served as missing.",
            ("what",),
            registry=registry,
        )
        self.not_stored = Counter(
            "streamer_responses_not_stored",
            "store:true responses answered but not stored: the store failed at their end "
            "(the response says store: false).",
            registry=registry,
        )

    def child(self, metric: Any, *values: str) -> Any:
        """`metric.labels(*values)`, looked up once: each `labels` call takes a lock and
        checks its values, and the hot ones are made for every request."""
        key = (id(metric), values)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*values)
        return found

    def request(self, method: str, route: str, status: int) -> None:
        """One answered request. `route` is a route's canonical name (or "unmatched"),
        never the path a client sent; `method` is one of METHODS or "other"."""
        label = method if method in METHODS else "other"
        self.child(self.requests, label, route, str(status)).inc()

    def render(self) -> bytes:
        shared = os.environ.get(MULTIPROC_DIR)
        if shared:  # one of `--workers N`: every worker's values, summed
            from prometheus_client.multiprocess import MultiProcessCollector

            everyone = CollectorRegistry()
            MultiProcessCollector(everyone, shared)
            return generate_latest(everyone)
        return generate_latest(self.registry)
