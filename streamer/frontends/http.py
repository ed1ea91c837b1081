"""HTTP routes for `/v1/responses`: SSE and JSON transports over `Gateway.run`, plus
`/v1/models`, `/healthz`, `/readyz` and `/metrics`."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
from aiohttp import web

from streamer.core.compaction import compacted, compaction_body
from streamer.core.model_catalog import ModelCatalog, configured_body, models_answer
from streamer.core.models_config import catalog_entries
from streamer.frontends.api_keys import CLIENT
from streamer.frontends.background import SSE_HEADERS, follow
from streamer.frontends.endpoint import Decorations, Endpoint
from streamer.frontends.frontdoor import FRONT_DOOR
from streamer.frontends.leases import Leases
from streamer.frontends.request_body import late, unreadable
from streamer.stopping import DRAINING
from streamer.turns.gateway import Gateway
from streamer.worker import WORKER_INFO

log = logging.getLogger("streamer.frontends.http")


GATEWAY = web.AppKey("gateway", Gateway)
LEASES = web.AppKey("leases", Leases)  # the background turns' (frontends/leases.py)
MODEL_CATALOG = web.AppKey("model_catalog", ModelCatalog)  # --model-metadata, checked
ENDPOINT = web.AppKey("endpoint", Endpoint)  # set at startup, with the gateway
DECORATIONS = web.AppKey("decorations", Decorations)  # what every answer carries


class SSEReply(web.StreamResponse):
    """A streamed reply whose head leaves with the first events, in one write.

    Every write on loopback or a LAN costs a syscall and a wake-up of the reader; the
    head on its own would be one more per response: 5-7 µs of a 68 µs loopback SSE
    exchange, measured. aiohttp has no public switch for it; its own `web.Response`
    buffers the head this way. tests/test_sse_head.py fails if aiohttp stops honouring
    the flag (pyproject bounds aiohttp below the next minor release for that reason).
    """

    _send_headers_immediately = False


def json_response(
    body: Any, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    return web.Response(
        body=orjson.dumps(body), status=status, content_type="application/json", headers=headers
    )


def _abandon(request: web.Request) -> None:
    """The rest of this body is not read, nor drained by aiohttp: close after the answer."""
    request.content.feed_eof()
    request.protocol.close()


async def read_json(request: web.Request) -> Any:
    """The request body as JSON, by the endpoint's rules (`request_body.py`); aiohttp only
    carries the bytes (its own decoding is off: the endpoint counts the decoded size)."""
    endpoint = request.app[ENDPOINT]
    headers = request.headers
    reader = endpoint.admit(
        request.content_type, headers.get("Content-Encoding"), request.content_length
    )
    try:
        async with asyncio.timeout(endpoint.body_timeout):
            async for data in request.content.iter_any():
                reader.feed(data)  # the 413 of a body that grows too large, as it grows
    except TimeoutError:
        _abandon(request)  # a body trickled in (slowloris): not worth keeping the connection
        raise late(endpoint.body_timeout) from None
    except web.RequestPayloadError:  # broken chunked framing: the rest cannot be trusted
        _abandon(request)
        raise unreadable("its chunked framing is broken") from None
    return endpoint.parse(reader.finish(), headers.get("Authorization"))


class _Reply:
    """The endpoint's `Reply` on aiohttp: a `web.Response`, or an `SSEReply` prepared with
    the first events (X-Request-Id and the rest: added by the app's hook)."""

    __slots__ = ("request", "response")

    def __init__(self, request: web.Request) -> None:
        self.request = request
        self.response: web.StreamResponse | None = None

    async def json(self, body: bytes) -> None:
        self.response = web.Response(body=body, content_type="application/json")

    async def stream(self, data: bytes, last: bool) -> None:
        reply = self.response
        if reply is None:
            reply = self.response = SSEReply(headers=SSE_HEADERS)
            await reply.prepare(self.request)
        if last:
            await reply.write_eof(data)
        elif data:
            await reply.write(data)

    def answer(self) -> web.StreamResponse:
        assert self.response is not None  # `serve` answers, or raises
        return self.response


async def create_response(request: web.Request) -> web.StreamResponse:
    """POST /v1/responses."""
    endpoint = request.app[ENDPOINT]
    endpoint.open()
    body = await read_json(request)
    turn = await endpoint.prepare(body, request.get(CLIENT), request.headers.get("Authorization"))
    if body.get("background"):
        gateway = endpoint.gateway
        gateway.stats["http_turns"] += 1
        snapshot = await gateway.start_background(turn)
        if not turn.request.get("stream"):
            return web.Response(body=snapshot, content_type="application/json")
        leases, keepalive = request.app[LEASES], gateway.settings.sse_keepalive
        return await follow(
            request, gateway.store, turn.response["id"], after=-1, leases=leases,
            keepalive=keepalive,
        )  # fmt: skip
    reply = _Reply(request)
    await endpoint.serve(turn, reply)
    return reply.answer()


async def compact(request: web.Request) -> web.StreamResponse:
    """POST /v1/responses/compact: the compaction turn of the trigger (streamer/core/compaction.py),
    answered as a `response.compaction` object."""
    endpoint = request.app[ENDPOINT]
    endpoint.open()
    body = compaction_body(await read_json(request))
    turn = await endpoint.prepare(body, request.get(CLIENT), request.headers.get("Authorization"))
    reply = _Reply(request)
    await endpoint.serve(turn, reply, lambda turn: compacted(turn.response, turn.items))
    return reply.answer()


async def list_models(request: web.Request) -> web.Response:
    """GET /v1/models: the backend's list, each model described for Codex (`models`)."""
    gateway = request.app[GATEWAY]
    catalog = request.app.get(MODEL_CATALOG) or ModelCatalog()
    config = gateway.upstreams.config
    if config.source is not None:  # --config: its models, described from the file
        listed = configured_body(catalog, catalog_entries(config))
        return web.Response(body=orjson.dumps(listed), content_type="application/json")
    status, body = await gateway.models(request.headers.get("Authorization"))
    described = models_answer(status, body, catalog, gateway.settings.model)
    if described is not None:
        status, body = 200, orjson.dumps(described)
    return web.Response(body=body, status=status, content_type="application/json")


async def healthz(request: web.Request) -> web.Response:
    """The process is up; with its turn and socket counters, and the front door's."""
    body: dict[str, Any] = {"status": "ok", "stats": request.app[GATEWAY].stats}
    worker = request.app.get(WORKER_INFO)
    if worker is not None:  # one of `--workers N`: which one answered
        body["worker"] = worker
    front = request.app.get(FRONT_DOOR)
    if front is not None:
        body["connections"] = front.report()
    return json_response(body)


def fresh(probed_at: float | None, now: float, seconds: float) -> bool:
    """Whether a probe made at `probed_at` may still answer at `now`."""
    return probed_at is not None and now - probed_at < seconds


class ReadyProbe:
    """The readiness probe (backend `GET /models`, a store write) behind `/readyz`.

    `/readyz` needs no key: without a cache, every call would be a backend request.
    An answer is kept `--readyz-cache-seconds`; calls meanwhile share the probe in flight.
    """

    __slots__ = ("_at", "_result", "_task")

    def __init__(self) -> None:
        self._task: asyncio.Task[tuple[bool, bool]] | None = None
        self._at: float | None = None
        self._result = (False, False)

    async def check(self, gateway: Gateway) -> tuple[bool, bool]:
        """(backend, store) reachable, probed at most once per cache period."""
        loop = asyncio.get_running_loop()
        if fresh(self._at, loop.time(), gateway.settings.readyz_cache_seconds):
            return self._result
        if self._task is None:
            self._task = asyncio.create_task(self._probe(gateway))
        # shielded: a caller that goes away does not cancel the others' probe
        return await asyncio.shield(self._task)

    async def _probe(self, gateway: Gateway) -> tuple[bool, bool]:
        try:
            backend = await gateway.upstreams.ping()
            store = await gateway.store_health.probe()  # a write: can the store keep one
            self._result = (backend, store)
            self._at = asyncio.get_running_loop().time()
            return self._result
        finally:
            self._task = None


READY_PROBE = web.AppKey("ready_probe", ReadyProbe)


async def readyz(request: web.Request) -> web.Response:
    """Ready when the backend answers and the store takes a write (503 otherwise); never
    while stopping (the drain window, stopping.py, and the shutdown after it)."""
    gateway = request.app[GATEWAY]
    if request.app[DRAINING].open or gateway.in_flight.closing:
        return json_response({"status": "stopping"}, status=503)
    backend, store = await request.app[READY_PROBE].check(gateway)
    ready = backend and store
    return json_response(
        {"status": "ready" if ready else "not ready", "backend": backend, "store": store},
        status=200 if ready else 503,
    )


async def metrics(request: web.Request) -> web.Response:
    from streamer.metrics import CONTENT_TYPE

    body = request.app[GATEWAY].metrics.render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


def add_routes(app: web.Application) -> None:
    app[READY_PROBE] = ReadyProbe()
    app.router.add_post("/v1/responses", create_response)
    app.router.add_post("/v1/responses/compact", compact)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
