"""A Responses stream's event-stream framing: raw events, not parsed lines (pure).

A Responses backend sends every event as `event: <type>` + `data: <json>` + a blank line.
`SSEDecoder`'s fast path takes only `data:`-only events, so each of these would go through
its line-by-line path. Here a read that is whole events (nothing pending, no `\\r`) is cut
at its blank lines into raw events, one `bytes` each (its lines, without the blank line),
in one C call; the event decoder reads the common layouts itself (`event_data`) and hands
any other to `event_messages`, the plain decoder's rules. Anything else (a partial line
pending, `\\r` line ends, a stream's first bytes split inside a BOM, or the `sse` speed
switch off: core/speed.py) takes `SSEDecoder`'s line parser, whose events come out in the
same raw form (`event: T` if named, then a `data: ` line per data line): one payload type,
`bytes`, whichever path cut the event. The decoder reads the type from the JSON.
"""

from __future__ import annotations

from streamer.core.sse import SSEDecoder, SSEMessage


class EventFraming(SSEDecoder):
    """`payloads(chunk)` gives raw events (`bytes`, each its lines); `close()` as before."""

    __slots__ = ()

    def _whole_events(self, chunk: bytes) -> list[bytes] | None:
        """A block of whole events cut at its blank lines in one split, each event raw
        (`event_data` / `event_messages` read them); the tail waits for the next chunk."""
        cut = chunk.rfind(b"\n\n")
        if cut >= 0 and len(chunk) - cut - 2 <= self.max_size and b"\r" not in chunk:
            self._raw = chunk[cut + 2 :]
            return chunk[:cut].split(b"\n\n")
        return None

    def _payload(self, event: bytes | None, data: list[bytes]) -> bytes:
        """A parsed event as the raw event the fast path would have cut for it."""
        raw = b"data: " + b"\ndata: ".join(data)
        return b"event: " + event + b"\n" + raw if event else raw


def event_data(event: bytes) -> bytes | None:
    """The `data:` payload of a raw event laid out as `data: P` or `event: T` + `data: P`
    (the type is in P too); None for any other layout (comments, several data lines)."""
    if event.startswith(b"event: "):
        end = event.find(b"\n")
        if end > 0 and event.startswith(b"data: ", end + 1) and event.find(b"\n", end + 1) < 0:
            return event[end + 7 :]
        return None
    if event.startswith(b"data: ") and b"\n" not in event:
        return event[6:]
    return None


def event_messages(event: bytes) -> list[SSEMessage]:
    """A raw event in any layout, by the plain decoder's rules (no event, or one). Its size
    was bounded by the framing that cut it."""
    decoder = SSEDecoder(max_size=len(event) + 2)
    decoder._first = False  # the stream's BOM was stripped at its start
    return decoder.feed(event + b"\n\n")
