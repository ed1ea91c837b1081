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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import sys
from collections import OrderedDict, deque
from typing import Any

import orjson
from aiohttp import WSCloseCode, WSMsgType, web

from streamer.core.errors import RequestError, invalid, server_error
from streamer.core.events import Event
from streamer.frontends.ws_frames import text_frames, with_stream_id
from streamer.frontends.ws_queue import QUEUE_FULL, Admission, QueueBudget
from streamer.gateway import GATEWAY, Gateway, continuation, previous_not_found
from streamer.observe import observed
from streamer.pipeline import Turn, warmup

log = logging.getLogger("streamer.frontends.websocket")

MAX_IN_FLIGHT = 16
MAX_LANES = 32  # distinct named lanes per connection; the default lane does not count
HEARTBEAT = 30.0  # seconds between pings; a peer that misses a pong is dropped
_STREAM_ID = re.compile(r"[A-Za-z0-9_.-]{1,256}")
# Client-only fields of response.create that are not part of the request body.
_FRAME_ONLY = ("type", "stream", "stream_id", "generate")

Lane = str | None
History = tuple[dict[str, Any], ...]
Queued = tuple[dict[str, Any], int]  # a frame and the size it counts for in the budget

SESSIONS = web.AppKey("ws_sessions", set)  # live sessions, for shutdown and introspection


class Session:
    """One socket: its lanes, its remembered responses, its in-flight turns."""

    __slots__ = (
        "__weakref__",
        "budget",
        "closing",
        "gateway",
        "in_flight",
        "named",
        "queues",
        "remembered",
        "request",
        "workers",
        "ws",
    )  # fmt: skip

    def __init__(self, gateway: Gateway, ws: web.WebSocketResponse, request: web.Request) -> None:
        self.gateway = gateway
        self.ws = ws
        self.request = request  # the upgrade request: its Authorization may be forwarded
        # response id -> (lane that produced it, its continuation history), oldest first
        self.remembered: OrderedDict[str, tuple[Lane, History]] = OrderedDict()
        self.queues: dict[Lane, deque[Queued]] = {}  # lanes with work, and their backlog
        self.named: set[str] = set()  # every named lane this socket has used
        self.workers: set[asyncio.Task[None]] = set()
        self.in_flight = asyncio.Semaphore(MAX_IN_FLIGHT)
        self.closing = False  # the server is shutting down: no new turns
        settings = gateway.settings
        self.budget = QueueBudget(
            settings.ws_max_queued_bytes,
            settings.ws_max_queued_frames,
            settings.ws_max_rejected_frames,
        )

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
        size = _size(raw)
        admission = self.budget.offer(size)
        if admission is not Admission.ACCEPT:
            await self.reject(size, admission)
            return admission is Admission.REJECT
        queued = False
        try:
            frame = await self.check(raw)
            if frame is not None:
                self.enqueue(frame, size)
                queued = True
        finally:
            if not queued:  # answered with an error: nothing is held for it
                self.budget.release(size)
        return True

    async def reject(self, size: int, admission: Admission) -> None:
        """Answer a frame the budget refused; after too many in a row, close 1008."""
        await self.send_error(RequestError(self.budget.describe(size), status=429, code=QUEUE_FULL))
        if admission is Admission.CLOSE:
            log.warning("websocket closed: %d frames in a row over its queue", self.budget.rejected)
            await self.close()  # in-flight turns end before the socket does
            await self.ws.close(code=WSCloseCode.POLICY_VIOLATION, message=b"websocket queue full")

    async def check(self, raw: str | bytes) -> dict[str, Any] | None:
        """The frame if it is a valid create this socket may run; else None, answered."""
        try:
            frame = orjson.loads(raw)
        except orjson.JSONDecodeError:
            await self.send_error(invalid("The message is not valid JSON.", code="invalid_json"))
            return None
        if not isinstance(frame, dict):
            await self.send_error(
                invalid("Each message must be a JSON object.", code="invalid_event")
            )
            return None
        kind = frame.get("type")
        if kind != "response.create":
            message = (
                f"Unsupported event type {kind!r}: this server accepts 'response.create'."
                if kind is not None
                else "Missing required parameter: 'type'."
            )
            await self.send_error(
                invalid(message, "type", "unsupported_event_type"), frame.get("stream_id")
            )
            return None
        lane = frame.get("stream_id")
        error = self.lane_error(lane)
        if error is not None:
            await self.send_error(error, lane if error.code != "invalid_stream_id" else None)
            return None
        if lane is not None:
            self.named.add(lane)
        return frame

    def lane_error(self, lane: Any) -> RequestError | None:
        """Why a create on `lane` cannot run here now, if it cannot."""
        if self.closing:
            return RequestError(
                "The server is shutting down; reconnect to continue.",
                status=503,
                type="server_error",
                code="server_shutting_down",
            )
        if lane is not None and (not isinstance(lane, str) or not _STREAM_ID.fullmatch(lane)):
            return invalid(
                "Invalid 'stream_id': 1-256 characters of [A-Za-z0-9_.-].",
                "stream_id",
                "invalid_stream_id",
            )
        if lane is not None and lane not in self.named and len(self.named) >= MAX_LANES:
            return invalid(
                f"At most {MAX_LANES} stream lanes per connection.",
                "stream_id",
                "websocket_stream_limit_reached",
            )
        return None

    def enqueue(self, frame: dict[str, Any], size: int) -> None:
        """Queue a checked frame on its lane, starting the lane's worker if it has none."""
        lane = frame.get("stream_id")
        queue = self.queues.get(lane)
        if queue is not None:  # its worker is running and will get to it
            queue.append((frame, size))
            return
        queue = self.queues[lane] = deque(((frame, size),))
        worker = asyncio.create_task(self.lane(lane, queue))
        self.workers.add(worker)
        worker.add_done_callback(self.workers.discard)

    async def lane(self, lane: Lane, queue: deque[Queued]) -> None:
        """FIFO within the lane, one create at a time; exits once the lane is idle."""
        try:
            while queue:
                frame, size = queue.popleft()
                try:
                    async with self.in_flight:
                        await self.create(frame, lane)
                finally:
                    self.budget.release(size)  # the frame is no longer held
        except ConnectionError as exc:  # the socket went away; run() cleans up
            log.debug("websocket closed during a turn: %s", exc)
        finally:
            # No await between the last emptiness check and this: a frame that arrives
            # later finds no queue and starts a new worker.
            if self.queues.get(lane) is queue:
                del self.queues[lane]

    # -- one response.create ------------------------------------------------------

    async def create(self, frame: dict[str, Any], lane: Lane) -> None:
        """Run one create to its end; every failure becomes an event on this lane."""
        gateway = self.gateway
        previous = frame.get("previous_response_id") or None
        turn: Turn | None = None
        try:
            turn = await self.prepare(frame, previous)
            gateway.stats["ws_turns"] += 1
            if frame.get("generate") is False:
                events = warmup(turn)
                await self.settle(turn, previous, lane)
                await self.send(events, lane)
            else:
                async with contextlib.aclosing(observed(gateway, turn, "websocket")) as events:
                    async for batch in events:
                        if turn.streamer.done:  # settled before the client can chain from it
                            await self.settle(turn, previous, lane)
                        await self.send(batch, lane)
        except RequestError as exc:  # invalid, or the backend refused before any event
            self.evict(previous, lane)
            await self.send_error(exc, lane)
            return
        except ConnectionError:
            raise
        except asyncio.CancelledError:
            if self.closing and turn is not None and not turn.streamer.done:
                # The shutdown deadline passed: end the turn well-formed before 1001.
                with contextlib.suppress(Exception):
                    events = turn.streamer.fail("server_error", "The gateway shut down.")
                    await self.send(events, lane)
            raise
        except Exception:
            log.exception("websocket create failed")
            self.evict(previous, lane)
            await self.send_error(
                server_error("The gateway failed while serving the request."), lane
            )
            return

    async def settle(self, turn: Turn, previous: str | None, lane: Lane) -> None:
        """Remember a finished turn (here and in the store), or evict what a failure continued."""
        if turn.response["status"] == "failed":
            self.evict(previous, lane)
            return
        self.remember(turn, lane)
        await self.gateway.remember(turn)

    async def prepare(self, frame: dict[str, Any], previous: Any) -> Turn:
        if frame.get("background"):
            raise invalid("Background responses are not supported over WebSocket.", "background")
        body = {k: v for k, v in frame.items() if k not in _FRAME_ONLY}
        history = await self.history(previous) if previous is not None else ()
        return await self.gateway.prepare(body, self.request, history=history)

    async def history(self, previous: Any) -> History:
        """The continued response's input then output: from this socket, else the store."""
        if not isinstance(previous, str):
            raise invalid(
                "Invalid type for 'previous_response_id': expected a string.",
                "previous_response_id",
                "invalid_type",
            )
        state = self.remembered.get(previous)
        if state is not None:
            self.remembered.move_to_end(previous)
            return state[1]
        from streamer.store import StoreUnavailable

        try:
            # stored elsewhere: continue from it, if this socket's client owns it
            record = await self.gateway.store.get(previous, owner=self.gateway.client(self.request))
        except StoreUnavailable as exc:
            raise RequestError(
                f"The response store is unavailable: {exc}",
                status=503,
                type="server_error",
                code="store_unavailable",
            ) from None
        if record is None:
            raise previous_not_found(previous)
        return tuple(continuation(record.input_items, record.response.get("output") or []))

    def remember(self, turn: Turn, lane: Lane) -> None:
        # References, not copies: items are never mutated once a turn is built, and
        # sharing them keeps a long session's memory linear in its length.
        remembered = self.remembered
        remembered[turn.response["id"]] = (lane, (*turn.items, *turn.response["output"]))
        over = len(remembered) - max(self.gateway.settings.ws_remembered, 0)
        if over <= 0:
            return
        # Least recently used first, but each lane's latest last of all: its chain
        # goes on from there, while clients that never chain only leave dead weight.
        latest = {owner: response_id for response_id, (owner, _) in remembered.items()}
        spare = set(latest.values())
        for response_id in [r for r in remembered if r not in spare][:over]:
            del remembered[response_id]
            over -= 1
        while over > 0:
            remembered.popitem(last=False)
            over -= 1

    def evict(self, previous: Any, lane: Lane) -> None:
        """A failed continuation forgets its parent, unless it forked from another lane."""
        if isinstance(previous, str):
            state = self.remembered.get(previous)
            if state is not None and state[0] == lane:
                del self.remembered[previous]

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
        protocol = self.request.protocol
        if protocol.writing_paused:  # the client is behind: wait as aiohttp's writers do
            await protocol._drain_helper()

    async def send_error(self, exc: RequestError, lane: Any = None) -> None:
        event = exc.ws_event()
        if isinstance(lane, str):
            event["stream_id"] = lane
        if not self.ws.closed:
            await self.ws.send_frame(orjson.dumps(event), WSMsgType.TEXT)

    async def shutdown(self, grace: float) -> None:
        self.closing = True
        if self.workers:
            await asyncio.wait(list(self.workers), timeout=grace)
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
        self.remembered.clear()
        self.queues.clear()
        self.named.clear()
        self.budget.clear()


def _size(raw: str | bytes) -> int:
    """What a frame counts for in the budget: its size as received, before parsing.

    Bytes for a binary frame; for text the decoded str's own size (1, 2 or 4 bytes per
    character, as the parsed strings will hold), known without a copy.
    """
    return len(raw) if isinstance(raw, bytes) else sys.getsizeof(raw)


def _duration(seconds: float) -> str:
    if seconds >= 60:
        return f"{seconds / 60:g} minutes"
    return f"{seconds:g} seconds"


async def responses_socket(request: web.Request) -> web.StreamResponse:
    """GET /v1/responses: the WebSocket upgrade, or a clear error for plain GETs."""
    gateway = request.app[GATEWAY]
    ws = web.WebSocketResponse(
        heartbeat=HEARTBEAT,
        compress=True,  # permessage-deflate when the client offers it
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
    """On shutdown: let turns in flight finish (within the grace period), then close 1001.

    Without this the server would wait its whole shutdown timeout for socket handlers,
    which never end on their own. 1001 (going away) is a code clients reconnect on.
    """
    sessions = list(app[SESSIONS])
    if sessions:
        grace = sessions[0].gateway.settings.shutdown_grace
        await asyncio.gather(*(s.shutdown(grace) for s in sessions), return_exceptions=True)


def add_routes(app: web.Application) -> None:
    app[SESSIONS] = set()
    app.on_shutdown.append(_close_sessions)
    app.router.add_get("/v1/responses", responses_socket)
