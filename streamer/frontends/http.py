"""HTTP routes for `/v1/responses`: SSE and JSON transports over `Gateway.run`, plus
`/v1/models`, `/healthz`, `/readyz` and `/metrics`."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
from aiohttp import web

from streamer.compaction import compacted, compaction_body
from streamer.core import sse
from streamer.core.errors import RequestError, invalid, shutting_down
from streamer.core.events import Event
from streamer.core.model_catalog import ModelCatalog, configured_body, models_answer
from streamer.frontends.background import SSE_HEADERS, follow
from streamer.frontends.fast_http import parse_json
from streamer.frontends.frontdoor import FRONT_DOOR
from streamer.gateway import Gateway
from streamer.identity import CLIENT
from streamer.models_config import catalog_entries
from streamer.turn import Turn
from streamer.turn_runner import JSONSink
from streamer.worker import WORKER_INFO

log = logging.getLogger("streamer.frontends.http")


GATEWAY = web.AppKey("gateway", Gateway)
MODEL_CATALOG = web.AppKey("model_catalog", ModelCatalog)  # --model-metadata, checked


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


# What aiohttp decodes (zstd via backports.zstd, br via brotli, both dependencies): one
# coding exactly; it passes anything else through as is, which would then fail as bad JSON.
BODY_CODINGS = ("", "identity", "gzip", "deflate", "br", "zstd")


def _check_coding(header: str) -> None:
    """One known Content-Encoding (Codex sends zstd), or a 415 naming the ones taken."""
    if header.strip().lower() not in BODY_CODINGS:
        raise RequestError(
            f"Unsupported Content-Encoding {header.strip()!r}: send one of zstd, gzip, "
            "deflate or br (one coding), or none.",
            status=415,
            code="unsupported_content_encoding",
        )


async def read_json(request: web.Request) -> Any:
    """The request body as JSON, or a 4xx that says what is wrong with it."""
    ctype = request.content_type
    if ctype not in ("application/json", "application/octet-stream", "") and not ctype.endswith(
        "+json"
    ):
        raise RequestError(
            f"Unsupported content type {ctype!r}: send application/json.",
            status=415,
            code="unsupported_media_type",
        )
    _check_coding(request.headers.get("Content-Encoding", ""))
    settings = request.app[GATEWAY].settings
    limit = settings.client_body_timeout
    try:
        async with asyncio.timeout(limit):
            raw = await request.read()
    except TimeoutError:
        # a body trickled in (slowloris): the connection is not worth keeping
        request.content.feed_eof()
        request.protocol.close()
        raise RequestError(
            f"The request body did not arrive within {limit:g} seconds.",
            status=408,
            code="request_timeout",
            headers={"Connection": "close"},
        ) from None
    except web.RequestPayloadError as exc:  # a body aiohttp could not decode (bad gzip, …)
        # The rest of this connection's bytes cannot be trusted: answer, then close it,
        # without aiohttp draining (and logging) the broken body once more.
        request.content.feed_eof()
        request.protocol.close()
        reason = getattr(exc.__cause__, "message", None) or "it could not be decoded"
        raise invalid(
            f"We could not read the body of your request: {reason}.", code="invalid_body"
        ) from None
    gateway = request.app[GATEWAY]
    authorization = request.headers.get("Authorization")
    return parse_json(raw, settings.max_json_values, gateway.bodies, authorization)


async def create_response(request: web.Request) -> web.StreamResponse:
    """POST /v1/responses."""
    gateway = request.app[GATEWAY]
    if gateway.in_flight.closing:
        raise shutting_down()
    body = await read_json(request)
    headers = request.headers
    turn = await gateway.prepare(
        body,
        client=gateway.client(request.get(CLIENT), headers),
        authorization=headers.get("Authorization"),
    )
    gateway.stats["http_turns"] += 1
    if body.get("background"):
        snapshot = await gateway.start_background(turn)
        if not turn.request.get("stream"):
            return web.Response(body=snapshot, content_type="application/json")
        return await follow(request, gateway.store, turn.response["id"], after=-1)
    if not body.get("stream"):
        await gateway.run(turn, JSONSink(), "json")
        return json_response(turn.response)
    return await stream_sse(request, gateway, turn)


async def compact(request: web.Request) -> web.Response:
    """POST /v1/responses/compact: the compaction turn of the trigger (streamer/compaction.py),
    answered as a `response.compaction` object."""
    gateway = request.app[GATEWAY]
    if gateway.in_flight.closing:
        raise shutting_down()
    body = compaction_body(await read_json(request))
    headers = request.headers
    turn = await gateway.prepare(
        body,
        client=gateway.client(request.get(CLIENT), headers),
        authorization=headers.get("Authorization"),
    )
    gateway.stats["http_turns"] += 1
    await gateway.run(turn, JSONSink(), "json")
    return json_response(compacted(turn.response, turn.items))


class _SSESink:
    """A streamed turn: one write per batch of events ready at once.

    The reply starts with the first batch: a backend that refuses the turn before any
    event is still an HTTP error. The last batch and the end of the chunked body leave
    in one write.
    """

    __slots__ = ("reply", "request")

    def __init__(self, request: web.Request) -> None:
        self.request = request
        self.reply: web.StreamResponse | None = None

    @property
    def answered(self) -> bool:
        return self.reply is not None

    async def send(self, batch: list[Event], final: bool) -> None:
        reply = self.reply
        if reply is None:  # X-Request-Id: added by the app on every answer
            reply = self.reply = SSEReply(headers=SSE_HEADERS)
            await reply.prepare(self.request)
        data = sse.encode_many(batch)
        if final:
            await reply.write_eof(data)
        else:
            await reply.write(data)


async def stream_sse(request: web.Request, gateway: Gateway, turn: Turn) -> web.StreamResponse:
    """Serve a turn as SSE."""
    sink = _SSESink(request)
    try:
        await gateway.run(turn, sink, "sse")
    except ConnectionResetError:  # the client left between two writes: let the backend go
        if sink.reply is None:
            raise
        return sink.reply
    assert sink.reply is not None  # `run` sends the terminal event, or raises
    await sink.reply.write_eof()  # nothing, if the last batch ended the body already
    return sink.reply


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
    """Ready when the backend answers and the store takes a write (503 otherwise)."""
    backend, store = await request.app[READY_PROBE].check(request.app[GATEWAY])
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
