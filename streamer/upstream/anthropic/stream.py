"""A Messages stream's body bytes -> batches of deltas, and its end (pure); a whole Message.

`MessagesDecoder` is `ChatDecoder`'s batching and end-of-body rules over decoder.py's
`MessagesEventDecoder`, with the Responses framing (`event:` + `data:` events cut whole);
`decode_message_body` reads a whole (non-streamed) Message as the deltas its stream would
have carried; `MessagesTapDecoder` is `streamer tap`'s reading of such a stream, one
payload at a time, and `looks_like_messages` how tap tells one.
"""

from __future__ import annotations

import orjson

from streamer.core.deltas import Delta, UpstreamError
from streamer.upstream.anthropic.decoder import EVENT_TYPES, MessagesEventDecoder
from streamer.upstream.anthropic.errors import error_body, stream_error
from streamer.upstream.chat.decoder import INVALID_CHUNK
from streamer.upstream.chat.stream import FIRST_BATCH, ChatDecoder
from streamer.upstream.responses.framing import EventFraming

_loads = orjson.loads


class MessagesDecoder(ChatDecoder):
    """A Message stream's body bytes -> batches of deltas, and its end (sans-I/O): the
    batches and end-of-body rules are `ChatDecoder`'s, the events `MessagesEventDecoder`'s
    (`message_stop`, or a stop reason, is the whole answer)."""

    __slots__ = ()

    def _framing(self) -> EventFraming:
        return EventFraming()

    def _payloads(self) -> MessagesEventDecoder:
        return MessagesEventDecoder(secrets=self._secrets)

    def take(self) -> list[Delta]:
        """As `ChatDecoder.take`, but the batches stay small until one has a delta: a
        Message stream opens with events that carry none (`message_start`, a block's start)."""
        first = self._batch == FIRST_BATCH
        out = super().take()
        if first and not out:
            self._batch = FIRST_BATCH
        return out


class MessagesTapDecoder:
    """`streamer tap`'s reading of a Messages stream: one event's payload at a time, into
    the deltas the gateway makes of it. `done`: `message_stop` (or an error) came."""

    __slots__ = ("_events", "done")

    def __init__(self) -> None:
        self._events = MessagesEventDecoder()
        self.done = False

    def feed(self, data: str, event: str | None = None) -> list[Delta]:
        out: list[Delta] = []
        if not self.done:
            self._events._one(data, out)
            self.done = self._events.done
        return out


def looks_like_messages(data: str) -> bool:
    """A stream's first data payload is an Anthropic Messages event (`message_start`, or a
    `ping` before it)."""
    try:
        obj = _loads(data)
    except orjson.JSONDecodeError:
        return False
    kind = obj.get("type") if isinstance(obj, dict) else None
    return kind in EVENT_TYPES and kind != "error"  # an error is any stream's: Responses' too


def decode_message_body(raw: bytes | bytearray, secrets: tuple[str, ...] = ()) -> list[Delta]:
    """A whole (non-streamed) Message, as the deltas its stream would have carried
    (`secrets`: taken out of an error it reports)."""
    try:
        body = _loads(raw)
    except orjson.JSONDecodeError:
        return [UpstreamError(INVALID_CHUNK, "The backend answered with malformed JSON.")]
    if not isinstance(body, dict):
        why = "The backend answered with a JSON value, not a Message."
        return [UpstreamError(INVALID_CHUNK, why)]
    if error_body(raw) is not None:
        return [stream_error(body, secrets)]
    decoder = MessagesEventDecoder(secrets=secrets)
    out: list[Delta] = []
    decoder.event({"type": "message_start", "message": {"usage": body.get("usage")}}, out)
    for index, block in enumerate(body.get("content") or ()):
        if not isinstance(block, dict):
            continue
        start = {**block}
        if block.get("type") == "tool_use":
            start["input"] = block.get("input") if isinstance(block.get("input"), dict) else {}
        decoder.event({"type": "content_block_start", "index": index, "content_block": start}, out)
        decoder.event({"type": "content_block_stop", "index": index}, out)
    delta = {"stop_reason": body.get("stop_reason") or "end_turn"}
    decoder.event({"type": "message_delta", "delta": delta, "usage": body.get("usage")}, out)
    decoder.event({"type": "message_stop"}, out)
    return out
