"""HTTP routes for `/v1/responses`: SSE encoding and JSON collect over one pipeline."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import orjson
from aiohttp import web

from streamer.core import sse
from streamer.core.errors import RequestError, invalid
from streamer.frontends.frontdoor import FRONT_DOOR
from streamer.gateway import GATEWAY, Gateway
from streamer.observe import observed
from streamer.pipeline import collect

log = logging.getLogger("streamer.frontends.http")

SSE_HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}
SHUT_DOWN = "The gateway shut down before the response finished; retry the request."


class _SSEReply(web.StreamResponse):
    """A streamed reply whose head leaves with the first events, in one write.

    Every write on loopback or a LAN costs a syscall and a wake-up of the reader; the
    head on its own would be one more per response (aiohttp's plain responses already
    buffer it the same way).
    """

    _send_headers_immediately = False


class InFlight:
    """The HTTP turns being served, so that a shutdown lets them finish, then ends the rest.

    At the deadline each remaining turn's task is cancelled with `cut` set: the turn
    then ends as `response.failed` (SSE and JSON alike), stored as such, instead of
    being torn off mid-frame.
    """

    __slots__ = ("closing", "cut", "tasks")

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[Any]] = set()
        self.closing = False  # shutting down: no new turns
        self.cut = False  # the deadline passed: a cancelled turn ends as failed

    async def drain(self, deadline: float) -> None:
        """Let the turns run until `deadline` (loop time), then end the rest as failed."""
        self.closing = True
        loop = asyncio.get_running_loop()
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=max(0.0, deadline - loop.time()))
        if self.tasks:
            self.cut = True
            for task in self.tasks:
                task.cancel()
            await asyncio.wait(list(self.tasks), timeout=1.0)  # each only writes its end

    def absorb_cut(self) -> bool:
        """In a cancelled turn: whether the deadline cancelled it (the cancel is then undone)."""
        if not self.cut:
            return False
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        return True


IN_FLIGHT = web.AppKey("in_flight", InFlight)


def shutting_down() -> RequestError:
    return RequestError(
        "The server is shutting down; retry the request.",
        status=503,
        type="server_error",
        code="server_shutting_down",
    )


def json_response(
    body: Any, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    return web.Response(
        body=orjson.dumps(body), status=status, content_type="application/json", headers=headers
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
    limit = request.app[GATEWAY].settings.client_body_timeout
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
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise invalid(
            f"We could not parse the JSON body of your request ({exc.msg}).", code="invalid_json"
        ) from None


async def create_response(request: web.Request) -> web.StreamResponse:
    """POST /v1/responses."""
    gateway = request.app[GATEWAY]
    in_flight = request.app[IN_FLIGHT]
    if in_flight.closing:
        raise shutting_down()
    body = await read_json(request)
    turn = await gateway.prepare(body, request)
    gateway.stats["http_turns"] += 1
    if body.get("background"):
        return await gateway.background.create(request, turn)
    task = asyncio.current_task()
    assert task is not None
    in_flight.tasks.add(task)
    try:
        if not body.get("stream"):
            return await collect_json(gateway, turn, in_flight)
        return await stream_sse(request, gateway, turn, in_flight)
    finally:
        in_flight.tasks.discard(task)


async def collect_json(gateway: Gateway, turn: Any, in_flight: InFlight) -> web.Response:
    try:
        async with contextlib.aclosing(observed(gateway, turn, "json")) as events:
            response = await collect(events, turn)
        await gateway.remember(turn)
    except asyncio.CancelledError:
        if not in_flight.absorb_cut():
            raise
        turn.streamer.fail("server_error", SHUT_DOWN)  # nothing, if it had finished
        response = turn.response
        await gateway.remember(turn)
    return json_response(response)


async def stream_sse(
    request: web.Request, gateway: Gateway, turn: Any, in_flight: InFlight
) -> web.StreamResponse:
    """Serve a turn as SSE: one write per batch of events ready at once."""
    events = observed(gateway, turn, "sse")
    try:
        first = await anext(events)  # opens the backend: its refusal is still an HTTP error
    except asyncio.CancelledError:
        await events.aclose()
        if not in_flight.absorb_cut():
            raise
        raise shutting_down() from None
    except BaseException:
        await events.aclose()
        raise
    reply = _SSEReply(headers=SSE_HEADERS)  # X-Request-Id: added by the app on every answer
    await reply.prepare(request)
    streamer = turn.streamer
    ending: list[Any] = []  # the last batch, while it is being stored and not yet written
    try:
        await reply.write(sse.encode_many(first))
        async for batch in events:
            if streamer.done:  # stored before the client sees the end, so it can chain at once
                ending = batch
                await gateway.remember(turn)
                ending = []
                # the last events and the end of the chunked body: one write
                await reply.write_eof(sse.encode_many(batch))
                return reply
            await reply.write(sse.encode_many(batch))
    except ConnectionResetError:  # the client left between two writes: let the backend go
        return reply
    except asyncio.CancelledError:
        if not in_flight.absorb_cut():
            raise
        # The shutdown deadline: end the stream well. A write that was interrupted has
        # already handed its bytes to the transport, so only an unwritten end remains.
        tail = ending or streamer.fail("server_error", SHUT_DOWN)
        if tail:
            await gateway.remember(turn)
            await reply.write(sse.encode_many(tail))
    finally:
        await events.aclose()
    await reply.write_eof()
    return reply


async def list_models(request: web.Request) -> web.Response:
    """GET /v1/models, forwarded from the backend."""
    gateway = request.app[GATEWAY]
    auth = request.headers.get("Authorization")
    headers = {"Authorization": auth} if auth and gateway.settings.forward_authorization else None
    status, body = await gateway.upstream.get_models(headers=headers)
    return web.Response(body=body, status=status, content_type="application/json")


async def healthz(request: web.Request) -> web.Response:
    """The process is up; with its turn and socket counters, and the front door's."""
    body: dict[str, Any] = {"status": "ok", "stats": request.app[GATEWAY].stats}
    front = request.app.get(FRONT_DOOR)
    if front is not None:
        body["connections"] = front.report()
    return json_response(body)


def fresh(probed_at: float | None, now: float, seconds: float) -> bool:
    """Whether a probe made at `probed_at` may still answer at `now`."""
    return probed_at is not None and now - probed_at < seconds


class ReadyProbe:
    """The readiness probe (backend `GET /models`, store ping) behind `/readyz`.

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
            backend = await gateway.upstream.ping()
            try:
                store = await gateway.store.ping()
            except Exception:
                store = False
            self._result = (backend, store)
            self._at = asyncio.get_running_loop().time()
            return self._result
        finally:
            self._task = None


READY_PROBE = web.AppKey("ready_probe", ReadyProbe)


async def readyz(request: web.Request) -> web.Response:
    """Ready when the backend answers and the store is reachable (503 otherwise)."""
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
    app[IN_FLIGHT] = InFlight()
    app[READY_PROBE] = ReadyProbe()
    app.router.add_post("/v1/responses", create_response)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
