"""A Responses backend's event stream -> model deltas (pure).

`ResponsesEventDecoder` reads the `data:` payloads of a streamed Response (`response.*`
events, each a JSON object with its `type`) and yields the same deltas a Chat backend's
chunks do, so one `OutputItemStreamer` makes every event the client sees (its ids, its
`sequence_number`, its naming): text, refusals and reasoning as text deltas; function and
custom calls as `ToolCallDelta`s keyed by the backend's `output_index` (or, for a backend
that sends none, llama.cpp, the item's id), their names as the
backend spells them (flat, `ns.name`, or split into `namespace` and `name`, joined back as
`ns.name`: the tool map decodes every one of these spellings); every other output item
(hosted tool calls, item types this gateway does not know) whole, at its
`output_item.done`, as a `WholeItem`. `response.completed` / `incomplete` / `failed` end it
with usage and a finish reason or an error; an `error` event is an `UpstreamError`.
Event types the gateway does not know pass on as they came (`ForeignEvent`; their items
still arrive whole at `output_item.done`). An item, annotation or event passed on must fit
`MAX_ITEM_DEPTH` (core/json_bounds.py: what a client can send back, what the gateway's
events can hold); one nested deeper fails the turn as malformed, naming why.

`ResponsesDecoder` is `ChatDecoder`'s batching and end-of-body rules over it, with the
framing of framing.py (raw events) and the learnt per-token shapes of event_shapes.py.
"""

from __future__ import annotations

from typing import Any

import orjson

from streamer.core import speed
from streamer.core.call_kinds import CALL_KINDS
from streamer.core.deltas import (
    CURRENT,
    Annotation,
    Delta,
    Finish,
    ForeignEvent,
    ItemAdded,
    ReasoningBlob,
    ReasoningDelta,
    ReasoningPart,
    RefusalDelta,
    ServiceTier,
    TextDelta,
    ToolCallDelta,
    UpstreamError,
    Usage,
    WholeItem,
)
from streamer.core.json_bounds import MAX_ITEM_DEPTH, too_deep
from streamer.core.passing import about_item
from streamer.core.scrub import excerpt, scrub
from streamer.upstream.chat.decoder import INVALID_CHUNK, payload_error
from streamer.upstream.chat.error_shapes import CONTEXT_OVERFLOW, is_context_overflow
from streamer.upstream.chat.stream import FIRST_BATCH, ChatDecoder
from streamer.upstream.responses.event_shapes import NO_SHAPE, fit, learn
from streamer.upstream.responses.framing import EventFraming, event_data, event_messages

_loads = orjson.loads
_TEXT: dict[Any, type[TextDelta | RefusalDelta | ReasoningDelta]] = {
    "response.output_text.delta": TextDelta,
    "response.refusal.delta": RefusalDelta,
    "response.reasoning_text.delta": ReasoningDelta,
    "response.reasoning.delta": ReasoningDelta,  # Open Responses' name for it
    "response.reasoning_summary_text.delta": ReasoningDelta,  # after its ReasoningPart
}
_SUMMARY_DELTA = "response.reasoning_summary_text.delta"
# Events the decoder reads or the streamer makes anew from the deltas; any other type is
# passed on as it came (`ForeignEvent`), so a backend's extensions survive.
_KNOWN = frozenset(
    f"response.{name}"
    for name in (
        "created", "in_progress", "queued", "completed", "incomplete", "failed",
        "output_item.added", "output_item.done", "content_part.added", "content_part.done",
        "output_text.delta", "output_text.done", "output_text.annotation.added",
        "refusal.delta", "refusal.done", "function_call_arguments.delta",
        "function_call_arguments.done", "custom_tool_call_input.delta",
        "custom_tool_call_input.done", "reasoning_text.delta", "reasoning_text.done",
        "reasoning.delta", "reasoning.done", "reasoning_summary_part.added",
        "reasoning_summary_part.done", "reasoning_summary_text.delta",
        "reasoning_summary_text.done",
    )
)  # fmt: skip
# the calls whose arguments stream (function arguments, custom input): their kinds' rows
_CALLS = tuple(
    row.call_type for row in CALL_KINDS.values() if row.events is not None and not row.hosted
)  # a backend's own mcp_call (it ran the tool) passes whole
# Items whose content arrives as the deltas above: nothing of them is passed whole.
_STREAMED = ("message", "reasoning", *_CALLS)
_INCOMPLETE = {"max_output_tokens": "length", "content_filter": "content_filter"}
_SNIPPET = 120
_ANNOTATION_DEPTH = MAX_ITEM_DEPTH - 4  # item, content, part, annotations: then the annotation
_PIECES = tuple(
    row.events[0] for row in CALL_KINDS.values() if row.events is not None and not row.hosted
)
_LESSONS = 8  # shapes learnt per stream at most: a backend whose events all differ costs little


class ResponsesEventDecoder:
    """One backend stream's events. `done`/`finished`: a terminal `response.*` came.

    `decode` takes raw events (`bytes`, as `EventFraming` gives them, whichever path cut
    them); the per-token ones are sliced through the stream's learnt shapes (event_shapes),
    the rest parsed whole. `lessons=0` never learns: the plain path, which the tests compare
    it to (the default follows the `shapes` speed switch, core/speed.py).
    """

    __slots__ = (
        "_annotated", "_args", "_calls", "_index", "_last", "_lessons", "_ours", "_passed",
        "_secrets", "_streamed", "_summary", "_text", "_text_kind", "_tier",
        "done", "finished",
    )  # fmt: skip

    def __init__(self, lessons: int | None = None, *, secrets: tuple[str, ...] = ()) -> None:
        self._secrets = secrets  # taken out of the backend's error text (streamer/core/scrub.py)
        self.done = False
        self.finished = False
        self._tier: str | None = None
        # per backend item (`_at`): [kind, arguments or input streamed so far, text seen]
        self._calls: dict[Any, list[Any]] = {}
        self._index: dict[Any, int] = {}  # backend item -> the call's own index
        # (item, "summary" | "content") whose text came in deltas
        self._streamed: set[tuple[Any, str]] = set()
        self._annotated: set[Any] = set()  # items whose annotations came as events
        self._ours: set[Any] = set()  # items the gateway streams itself (text, reasoning, calls)
        self._passed: set[Any] = set()  # items passed whole that were added
        self._summary: int | None = None  # the summary part reasoning text goes to (ReasoningPart)
        self._lessons = (_LESSONS if speed.fast("shapes") else 0) if lessons is None else lessons
        self._text = NO_SHAPE  # the stream's text (or reasoning, refusal) delta event
        self._text_kind: type[TextDelta | RefusalDelta | ReasoningDelta] = TextDelta
        self._args = NO_SHAPE  # its argument (or custom input) delta event
        self._last: Any = None  # the type of the last event parsed whole

    def decode(self, messages: list[bytes]) -> list[Delta]:
        """The deltas of a batch of events; stops after an error or the terminal event."""
        out: list[Delta] = []
        if self.done:
            return out
        append = out.append
        # The per-token path: the shapes as locals, slices compared. A text event is head,
        # a string, the middle, the number (`tw` digits, as the last one had) and the tail;
        # any other split of it is `fit`'s. A shape fits only events the full parse decodes
        # alike (event_shapes), so only their strings are parsed.
        text, args, kind = self._text, self._args, self._text_kind
        th, ts, te, tt, tm, tw = text.head, text.start, text.end, text.tail, text.middle, text.width
        tml = len(tm)
        ah, as_ = args.head, args.start
        for message in messages:
            if th and message[:ts] == th:
                end = len(message) - te
                cut = end - tw  # where the number starts
                at = cut - tml  # where the middle starts
                if (
                    at >= ts
                    and message[end:] == tt
                    and message[at:cut] == tm
                    and (not tw or (message[cut:end].isdigit() and (tw == 1 or message[cut] != 48)))
                ):
                    try:
                        value = _loads(message[ts:at])
                    except orjson.JSONDecodeError:
                        value = None
                else:
                    value = fit(text, message)  # the number's width changed, or no fit
                    tw = text.width
                if value.__class__ is str:
                    if value:
                        append(kind(value))
                    continue
            if ah and message[:as_] == ah:
                value = fit(args, message)
                if value is not None:
                    self._call_value(args.at, value, out)
                    continue
            if self._raw(message, out) or self.done:
                break
            if text is not self._text or args is not self._args:  # it learnt a shape
                text, args, kind = self._text, self._args, self._text_kind
                th, ts, te, tt, tm, tw = (
                    text.head, text.start, text.end, text.tail, text.middle, text.width
                )  # fmt: skip
                tml = len(tm)
                ah, as_ = args.head, args.start
        return out

    def _raw(self, event: bytes, out: list[Delta]) -> bool:
        """A raw event the shapes did not take; True: stop (an error)."""
        data = event_data(event)
        if data is not None:
            return self._one(data, event, len(event) - len(data), out)
        return any(self._one(message.data, None, 0, out) for message in event_messages(event))

    def _one(self, data: bytes | str, event: bytes | None, offset: int, out: list[Delta]) -> bool:
        """One event's payload parsed whole (its shape learnt from `event` if it has one);
        True: stop (an error)."""
        try:
            obj = _loads(data)
        except orjson.JSONDecodeError:
            if data.strip() in (b"[DONE]", "[DONE]"):
                return False  # some relays end a Responses stream as a Chat one
            # the same characters whether the framing gave bytes or text (4 bytes a character)
            text = data[: _SNIPPET * 4]
            text = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
            text = excerpt(text, _SNIPPET, self._secrets)
            out.append(UpstreamError(INVALID_CHUNK, f"The backend sent malformed JSON: {text!r}"))
            return True
        if obj.__class__ is not dict:
            return False
        before = len(out)
        self._event(obj, out)
        if out and out[-1].__class__ is UpstreamError:
            self.done = True
            return True
        if event is not None and self._lessons:
            self._learn(event, offset, obj, len(out) - before)
        return False

    def _learn(self, event: bytes, offset: int, obj: dict[str, Any], made: int) -> None:
        """Learn the shape of a per-token event that decoded to one delta (or, for a call's
        fragment, to what a fragment decodes to): see event_shapes."""
        kind = obj.get("type")
        if kind != self._last:  # learnt from the second one: a one-token answer learns nothing
            self._last = kind
            return
        text_kind = _TEXT.get(kind)
        if text_kind is not None:
            if made != 1 or not obj.get("delta"):
                return
            self._lessons -= 1
            shape = learn(event, offset, obj, _at(obj))
            if shape is not None:
                self._text, self._text_kind = shape, text_kind
        elif kind in _PIECES and obj.get("delta") and _at(obj) in self._calls:
            self._lessons -= 1
            self._args = learn(event, offset, obj, _at(obj)) or self._args

    def _event(self, obj: dict[str, Any], out: list[Delta]) -> None:
        kind = obj.get("type")
        text_delta = _TEXT.get(kind)
        if text_delta is not None:
            piece = obj.get("delta")
            if isinstance(piece, str) and piece:
                at = _at(obj)
                self._ours.add(at)
                if text_delta is ReasoningDelta:
                    summary = kind == _SUMMARY_DELTA
                    self._to_part(_index(obj, "summary_index") if summary else None, out)
                    self._streamed.add((at, "summary" if summary else "content"))
                else:
                    self._streamed.add((at, "content"))
                out.append(text_delta(piece))
        elif kind == "response.reasoning_summary_part.added":
            self._to_part(_index(obj, "summary_index"), out)
        elif kind == "response.output_text.annotation.added":
            annotation = obj.get("annotation")
            if isinstance(annotation, dict) and too_deep(annotation, _ANNOTATION_DEPTH):
                out.append(_too_deep("an annotation", annotation.get("type"), self._secrets))
            elif isinstance(annotation, dict):
                self._annotated.add(_at(obj))
                out.append(Annotation(annotation))
        elif kind in _PIECES:
            self._call_value(_at(obj), obj.get("delta"), out)
        elif kind == "response.output_item.added":
            self._added(obj, out)
        elif kind == "response.output_item.done":
            self._done(obj, out)
        elif kind in ("response.completed", "response.incomplete", "response.failed"):
            self._terminal(kind, obj.get("response"), out)
        elif kind == "error" or (kind is None and ("error" in obj or obj.get("object") == "error")):
            out.append(_error(obj, self._secrets))
        elif isinstance(kind, str) and kind not in _KNOWN:
            event = {k: v for k, v in obj.items() if k != "sequence_number"}
            if too_deep(event, MAX_ITEM_DEPTH):
                out.append(_too_deep("an event", kind, self._secrets))
            else:
                out.append(ForeignEvent(event, self._key(obj)))

    def _key(self, obj: dict[str, Any]) -> Any:
        """A pass-through event's item, as `ForeignEvent.key`: none, one the gateway streams
        (CURRENT), or a backend item passed whole (added or to come)."""
        if not about_item(obj):
            return None
        at = _at(obj)
        return CURRENT if at in self._ours and at not in self._passed else at

    def _to_part(self, summary_index: int | None, out: list[Delta]) -> None:
        """The reasoning text that follows goes to `summary_index` (None: raw reasoning):
        a `ReasoningPart` when that changes. The learnt text shape is forgotten then, so a
        text event the shape takes is always of the part last named."""
        if summary_index != self._summary:
            self._summary = summary_index
            self._text = NO_SHAPE
            out.append(ReasoningPart(summary_index))

    # -- calls --------------------------------------------------------------------------

    def _own(self, at: Any) -> int:
        own = self._index.get(at)
        if own is None:
            own = self._index[at] = len(self._index)
        return own

    def _added(self, obj: dict[str, Any], out: list[Delta]) -> None:
        item, at = obj.get("item"), _at(obj)
        if not isinstance(item, dict):
            return
        kind = item.get("type")
        if kind not in _STREAMED and too_deep(item, MAX_ITEM_DEPTH):
            out.append(_too_deep("an output item", kind, self._secrets))
            return
        if kind not in _STREAMED:  # a hosted call: opened now, its own events follow it
            self._passed.add(at)
            out.append(ItemAdded(item, at))
            return
        self._ours.add(at)
        if kind == "reasoning":
            self._to_part(None, out)  # a new reasoning item: its summary parts are new ones
        if kind not in _CALLS:
            return
        self._calls[at] = [item["type"], "", False]
        out.append(ToolCallDelta(self._own(at), _str(item.get("call_id")) or None, _name(item)))

    def _call_value(self, at: Any, piece: Any, out: list[Delta]) -> None:
        call = self._calls.get(at)
        if call is None or not isinstance(piece, str) or not piece:
            return
        call[1] += piece
        if call[0] == "function_call":  # custom input is JSON-wrapped once whole, at done
            out.append(ToolCallDelta(self._own(at), arguments=piece))

    def _done(self, obj: dict[str, Any], out: list[Delta]) -> None:
        item, at = obj.get("item"), _at(obj)
        if not isinstance(item, dict):
            return
        kind = item.get("type")
        if kind in _CALLS:
            self._call_done(at, item, out)
        # too deep to pass on (a message's annotations) or whole
        elif kind != "reasoning" and too_deep(item, MAX_ITEM_DEPTH):
            out.append(_too_deep("an output item", kind, self._secrets))
        elif kind == "message":
            self._message_done(at, item.get("content"), out)
        elif kind == "reasoning":
            self._reasoning_done(at, item, out)
        else:  # a hosted call, or an item type this gateway does not know: whole
            out.append(WholeItem(item, at))

    def _message_done(self, at: Any, content: Any, out: list[Delta]) -> None:
        """A message's text if it was not streamed (sent whole), and its annotations if they
        did not come as events."""
        if not isinstance(content, list):
            return
        whole = (at, "content") not in self._streamed
        annotate = at not in self._annotated
        for part in content:
            if not isinstance(part, dict):
                continue
            if whole and isinstance(part.get("text"), str):
                kind_of = RefusalDelta if part.get("type") == "refusal" else TextDelta
                out.append(kind_of(part["text"]))
            elif whole and isinstance(part.get("refusal"), str):
                out.append(RefusalDelta(part["refusal"]))
            annotations = part.get("annotations")
            if annotate and isinstance(annotations, list):
                out += [Annotation(a) for a in annotations if isinstance(a, dict)]

    def _reasoning_done(self, at: Any, item: dict[str, Any], out: list[Delta]) -> None:
        """What of a reasoning item did not stream: each summary part as its own, the raw
        reasoning as content (never one for the other); then its blob."""
        if (at, "summary") not in self._streamed:
            for index, text in enumerate(_texts(item.get("summary"), "summary_text")):
                if text:
                    self._to_part(index, out)
                    out.append(ReasoningDelta(text))
        if (at, "content") not in self._streamed:
            text = "\n".join(_texts(item.get("content"), "reasoning_text"))
            if text:
                self._to_part(None, out)
                out.append(ReasoningDelta(text))
        self._to_part(None, out)  # the next reasoning item's parts are new ones
        blob = item.get("encrypted_content")
        if isinstance(blob, str) and blob:
            out.append(ReasoningBlob(blob))

    def _call_done(self, at: Any, item: dict[str, Any], out: list[Delta]) -> None:
        call = self._calls.pop(at, None)
        if call is None:  # no `added` came for it: the whole call now
            call = [item["type"], "", False]
            out.append(ToolCallDelta(self._own(at), _str(item.get("call_id")) or None, _name(item)))
        if item["type"] == "custom_tool_call":
            text = _str(item.get("input")) or call[1]
            out.append(
                ToolCallDelta(self._own(at), arguments=orjson.dumps({"input": text}).decode())
            )
            return
        whole = _str(item.get("arguments"))
        if whole.startswith(call[1]) and len(whole) > len(call[1]):
            out.append(ToolCallDelta(self._own(at), arguments=whole[len(call[1]) :]))

    # -- the end ------------------------------------------------------------------------

    def _terminal(self, kind: str, response: Any, out: list[Delta]) -> None:
        response = response if isinstance(response, dict) else {}
        self.done = self.finished = True
        tier = response.get("service_tier")
        if isinstance(tier, str) and tier and tier != self._tier:
            self._tier = tier
            out.append(ServiceTier(tier))
        usage = response.get("usage")
        if isinstance(usage, dict):
            out.append(decode_usage(usage))
        if kind == "response.failed":
            out.append(_error({"error": response.get("error") or {}}, self._secrets))
            return
        if kind == "response.incomplete":
            reason = _str((response.get("incomplete_details") or {}).get("reason"))
            out.append(Finish(_INCOMPLETE.get(reason, "length")))
            return
        out.append(Finish("tool_calls" if self._index else "stop"))


class ResponsesDecoder(ChatDecoder):
    """A Responses stream's body bytes -> batches of deltas, and its end (sans-I/O): the
    framing, batches and end-of-body rules are `ChatDecoder`'s; the events are read by
    `ResponsesEventDecoder` (a terminal `response.*` event is the whole answer)."""

    __slots__ = ()

    def _framing(self) -> EventFraming:
        return EventFraming()

    def _payloads(self) -> ResponsesEventDecoder:
        return ResponsesEventDecoder(secrets=self._secrets)

    def take(self) -> list[Delta]:
        """As `ChatDecoder.take`, but the batches stay small until one has a delta: a
        Responses stream opens with several events that carry none (`response.created`,
        `in_progress`, the item and part `added`), and the first text must not wait for
        the next `MAX_BATCH` events."""
        first = self._batch == FIRST_BATCH
        out = super().take()
        if first and not out:
            self._batch = FIRST_BATCH
        return out


def decode_response_body(raw: bytes | bytearray, secrets: tuple[str, ...] = ()) -> list[Delta]:
    """A whole (non-streamed) Response, as the deltas its stream would have carried
    (`secrets`: taken out of an error it reports)."""
    try:
        body = _loads(raw)
    except orjson.JSONDecodeError:
        return [UpstreamError(INVALID_CHUNK, "The backend answered with malformed JSON.")]
    if not isinstance(body, dict):
        return [
            UpstreamError(INVALID_CHUNK, "The backend answered with a JSON value, not a Response.")
        ]
    error = payload_error(body, secrets) if body.get("object") != "response" else None
    if error is not None:
        return [error]
    decoder = ResponsesEventDecoder(secrets=secrets)
    out: list[Delta] = []
    for at, item in enumerate(body.get("output") or ()):
        if isinstance(item, dict):
            decoder._done({"item": item, "output_index": at}, out)
            if out and out[-1].__class__ is UpstreamError:
                return out
    status = body.get("status")
    kind = {"failed": "response.failed", "incomplete": "response.incomplete"}.get(
        status if isinstance(status, str) else "", "response.completed"
    )
    decoder._terminal(kind, body, out)
    return out


def decode_usage(usage: dict[str, Any]) -> Usage:
    """A Responses `usage` object (input/output tokens and their details)."""
    inputs = usage.get("input_tokens_details")
    outputs = usage.get("output_tokens_details")
    inputs = inputs if isinstance(inputs, dict) else {}
    outputs = outputs if isinstance(outputs, dict) else {}
    return Usage(
        input_tokens=_int(usage.get("input_tokens")),
        output_tokens=_int(usage.get("output_tokens")),
        cached_tokens=_int(inputs.get("cached_tokens")),
        reasoning_tokens=_int(outputs.get("reasoning_tokens")),
    )


def _too_deep(what: str, kind: Any, secrets: tuple[str, ...]) -> UpstreamError:
    """A backend's item or event the gateway cannot pass on: nested deeper than a client
    could send it back (and than the gateway's own events can hold)."""
    return UpstreamError(
        INVALID_CHUNK,
        f"The backend sent {what} of type {excerpt(str(kind), _SNIPPET, secrets)!r} nested "
        f"more than {MAX_ITEM_DEPTH} levels deep, which the gateway cannot pass on.",
    )


def _error(obj: dict[str, Any], secrets: tuple[str, ...] = ()) -> UpstreamError:
    """An `error` event (`{type, code, message, param}`), or `response.failed`'s `error`,
    with the codes a Chat backend's errors get (context overflow recognised); the backend's
    words scrubbed of `secrets` (whole ones)."""
    inner = obj.get("error")
    err: dict[str, Any] = inner if isinstance(inner, dict) else obj
    code = _str(err.get("code"))
    message = _str(err.get("message"))
    kind = _str(err.get("type"))
    if is_context_overflow(code, message) or is_context_overflow(kind, ""):
        code = CONTEXT_OVERFLOW
    elif secrets:
        code = scrub(code, secrets)
    if secrets:
        message, kind = scrub(message, secrets), scrub(kind, secrets)
    return UpstreamError(
        code or "server_error", message or "The backend reported an error.", kind or None
    )


def _at(obj: dict[str, Any]) -> Any:
    """Which backend item an event is about: its `output_index`, else (llama.cpp sends none)
    the item's id."""
    index = obj.get("output_index")
    if isinstance(index, int) and not isinstance(index, bool):
        return index
    item = obj.get("item")
    item_id = obj.get("item_id") or (item.get("id") if isinstance(item, dict) else None)
    return item_id if isinstance(item_id, str) else 0


def _index(obj: dict[str, Any], field: str) -> int:
    value = obj.get(field)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _name(item: dict[str, Any]) -> str:
    """The call's name as the map knows it: a split name is joined back as `ns.name`."""
    name, namespace = _str(item.get("name")), _str(item.get("namespace"))
    return f"{namespace}.{name}" if namespace else name


def _texts(parts: Any, kind: str) -> list[str]:
    if not isinstance(parts, list):
        return []
    return [
        p["text"]
        for p in parts
        if isinstance(p, dict) and p.get("type") == kind and isinstance(p.get("text"), str)
    ]


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
