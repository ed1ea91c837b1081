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
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import orjson

from .deltas import (
    Delta,
    Finish,
    ReasoningDelta,
    RefusalDelta,
    TextDelta,
    ToolCallDelta,
    UpstreamError,
    Usage,
)
from .events import Event
from .response import new_id, usage_object
from .tools import ResponsesToolNames, ToolIdentity

_dumps = orjson.dumps

# `error.code`s a client can act on: the spec's (`ResponseError.code`), plus the ones
# Codex classifies itself (context window, quota, plan).
FAILURE_CODES = frozenset(
    {
        "server_error", "rate_limit_exceeded", "invalid_prompt", "vector_store_timeout",
        "invalid_image", "invalid_image_format", "invalid_base64_image", "invalid_image_url",
        "image_too_large", "image_too_small", "image_parse_error",
        "image_content_policy_violation", "invalid_image_mode", "image_file_too_large",
        "unsupported_image_media_type", "empty_image_file", "failed_to_download_image",
        "image_file_not_found", "context_length_exceeded", "insufficient_quota",
        "usage_not_included",
    }
)  # fmt: skip

# Finish reasons that end the response `incomplete`, and the reason they report.
_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


class _Part:
    """The open content part of a message or reasoning item.

    Its delta events differ only in `delta` and `sequence_number`, so the rest of the
    JSON is built once, here, and each delta is one bytes format away.
    """

    __slots__ = ("chunks", "delta_prefix", "delta_type", "index", "kind")

    def __init__(self, kind: str, index: int, delta_type: str, delta_prefix: bytes) -> None:
        self.kind = kind  # output_text | refusal | reasoning_text
        self.index = index
        self.delta_type = delta_type
        self.delta_prefix = delta_prefix
        self.chunks: list[str] = []


class _Item:
    """The open message or reasoning item."""

    __slots__ = ("id", "item", "output_index", "part")

    def __init__(self, item: dict[str, Any], output_index: int) -> None:
        self.item = item
        self.id: str = item["id"]
        self.output_index = output_index
        self.part: _Part | None = None


class _Call:
    """One backend tool call, accumulated by its backend index."""

    __slots__ = ("args", "call_id", "delta_prefix", "emitted", "index", "item", "name")

    def __init__(self, index: int) -> None:
        self.index = index
        self.call_id: str | None = None
        self.name = ""
        self.args: list[str] = []
        self.item: dict[str, Any] | None = None  # set once output_item.added went out
        self.delta_prefix = b""
        self.emitted = False  # output_item.done went out


class OutputItemStreamer:
    """Turns one backend turn's deltas into the Responses event stream."""

    def __init__(
        self,
        names: ResponsesToolNames,
        response: dict[str, Any],
        *,
        make_id: Callable[[str], str] = new_id,
    ) -> None:
        self.names = names
        self.response = response
        self._make_id = make_id
        self._seq = 0
        self._events: list[Event] = []
        self._output: list[dict[str, Any]] = response["output"]
        self._open: _Item | None = None
        self._hot: _Part | None = None  # the open part, while deltas may go straight to it
        self._calls: dict[int, _Call] = {}
        self._live: _Call | None = None  # the function call streaming its arguments now
        self._deferred: list[Delta] = []  # text that arrived while tool calls were open
        self._call_ids: set[str] = set()
        self._usage: Usage | None = None
        self._finish: str | None = None
        self.done = False
        self._handlers: dict[type, Callable[[Any], None]] = {
            TextDelta: self._on_text,
            ReasoningDelta: self._on_reasoning,
            RefusalDelta: self._on_refusal,
            ToolCallDelta: self._on_tool_call,
            Finish: self._on_finish,
            Usage: self._on_usage,
        }

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
        self._lifecycle("response.created")
        if in_progress:
            self._lifecycle("response.in_progress")
        return self._take()

    def feed(self, deltas: Iterable[Delta]) -> list[Event]:
        """Consume a batch of deltas (one upstream read); return the events they make."""
        if self.done:
            return []
        handlers = self._handlers
        for delta in deltas:
            cls = delta.__class__
            if cls is TextDelta:  # the per-token path, inlined
                hot = self._hot
                text = delta.text  # type: ignore[union-attr]
                if hot is not None and hot.kind == "output_text" and text:
                    hot.chunks.append(text)
                    seq = self._seq
                    self._events.append(
                        Event(
                            "response.output_text.delta",
                            b'%s%s,"sequence_number":%d}' % (hot.delta_prefix, _dumps(text), seq),
                            seq,
                        )
                    )
                    self._seq = seq + 1
                    continue
            elif cls is UpstreamError:
                return self.fail(delta.code, delta.message)  # type: ignore[union-attr]
            handlers[cls](delta)
        return self._take()

    def finish(self) -> list[Event]:
        """The backend's stream ended: close every item and emit the terminal event."""
        if self.done:
            return []
        incomplete = _INCOMPLETE.get(self._finish or "")
        self._close_all("incomplete" if incomplete else "completed")
        if incomplete:
            self.response["incomplete_details"] = {"reason": incomplete}
            self._terminal("incomplete", "response.incomplete")
        else:
            self._terminal("completed", "response.completed")
        return self._take()

    def fail(self, code: str, message: str) -> list[Event]:
        """End with `response.failed` and `error: {code, message}`.

        `code` stays when clients know it (the spec's codes, and the ones Codex acts on);
        any other becomes `server_error`, keeping the original in `type`.
        """
        error: dict[str, Any] = {"code": code, "message": message}
        if code not in FAILURE_CODES:
            error = {"code": "server_error", "message": message, "type": code}
        return self._end("failed", error)

    def cancel(self) -> list[Event]:
        """A cancelled background turn: `response.failed` whose response is `cancelled`.

        The event grammar has no cancelled event; `response.failed` is the terminal event
        every client already handles.
        """
        return self._end("cancelled", None)

    def _end(self, status: str, error: dict[str, Any] | None) -> list[Event]:
        if self.done:
            return []
        self._close_all("incomplete")
        self.response["error"] = error
        self._terminal(status, "response.failed")
        return self._take()

    # -- deltas -------------------------------------------------------------------

    def _on_text(self, delta: TextDelta) -> None:
        hot = self._hot
        if hot is not None and hot.kind == "output_text":  # the per-token path
            self._delta(hot, delta.text)
        elif self._calls:
            self._deferred.append(delta)
        elif delta.text:
            self._part("message", "output_text", "response.output_text.delta", delta.text)

    def _on_refusal(self, delta: RefusalDelta) -> None:
        hot = self._hot
        if hot is not None and hot.kind == "refusal":
            self._delta(hot, delta.text)
        elif self._calls:
            self._deferred.append(delta)
        elif delta.text:
            self._part("message", "refusal", "response.refusal.delta", delta.text)

    def _on_reasoning(self, delta: ReasoningDelta) -> None:
        hot = self._hot
        if hot is not None and hot.kind == "reasoning_text":
            self._delta(hot, delta.text)
        elif self._calls:
            self._deferred.append(delta)
        elif delta.text:
            self._part("reasoning", "reasoning_text", "response.reasoning_text.delta", delta.text)

    def _delta(self, part: _Part, text: str) -> None:
        if text:
            part.chunks.append(text)
            seq = self._seq
            self._events.append(
                Event(
                    part.delta_type,
                    b'%s%s,"sequence_number":%d}' % (part.delta_prefix, _dumps(text), seq),
                    seq,
                )
            )
            self._seq = seq + 1

    def _on_tool_call(self, delta: ToolCallDelta) -> None:
        self._hot = None  # text from now on waits until the calls are out
        call = self._calls.get(delta.index)
        if call is None:
            call = self._calls[delta.index] = _Call(delta.index)
        if delta.id and call.call_id is None:
            call.call_id = delta.id
        # Some backends repeat the whole name on every fragment; a name only grows
        # until the arguments start.
        if delta.name and not call.args and delta.name != call.name:
            call.name += delta.name
        if not delta.arguments:
            return
        call.args.append(delta.arguments)
        if call is self._live:
            self._emit(
                b'%s%s,"sequence_number":%d}'
                % (call.delta_prefix, _dumps(delta.arguments), self._seq),
                "response.function_call_arguments.delta",
            )
        elif (
            self._live is None
            and call.item is None
            and call.name
            and self.names.decode(call.name).kind == "function"
        ):
            # The first function call with a complete name streams live; the
            # others wait whole in their buffers until it is done.
            self._close_open("completed")
            self._add_call(call)
            self._live = call
            self._emit(
                b'%s%s,"sequence_number":%d}'
                % (call.delta_prefix, _dumps("".join(call.args)), self._seq),
                "response.function_call_arguments.delta",
            )

    def _on_finish(self, delta: Finish) -> None:
        self._finish = delta.reason

    def _on_usage(self, delta: Usage) -> None:
        self._usage = delta

    # -- message and reasoning items ----------------------------------------------

    def _part(self, item_type: str, part_kind: str, delta_type: str, text: str) -> None:
        """Append `text` to the open part of kind `part_kind`, opening what is needed."""
        item = self._open
        if item is None or item.item["type"] != item_type:
            self._close_open("completed")
            item = self._open_item(item_type)
        part = item.part
        if part is None or part.kind != part_kind:
            part = self._open_part(item, part_kind, delta_type)
        self._hot = part
        self._delta(part, text)

    def _open_item(self, item_type: str) -> _Item:
        if item_type == "message":
            body = {
                "id": self._make_id("msg"),
                "type": "message",
                "status": "in_progress",
                "content": [],
                "role": "assistant",
            }
        else:
            body = {
                "id": self._make_id("rs"),
                "type": "reasoning",
                "status": "in_progress",
                "summary": [],
                "content": [],
            }
        item = self._open = _Item(body, len(self._output))
        self._event(
            {"type": "response.output_item.added", "output_index": item.output_index, "item": body}
        )
        return item

    def _open_part(self, item: _Item, kind: str, delta_type: str) -> _Part:
        if item.part is not None:
            self._close_part(item)
        index = len(item.item["content"])
        prefix = b'{"type":"%s","item_id":"%s","output_index":%d,"content_index":%d,%s"delta":' % (
            delta_type.encode(),
            item.id.encode(),
            item.output_index,
            index,
            b'"logprobs":[],' if kind == "output_text" else b"",
        )
        part = item.part = _Part(kind, index, delta_type, prefix)
        self._event(
            {
                "type": "response.content_part.added",
                "item_id": item.id,
                "output_index": item.output_index,
                "content_index": index,
                "part": _empty_part(kind),
            }
        )
        return part

    def _close_part(self, item: _Item) -> None:
        part = item.part
        assert part is not None
        text = "".join(part.chunks)
        where = {"item_id": item.id, "output_index": item.output_index, "content_index": part.index}
        if part.kind == "output_text":
            self._event(
                {"type": "response.output_text.done", **where, "text": text, "logprobs": []}
            )
            full = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        elif part.kind == "refusal":
            self._event({"type": "response.refusal.done", **where, "refusal": text})
            full = {"type": "refusal", "refusal": text}
        else:
            self._event({"type": "response.reasoning_text.done", **where, "text": text})
            full = {"type": "reasoning_text", "text": text}
        self._event({"type": "response.content_part.done", **where, "part": full})
        item.item["content"].append(full)
        item.part = self._hot = None

    def _close_open(self, status: str) -> None:
        item = self._open
        if item is None:
            return
        if item.part is not None:
            self._close_part(item)
        self._open = None
        self._done_item(item.item, item.output_index, status)

    # -- tool calls ---------------------------------------------------------------

    def _add_call(self, call: _Call) -> None:
        """`output_item.added` for a call whose name is complete."""
        identity = self.names.decode(call.name)
        call_id = call.call_id
        if not call_id or call_id in self._call_ids or len(call_id) > 64:
            call_id = self._make_id("call")
        self._call_ids.add(call_id)
        output_index = len(self._output)  # nothing else is open while a call is added
        kind = identity.kind
        if kind == "custom":
            item = {"id": self._make_id("ctc"), "type": "custom_tool_call", "status": "in_progress"}
            item.update(call_id=call_id, input="", **_public_name(identity))
        elif kind == "tool_search":
            item = {"id": self._make_id("tsc"), "type": "tool_search_call", "status": "in_progress"}
            item.update(call_id=call_id, execution="client", arguments={})
        else:
            item = {"id": self._make_id("fc"), "type": "function_call", "status": "in_progress"}
            item.update(arguments="", call_id=call_id, **_public_name(identity))
            call.delta_prefix = (
                b'{"type":"response.function_call_arguments.delta","item_id":"%s",'
                b'"output_index":%d,"delta":' % (item["id"].encode(), output_index)
            )
        call.item = item
        self._event(
            {"type": "response.output_item.added", "output_index": output_index, "item": item}
        )

    def _close_call(self, call: _Call, status: str) -> None:
        """Finish a call: its argument/input events (if not streamed) and `output_item.done`."""
        if call.item is None:
            self._add_call(call)
        item = call.item
        assert item is not None
        arguments = "".join(call.args)
        output_index = len(self._output)
        where = {"item_id": item["id"], "output_index": output_index}
        if item["type"] == "function_call":
            if call is not self._live and arguments:
                self._event(
                    {"type": "response.function_call_arguments.delta", **where, "delta": arguments}
                )
            item["arguments"] = arguments
            done = {
                "type": "response.function_call_arguments.done",
                **where,
                "arguments": arguments,
            }
            done["name"] = item["name"]
            if "namespace" in item:
                done["namespace"] = item["namespace"]
            self._event(done)
        elif item["type"] == "custom_tool_call":
            text = _custom_input(arguments)
            if text:
                self._event(
                    {"type": "response.custom_tool_call_input.delta", **where, "delta": text}
                )
            self._event({"type": "response.custom_tool_call_input.done", **where, "input": text})
            item["input"] = text
        else:
            item["arguments"] = _json_object(arguments)
        call.emitted = True
        self._done_item(item, output_index, status)

    # -- closing ------------------------------------------------------------------

    def _close_all(self, status: str) -> None:
        """Close the open item, every call in backend order, then any deferred text."""
        self._close_open(status)
        if self._live is not None:
            self._close_call(self._live, status)
        for call in sorted(self._calls.values(), key=lambda c: c.index):
            if not call.emitted:
                self._close_call(call, status)
        self._live = None
        if self._deferred:
            deferred, self._deferred = self._deferred, []
            self._calls = {}
            for delta in deferred:
                self._handlers[type(delta)](delta)
            self._close_open(status)

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
        u = self._usage or Usage()
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

    def _lifecycle(self, event_type: str) -> None:
        self._event({"type": event_type, "response": self.response})

    def _event(self, event: dict[str, Any]) -> None:
        event["sequence_number"] = self._seq
        self._emit(_dumps(event), event["type"])

    def _emit(self, data: bytes, event_type: str) -> None:
        self._events.append(Event(event_type, data, self._seq))
        self._seq += 1

    def _take(self) -> list[Event]:
        events, self._events = self._events, []
        return events


def _public_name(identity: ToolIdentity) -> dict[str, str]:
    """`name`, plus `namespace` for namespaced identities: what Codex routes on."""
    if identity.namespace is None:
        return {"name": identity.name}
    return {"name": identity.name, "namespace": identity.namespace}


def _empty_part(kind: str) -> dict[str, Any]:
    if kind == "output_text":
        return {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    if kind == "refusal":
        return {"type": "refusal", "refusal": ""}
    return {"type": "reasoning_text", "text": ""}


def _custom_input(arguments: str) -> str:
    """A custom tool's raw input from its function wrapper's `{"input": ...}` arguments.

    Models sometimes answer the wrapper with the raw text instead of JSON; keep it.
    """
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return arguments
    if isinstance(value, dict) and isinstance(value.get("input"), str):
        return value["input"]
    return arguments


def _json_object(arguments: str) -> Any:
    """Tool-search arguments travel as a JSON object, not a string."""
    try:
        value = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError:
        return {"query": arguments}
    return value if isinstance(value, dict) else {"query": value}
