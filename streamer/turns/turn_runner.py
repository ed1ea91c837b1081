"""A prepared turn run against its backend: the async part of a turn.

`TurnEvents` opens the backend request, feeds the backend's batches to the turn's
streamer and gives batches of encoded events; `TurnClock` is the turn's deadline.
`Gateway.run` drives them for every transport into a `Sink` (what a transport gives it)
and is where the turn ends; `stream_events` is the same as an async generator (the tap's
replay, tests). The turn itself (`prepare`, `Turn`) is plain values: streamer/turns/turn.py.

The runner acts on what the turn owns: the output limits its streamer counts and its
deadline (`TurnClock`), ending the turn and cutting the backend at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, Protocol, TypeVar

from streamer.core.batch import Batch, Upstream, UpstreamStream
from streamer.core.errors import RequestError
from streamer.core.events import Event
from streamer.core.truncation import CONTEXT_OVERFLOW, keep_share, truncate
from streamer.mcp import steps as mcp_steps
from streamer.turns.turn import Turn
from streamer.upstream.first_call import first_calls

log = logging.getLogger("streamer.turn_runner")
T = TypeVar("T")

BROKEN = "The gateway failed while streaming the response."
"""A failed turn's message when the gateway itself failed (a bug): the stream still ends."""


class Sink(Protocol):
    """Where a transport takes a turn's events (`Gateway.run`): SSE, JSON, WebSocket, log."""

    @property
    def answered(self) -> bool:
        """Whether the client has an answer under way: a failure must then be sent as
        events (else it can still be an HTTP error)."""
        ...

    async def send(self, batch: list[Event], final: bool) -> None:
        """One batch of events, in order; `final`: it holds the terminal event."""
        ...


class JSONSink:
    """A non-streaming turn's sink: events dropped, the final response is the answer."""

    __slots__ = ()
    answered = True  # a failure is still a 200 with a failed response

    async def send(self, batch: list[Event], final: bool) -> None:
        return None


class TurnTimeout(Exception):
    """The turn ran past `--max-turn-seconds`."""


class TurnClock:
    """One timer for the whole turn (not one per read: reads are the per-token path).

    The turn sets `waiting` around each wait on the backend. At the deadline the clock
    cancels the turn's task if it is waiting (so the backend is cut at once), else it
    only sets `expired`, which the next wait checks; a write to a slow client is never
    interrupted. `timed_out` tells the deadline's cancellation from anybody else's.
    """

    __slots__ = ("_fired", "_handle", "_task", "expired", "seconds", "waiting")

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.expired = False
        self.waiting = False
        self._fired = False  # it cancelled the task
        self._task = asyncio.current_task()
        self._handle = asyncio.get_running_loop().call_later(seconds, self._expire)

    def _expire(self) -> None:
        self.expired = True
        task = self._task
        # a task being cancelled already is left to that cancellation
        if self.waiting and task is not None and not task.cancelling():
            self._fired = True
            task.cancel()

    def timed_out(self, error: BaseException | None) -> bool:
        """Whether the wait that ended (with `error`, or none) ran into the deadline; the
        deadline's own cancellation is taken back, anybody else's is left to propagate."""
        self.waiting = False
        if self._fired:
            self._fired = False
            uncancelled = self._task is not None and self._task.uncancel() == 0
            return uncancelled or not isinstance(error, asyncio.CancelledError)
        return self.expired and not isinstance(error, asyncio.CancelledError)

    def close(self) -> None:
        self._handle.cancel()


async def _open(
    turn: Turn, upstream: Upstream, clock: TurnClock, on_raw: Any, on_request: Any = None
) -> UpstreamStream:
    """Open the backend request within the turn's deadline (504 past it); under
    `truncation: "auto"` a context overflow is retried once with the oldest items dropped
    (`on_request` is told the request sent again)."""
    try:
        return await _open_once(turn, upstream, clock, on_raw)
    except RequestError as exc:
        retry = _truncated(turn, exc)
        if retry is None:
            raise
    turn.backend_request = retry
    if on_request is not None:
        on_request(retry)
    return await _open_once(turn, upstream, clock, on_raw)


def _truncated(turn: Turn, exc: RequestError) -> dict[str, Any] | None:
    """The Chat request without the oldest items, if the overflow is one to truncate."""
    if exc.code != CONTEXT_OVERFLOW or turn.request.get("truncation") != "auto":
        return None
    if turn.compactor is not None:  # a compaction turn is what makes room; it is not cut
        return None
    items = turn.view or turn.items
    kept = truncate(items, keep_share(exc.message))
    if kept is None:
        return None
    log.info(
        "turn %s: context overflow, retried with %d of %d items (truncation: auto)",
        turn.response["id"],
        len(kept),
        len(items),
    )
    return turn.kind.lower(turn.request, kept, turn.names, turn.lowering)


async def _open_once(
    turn: Turn, upstream: Upstream, clock: TurnClock, on_raw: Any
) -> UpstreamStream:
    headers = turn.headers or None
    clock.waiting = True
    try:
        if on_raw is None:  # the client picks the backend connections: only its own use them
            stream = await upstream.open(turn.backend_request, headers=headers, client=turn.client)
        else:  # record the backend's bytes as they come (`--tap-dir`)
            stream = await upstream.open(
                turn.backend_request, headers=headers, on_raw=on_raw, client=turn.client
            )
    except BaseException as exc:
        if clock.timed_out(exc):
            raise _timeout_error(turn, clock) from None
        raise
    if clock.timed_out(None):  # it answered, but too late: let go of it
        await stream.aclose()
        raise _timeout_error(turn, clock)
    return stream


def _timed_out(turn: Turn, clock: TurnClock) -> str:
    """The log line and the message for a turn past its deadline."""
    log.warning("turn %s: past --max-turn-seconds (%g s)", turn.response["id"], clock.seconds)
    return f"The response took longer than the gateway allows ({clock.seconds:g} s)."


def _timeout_error(turn: Turn, clock: TurnClock) -> RequestError:
    message = _timed_out(turn, clock)
    return RequestError(message, status=504, type="server_error", code="turn_timeout")


def _limit_hit(turn: Turn) -> list[Event]:
    """The backend's answer went past an output limit: end `incomplete`, say which in the log."""
    streamer = turn.streamer
    log.warning(
        "turn %s: the backend's answer went past --%s; ended incomplete",
        turn.response["id"],
        (streamer.exceeded or "").replace("_", "-"),
    )
    return streamer.cut()


class TurnEvents:
    """One turn against an upstream, as batches of encoded events: `open`, then `next`
    until it gives None, then `close` (always).

    A plain object rather than an async generator: `Gateway.run` drives it with one await
    per batch, with no generator layers between the backend's read and the client's write.
    `open` reaches the backend before any event, so that a backend that refuses the request
    (4xx/5xx, unreachable) surfaces as a `RequestError` with nothing sent yet; any later
    failure is the last batch (`response.failed`). `close` lets go of the backend: at once
    when the client went away, kept for reuse when its answer was read whole.
    """

    __slots__ = (
        "_clock",
        "_first",
        "_next",
        "_on_raw",
        "_on_request",
        "_phase",
        "_stream",
        "turn",
        "upstream",
    )

    def __init__(
        self,
        turn: Turn,
        upstream: Upstream,
        *,
        on_raw: Callable[[bytes], None] | None = None,
        on_request: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.turn = turn
        self.upstream = upstream
        self._on_raw = on_raw
        self._on_request = on_request
        self._clock: TurnClock | None = None
        self._stream: UpstreamStream | None = None
        self._next: Callable[[], Awaitable[Batch]] | None = None  # None: no batch follows
        self._first: list[Event] | None = None
        # the MCP steps between two backend answers, while they run (streamer/mcp/steps.py)
        self._phase: AsyncGenerator[list[Event] | None, None] | None = None

    async def open(self) -> None:
        """Reach the backend (a `RequestError` if it refuses) and make the first batch:
        `response.created`, with the deltas that came with the backend's head. A turn with
        MCP servers lists them first (a 424 for one that cannot be listed)."""
        turn = self.turn
        clock = self._clock = TurnClock(turn.max_seconds)
        ran: list[mcp_steps.Done] = []
        if turn.mcp is not None:
            try:
                ran = await mcp_steps.prepare(turn, self._wait)
            except TurnTimeout:
                raise _timeout_error(turn, clock) from None
        stream = await _open(turn, self.upstream, clock, self._on_raw, self._on_request)
        first = turn.streamer.start()
        if turn.mcp is not None:
            first += mcp_steps.announce(turn, ran)
        self._first = self._begin(stream, first)

    def _begin(self, stream: UpstreamStream, first: list[Event]) -> list[Event]:
        """A backend answer opened: its first deltas (with its head) after `first`."""
        turn, clock = self.turn, self._clock
        assert clock is not None
        streamer = turn.streamer
        self._stream = stream
        try:
            next_batch, batch = aiter(stream).__anext__, stream.first
            limit = _call_limit(turn)
            if limit is not None:  # enforced: backends ignore parallel_tool_calls, know no limit
                next_batch, batch = first_calls(next_batch, batch, limit)
            if turn.compactor is not None:  # the answer is the summary, not output
                next_batch, batch = turn.compactor.wrap(next_batch, batch)
            self._next = next_batch
            if batch is not None:  # the first deltas came with the head: they leave with `created`
                first += self._settled(streamer.feed(batch) + _settle(turn, batch.end))
            if streamer.done:
                self._next = None
        except Exception as exc:
            first += _failed(turn, exc, clock)
        return first

    def _settled(self, events: list[Event]) -> list[Event]:
        """`events`; when the answer ended with MCP calls, their steps start next."""
        mcp = self.turn.mcp
        if mcp is not None and mcp.held is not None:
            self._next = None
            self._phase = mcp_steps.between(self.turn, self._wait)
        return events

    async def _wait(self, pending: Awaitable[T]) -> T:
        """An MCP operation, within the turn's deadline (`TurnTimeout` past it)."""
        clock = self._clock
        assert clock is not None
        clock.waiting = True
        try:
            result = await pending
        except BaseException as exc:
            if clock.timed_out(exc):
                raise TurnTimeout from None
            raise
        if clock.timed_out(None):
            raise TurnTimeout
        return result

    async def _step(self, phase: AsyncGenerator[list[Event] | None, None]) -> list[Event]:
        """The next batch of the MCP steps; at their end the backend is asked again."""
        turn, clock = self.turn, self._clock
        assert clock is not None
        try:
            events = await anext(phase)
            if events is not None:
                if turn.streamer.done:
                    self._phase = None
                return events
            self._phase = None
            old, self._stream = self._stream, None
            if old is not None:
                await old.aclose()  # read whole: kept for reuse
            request = turn.backend_request = mcp_steps.lowered(turn, ())
            turn.streamer.next_answer(
                {k: request[k] for k in turn.kind.prompt_keys if k in request}
            )
            stream = await _open(turn, self.upstream, clock, self._on_raw, self._on_request)
        except Exception as exc:
            self._phase = None
            return _failed(turn, exc, clock)
        return self._begin(stream, [])

    async def next(self) -> list[Event] | None:
        """The next batch of events; None once the terminal event has been given."""
        first = self._first
        if first is not None:
            self._first = None
            return first
        if self._phase is not None:
            return await self._step(self._phase)
        next_batch, clock, turn = self._next, self._clock, self.turn
        if next_batch is None or clock is None:
            return None
        streamer = turn.streamer
        try:
            while True:
                if clock.expired:
                    raise TurnTimeout
                clock.waiting = True
                try:
                    batch = await next_batch()
                except StopAsyncIteration:
                    clock.waiting = False
                    self._next = None
                    return self._settled(_settle(turn, True))
                except BaseException as exc:
                    if clock.timed_out(exc):
                        raise TurnTimeout from None
                    raise
                clock.waiting = False
                events = streamer.feed(batch) + _settle(turn, batch.end)  # the end rides along
                del batch  # its deltas are spent: not kept while the events are out
                events = self._settled(events)
                if streamer.done:
                    self._next = None
                if events or streamer.done or self._phase is not None:
                    return events
        except Exception as exc:
            self._next = None
            return _failed(turn, exc, clock)

    async def close(self) -> None:
        """Stop the clock and let go of the backend (idempotent)."""
        self._next = None
        phase, self._phase = self._phase, None
        if phase is not None:
            await phase.aclose()
        if self._clock is not None:
            self._clock.close()
        stream, self._stream = self._stream, None
        if stream is not None:
            await stream.aclose()  # cuts the backend unless its answer was read whole


async def stream_events(
    turn: Turn,
    upstream: Upstream,
    *,
    on_raw: Callable[[bytes], None] | None = None,
    on_request: Callable[[dict[str, Any]], None] | None = None,
) -> AsyncGenerator[list[Event], None]:
    """`TurnEvents` as an async generator (for the tap's replay and tests): one batch of
    events per upstream read; closing it closes the backend request at once."""
    events = TurnEvents(turn, upstream, on_raw=on_raw, on_request=on_request)
    try:
        await events.open()
        while (batch := await events.next()) is not None:
            yield batch
    finally:
        await events.close()


def _call_limit(turn: Turn) -> int | None:
    """The most tool calls an answer may emit: 1 for `parallel_tool_calls: false`, and
    `max_tool_calls` (calls beyond are left out, as OpenAI ignores them), or with MCP
    servers what the response's MCP call budget leaves; None: any."""
    request = turn.request
    limits = [request["max_tool_calls"]] if request.get("max_tool_calls") else []
    if turn.mcp is not None:
        limits = [turn.mcp.call_limit()]
    if request.get("parallel_tool_calls") is False:
        limits.append(1)
    return min(limits) if limits else None


def _failed(turn: Turn, exc: Exception, clock: TurnClock) -> list[Event]:
    """The turn's end when its run raised: past the deadline, refused, or a bug."""
    streamer = turn.streamer
    if isinstance(exc, TurnTimeout):
        return streamer.fail("turn_timeout", _timed_out(turn, clock))
    if isinstance(exc, RequestError):
        return streamer.fail(exc.code or "server_error", exc.message, exc.type)
    # A bug must still end the stream well-formed, never as a torn connection.
    log.error("turn %s failed", turn.response["id"], exc_info=exc)
    return streamer.fail("server_error", BROKEN)


def _settle(turn: Turn, end: bool) -> list[Event]:
    """The terminal events once the streamer is past a limit or the backend is done (`end`)."""
    streamer, compactor = turn.streamer, turn.compactor
    if compactor is not None and compactor.exceeded and not streamer.exceeded:
        streamer.exceeded = "max_output_bytes"  # a summary past the limit: no item
    if streamer.exceeded:
        return _limit_hit(turn)
    if end:
        if compactor is not None and not streamer.done:
            return streamer.feed(compactor.item()) + streamer.finish()
        if turn.mcp is not None and streamer.holds():  # the gateway runs them, then goes on
            events, held = streamer.end_answer()
            turn.mcp.held = mcp_steps.held_calls(turn, held)
            return events
        return streamer.finish()
    return []
