"""What operators see: Prometheus metrics, one registry per application.

Under `--workers N` the supervisor gives its workers one `PROMETHEUS_MULTIPROC_DIR`:
each worker's values go to files there, and `/metrics`, whichever worker the kernel hands
the scrape to, answers the sum over all of them (counters and histograms of workers that
have died included, gauges of the live ones only).
"""

from __future__ import annotations

import os
import platform
from collections.abc import Iterable
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)
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
OTHER = "other"  # the model label of a model neither the config nor the catalog names


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
        self._turns(registry)
        self._routing(registry)
        self._process(registry)
        self.models: frozenset[str] = frozenset()  # the model labels (`know_models`)
        self.per_client = False  # client keys are set: tokens by client too

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

    def _turns(self, registry: CollectorRegistry) -> None:
        """Per turn, by model (bounded: `model_label`) and replica (from the config)."""
        self.responses = Counter(
            "streamer_responses",
            "Turns ended, by transport, model, replica and status (failed: the errors).",
            ("transport", "model", "replica", "status"),
            registry=registry,
        )
        self.tokens = Counter(
            "streamer_tokens", "Tokens by model and direction (input, output).",
            ("model", "direction"), registry=registry,
        )  # fmt: skip
        self.client_tokens = Counter(
            "streamer_client_tokens",
            "Tokens by client (the first 12 hex digits of its key's digest; only with "
            "--api-key/--api-key-file) and direction.",
            ("client", "direction"),
            registry=registry,
        )
        self.backend_first_token = Histogram(
            "streamer_backend_time_to_first_token_seconds",
            "From the turn's start (its backend request) to the backend's first output.",
            ("model",), buckets=_LATENCY_BUCKETS, registry=registry,
        )  # fmt: skip
        self.backend_duration = Histogram(
            "streamer_backend_duration_seconds",
            "From the turn's start (its backend request) to its end, by model.",
            ("model",), buckets=_LATENCY_BUCKETS, registry=registry,
        )  # fmt: skip

    def _routing(self, registry: CollectorRegistry) -> None:
        """The router's waits and detours (streamer/upstream/router.py)."""
        self.queue_wait = Histogram(
            "streamer_route_queue_wait_seconds",
            "Waits for a slot of a model with max_concurrency (--route-queue-seconds).",
            ("model",), buckets=_LATENCY_BUCKETS, registry=registry,
        )  # fmt: skip
        self.rate_limited = Counter(
            "streamer_rate_limited",
            "429s by model and source: gateway (its concurrency limit) or backend.",
            ("model", "source"), registry=registry,
        )  # fmt: skip
        self.fallbacks = Counter(
            "streamer_fallbacks", "Turns served by a fallback model, by model and fallback.",
            ("model", "fallback"), registry=registry,
        )  # fmt: skip
        self.failovers = Counter(
            "streamer_replica_failovers",
            "Backend attempts that failed before the first byte and moved on to another replica.",
            ("model", "replica"), registry=registry,
        )  # fmt: skip

    def _process(self, registry: CollectorRegistry) -> None:
        """The process (RSS, CPU, open fds: prometheus_client's `process_*`) and the build."""
        from streamer import __version__

        if not os.environ.get(MULTIPROC_DIR):  # --workers: not summable, left out
            ProcessCollector(registry=registry)
        self.build_info = Gauge(
            "streamer_build_info", "1, labelled with the gateway's version and Python's.",
            ("version", "python"), registry=registry, multiprocess_mode="max",
        )  # fmt: skip
        self.build_info.labels(__version__, platform.python_version()).set(1)

    def know_models(self, names: Iterable[str | None]) -> None:
        """The model labels: the config's models and the catalog's; any other is `other`."""
        self.models = frozenset(name for name in names if name)

    def model_label(self, model: Any) -> str:
        return model if model in self.models else OTHER

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
