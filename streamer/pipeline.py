"""One request through the gateway: names -> lowering -> upstream -> streamer -> events.

`prepare` is pure: it validates the client's request, builds the tool map once, lowers
the request for the backend and builds the `OutputItemStreamer`. `stream_events` runs
the turn against an upstream and yields batches of encoded events. `Gateway.run` drives
it for every transport (SSE, JSON, WebSocket, background); `Sink` is what a transport
gives it.

The turn owns what a backend may make it hold: the streamer counts output characters
and items (`OutputLimits`) and `stream_events` acts on them, and on the turn's deadline
(`TurnClock`), ending the turn and cutting the backend at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from streamer import history_reuse
from streamer.compaction import (
    BACKEND_FIELD,
    REASONING_FIELD,
    Compactor,
    is_compaction,
    last_user_request,
)
from streamer.core.deltas import Usage
from streamer.core.errors import RequestError
from streamer.core.events import Event
from streamer.core.lowering import LoweringOptions
from streamer.core.output import OutputItemStreamer
from streamer.core.output_items import OutputLimits
from streamer.core.request_checks import validate_request
from streamer.core.request_fields import echo_applied
from streamer.core.response import new_response
from streamer.core.tools import NamingConfig, ResponsesToolNames
from streamer.core.truncation import CONTEXT_OVERFLOW, keep_share, truncate
from streamer.history_reuse import HistoryCache
from streamer.recorder import ExchangeRecorder
from streamer.sealing import REASONING_INCLUDE, Sealer
from streamer.upstream.batch import Batch
from streamer.upstream.chat.kind import CHAT
from streamer.upstream.first_call import first_calls
from streamer.upstream.kind import BackendKind

log = logging.getLogger("streamer.pipeline")


class UpstreamStream(Protocol):
    """An opened backend answer (see streamer/upstream/batch.py): `first`, the batch that came
    with its head (None when nothing did), then the batches iterated, the last one `end`."""

    first: Batch | None

    def __aiter__(self) -> AsyncIterator[Batch]: ...
    async def aclose(self) -> None: ...


class Upstream(Protocol):
    """What the pipeline needs of a backend client (see streamer/upstream/chat/client.py)."""

    async def open(
        self,
        backend_request: dict[str, Any],
        *,
        headers: dict[str, str] | None = None,
        on_raw: Callable[[bytes], None] | None = None,
        client: str = "",
    ) -> UpstreamStream: ...


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


@dataclass(frozen=True, slots=True)
class TurnOptions:
    """Per-gateway settings that shape every turn."""

    naming: NamingConfig = field(default_factory=NamingConfig)
    lowering: LoweringOptions = field(default_factory=LoweringOptions)
    max_input_items: int = 10_000
    max_output_bytes: int = 16 * 1024 * 1024  # see OutputLimits
    max_output_items: int = 2048
    max_turn_seconds: float = 3600.0
    sealer: Sealer = field(default_factory=Sealer.random)  # encrypted_content (--state-key-file)
    kind: BackendKind = CHAT  # what the backend speaks (--upstream-api): its lowering
    # the turns kept for the turns that continue them (--history-cache-bytes); None: none
    history: HistoryCache | None = field(default=None, compare=False)


@dataclass(slots=True)
class Turn:
    """Everything one response needs, built once per request."""

    request: dict[str, Any]
    items: list[dict[str, Any]]  # the effective input: history, then the new items
    names: ResponsesToolNames
    backend_request: dict[str, Any]
    streamer: OutputItemStreamer
    headers: dict[str, str] = field(default_factory=dict)
    client: str = ""  # who asked (streamer.identity): pools and stored responses are per client
    max_seconds: float = 3600.0  # the turn's deadline, from its start (TurnOptions)
    compactor: Compactor | None = None  # a compaction turn (streamer/compaction.py)
    lowering: LoweringOptions = field(default_factory=LoweringOptions)  # for a re-lowering
    view: list[dict[str, Any]] = field(default_factory=list)  # items with sealed ones opened
    # `--tap-dir`: a recording opened before the turn runs (a background turn's, which holds
    # its `response.queued` and its cancel); its opener records the client events and closes it.
    recorder: ExchangeRecorder | None = None
    conversation: str | None = None  # the conversation this turn extends at its end
    new_from: int = 0  # where the request's own items start in `items` (after any history)
    route: object | None = None  # the model and affinity it is routed by (upstream/registry.py)
    kind: BackendKind = CHAT  # the backend's kind: how a truncated retry is lowered again
    # (previous response, n): `items[:n]` are its stored input as the store holds it (taken
    # from the kept turn, not read back): the record extends that one (records.py)
    stored_base: tuple[str, int] | None = None

    @property
    def response(self) -> dict[str, Any]:
        return self.streamer.response


def prepare(
    request: dict[str, Any],
    options: TurnOptions,
    *,
    history: Sequence[dict[str, Any]] = (),
    response_id: str | None = None,
    client: str = "",
) -> Turn:
    """Validate and lower one request. `history` is the continued response's input+output;
    `client`: who asks (streamer.identity): its sealed items open only for it, and a
    conversation's kept lowering is its alone."""
    validate_request(request, model_required=options.lowering.model is None)
    # null means "not given" in OpenAI's API: the Response echoes the default, never null
    request = {k: v for k, v in request.items() if v is not None}
    # validated and opened (a 400 for a sealed item that does not open), only past what an
    # earlier turn of the conversation did already (streamer/history_reuse.py)
    got = history_reuse.inputs(request, options, history, client)
    new_items, items, view, names = got.new_items, got.items, got.view, got.names
    if names is None:
        names = ResponsesToolNames.convert(request.get("tools"), view, config=options.naming)
    compactor = None
    if is_compaction(new_items):
        backend_request = options.kind.compaction(request, view, names, options.lowering)
        last = last_user_request(items)
        compactor = Compactor(options.sealer, last, options.max_output_bytes, client)
    else:
        backend_request = history_reuse.lower(request, got, names, options)
    response = new_response(request, response_id=response_id)
    if compactor is None:
        history_reuse.keep(got, backend_request, names, response["id"], options)
    echo_applied(response, backend_request)
    limits = OutputLimits(options.max_output_bytes, options.max_output_items)
    prompt = {k: backend_request[k] for k in options.kind.prompt_keys if k in backend_request}
    streamer = OutputItemStreamer(
        names,
        response,
        limits=limits,
        prompt=prompt,
        seal_reasoning=_reasoning_sealer(request, options, client),
    )
    return Turn(
        request,
        items,
        names,
        backend_request,
        streamer,
        client=client,
        max_seconds=options.max_turn_seconds,
        compactor=compactor,
        lowering=options.lowering,
        view=view,
        kind=options.kind,
    )


def _reasoning_sealer(
    request: dict[str, Any], options: TurnOptions, owner: str
) -> Callable[[str, str | None], str] | None:
    """Reasoning items carry their text sealed when the client asks for it (with a
    Responses backend's own blob, when it sent one)."""
    include = request.get("include")
    if not isinstance(include, list) or REASONING_INCLUDE not in include:
        return None
    sealer = options.sealer

    def seal(text: str, backend: str | None) -> str:
        extra = {BACKEND_FIELD: backend} if backend else None
        return sealer.seal("reasoning", REASONING_FIELD, text, extra, owner=owner)

    return seal


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

    async def open(self) -> None:
        """Reach the backend (a `RequestError` if it refuses) and make the first batch:
        `response.created`, with the deltas that came with the backend's head."""
        turn = self.turn
        streamer = turn.streamer
        clock = self._clock = TurnClock(turn.max_seconds)
        self._stream = stream = await _open(
            turn, self.upstream, clock, self._on_raw, self._on_request
        )
        first = streamer.start()
        try:
            next_batch, batch = aiter(stream).__anext__, stream.first
            limit = _call_limit(turn.request)
            if limit is not None:  # enforced: backends ignore parallel_tool_calls, know no limit
                next_batch, batch = first_calls(next_batch, batch, limit)
            if turn.compactor is not None:  # the answer is the summary, not output
                next_batch, batch = turn.compactor.wrap(next_batch, batch)
            if batch is not None:  # the first deltas came with the head: they leave with `created`
                first += streamer.feed(batch) + _settle(turn, batch.end)
            self._next = None if streamer.done else next_batch
        except Exception as exc:
            first += _failed(turn, exc, clock)
        self._first = first

    async def next(self) -> list[Event] | None:
        """The next batch of events; None once the terminal event has been given."""
        first = self._first
        if first is not None:
            self._first = None
            return first
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
                    return _settle(turn, True)
                except BaseException as exc:
                    if clock.timed_out(exc):
                        raise TurnTimeout from None
                    raise
                clock.waiting = False
                events = streamer.feed(batch) + _settle(turn, batch.end)  # the end rides along
                del batch  # its deltas are spent: not kept while the events are out
                if streamer.done:
                    self._next = None
                if events or streamer.done:
                    return events
        except Exception as exc:
            self._next = None
            return _failed(turn, exc, clock)

    async def close(self) -> None:
        """Stop the clock and let go of the backend (idempotent)."""
        self._next = None
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


def _call_limit(request: dict[str, Any]) -> int | None:
    """The most tool calls the turn may emit: 1 for `parallel_tool_calls: false`, and
    `max_tool_calls` (calls beyond are left out, as OpenAI ignores them); None: any."""
    limits = [request["max_tool_calls"]] if request.get("max_tool_calls") else []
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
    return streamer.fail("server_error", "The gateway failed while streaming the response.")


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
        return streamer.finish()
    return []


def warmup(turn: Turn) -> list[Event]:
    """WebSocket `generate:false`: created then completed, empty output, no backend call
    (so no usage at all, not an estimate)."""
    events = turn.streamer.start(in_progress=False)
    turn.streamer.feed([Usage()])
    return events + turn.streamer.finish()
