"""OutputItemStreamer: model deltas in, encoded Responses events out (pure, no I/O).

Built once per request with the request's `ResponsesToolNames` and the Response
skeleton. Every frontend (SSE, JSON, WebSocket, background replay) consumes the
events it produces; a non-streaming request is the same run with the events ignored
and `response` read at the end. Nothing else builds output items.

The grammar it keeps (see shared/notes/responses-wire.md §6.3):
- `sequence_number` from 0, rising by one;
- one output item open at a time: every `output_item.added` is done before the next;
- tool calls are buffered by backend index, so interleaved parallel calls still come
  out whole and in order; a call is added only once its name is known;
- `name`/`namespace` are restored through the map on every surface.

It also counts what the backend makes it hold (`OutputLimits`): past a limit it takes
no more deltas and sets `exceeded`; the caller then ends the turn with `cut()`.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

import orjson

from streamer.core import speed
from streamer.core.call_kinds import ARGUMENTS_DELTA, BY_CALL_TYPE, new_call_item
from streamer.core.deltas import (
    CURRENT,
    Annotation,
    Delta,
    Finish,
    ForeignEvent,
    ItemAdded,
    LoggedText,
    ReasoningBlob,
    ReasoningDelta,
    ReasoningPart,
    RefusalDelta,
    ServiceTier,
    TextDelta,
    TextRun,
    ToolCallDelta,
    ToolCallRun,
    UpstreamError,
    Usage,
    WholeItem,
)
from streamer.core.errors import failure
from streamer.core.events import CANCELLED, CANCELLED_EVENT, Event
from streamer.core.output_items import (
    INCOMPLETE,
    LIMIT_REASON,
    Call,
    DeltaTemplate,
    Item,
    OutputLimits,
    Part,
    empty_part,
    new_item,
    part_done,
)
from streamer.core.passing import PassedItems, item_type_of, named
from streamer.core.response import new_id, usage_object
from streamer.core.tools import ResponsesToolNames

_dumps = orjson.dumps
_loads = orjson.loads
# `Event(...)` goes through the NamedTuple's Python-level __new__; this is the C one
# (0.1 us an event; tests/test_output_fast_path.py compares the events either way).
_event = tuple.__new__
# The part kind each text delta goes to, and the item and delta event type of that kind.
_PART_KINDS: dict[type, str] = {
    TextDelta: "output_text",
    LoggedText: "output_text",
    RefusalDelta: "refusal",
    ReasoningDelta: "reasoning_text",
}
_PART_HOMES = {
    "output_text": ("message", "response.output_text.delta"),
    "refusal": ("message", "response.refusal.delta"),
    "reasoning_text": ("reasoning", "response.reasoning_text.delta"),
    "summary_text": ("reasoning", "response.reasoning_summary_text.delta"),
}
_REASONING_KINDS = ("reasoning_text", "summary_text")


_PART_ADDED = {False: "response.content_part.added", True: "response.reasoning_summary_part.added"}
_PART_DONE = {False: "response.content_part.done", True: "response.reasoning_summary_part.done"}


class OutputItemStreamer:
    """Turns one backend turn's deltas into the Responses event stream."""

    def __init__(
        self,
        names: ResponsesToolNames,
        response: dict[str, Any],
        *,
        make_id: Callable[[str], str] = new_id,
        limits: OutputLimits | None = None,
        prompt: Any = None,
        seal_reasoning: Callable[[str, str | None], str] | None = None,
        reasoning_summary: int | None = None,
    ) -> None:
        # the `output` speed switch (core/speed.py); False: every delta through its handler
        self.per_token_paths = speed.fast("output")
        limits = limits or OutputLimits()
        # the client asked for `reasoning.encrypted_content`: each reasoning item carries
        # its text sealed (streamer/core/sealing.py), for clients that keep only that
        self._seal_reasoning = seal_reasoning
        self._blob: str | None = None  # the backend's encrypted_content of the open reasoning
        self._prompt = prompt  # what was sent (JSON-able): usage is estimated from it if need be
        self.names = names
        self.response = response
        self._make_id = make_id
        self._seq = 0
        self._events: list[Event] = []
        self._output: list[dict[str, Any]] = response["output"]
        self._open: Item | None = None
        self._hot: Part | None = None  # the open part, while deltas may go straight to it
        self._calls: dict[int, Call] = {}
        # Calls not finished yet, in the order they started; None once a call started at a
        # lower index than one before it (then all wait for the end, sorted by index).
        self._waiting: deque[Call] | None = deque()
        self._live: Call | None = None  # the function call streaming its arguments now
        self._deferred: list[Delta] = []  # text that arrived while tool calls were open
        self._call_ids: set[str] = set()
        self._usage: Usage | None = None
        self._finish: str | None = None
        self.done = False
        self._left = limits.max_chars  # characters of output the backend may still send
        self._items_left = limits.max_items
        # The limit the backend's answer went past ("max_output_bytes"/"max_output_items").
        self.exceeded: str | None = None
        # the summary part the reasoning text goes to (None: the raw reasoning,
        # `reasoning_text` content); a Responses backend names one (`ReasoningPart`), and
        # `reasoning_summary` says where reasoning nobody named goes (summary 0 when the
        # client asked for a summary of a backend that only has its reasoning)
        self._summary: int | None = reasoning_summary
        # a backend's items passed whole, and their events (made when the first comes)
        self._passing: PassedItems | None = None
        # A turn of several backend answers (the gateway runs MCP calls between them): the
        # identity kinds whose calls are held at an answer's end (`end_answer`), where this
        # answer's items start, and the usage of the answers before it.
        self.hold: frozenset[str] = frozenset()
        self.answer_finish: str | None = None  # the last ended answer's finish reason
        self._answer_from = 0
        self._spent: Usage | None = None
        # the handlers are the class's (HANDLERS): a table of bound methods here would make
        # every turn a reference cycle, freed only by the collector, turns after it ended
        self._handlers = HANDLERS

    # -- public API -------------------------------------------------------------

    @property
    def sequence_number(self) -> int:
        """The number the next event will carry."""
        return self._seq

    def queued(self) -> list[Event]:
        """`response.queued`, for background responses, before the turn starts."""
        self.response["status"] = "queued"
        self._lifecycle("response.queued")
        return self._take()

    def start(self, *, in_progress: bool = True) -> list[Event]:
        """`response.created`, then `response.in_progress` unless told otherwise."""
        self.response["status"] = "in_progress"
        response = self._lifecycle("response.created")
        if in_progress:
            self._lifecycle("response.in_progress", response)  # the same response
        return self._take()

    def feed(self, deltas: Iterable[Delta]) -> list[Event]:
        """Consume a batch of deltas (one upstream read); return the events they make."""
        if self.done or self.exceeded:
            return []
        handlers = self._handlers
        events = self._events
        fast = self.per_token_paths
        for delta in deltas:
            cls = delta.__class__
            # The two per-token paths, inlined: text into the open text part, and argument
            # fragments of the call streaming live. Measured end to end they are worth ~15%
            # of requests/s (bench --baseline A/B); tests/test_output_fast_path.py checks
            # them against the handlers (`per_token_paths = False`) on random turns.
            if fast and cls is TextDelta:
                hot, piece = self._hot, delta.text  # type: ignore[union-attr]
                if hot is not None and hot.kind == "output_text" and 0 < len(piece) <= self._left:
                    self._left -= len(piece)
                    hot.text.write(piece)
                    template, seq = hot.delta, self._seq
                    events.append(_event(Event, (template.type, template.encode(piece, seq), seq)))
                    self._seq = seq + 1
                    continue
            elif fast and cls is ToolCallDelta:
                live, piece = self._live, delta.arguments  # type: ignore[union-attr]
                if (
                    live is not None
                    and live.index == delta.index  # type: ignore[union-attr]
                    and delta.id is None  # type: ignore[union-attr]
                    and delta.name is None  # type: ignore[union-attr]
                    and piece  # None (a bare index) goes to the handler
                    and len(piece) <= self._left
                ):
                    self._left -= len(piece)
                    live.args.append(piece)
                    template, seq = live.delta, self._seq  # type: ignore[assignment]
                    events.append(_event(Event, (template.type, template.encode(piece, seq), seq)))
                    self._seq = seq + 1
                    continue
            elif (
                fast and (cls is TextRun or cls is ToolCallRun) and self._run_rest(delta, 0)  # type: ignore[arg-type]
            ):
                continue  # one event per piece still, encoded as a batch
            handlers[cls](self, delta)
            if self.done or self.exceeded:  # a failure ended the turn, or a limit was hit
                break
        return self._take()

    def finish(self) -> list[Event]:
        """The backend's stream ended: close every item and emit the terminal event."""
        if self.done:
            return []
        if self.exceeded:
            return self.cut()
        incomplete = INCOMPLETE.get(self._finish or "")
        if incomplete:
            return self._incomplete(incomplete)
        self._close_all("completed")
        self._terminal("completed", "response.completed")
        return self._take()

    def end_answer(self) -> tuple[list[Event], list[Call]]:
        """One backend answer of a longer turn ended (the gateway runs the calls it holds,
        then asks the backend again): its items closed, the calls of a `hold` kind kept back
        (returned in backend order, never emitted), no terminal event; its usage is summed
        into the response's at the end."""
        held = [
            c
            for c in sorted(self._calls.values(), key=lambda c: c.index)
            if not c.emitted and c.name and self.names.decode(c.name).kind in self.hold
        ]
        for call in held:
            call.emitted = True
        left, items_left = self._left, self._items_left + len(held)  # their items come later
        self._close_all("completed")
        self._left, self._items_left = left, items_left
        self.answer_finish, u = self._finish, self._answer_usage()
        self._spent = u if self._spent is None else _plus(self._spent, u)
        # nothing of the next answer yet: a turn that ends here adds no more usage
        self._answer_from, self._usage, self._finish = len(self._output), Usage(), None
        self._calls, self._waiting, self._live, self._hot = {}, deque(), None, None
        self._summary = self._passing = None
        return self._take(), held

    def next_answer(self, prompt: Any) -> None:
        """The backend is asked again, with `prompt` (what usage is estimated from)."""
        self._prompt, self._usage = prompt, None

    def holds(self) -> bool:
        """Whether the answer so far made a call of a `hold` kind (the gateway runs it)."""
        return bool(self.hold) and any(
            not c.emitted and c.name and self.names.decode(c.name).kind in self.hold
            for c in self._calls.values()
        )

    def add_item(self, item: dict[str, Any]) -> list[Event]:
        """`output_item.added` for an item the gateway makes itself (an MCP list, call or
        approval request), open until `done_item`; nothing past the item limit (then
        `exceeded` is set)."""
        if self.done or not self._new_item():
            return []
        self._close_open("completed")
        self._open_item_as(item)
        return self._take()

    def item_event(self, event: dict[str, Any]) -> list[Event]:
        """An event about the item `add_item` opened (its id and output index added)."""
        item = self._open
        if item is None:
            return []
        self._event({**event, "item_id": item.id, "output_index": item.output_index})
        return self._take()

    def done_item(self, item: dict[str, Any]) -> list[Event]:
        """`output_item.done` for the item `add_item` opened: `item` is its final form."""
        opened, self._open = self._open, None
        if opened is None:
            return []
        self._output.append(item)
        self._event(
            {"type": "response.output_item.done", "output_index": opened.output_index, "item": item}
        )
        return self._take()

    def _answer_usage(self) -> Usage:
        """The usage the ended answer's backend sent, else an estimate of that answer."""
        if self._usage is not None:
            return self._usage
        return estimate_usage(self._prompt, self._output[self._answer_from :])

    def cut(self) -> list[Event]:
        """End `incomplete` now (an output limit, see `exceeded`), keeping the output so far."""
        if self.done:
            return []
        return self._incomplete(LIMIT_REASON)

    def _incomplete(self, reason: str) -> list[Event]:
        self._close_all("incomplete")
        self.response["incomplete_details"] = {"reason": reason}
        self._terminal("incomplete", "response.incomplete")
        return self._take()

    def fail(self, code: str, message: str, type: str | None = None) -> list[Event]:
        """End with `response.failed` and `error: {code, message, type}` (core/errors.py's
        `failure`: a code clients know, the original kept as the type)."""
        self._fail(code, message, type)
        return self._take()

    def _fail(self, code: str, message: str, type: str | None = None) -> None:
        self._end("failed", failure(code, message, type))

    def cancel(self) -> list[Event]:
        """A cancelled turn: `CANCELLED_EVENT` (`response.failed`) whose response is
        `cancelled`, with no error (core/events.py)."""
        self._end(CANCELLED, None)
        return self._take()

    def _end(self, status: str, error: dict[str, Any] | None) -> None:
        if self.done:
            return
        self._close_all("incomplete")
        self.response["error"] = error
        self._terminal(status, CANCELLED_EVENT if status == CANCELLED else "response.failed")

    # -- deltas -------------------------------------------------------------------

    def _on_content(self, delta: TextDelta | RefusalDelta | ReasoningDelta) -> None:
        """Text, refusal or reasoning: into the open part of its kind (the per-token path),
        held while tool calls are open, or into a new part."""
        text = self._fit(delta.text)
        if not text:
            return
        kind = _PART_KINDS[delta.__class__]
        if self._summary is not None and kind == "reasoning_text":
            kind = "summary_text"
        logprobs = delta.logprobs if delta.__class__ is LoggedText else None
        hot = self._hot
        if hot is not None and hot.kind == kind:
            self._write(hot, text, logprobs)
        elif self._calls:
            self._deferred.append(replace(delta, text=text))
        else:
            self._part(kind, text, logprobs)

    def _on_run(self, run: TextRun | ToolCallRun) -> None:
        """A run its fast path did not take: piece by piece, as the decoder would have sent
        it, until the first piece has opened the part or made the call live (the rest is
        then the fast path's)."""
        handle: Any = self._on_content if run.__class__ is TextRun else self._on_tool_call
        for i, piece in enumerate(run.pieces):
            if i and self.per_token_paths and self._run_rest(run, i):
                return
            handle(run.piece(piece))
            if self.done or self.exceeded:
                return

    def _run_rest(self, run: TextRun | ToolCallRun, at: int) -> bool:
        """A run's pieces from `at` on into the text part or the live call they continue,
        one event each encoded as a batch; False: they continue neither, or the output
        limit would be passed (the handlers take them)."""
        if run.__class__ is TextRun:
            target: Any = self._hot
            if target is None or target.kind != "output_text":
                return False
            write = target.text.write
        else:
            target = self._live
            if target is None or target.index != run.index:  # type: ignore[union-attr]
                return False
            write = target.args.append
        rest = "".join(run.pieces[at:]) if at else run.joined()
        if len(rest) > self._left:
            return False
        self._left -= len(rest)
        write(rest)
        raw, seq = run.raw[at:] if at else run.raw, self._seq
        self._events += target.delta.run(raw, seq)
        self._seq = seq + len(raw)
        return True

    def _write(self, part: Part, text: str, logprobs: list[dict[str, Any]] | None) -> None:
        """`text` into `part`, and its delta event (with the tokens' logprobs, if any)."""
        part.text.write(text)
        if not logprobs:
            self._delta(part.delta, text)
            return
        part.logprobs.extend(logprobs)
        self._event(
            {
                "type": part.delta.type,
                **part.where,
                "delta": text,
                "logprobs": logprobs,
            }
        )

    def _on_service_tier(self, delta: ServiceTier) -> None:
        self.response["service_tier"] = delta.tier  # the echo says the tier that served it

    def _on_error(self, delta: UpstreamError) -> None:
        self._fail(delta.code, delta.message, delta.type)

    def _on_reasoning_part(self, delta: ReasoningPart) -> None:
        """The reasoning text from here on goes to another part (a summary part of the
        backend's, or the raw reasoning): the open reasoning part is done."""
        if self._calls:
            self._deferred.append(delta)  # in order with the text it comes before
            return
        self._summary = delta.summary_index
        item = self._open
        if item is not None and item.part is not None and item.part.kind in _REASONING_KINDS:
            self._close_part(item)

    def _on_annotation(self, delta: Annotation) -> None:
        """An annotation of the answer's text: into the open `output_text` part (one is
        opened for it if none is), with its `annotation_index` there."""
        if self._calls:
            self._deferred.append(delta)
            return
        if not self._charge(len(_dumps(delta.annotation))):
            return
        item = self._open
        if item is None or item.item["type"] != "message":
            if not self._new_item():
                return
            self._close_open("completed")
            item = self._open_item("message")
        part = item.part
        if part is None or part.kind != "output_text":
            part = self._open_part(item, "output_text", "response.output_text.delta")
        self._hot = part
        self._event(
            {
                "type": "response.output_text.annotation.added",
                **part.where,
                "annotation_index": len(part.annotations),
                "annotation": delta.annotation,
            }
        )
        part.annotations.append(delta.annotation)

    def _on_reasoning_blob(self, delta: ReasoningBlob) -> None:
        """The backend's blob for its reasoning: sealed with the item's text when it closes
        (a reasoning item of its own if none is open; after the calls, with the reasoning
        held with it, while calls are open); without sealing, left out."""
        if self._seal_reasoning is None:
            return
        item = self._open
        if item is None or item.item["type"] != "reasoning":
            if self._calls:
                self._deferred.append(delta)
                return
            if not self._new_item():
                return
            self._close_open("completed")
            self._open_item("reasoning")
        self._blob = delta.encrypted_content

    def _on_item_added(self, delta: ItemAdded) -> None:
        """A backend's item passed whole is added: open under its gateway id (the item's
        own), its events held so far after it."""
        if self._calls:
            self._deferred.append(delta)
            return
        if not self._new_item():
            return
        self._close_open("completed")
        item = self._open_item_as(self._own_id(delta.item))
        for event in self._passed().opened(delta.key, item.id, item.output_index):
            self._event(event)

    def _on_whole_item(self, delta: WholeItem) -> None:
        """An item passed whole (a compaction, a backend's hosted call): done now, added
        first unless `ItemAdded` opened it (then it closes that one)."""
        if self._calls:
            self._deferred.append(delta)
            return
        opened = self._open
        where = self._passed().where(delta.key) if delta.key is not None else None
        if opened is None or where is None or where != (opened.id, opened.output_index):
            if not self._new_item():
                return
            self._close_open("completed")
            opened = self._open_item_as(
                self._own_id(delta.item) if delta.key is not None else delta.item
            )
            for event in self._passed().opened(delta.key, opened.id, opened.output_index):
                self._event(event)
        item = {**delta.item, "id": opened.id}
        self._open = None
        self._output.append(item)
        self._event(
            {"type": "response.output_item.done", "output_index": opened.output_index, "item": item}
        )

    def _own_id(self, item: dict[str, Any]) -> dict[str, Any]:
        """A backend's item under an id of the gateway's (the backend's prefix kept)."""
        raw = item.get("id")
        prefix = raw.partition("_")[0][:8] if isinstance(raw, str) and "_" in raw else ""
        return {**item, "id": self._make_id(prefix or "item")}

    def _passed(self) -> PassedItems:
        passing = self._passing
        if passing is None:
            passing = self._passing = PassedItems()
        return passing

    def _open_item_as(self, body: dict[str, Any]) -> Item:
        """`output_item.added` for an item given whole (its id the gateway's own)."""
        item = self._open = Item(body, len(self._output))
        self._event(
            {"type": "response.output_item.added", "output_index": item.output_index, "item": body}
        )
        return item

    def _on_foreign(self, delta: ForeignEvent) -> None:
        """An event type this gateway does not know: it survives, in stream order, naming
        the gateway's item when it is about one (held until the gateway has added it)."""
        key = delta.key
        if key is None:
            self._event(dict(delta.event))
        elif key is CURRENT:
            where = self._streaming()
            if where is None:
                if self._charge(len(_dumps(delta.event))):
                    self._passed().hold(delta.event, key)
            else:
                self._event(named(delta.event, *where))
        elif self._calls:
            self._deferred.append(delta)
        elif self._charge(len(_dumps(delta.event))):
            event = self._passed().event(delta.event, key)
            if event is not None:
                self._event(event)

    def _streaming(self) -> tuple[str, int] | None:
        """The gateway's id and output index of the item it is streaming now (the open
        item, else the call streaming live, else the last item done), if any."""
        if self._open is not None:
            return self._open.id, self._open.output_index
        live = self._live
        if live is not None and live.item is not None:
            return live.item["id"], len(self._output)
        if self._output:
            return self._output[-1]["id"], len(self._output) - 1
        return None

    def _orphans(self, status: str) -> None:
        """Events held for items that never came: each item opened for them at the end
        (its type from the events' own), so that they are never dropped."""
        for _key, events in self._passed().orphans():
            body = {"id": self._make_id("item"), "type": item_type_of(events[0]["type"])}
            item = self._open_item_as(body)
            for event in events:
                self._event(named(event, item.id, item.output_index))
            self._open = None
            self._done_item(body, item.output_index, status)

    # -- limits -------------------------------------------------------------------

    def _fit(self, text: str) -> str:
        """`text`, cut to what the output limit has left (then `exceeded` is set)."""
        n = len(text)
        if n <= self._left:
            self._left -= n
            return text
        text = text[: self._left]
        self._left = 0
        self.exceeded = "max_output_bytes"
        return text

    def _charge(self, n: int) -> bool:
        """Count `n` characters held for the client (an annotation, a held event) against
        the output limit; False past it (then `exceeded` is set)."""
        if n <= self._left:
            self._left -= n
            return True
        self._left = 0
        self.exceeded = "max_output_bytes"
        return False

    def _new_item(self) -> bool:
        """Count one more output item (or held call); False past the limit."""
        if self._items_left > 0:
            self._items_left -= 1
            return True
        self.exceeded = self.exceeded or "max_output_items"
        return False

    def _delta(self, template: DeltaTemplate, text: str) -> None:
        """A delta event: every `*.delta` type is encoded here, by its item's template."""
        seq = self._seq
        self._events.append(_event(Event, (template.type, template.encode(text, seq), seq)))
        self._seq = seq + 1

    def _on_tool_call(self, delta: ToolCallDelta) -> None:
        self._hot = None  # text from now on waits until the calls are out
        call = self._calls.get(delta.index)
        if call is None:
            if not self._new_item():
                return
            call = self._calls[delta.index] = Call(delta.index)
            self._started(call)
        elif call.emitted:  # more of a call already finished (its arguments were whole)
            return
        if delta.id and call.call_id is None:
            call.call_id = self._fit(delta.id)
        # Some backends repeat the whole name on every fragment; a name only grows
        # until the arguments start.
        if delta.name and not call.args and delta.name != call.name:
            call.name += self._fit(delta.name)
        arguments = self._fit(delta.arguments) if delta.arguments else ""
        if not arguments:
            return
        call.args.append(arguments)
        if call is self._live:
            assert call.delta is not None
            self._delta(call.delta, arguments)
        elif (
            self._live is None
            and call.item is None
            and call.name
            and self.names.decode(call.name).kind == "function"
        ):
            # The first function call with a complete name streams live; the
            # others wait whole in their buffers until it is done.
            self._close_open("completed")
            item = self._add_call(call)
            self._live = call
            where = {"item_id": item["id"], "output_index": len(self._output)}
            call.delta = DeltaTemplate(ARGUMENTS_DELTA, where)
            self._delta(call.delta, "".join(call.args))

    def _started(self, new: Call) -> None:
        """A call at a higher index starts: the calls before it whose arguments are whole
        JSON are finished (llama.cpp and vLLM send calls one after another), in order, up to
        the first that is not (a backend that interleaves calls), so the next can stream."""
        waiting = self._waiting
        if waiting is None:
            return
        if waiting and waiting[-1].index > new.index:
            self._waiting = None  # out of order: the end sorts them
            return
        while waiting and not waiting[0].emitted:
            call = waiting[0]
            if not call.name or not _whole_json("".join(call.args)):
                break
            waiting.popleft()
            if self.hold and self.names.decode(call.name).kind in self.hold:
                continue  # the gateway runs it once the answer ended (`end_answer`)
            self._close_open("completed")
            self._close_call(call, "completed")
            if call is self._live:
                self._live = None
        while waiting and waiting[0].emitted:
            waiting.popleft()
        waiting.append(new)

    def _on_finish(self, delta: Finish) -> None:
        self._finish = delta.reason

    def _on_usage(self, delta: Usage) -> None:
        self._usage = delta

    # -- message and reasoning items ----------------------------------------------

    def _part(
        self, part_kind: str, text: str, logprobs: list[dict[str, Any]] | None = None
    ) -> None:
        """Append `text` to the open part of kind `part_kind`, opening what is needed."""
        item_type, delta_type = _PART_HOMES[part_kind]
        item = self._open
        if item is None or item.item["type"] != item_type:
            if not self._new_item():
                return
            self._close_open("completed")
            item = self._open_item(item_type)
        part = item.part
        if part is None or part.kind != part_kind:
            part = self._open_part(item, part_kind, delta_type)
        self._hot = part
        self._write(part, text, logprobs)

    def _open_item(self, item_type: str) -> Item:
        body = new_item(item_type, self._make_id)
        item = self._open = Item(body, len(self._output))
        self._event(
            {"type": "response.output_item.added", "output_index": item.output_index, "item": body}
        )
        return item

    def _open_part(self, item: Item, kind: str, delta_type: str) -> Part:
        if item.part is not None:
            self._close_part(item)
        summary = kind == "summary_text"
        index = len(item.item["summary" if summary else "content"])
        part = item.part = Part(kind, index, delta_type, item.id, item.output_index)
        self._event(
            {
                "type": _PART_ADDED[summary],
                "item_id": item.id,
                "output_index": item.output_index,
                ("summary_index" if summary else "content_index"): index,
                "part": empty_part(kind),
            }
        )
        return part

    def _close_part(self, item: Item) -> None:
        part = item.part
        assert part is not None
        text = part.text.getvalue()
        summary = part.kind == "summary_text"
        where = {
            "item_id": item.id,
            "output_index": item.output_index,
            ("summary_index" if summary else "content_index"): part.index,
        }
        done, full = part_done(part.kind, text, part.logprobs, part.annotations)
        self._event({**done, **where})
        self._event({"type": _PART_DONE[summary], **where, "part": full})
        item.item["summary" if summary else "content"].append(full)
        item.part = self._hot = None

    def _close_open(self, status: str) -> None:
        item = self._open
        if item is None:
            return
        if item.part is not None:
            self._close_part(item)
        self._open = None
        body = item.item
        if self._seal_reasoning is not None and body["type"] == "reasoning":
            texts = [p["text"] for p in body["content"] if p.get("type") == "reasoning_text"]
            body["encrypted_content"] = self._seal_reasoning("\n".join(texts), self._blob)
            self._blob = None
        self._done_item(body, item.output_index, status)

    # -- tool calls ---------------------------------------------------------------

    def _add_call(self, call: Call) -> dict[str, Any]:
        """`output_item.added` for a call whose name is complete."""
        identity = self.names.decode(call.name)
        call_id = call.call_id
        if not call_id or call_id in self._call_ids or len(call_id) > 64:
            call_id = self._make_id("call")
        self._call_ids.add(call_id)
        output_index = len(self._output)  # nothing else is open while a call is added
        item = call.item = new_call_item(identity, call_id, self._make_id, call.args)
        self._event(
            {"type": "response.output_item.added", "output_index": output_index, "item": item}
        )
        return item

    def _close_call(self, call: Call, status: str) -> None:
        """Finish a call: its argument/input events (if not streamed) and `output_item.done`."""
        item = call.item if call.item is not None else self._add_call(call)
        arguments = "".join(call.args)
        call.args = [arguments]  # held once from here on: the item and the events share it
        output_index = len(self._output)
        where = {"item_id": item["id"], "output_index": output_index}
        row = BY_CALL_TYPE[item["type"]]
        if row.lifted is None:  # shell, apply_patch: added whole
            status = row.status(status)
        else:
            value = item[row.field] = row.lifted(arguments)
            if row.events is not None:  # function arguments, custom input: their events
                delta_type, done_type = row.events
                if value and call is not self._live:  # a live call's are out already
                    self._delta(DeltaTemplate(delta_type, where), value)
                done = {"type": done_type, **where, row.field: value}
                if row.done_named:
                    done["name"] = item["name"]
                    if "namespace" in item:
                        done["namespace"] = item["namespace"]
                self._event(done)
        call.emitted = True
        self._done_item(item, output_index, status)

    # -- closing ------------------------------------------------------------------

    def _close_all(self, status: str) -> None:
        """Close the open item, every call in backend order, then any deferred text.

        Ending `incomplete`, a call whose arguments are whole JSON is still `completed`:
        only the call the cut went through is `incomplete`."""
        self._close_open(status)
        if self._live is not None:
            self._close_call(self._live, self._call_status(self._live, status))
        for call in sorted(self._calls.values(), key=lambda c: c.index):
            if not call.emitted:
                self._close_call(call, self._call_status(call, status))
        self._live = None
        # What closing replays was counted when it came; nothing is refused from here.
        self._left = self._items_left = sys.maxsize
        if self._deferred:
            deferred, self._deferred = self._deferred, []
            self._calls = {}
            for delta in deferred:
                self._handlers[type(delta)](self, delta)
            self._close_open(status)
        if self._passing is not None:
            self._orphans(status)

    def _call_status(self, call: Call, status: str) -> str:
        if status != "incomplete" or not _whole_json("".join(call.args)):
            return status
        if self.hold and self.names.decode(call.name).kind in self.hold:
            return status  # a call the gateway would have run: it did not
        return "completed"

    def _done_item(self, item: dict[str, Any], output_index: int, status: str) -> None:
        item["status"] = status
        self._output.append(item)
        self._event(
            {"type": "response.output_item.done", "output_index": output_index, "item": item}
        )

    def _terminal(self, status: str, event_type: str) -> None:
        response = self.response
        response["status"] = status
        if status == "completed":
            response["completed_at"] = int(time.time())
        u = self._answer_usage()
        if self._spent is not None:
            u = _plus(self._spent, u)
        response["usage"] = usage_object(
            u.input_tokens,
            u.output_tokens,
            u.cached_tokens,
            u.cache_write_tokens,
            u.reasoning_tokens,
        )
        self._lifecycle(event_type)
        self.done = True

    # -- encoding -----------------------------------------------------------------

    def _lifecycle(self, event_type: str, response: bytes | None = None) -> bytes:
        """An event that carries the whole response; returns the response's JSON."""
        if response is None:
            response = _dumps(self.response)
        seq = self._seq
        self._emit(
            b'{"type":"%s","response":%s,"sequence_number":%d}'
            % (event_type.encode(), response, seq),
            event_type,
        )
        return response

    def _event(self, event: dict[str, Any]) -> None:
        event["sequence_number"] = self._seq
        # Copied to its exact size: orjson's own bytes keep a ~4 kB buffer, and events are
        # held in bulk (a finish that closes thousands of calls, a background replay).
        self._emit(b"%b" % (_dumps(event),), event["type"])

    def _emit(self, data: bytes, event_type: str) -> None:
        self._events.append(Event(event_type, data, self._seq))
        self._seq += 1

    def _take(self) -> list[Event]:
        events, self._events = self._events, []
        return events


_S = OutputItemStreamer  # short, for the table
HANDLERS: dict[type, Callable[[OutputItemStreamer, Any], None]] = {
    TextDelta: _S._on_content,
    TextRun: _S._on_run,
    ToolCallRun: _S._on_run,
    LoggedText: _S._on_content,
    ReasoningDelta: _S._on_content,
    RefusalDelta: _S._on_content,
    ToolCallDelta: _S._on_tool_call,
    Finish: _S._on_finish,
    Usage: _S._on_usage,
    UpstreamError: _S._on_error,
    WholeItem: _S._on_whole_item,
    ItemAdded: _S._on_item_added,
    ForeignEvent: _S._on_foreign,
    ReasoningPart: _S._on_reasoning_part,
    Annotation: _S._on_annotation,
    ReasoningBlob: _S._on_reasoning_blob,
    ServiceTier: _S._on_service_tier,
}
"""Each delta's handler, called with the streamer (one table for every turn)."""
del _S


def _plus(a: Usage, b: Usage) -> Usage:
    """Two answers' usage summed (one response of several backend answers)."""
    return Usage(
        a.input_tokens + b.input_tokens,
        a.output_tokens + b.output_tokens,
        a.cached_tokens + b.cached_tokens,
        a.cache_write_tokens + b.cache_write_tokens,
        a.reasoning_tokens + b.reasoning_tokens,
    )


def _whole_json(arguments: str) -> bool:
    """`arguments` parse as one JSON value (a call's arguments are complete)."""
    if not arguments:
        return False
    try:
        _loads(arguments)
    except orjson.JSONDecodeError:
        return False
    return True


CHARS_PER_TOKEN = 4  # the usage estimate's heuristic: ~4 characters of JSON/text a token


def estimate_usage(prompt: Any, output: list[dict[str, Any]]) -> Usage:
    """Usage for a backend that sent none: the prompt's JSON and the output's text (and
    arguments), at `CHARS_PER_TOKEN` characters a token, rounded up. An estimate, not zeros:
    clients that budget the context on `usage` keep working."""
    sent = len(_dumps(prompt)) if prompt is not None else 0
    made = 0
    for item in output:
        for part in item.get("content") or ():
            made += len(part.get("text") or part.get("refusal") or "")
        for key in ("arguments", "input"):
            value = item.get(key)
            made += len(value) if isinstance(value, str) else 0
        if item.get("type") == "compaction":  # its summary, sealed: about 3/4 of the blob
            made += len(item.get("encrypted_content") or "") * 3 // 4
    return Usage(
        input_tokens=-(-sent // CHARS_PER_TOKEN), output_tokens=-(-made // CHARS_PER_TOKEN)
    )
