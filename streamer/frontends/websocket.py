"""Responses WebSocket mode: whole agent sessions over one socket (GET /v1/responses).

Frames in are `response.create` events (the POST body, flat beside `type`); frames
out are the very events the SSE route sends, from the same pipeline, one per message.
The socket remembers each response it produced (effective input and public output),
so `previous_response_id` continues with only the new items, even with `store:false`.
Creates run FIFO per lane (`stream_id`); lanes run concurrently, at most
`MAX_IN_FLIGHT` at once. An idle socket holds no task of its own: a lane's worker
exists only while the lane has work.

What a socket holds is bounded across its lanes (`QueueBudget`, ws_queue.py): a frame
beyond `--ws-max-queued-frames`/`--ws-max-queued-bytes` gets a `websocket_queue_full`
error and is dropped unparsed; `--ws-max-rejected-frames` such rejections in a row and the
next closes the socket 1008. The reader never stops reading while the queue is full:
stopping would leave pings, pongs and the client's close unread (aiohttp handles them in
`receive`), and a rejected frame costs only its own read, one message at a time.

This module is the shell: the rules (frame checks, lanes, budget, remembered responses)
are plain code in ws_session.py, and each turn runs through `Gateway.run` into a
`_LaneSink`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict, deque
from typing import Any

import orjson
from aiohttp import WSCloseCode, WSMsgType, web

from streamer.core.errors import RequestError, invalid, server_error
from streamer.core.events import Event
from streamer.core.response import new_id
from streamer.frontends.api_keys import CLIENT
from streamer.frontends.http import GATEWAY
from streamer.frontends.ws_frames import text_frames, with_stream_id
from streamer.frontends.ws_queue import QUEUE_FULL, Admission, QueueBudget
from streamer.frontends.ws_session import History, Lane, Queued, Refused, SessionRules
from streamer.turns.gateway import Gateway
from streamer.turns.turn import Turn

log = logging.getLogger("streamer.frontends.websocket")

MAX_IN_FLIGHT = 16
HEARTBEAT = 30.0  # seconds between pings; a peer that misses a pong is dropped
# Client-only fields of response.create that are not part of the request body.
_FRAME_ONLY = ("type", "stream", "stream_id", "generate")

SESSIONS: web.AppKey[set[Session]] = web.AppKey("ws_sessions", set)  # live sessions


class Session:
    """One socket: its rules (lanes, remembered responses, budget), its in-flight turns."""

    __slots__ = ("__weakref__", "client", "gateway", "in_flight", "request", "rules",
                 "session", "workers", "ws")  # fmt: skip

    def __init__(self, gateway: Gateway, ws: web.WebSocketResponse, request: web.Request) -> None:
        self.gateway = gateway
        self.ws = ws
        self.request = request  # the upgrade request: its Authorization may be forwarded
        self.client = gateway.client(request.get(CLIENT), request.headers)
        self.session = new_id("ws")  # its turns keep to one replica (routing affinity)
        self.workers: set[asyncio.Task[None]] = set()
        self.in_flight = asyncio.Semaphore(MAX_IN_FLIGHT)
        settings = gateway.settings
        budget = QueueBudget(
            settings.ws_max_queued_bytes,
            settings.ws_max_queued_frames,
            settings.ws_max_rejected_frames,
        )
        self.rules = SessionRules(budget, settings.ws_remembered, settings.max_json_values)

    @property
    def remembered(self) -> OrderedDict[str, tuple[Lane, History]]:
        return self.rules.remembered

    @property
    def queues(self) -> dict[Lane, deque[Queued]]:
        return self.rules.queues

    @property
    def named(self) -> set[str]:
        return self.rules.named

    # -- receiving ----------------------------------------------------------------

    async def run(self) -> None:
        """Read frames until the client leaves or the connection's lifetime is up."""
        lifetime = self.gateway.settings.ws_lifetime
        try:
            async with asyncio.timeout(lifetime):
                async for message in self.ws:
                    data = message.type in (WSMsgType.TEXT, WSMsgType.BINARY)
                    if data and not await self.receive(message.data):
                        break  # closed: the client would not stop flooding
        except TimeoutError:
            await self.send_error(
                RequestError(
                    f"Responses websocket connection limit reached ({_duration(lifetime)})."
                    " Create a new websocket connection to continue.",
                    code="websocket_connection_limit_reached",
                )
            )
            await self.close()  # in-flight turns end before the socket does
            await self.ws.close(code=WSCloseCode.OK, message=b"connection lifetime reached")
        finally:
            await self.close()

    async def receive(self, raw: str | bytes) -> bool:
        """Queue one client frame on its lane, if the budget takes it; False: close now."""
        rules = self.rules
        rules.closing = rules.closing or self.gateway.in_flight.closing  # the one registry's
        admission, size = rules.offer(raw)
        if admission is not Admission.ACCEPT:
            await self.reject(size, admission)
            return admission is Admission.REJECT
        frame = rules.check(raw)
        if isinstance(frame, Refused):  # answered with an error: nothing is held for it
            rules.budget.release(size)
            await self.send_error(frame.error, frame.lane)
            return True
        queue = rules.enqueue(frame, size)
        if queue is not None:  # the lane had no worker: start one
            worker = asyncio.create_task(self.lane(frame.get("stream_id"), queue))
            self.workers.add(worker)
            worker.add_done_callback(self.workers.discard)
        return True

    async def reject(self, size: int, admission: Admission) -> None:
        """Answer a frame the budget refused; after too many in a row, close 1008."""
        budget = self.rules.budget
        await self.send_error(RequestError(budget.describe(size), status=429, code=QUEUE_FULL))
        if admission is Admission.CLOSE:
            log.warning("websocket closed: %d frames in a row over its queue", budget.rejected)
            await self.close()  # in-flight turns end before the socket does
            await self.ws.close(code=WSCloseCode.POLICY_VIOLATION, message=b"websocket queue full")

    async def lane(self, lane: Lane, queue: deque[Queued]) -> None:
        """FIFO within the lane, one create at a time; exits once the lane is idle."""
        try:
            while queue:
                frame, size = queue.popleft()
                try:
                    async with self.in_flight:
                        await self.create(frame, lane)
                finally:
                    self.rules.budget.release(size)  # the frame is no longer held
        except ConnectionError as exc:  # the socket went away; run() cleans up
            log.debug("websocket closed during a turn: %s", exc)
        finally:
            # No await between the last emptiness check and this: a frame that arrives
            # later finds no queue and starts a new worker.
            self.rules.lane_idle(lane, queue)

    # -- one response.create ------------------------------------------------------

    async def create(self, frame: dict[str, Any], lane: Lane) -> None:
        """Run one create to its end; every failure becomes an event on this lane."""
        previous = frame.get("previous_response_id") or None
        try:
            turn = await self.prepare(frame, previous)
            self.gateway.stats["ws_turns"] += 1
            sink = _LaneSink(self, turn, previous, lane)
            generate = frame.get("generate") is not False  # False: a warmup, no backend call
            await self.gateway.run(turn, sink, "websocket", generate=generate)
        except RequestError as exc:  # invalid, or refused before any event
            self.rules.evict(previous, lane)
            await self.send_error(exc, lane)
        except ConnectionError:
            raise
        except Exception:
            log.exception("websocket create failed")
            self.rules.evict(previous, lane)
            await self.send_error(
                server_error("The gateway failed while serving the request."), lane
            )

    async def prepare(self, frame: dict[str, Any], previous: Any) -> Turn:
        if frame.get("background"):
            raise invalid("Background responses are not supported over WebSocket.", "background")
        body = {k: v for k, v in frame.items() if k not in _FRAME_ONLY}
        history = await self.history(previous) if previous is not None else ()
        authorization = self.request.headers.get("Authorization")
        return await self.gateway.prepare(
            body,
            client=self.client,
            authorization=authorization,
            history=history,
            session=self.session,
        )

    async def history(self, previous: Any) -> History:
        """The continued response's input then output: from this socket, else the store
        (if this socket's client owns it)."""
        if not isinstance(previous, str):
            raise invalid(
                "Invalid type for 'previous_response_id': expected a string.",
                "previous_response_id",
                "invalid_type",
            )
        history = self.rules.recall(previous)
        if history is not None:
            return history
        return tuple(await self.gateway.history(previous, self.client))

    def settle(self, turn: Turn, previous: str | None, lane: Lane) -> None:
        """Remember a finished turn on this socket, or evict what a failure continued."""
        if turn.response["status"] == "failed":
            self.rules.evict(previous, lane)
            return
        # References, not copies: items are never mutated once a turn is built, and
        # sharing them keeps a long session's memory linear in its length.
        self.rules.remember(turn.response["id"], lane, self.gateway.continuation(turn))

    # -- sending ------------------------------------------------------------------

    async def send(self, events: list[Event], lane: Lane) -> None:
        """One message per event; the batch in one write unless the socket compresses."""
        if lane is None:
            messages = [event.data for event in events]
        else:
            messages = with_stream_id([event.data for event in events], lane)
        ws = self.ws
        if ws.compress:  # permessage-deflate: the library compresses and frames each one
            for message in messages:
                await ws.send_frame(message, WSMsgType.TEXT)
            return
        transport = self.request.transport
        if ws.closed or transport is None or transport.is_closing():
            raise ConnectionResetError("Cannot write to closing transport")
        transport.write(text_frames(messages))
        # the client is behind: wait as aiohttp's own writers do (public StreamWriter API)
        await self.request.writer.drain()

    async def send_error(self, exc: RequestError, lane: Any = None) -> None:
        event = exc.ws_event()
        if isinstance(lane, str):
            event["stream_id"] = lane
        if not self.ws.closed:
            await self.ws.send_frame(orjson.dumps(event), WSMsgType.TEXT)

    async def shutdown(self) -> None:
        """After the gateway's drain (its turns have ended): close 1001."""
        self.rules.closing = True
        await self.close()
        await self.ws.close(code=WSCloseCode.GOING_AWAY, message=b"server shutting down")

    async def close(self) -> None:
        """Cancel every in-flight turn (closing their backend requests) and drop state."""
        workers = list(self.workers)
        for worker in workers:
            worker.cancel()
        for worker in workers:
            with contextlib.suppress(BaseException):
                await worker
        self.rules.clear()


class _LaneSink:
    """A turn's transport on one lane of a socket."""

    __slots__ = ("lane", "previous", "session", "turn")
    answered = True  # errors before the first event are `error` events too

    def __init__(self, session: Session, turn: Turn, previous: str | None, lane: Lane) -> None:
        self.session = session
        self.turn = turn
        self.previous = previous
        self.lane = lane

    async def send(self, batch: list[Event], final: bool) -> None:
        if final:  # settled (and stored) before the client can chain from it
            self.session.settle(self.turn, self.previous, self.lane)
        await self.session.send(batch, self.lane)


def _duration(seconds: float) -> str:
    if seconds >= 60:
        return f"{seconds / 60:g} minutes"
    return f"{seconds:g} seconds"


async def responses_socket(request: web.Request) -> web.StreamResponse:
    """GET /v1/responses: the WebSocket upgrade, or a clear error for plain GETs."""
    gateway = request.app[GATEWAY]
    ws = web.WebSocketResponse(
        heartbeat=HEARTBEAT,
        compress=gateway.settings.ws_compression,  # permessage-deflate, if offered
        max_msg_size=gateway.settings.ws_max_message_bytes + 1,  # aiohttp refuses at the size
    )
    if not ws.can_prepare(request).ok:
        raise RequestError(
            "Use POST /v1/responses, or open a WebSocket on this path.",
            status=405,
            code="method_not_allowed",
        )
    await ws.prepare(request)
    gateway.stats["ws_connections"] += 1
    session = Session(gateway, ws, request)
    sessions = request.app[SESSIONS]
    sessions.add(session)
    try:
        await session.run()
    finally:
        sessions.discard(session)
    return ws


async def _close_sessions(app: web.Application) -> None:
    """On shutdown, once the gateway's drain has let the turns in flight end (app.py):
    close every socket 1001.

    Without this the server would wait its whole shutdown timeout for socket handlers,
    which never end on their own. 1001 (going away) is a code clients reconnect on.
    """
    live: set[Session] = app[SESSIONS]
    sessions = list(live)
    if sessions:
        await asyncio.gather(*(s.shutdown() for s in sessions), return_exceptions=True)


def add_routes(app: web.Application) -> None:
    app[SESSIONS] = set[Session]()
    app.on_shutdown.append(_close_sessions)
    app.router.add_get("/v1/responses", responses_socket)
