"""Background responses: turns that outlive their request, logged to the store.

The turn runs in a task on the instance that accepted it; every event goes to the
store's log, so any instance can replay and follow it (`GET ...?stream=true`) or ask
to cancel it (the store carries the request to the running instance).

A store that stalls or goes away mid-turn pauses the turn, not ends it: each write is
retried (backing off) for up to `--background-store-wait` seconds, and the turn goes on
once the store answers. Past that wait the backend is stopped and the turn ends
`failed` with `store_unavailable`, whose writing gets the same wait again; only a store
gone for longer than both leaves the record as it last was. A follower always ends with
a terminal event or an `error` event, never a stream that just stops.

The turn itself runs through `Gateway.run` (given to `start`, so this module needs no
gateway) into `_LogSink`, and `Gateway.run` ends it, however it ends: a watcher task asks
the in-flight registry to stop it when a cancel is asked for, and the shutdown drains it
with every other turn (`--shutdown-grace`). A cancel waits `--background-cancel-wait`
seconds for the running instance before ending an orphaned response itself.

How many run at once is capped, in all and per client (`TurnCaps`, background_caps.py):
a create beyond is a 429 before anything is stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, TypeVar, cast

import orjson
from aiohttp import web

from streamer.core import sse
from streamer.core.errors import STORE_UNAVAILABLE, invalid
from streamer.core.events import (
    CANCELLED,
    CANCELLED_EVENT,
    STREAM_END_TYPES,
    TERMINAL_EVENT_TYPES,
    Event,
)
from streamer.core.response import usage_object
from streamer.frontends.background_caps import TurnCaps
from streamer.store import ResponseStore, StoreUnavailable
from streamer.store.base import event_type
from streamer.turns.in_flight import InFlight, Stop
from streamer.turns.records import stored
from streamer.turns.turn import Turn
from streamer.turns.turn_runner import Sink

log = logging.getLogger("streamer.frontends.background")
T = TypeVar("T")

RUNNING = ("queued", "in_progress")
# The record is rewritten just before these go to the log, so whoever sees the event
# (a follower, a cancel on another instance) then reads the matching status.
_STATUS_EVENTS = frozenset({"response.in_progress", *TERMINAL_EVENT_TYPES})
SSE_HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}
# Waits between retries of a write to a stalled store: short first (a blip), then steady.
RETRY_FIRST = 0.05
RETRY_MAX = 1.0
DEFAULT_CAP = 256  # background turns, when no cap is given (the app's come from the fd budget)


TurnRun = Callable[[Turn, Sink], Awaitable[None]]  # `Gateway.run` for background turns


class _LogSink:
    """A background turn's transport: every batch goes to the store's event log."""

    __slots__ = ("background", "turn")
    answered = True  # the client had its answer (the queued response) before the turn ran

    def __init__(self, background: Background, turn: Turn) -> None:
        self.background = background
        self.turn = turn

    async def send(self, batch: list[Event], final: bool) -> None:
        await self.background.log(self.turn, batch)


class Background:
    """The background turns this instance runs, and cancel for any instance's turns."""

    def __init__(
        self,
        store: ResponseStore,
        *,
        store_wait: float,
        cancel_wait: float = 5.0,
        caps: TurnCaps | None = None,
    ):
        self.store = store
        self.store_wait = store_wait  # --background-store-wait
        # How long a cancel waits for the running instance to end the turn before it
        # decides that instance is gone and ends the response itself.
        self.cancel_wait = cancel_wait
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.unlogged: dict[str, deque[Event]] = {}
        # --background-max-turns / --background-max-per-client (the app's: the fd budget's)
        self.caps = caps or TurnCaps(DEFAULT_CAP, DEFAULT_CAP // 4)

    async def start(self, turn: Turn, run: TurnRun, in_flight: InFlight) -> bytes:
        """Accept a background turn: stored as queued, then `run` in its own task, held by
        `in_flight` from now (the shutdown drains it like any turn); the queued snapshot
        (what the client is answered)."""
        self._admit(turn)
        response_id, client = turn.response["id"], turn.client
        queued = turn.streamer.queued()
        try:
            # A store outage is a 503 here, before anything started. The event goes first:
            # a failure then leaves no record that would read `queued` until its TTL.
            await self.log(turn, queued, wait=0.0)
            await self._put(turn)
        except BaseException:
            self.unlogged.pop(response_id, None)
            self.caps.give(client)
            _close_recording(turn)
            raise
        body = orjson.dumps(turn.response)  # the queued snapshot, before the task runs
        task = asyncio.create_task(
            self._run(turn, run, in_flight), name=f"background {response_id}"
        )
        in_flight.hold(task)
        self.tasks[response_id] = task

        def ended(_: asyncio.Task[None]) -> None:
            self.tasks.pop(response_id, None)
            self.caps.give(client)

        task.add_done_callback(ended)
        return body

    def _admit(self, turn: Turn) -> None:
        """Count the turn under its caps, or refuse it before anything is stored: a 400
        without `store`, a 429 beyond a cap (logged when the cap fills up)."""
        if turn.request.get("store") is False:
            _close_recording(turn)
            raise invalid("Background responses require 'store' to be true.", "background")
        refusal = self.caps.take(turn.client)
        if refusal is not None:
            _close_recording(turn)
            if refusal.first:
                log.warning(refusal.log_line())
            raise refusal.error()

    async def _run(self, turn: Turn, run: TurnRun, in_flight: InFlight) -> None:
        """The turn's task. `run` (`Gateway.run`) ends the turn, however it ends: a watcher
        asks `in_flight` to stop it when a cancel is asked for, and the shutdown does the
        same at its deadline."""
        response_id = turn.response["id"]
        task = asyncio.current_task()
        assert task is not None
        watcher = asyncio.create_task(self._cancel_requested(response_id))
        watcher.add_done_callback(functools.partial(_asked_to_cancel, in_flight, task))
        try:
            await run(turn, _LogSink(self, turn))
        except StoreUnavailable as exc:  # its end could not be logged either
            log.error("background response %s: the store did not come back: %s",
                      response_id, exc)  # fmt: skip
        except Exception as exc:
            log.warning("background response %s failed: %r", response_id, exc)
        finally:
            watcher.cancel()
            self.unlogged.pop(response_id, None)
            _close_recording(turn)
            with contextlib.suppress(Exception):
                await self.store.end_events(response_id)

    async def _cancel_requested(self, response_id: str) -> None:
        """Return once a cancel was asked for; a store outage only delays noticing it."""
        while True:
            try:
                await self.store.wait_cancel(response_id)
                return
            except Exception as exc:  # StoreUnavailable, mostly
                log.warning("waiting for cancels of %s: %r", response_id, exc)
                await asyncio.sleep(1.0)

    async def _put(self, turn: Turn) -> None:
        await self.store.put(stored(turn))

    async def log(self, turn: Turn, events: list[Event], *, wait: float | None = None) -> None:
        """Append events to the store's log in order. An event leaves the turn's queue only
        once logged, so a log interrupted by shutdown or a store outage is finished before
        the failure events that follow it (no gap in the sequence numbers). Each write is
        retried for `wait` seconds (default `--background-store-wait`) while the store is
        unavailable; writes are idempotent (a put replaces, a logged seq is ignored)."""
        store = self.store
        response_id = turn.response["id"]
        window = self.store_wait if wait is None else wait
        pending = self.unlogged.setdefault(response_id, deque())
        pending.extend(events)
        while pending:
            event = pending[0]
            if event.type in _STATUS_EVENTS:
                await _retrying(functools.partial(self._put, turn), window, response_id)
            append = functools.partial(store.append_event, response_id, event.seq, event.data)
            await _retrying(append, window, response_id)
            pending.popleft()
            if turn.recorder is not None:  # `--tap-dir`: the log is what the client gets
                turn.recorder.client_events([event])

    async def cancel(self, response_id: str) -> dict[str, Any] | None:
        """Ask whichever instance runs it to cancel; return the response once it ended."""
        store = self.store
        response = await store.get_response(response_id)
        if response is None:
            return None
        if not response.get("background"):
            raise invalid("Only background responses can be cancelled.", "response_id")
        if response.get("status") not in RUNNING:
            return response  # already over: cancel is a no-op, as upstream
        await store.request_cancel(response_id)
        last = -1
        try:
            async with asyncio.timeout(self.cancel_wait):
                async with contextlib.aclosing(_log_of(store, response_id)) as logged:
                    async for seq, _ in logged:  # ends with the running instance's terminal
                        last = seq
        except TimeoutError:
            # Nobody ended it: the instance that ran it is gone. End it here, so the
            # response and its followers do not wait forever.
            log.warning("background response %s: no instance answered the cancel", response_id)
            await _end_orphan(store, response_id, last)
        return await store.get_response(response_id) or response

    async def close(self) -> None:
        """After the shutdown's drain: whatever it left (a turn still writing its end to a
        stalled store) is cancelled, its record as it last was."""
        for task in list(self.tasks.values()):
            task.cancel()
        for task in list(self.tasks.values()):
            with contextlib.suppress(BaseException):
                await task


def _asked_to_cancel(
    in_flight: InFlight, task: asyncio.Task[None], watcher: asyncio.Task[None]
) -> None:
    """The watcher returned (a cancel was asked for): the registry stops the turn."""
    if not watcher.cancelled():
        in_flight.stop(task, Stop.CANCEL)


def _close_recording(turn: Turn) -> None:
    if turn.recorder is not None:
        turn.recorder.close()


async def _retrying(write: Callable[[], Awaitable[T]], window: float, response_id: str) -> T:
    """`write()`, tried again while the store is unavailable, for up to `window` seconds
    from the first failure (then its StoreUnavailable goes up)."""
    loop = asyncio.get_running_loop()
    deadline: float | None = None
    delay = RETRY_FIRST
    while True:
        try:
            return await write()
        except StoreUnavailable as exc:
            now = loop.time()
            if deadline is None:
                deadline = now + window
                if window > 0:
                    log.warning("background response %s: store unavailable, retrying: %s",
                                response_id, exc)  # fmt: skip
            if now >= deadline:
                raise
            await asyncio.sleep(min(delay, deadline - now))  # back off: the store is stalled
            delay = min(delay * 2, RETRY_MAX)


def _log_of(
    store: ResponseStore, response_id: str, after: int = -1
) -> AsyncGenerator[tuple[int, bytes], None]:
    """The store's event log, as the async generator every store returns (closable)."""
    return cast("AsyncGenerator[tuple[int, bytes], None]", store.events(response_id, after=after))


async def _end_orphan(store: ResponseStore, response_id: str, last: int) -> None:
    """Log `cancelled` for a response whose instance died; a late writer is then ignored."""
    record = await store.get(response_id)
    if record is None:
        return
    response = record.response
    if response.get("status") not in RUNNING:
        return
    response["status"] = CANCELLED
    response["error"] = None  # as OpenAI's cancelled responses: the status says it
    response["usage"] = response.get("usage") or usage_object()
    await store.put(record)
    event = {"type": CANCELLED_EVENT, "response": response, "sequence_number": last + 1}
    await store.append_event(response_id, last + 1, orjson.dumps(event))
    await store.end_events(response_id)


async def follow(
    request: web.Request, store: ResponseStore, response_id: str, *, after: int
) -> web.StreamResponse:
    """Replay the logged events after `after`, then follow live ones, as SSE.

    The stream always ends with a terminal event or an `error` event: a log that ended
    without one (its writer gave up on the store) is closed with an `error`."""
    reply = web.StreamResponse(headers=SSE_HEADERS)
    await reply.prepare(request)
    last, kind = after, None
    async with contextlib.aclosing(_log_of(store, response_id, after)) as logged:
        try:
            async for last, data in logged:
                kind = event_type(data)
                await reply.write(sse.encode(Event(kind or "message", data, last)))
            if kind not in STREAM_END_TYPES:
                error = await _unfinished(store, response_id)
                if error is not None:
                    await reply.write(_error_event(last + 1, *error))
        except StoreUnavailable as exc:  # headers are out: end the stream with an error event
            log.warning("following %s: %s", response_id, exc)
            message = "The response store became unavailable while streaming."
            await reply.write(_error_event(last + 1, STORE_UNAVAILABLE, message))
        except ConnectionResetError:  # the follower left; the turn itself goes on
            return reply
    await reply.write_eof()
    return reply


async def _unfinished(store: ResponseStore, response_id: str) -> tuple[str, str] | None:
    """Why a log that ended without a terminal event is not over, if it is not: None when
    the response did end (its terminal was before `starting_after`)."""
    response = await store.get_response(response_id)
    if response is None:
        return "not_found", "The response was deleted while streaming."
    if response.get("status") in RUNNING:
        return STORE_UNAVAILABLE, "The response's event log ended before the response did."
    return None


def error_event(seq: int, code: str, message: str) -> dict[str, Any]:
    """The SSE `error` event in OpenAI's flat form (the spec nests the fields in `error`,
    but the OpenAI SDK raises on an `error` event with an `error` object in it)."""
    error = {"type": "error", "code": code, "message": message, "param": None}
    return {**error, "sequence_number": seq}


def _error_event(seq: int, code: str, message: str) -> bytes:
    return sse.encode(Event("error", orjson.dumps(error_event(seq, code, message))))
