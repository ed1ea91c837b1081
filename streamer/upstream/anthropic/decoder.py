"""A Messages backend's event stream -> model deltas (pure).

`MessagesEventDecoder` reads the `data:` payloads of a streamed Message (each a JSON
object with its `type`) into the one delta vocabulary:
- `message_start`: its usage (input and cache tokens) kept;
- `content_block_start` / `_delta` / `_stop`: `text_delta` -> `TextDelta`;
  `thinking_delta` -> `ReasoningDelta`; `tool_use` blocks -> `ToolCallDelta`s keyed by the
  call's own index (the block's `id` and `name`, then each `input_json_delta`; an input
  given whole in the start, or none, at the stop); a thinking block's `signature_delta`s and
  a `redacted_thinking` block's `data` are kept, and at each such block's stop one
  `ReasoningBlob` carries every signed thinking block of the answer so far, each run of
  them with the tool_use started before it (blocks.py), for the streamer to seal; an
  unsigned block (llama.cpp's `signature: ""`) is its text only;
- `message_delta`: the stop reason (`end_turn`, `stop_sequence`, `pause_turn` -> stop;
  `tool_use` -> tool_calls; `max_tokens`, `model_context_window_exceeded` -> length, an
  incomplete response; `refusal` -> content_filter) and the usage so far (input tokens
  with the cache reads and writes, the reads as `cached_tokens`, thinking tokens as
  reasoning tokens);
- `message_stop` ends it; `ping` is nothing; `error` is an `UpstreamError` (errors.py).
Unknown event and block types (server tools the gateway never declares) are skipped.

The body's state machine over it, a whole Message and tap's reading: stream.py.
"""

from __future__ import annotations

from typing import Any

import orjson

from streamer.core import speed
from streamer.core.deltas import (
    Delta,
    Finish,
    ReasoningBlob,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    UpstreamError,
    Usage,
)
from streamer.core.json_bounds import MAX_ITEM_DEPTH, too_deep
from streamer.core.scrub import excerpt
from streamer.core.sealing import MAX_PLAIN_BYTES
from streamer.upstream.anthropic.blocks import ThinkingRun, thinking_blob
from streamer.upstream.anthropic.errors import stream_error
from streamer.upstream.anthropic.event_shapes import NO_SHAPE, fit, learn_piece
from streamer.upstream.chat.decoder import INVALID_CHUNK
from streamer.upstream.responses.framing import event_data, event_messages

_loads = orjson.loads
STOP_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",  # the gateway runs no server tools: the answer so far
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "refusal": "content_filter",
}
_USAGE_KEYS = (
    "input_tokens",
    "output_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
)
_THINKING = ("thinking", "redacted_thinking")
EVENT_TYPES = frozenset(
    {
        "message_start", "content_block_start", "content_block_delta", "content_block_stop",
        "message_delta", "message_stop", "ping", "error",
    }
)  # fmt: skip
_SNIPPET = 120


_LESSONS = 8  # shapes learnt per stream at most: a backend whose events all differ costs little
# What one answer's kept thinking (signed blocks, redacted data) may hold: it is sealed into
# one `encrypted_content`, which must still open (sealing.py's bound) with text beside it.
MAX_THINKING_BLOCKS = 64
MAX_THINKING_CHARS = MAX_PLAIN_BYTES // 2
THINKING_LIMIT = "upstream_thinking_limit"


class MessagesEventDecoder:
    """One Message stream's events. `done`: `message_stop` came; `finished`: the answer is
    whole (its stop reason came).

    A block's per-token deltas are sliced through the shape learnt from the second one
    (event_shapes.py); `lessons=0` never learns: the plain path, which the tests compare
    it to (the default follows the `shapes` speed switch, core/speed.py). Its events come
    raw, as `EventFraming` gives them (responses/framing.py)."""

    __slots__ = (
        "_blocks", "_calls", "_in_run", "_kept", "_kind", "_last", "_last_use", "_lessons",
        "_runs", "_secrets", "_shape", "_thought", "_usage", "done", "finished",
    )  # fmt: skip

    def __init__(self, lessons: int | None = None, *, secrets: tuple[str, ...] = ()) -> None:
        self._lessons = (_LESSONS if speed.fast("shapes") else 0) if lessons is None else lessons
        self._secrets = secrets  # taken out of the backend's error text (streamer/core/scrub.py)
        self._shape = NO_SHAPE  # the block's per-token event, once learnt
        self._kind: Any = None  # (block index, delta type) the shape is of
        self._last: Any = None  # (block index, delta type) of the last delta parsed whole
        self.done = False
        self.finished = False
        # per block index: [type, own call index | thinking text, signature | data, ...]
        self._blocks: dict[int, dict[str, Any]] = {}
        self._calls = 0
        self._usage: dict[str, int] = {}
        # runs of consecutive thinking blocks, in the order they started: the id of the
        # tool_use started before each, and its blocks (each filled in at its stop)
        self._runs: list[tuple[str | None, list[dict[str, Any]]]] = []
        self._in_run = False  # the block started last is a thinking block
        self._last_use: str | None = None  # the id of the tool_use started last
        self._thought = 0  # thinking blocks started
        self._kept = 0  # characters of thinking kept for the seal

    def decode(self, messages: list[bytes]) -> list[Delta]:
        """The deltas of a batch of raw events; stops after an error or `message_stop`."""
        out: list[Delta] = []
        shape = self._shape
        head, start = shape.head, shape.start
        for message in messages:
            if self.done:
                break
            if head and message[:start] == head:  # the per-token path: a slice, one parse
                value = fit(shape, message)
                if value is not None:
                    if value:
                        self._piece(value, out)
                    continue
            data = event_data(message)
            if data is not None:
                if self._one(data, out, message, len(message) - len(data)):
                    break
            elif any(self._one(m.data, out) for m in event_messages(message)):
                break
            if self._shape is not shape:  # it learnt (or dropped) a shape
                shape = self._shape
                head, start = shape.head, shape.start
        return out

    def _one(
        self, data: bytes | str, out: list[Delta], event: bytes | None = None, offset: int = 0
    ) -> bool:
        """One event's payload parsed whole (a delta's shape learnt from `event`, when it
        has one); True: stop (an error)."""
        try:
            obj = _loads(data)
        except orjson.JSONDecodeError:
            text = data[: _SNIPPET * 4]
            text = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
            text = excerpt(text, _SNIPPET, self._secrets)
            out.append(UpstreamError(INVALID_CHUNK, f"The backend sent malformed JSON: {text!r}"))
            self.done = True
            return True
        if obj.__class__ is dict:
            before = len(out)
            self.event(obj, out)
            if event is not None and self._lessons and obj.get("type") == "content_block_delta":
                self._learn(event, offset, obj, len(out) - before)
        if out and out[-1].__class__ is UpstreamError:
            self.done = True
            return True
        return False

    def _learn(self, event: bytes, offset: int, obj: dict[str, Any], made: int) -> None:
        """From the second delta of a kind in a block that made one delta: its shape."""
        delta = obj.get("delta")
        last = (obj.get("index"), delta.get("type") if isinstance(delta, dict) else None)
        if last != self._last:
            self._last = last
            return
        if made == 1:
            self._lessons -= 1
            shape = learn_piece(event, offset, obj)
            if shape is not None:
                self._shape, self._kind = shape, last

    def _piece(self, value: str, out: list[Delta]) -> None:
        """A sliced delta's string, as `_delta` would have read it (the shape's own kind)."""
        at, kind = self._kind
        if kind == "text_delta":
            out.append(TextDelta(value))
            return
        block = self._blocks[at]
        if kind == "thinking_delta":
            block["thinking"] += value
            out.append(ReasoningDelta(value))
        else:
            block["args"] = True
            out.append(ToolCallDelta(block["own"], arguments=value))

    def event(self, obj: dict[str, Any], out: list[Delta]) -> None:
        kind = obj.get("type")
        if kind == "content_block_delta":
            self._delta(obj, out)
        elif kind == "content_block_start":
            self._start(obj, out)
        elif kind == "content_block_stop":
            self._stop(obj, out)
        elif kind == "message_start":
            message = obj.get("message")
            if isinstance(message, dict):
                self._count(message.get("usage"))
        elif kind == "message_delta":
            self._message_delta(obj, out)
        elif kind == "message_stop":
            self.done = self.finished = True
        elif kind == "error":
            out.append(stream_error(obj, self._secrets))

    # -- content blocks -----------------------------------------------------------------

    def _start(self, obj: dict[str, Any], out: list[Delta]) -> None:
        index, block = obj.get("index"), obj.get("content_block")
        if not isinstance(index, int) or not isinstance(block, dict):
            return
        kind = block.get("type")
        if kind in _THINKING:
            self._thinking_start(index, kind, block, out)
            return
        self._in_run = False
        if kind == "text":
            text = block.get("text")
            if isinstance(text, str) and text:
                out.append(TextDelta(text))
        elif kind == "tool_use":
            own = self._calls
            self._calls += 1
            call_id = self._last_use = _str(block.get("id")) or None
            self._blocks[index] = {"type": kind, "own": own, "args": False}
            self._blocks[index]["input"] = block.get("input")
            out.append(ToolCallDelta(own, call_id, _str(block.get("name"))))

    def _thinking_start(
        self, index: int, kind: str, block: dict[str, Any], out: list[Delta]
    ) -> None:
        self._thought += 1
        if self._thought > MAX_THINKING_BLOCKS:
            out.append(_too_much(f"more than {MAX_THINKING_BLOCKS} thinking blocks"))
            return
        if not self._in_run:
            self._runs.append((self._last_use, []))
            self._in_run = True
        entry: dict[str, Any] = {}
        self._runs[-1][1].append(entry)
        if kind == "redacted_thinking":
            self._blocks[index] = {"type": kind, "entry": entry, "data": _str(block.get("data"))}
            return
        text = _str(block.get("thinking"))
        record = {"type": kind, "entry": entry, "thinking": text}
        record["signature"] = _str(block.get("signature"))
        self._blocks[index] = record
        if text:
            out.append(ReasoningDelta(text))

    def _delta(self, obj: dict[str, Any], out: list[Delta]) -> None:
        delta = obj.get("delta")
        if not isinstance(delta, dict):
            return
        kind = delta.get("type")
        if kind == "text_delta":
            text = delta.get("text")
            if isinstance(text, str) and text:
                out.append(TextDelta(text))
            return
        block = self._blocks.get(obj.get("index"))  # type: ignore[arg-type]
        if block is None:
            return
        if kind == "input_json_delta" and block["type"] == "tool_use":
            piece = delta.get("partial_json")
            if isinstance(piece, str) and piece:
                block["args"] = True
                out.append(ToolCallDelta(block["own"], arguments=piece))
        elif kind == "thinking_delta" and block["type"] == "thinking":
            text = delta.get("thinking")
            if isinstance(text, str) and text:
                block["thinking"] += text
                out.append(ReasoningDelta(text))
        elif kind == "signature_delta" and block["type"] == "thinking":
            block["signature"] += _str(delta.get("signature"))
            if len(block["signature"]) > MAX_THINKING_CHARS:
                out.append(_too_much(f"a signature over {MAX_THINKING_CHARS} characters"))

    def _stop(self, obj: dict[str, Any], out: list[Delta]) -> None:
        index = obj.get("index")
        if index == self._shape.at:  # no delta of it may follow (a late one is dropped)
            self._shape = NO_SHAPE
        block = self._blocks.pop(index, None)  # type: ignore[arg-type]
        if block is None:
            return
        kind = block["type"]
        if kind == "tool_use":
            if not block["args"]:  # an input given whole, or none
                given = block["input"] if isinstance(block["input"], dict) else {}
                if too_deep(given, MAX_ITEM_DEPTH):  # as what a client may send back
                    what = f"a call's input nested more than {MAX_ITEM_DEPTH} levels deep"
                    out.append(UpstreamError(INVALID_CHUNK, f"The backend sent {what}."))
                    return
                out.append(ToolCallDelta(block["own"], arguments=orjson.dumps(given).decode()))
            return
        entry = block["entry"]
        if kind == "redacted_thinking":
            entry.update(type=kind, data=block["data"])
        elif block["signature"]:  # an unsigned block (llama.cpp) holds only its text
            entry.update(type=kind, thinking=block["thinking"], signature=block["signature"])
        else:
            return
        self._kept += sum(len(v) for v in entry.values())
        if self._kept > MAX_THINKING_CHARS:
            out.append(_too_much(f"thinking blocks over {MAX_THINKING_CHARS} characters"))
            return
        runs = [ThinkingRun(after, tuple(b for b in blocks if b)) for after, blocks in self._runs]
        out.append(ReasoningBlob(thinking_blob([run for run in runs if run.blocks])))

    # -- the end ------------------------------------------------------------------------

    def _message_delta(self, obj: dict[str, Any], out: list[Delta]) -> None:
        self._count(obj.get("usage"))
        if self._usage:
            out.append(self.usage())
        delta = obj.get("delta")
        reason = delta.get("stop_reason") if isinstance(delta, dict) else None
        if isinstance(reason, str) and reason:
            self.finished = True
            finish = STOP_REASONS.get(reason, "stop")
            out.append(Finish("tool_calls" if finish == "stop" and self._calls else finish))

    def _count(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        for key in _USAGE_KEYS:
            value = usage.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                self._usage[key] = value
        details = usage.get("output_tokens_details")
        thinking = details.get("thinking_tokens") if isinstance(details, dict) else None
        if isinstance(thinking, int) and not isinstance(thinking, bool):
            self._usage["thinking_tokens"] = thinking

    def usage(self) -> Usage:
        u = self._usage
        read, write = u.get("cache_read_input_tokens", 0), u.get("cache_creation_input_tokens", 0)
        return Usage(
            input_tokens=u.get("input_tokens", 0) + read + write,
            output_tokens=u.get("output_tokens", 0),
            cached_tokens=read,
            cache_write_tokens=write,
            reasoning_tokens=u.get("thinking_tokens", 0),
        )


def _too_much(what: str) -> UpstreamError:
    return UpstreamError(THINKING_LIMIT, f"The backend sent {what} in one answer.")


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""
