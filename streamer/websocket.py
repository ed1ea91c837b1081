"""Responses WebSocket mode: whole agent sessions over one socket (GET /v1/responses).

Frames in are `response.create` events (the POST body, flat beside `type`); frames
out are the very events the SSE route sends, from the same pipeline, one per message.
The socket remembers each response it produced (effective input and public output),
so `previous_response_id` continues with only the new items, even with `store:false`.
Creates run FIFO per lane (`stream_id`); lanes run concurrently.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections import OrderedDict
from typing import Any

import orjson
from aiohttp import WSCloseCode, WSMsgType, web

from .errors import RequestError, invalid
from .events import Event
from .gateway import GATEWAY, Gateway, continuation, previous_not_found
from .pipeline import Turn, stream_events, warmup

log = logging.getLogger("streamer.websocket")

MAX_IN_FLIGHT = 16
MAX_LANES = 32
_STREAM_ID = re.compile(r"[A-Za-z0-9_.-]{1,256}")
_TERMINAL_FAILURES = frozenset({"response.failed", "error"})
# Client-only fields of response.create that are not part of the request body.
_FRAME_ONLY = ("type", "stream", "stream_id", "generate")


class Session:
    """One socket: its lanes, its remembered responses, its in-flight turns."""

    def __init__(self, gateway: Gateway, ws: web.WebSocketResponse) -> None:
        self.gateway = gateway
        self.ws = ws
        self.remembered: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()
        self.lanes: dict[str | None, asyncio.Queue[dict[str, Any]]] = {}
        self.workers: set[asyncio.Task[None]] = set()
        self.in_flight = asyncio.Semaphore(MAX_IN_FLIGHT)

    # -- receiving ----------------------------------------------------------------

    async def run(self) -> None:
        lifetime = self.gateway.settings.ws_lifetime
        try:
            async with asyncio.timeout(lifetime):
                async for message in self.ws:
                    if message.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                        await self.receive(message.data)
                    elif message.type is WSMsgType.ERROR:
                        break
        except TimeoutError:
            await self.send_error(
                RequestError(
                    f"Responses websocket connection limit reached ({int(lifetime // 60)} minutes)."
                    " Create a new websocket connection to continue.",
                    code="websocket_connection_limit_reached",
                )
            )
            await self.ws.close(code=WSCloseCode.OK)
        finally:
            await self.close()

    async def receive(self, raw: str | bytes) -> None:
        try:
            frame = orjson.loads(raw)
        except orjson.JSONDecodeError:
            await self.send_error(invalid("The message is not valid JSON.", code="invalid_json"))
            return
        if not isinstance(frame, dict):
            await self.send_error(invalid("Each message must be a JSON object.", code="invalid_event"))
            return
        kind = frame.get("type")
        if kind != "response.create":
            await self.send_error(
                invalid(f"Unsupported event type {kind!r}.", "type", "unsupported_event_type"),
                frame.get("stream_id"),
            )
            return
        lane = frame.get("stream_id")
        if lane is not None and (not isinstance(lane, str) or not _STREAM_ID.fullmatch(lane)):
            await self.send_error(
                invalid("Invalid 'stream_id': 1-256 characters of [A-Za-z0-9_.-].", "stream_id",
                        "invalid_stream_id")
            )
            return
        queue = self.lanes.get(lane)
        if queue is None:
            if lane is not None and len(self.lanes) - (None in self.lanes) >= MAX_LANES:
                await self.send_error(
                    invalid(f"At most {MAX_LANES} stream lanes per connection.", "stream_id",
                            "websocket_stream_limit_reached"),
                    lane,
                )
                return
            queue = self.lanes[lane] = asyncio.Queue()
            worker = asyncio.create_task(self.lane(lane, queue))
            self.workers.add(worker)
            worker.add_done_callback(self.workers.discard)
        queue.put_nowait(frame)

    async def lane(self, lane: str | None, queue: asyncio.Queue[dict[str, Any]]) -> None:
        """FIFO within the lane: one create at a time."""
        while True:
            frame = await queue.get()
            async with self.in_flight:
                try:
                    await self.create(frame, lane)
                except (ConnectionError, RuntimeError) as exc:  # the socket went away
                    log.debug("websocket closed during a turn: %s", exc)
                    return

    # -- one response.create ------------------------------------------------------

    async def create(self, frame: dict[str, Any], lane: str | None) -> None:
        gateway = self.gateway
        previous = frame.get("previous_response_id")
        try:
            if frame.get("background"):
                raise invalid("Background responses are not supported over WebSocket.", "background")
            body = {k: v for k, v in frame.items() if k not in _FRAME_ONLY}
            history = await self.history(previous) if previous else []
            turn = await gateway.prepare(body, history=history)
        except RequestError as exc:
            await self.send_error(exc, lane)
            return
        gateway.stats["ws_turns"] += 1
        failed = False
        try:
            if frame.get("generate") is False:
                await self.send(warmup(turn), lane)
            else:
                async with contextlib.aclosing(stream_events(turn, gateway.upstream)) as events:
                    async for batch in events:
                        await self.send(batch, lane)
                failed = turn.response["status"] == "failed"
        except RequestError as exc:  # the backend refused the turn before it started
            failed = True
            await self.send_error(exc, lane)
        if failed:
            if previous:
                self.remembered.pop(previous, None)
            return
        self.remember(turn)
        await gateway.remember(turn)

    async def history(self, previous: Any) -> list[dict[str, Any]]:
        if not isinstance(previous, str):
            raise invalid("Invalid 'previous_response_id': expected a string.", "previous_response_id")
        state = self.remembered.get(previous)
        if state is not None:
            self.remembered.move_to_end(previous)
            return state
        record = await self.gateway.store.get(previous)  # stored elsewhere: continue from it
        if record is None:
            raise previous_not_found(previous)
        return continuation(record.input_items, record.response.get("output") or [])

    def remember(self, turn: Turn) -> None:
        self.remembered[turn.response["id"]] = continuation(turn.items, turn.response["output"])
        while len(self.remembered) > self.gateway.settings.ws_remembered:
            self.remembered.popitem(last=False)

    # -- sending ------------------------------------------------------------------

    async def send(self, events: list[Event], lane: str | None) -> None:
        ws = self.ws
        if lane is None:
            for event in events:
                await ws.send_frame(event.data, WSMsgType.TEXT)
            return
        tail = b',"stream_id":%s}' % orjson.dumps(lane)
        for event in events:
            await ws.send_frame(event.data[:-1] + tail, WSMsgType.TEXT)

    async def send_error(self, exc: RequestError, lane: str | None = None) -> None:
        event = exc.ws_event()
        if isinstance(lane, str):
            event["stream_id"] = lane
        if not self.ws.closed:
            await self.ws.send_frame(orjson.dumps(event), WSMsgType.TEXT)

    async def close(self) -> None:
        """Cancel every in-flight turn (closing their backend requests) and drop state."""
        for worker in list(self.workers):
            worker.cancel()
        for worker in list(self.workers):
            with contextlib.suppress(BaseException):
                await worker
        self.remembered.clear()
        self.lanes.clear()


async def responses_socket(request: web.Request) -> web.StreamResponse:
    """GET /v1/responses: the WebSocket upgrade, or a clear error for plain GETs."""
    ws = web.WebSocketResponse(
        heartbeat=30.0,
        compress=True,
        max_msg_size=request.app[GATEWAY].settings.ws_max_message_bytes,
    )
    if not ws.can_prepare(request).ok:
        raise RequestError(
            "Use POST /v1/responses, or open a WebSocket on this path.",
            status=405,
            code="method_not_allowed",
        )
    gateway = request.app[GATEWAY]
    await ws.prepare(request)
    gateway.stats["ws_connections"] += 1
    await Session(gateway, ws).run()
    return ws


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/responses", responses_socket)
