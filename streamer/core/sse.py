"""Server-sent events: an incremental decoder for backend streams and the encoder for ours.

The decoder follows the WHATWG event-stream rules (`\\n`, `\\r\\n` and `\\r` line ends,
`data:` lines joined by `\\n`, comments, a leading BOM stripped, `id`/`retry` ignored)
with one leniency: `close()` dispatches an event left unterminated at end of stream,
because a backend that drops the final blank line still meant its last chunk.

It works on bytes and decodes each event's data once: line ends are ASCII, so a chunk
boundary inside a UTF-8 sequence can only fall inside a pending line, never across a
decoded one.

Decoding is linear in the bytes fed, however long a line: a pending partial line grows
in place (a bytearray) while reads without a line end arrive, and is copied out once,
when its end comes. `copied` counts the pending bytes moved, for the tests.

The framing emits one payload type, `bytes`, whichever path cut the event: `payloads` gives
each event's data (its `data:` lines joined by `\n`), undecoded; an event sent with an
`event:` name comes as a `NamedPayload` (bytes too, with the name: a decoder that reads
names looks at `.event`; `named` counts them). A read that is whole `data:` events is cut in
one C pass (the `sse` speed switch, core/speed.py); the line parser is its plain equivalent.
`feed` is the text view of the same events (`SSEMessage`), for the tools.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from itertools import groupby
from operator import itemgetter
from typing import NamedTuple

from streamer.core import speed
from streamer.core.events import Event

_BOM = b"\xef\xbb\xbf"
_DATA_PAYLOAD = re.compile(rb"data: ([^\n]*)\n\n")  # the fast path's one event shape
DEFAULT_MAX_SIZE = 16 * 1024 * 1024


class SSEMessage(NamedTuple):
    event: str | None
    data: str


class NamedPayload(bytes):
    """The data of an event sent with an `event:` field; `event` is its name."""

    event: str

    def __new__(cls, data: bytes, event: str) -> NamedPayload:
        self = super().__new__(cls, data)
        self.event = event
        return self

    def __repr__(self) -> str:
        return f"NamedPayload({bytes(self)!r}, {self.event!r})"


def message(payload: bytes) -> SSEMessage:
    """A payload as text, with its event name (None when it had none)."""
    return SSEMessage(getattr(payload, "event", None), payload.decode("utf-8", "replace"))


class SSEError(ValueError):
    """The stream broke a limit (an event or a line larger than `max_size`)."""


class SSEDecoder:
    """Feed raw bytes as they arrive; get back the events completed by each chunk."""

    __slots__ = (
        "_buf",
        "_data",
        "_data_size",
        "_event",
        "_fast",
        "_first",
        "_raw",
        "_skip_lf",
        "copied",
        "max_size",
        "named",
    )

    def __init__(self, max_size: int = DEFAULT_MAX_SIZE, *, fast: bool | None = None) -> None:
        self.max_size = max_size
        self._fast = speed.fast("sse") if fast is None else fast  # False: lines only
        self._buf = bytearray()  # the pending partial line, already free of \r
        self._data: list[bytes] = []  # data lines of the event being built
        self._data_size = 0
        self._event: bytes | None = None
        self._skip_lf = False  # the previous chunk ended in \r: a leading \n belongs to it
        self._first = True  # the next complete line is the stream's first (BOM check)
        # An unparsed tail left by the fast path: bytes, or a bytearray once it is known to
        # be one partial line (no line end), which then grows in place.
        self._raw: bytes | bytearray = b""
        self.copied = 0  # bytes of pending input copied again (linear: a few per byte fed)
        self.named = 0  # the events given as a NamedPayload so far

    def feed(self, chunk: bytes) -> list[SSEMessage]:
        """The events completed by `chunk`, as text."""
        return list(map(message, self.payloads(chunk)))

    def payloads(self, chunk: bytes) -> list[bytes]:
        """The payloads of the events completed by `chunk` (see the module's docstring).

        This is the upstream's hot path: a JSON decoder takes the bytes as they are, so
        the common event costs no decoding and no object here at all.
        """
        if not self._fast:
            return self._feed_lines(chunk)
        raw = self._raw
        if raw:
            if b"\n" not in chunk and b"\r" not in chunk:
                if raw.__class__ is bytes:
                    if b"\n" in raw:  # whole lines pend too: the general path keeps them
                        return self._feed_pending(raw, chunk)
                    raw = self._raw = bytearray(raw)  # once per line: grows in place now
                    self.copied += len(raw)
                raw += chunk
                if len(raw) > self.max_size:
                    raise SSEError(f"an event-stream line exceeded {self.max_size} bytes")
                return []
            self.copied += len(raw)
            chunk = b"".join((raw, chunk))  # the pending line ends here: copied out once
            self._raw = b""
        elif self._first and not self._buf and (len(chunk) >= 3 or not _BOM.startswith(chunk)):
            # The stream's start is here whole: strip a BOM now, so the fast path applies
            # (a start split inside the BOM takes the line path, which strips it there).
            if chunk.startswith(_BOM):
                chunk = chunk[3:]
            self._first = False
        if not (self._buf or self._data or self._skip_lf or self._first) and self._event is None:
            # The common case: nothing parsed is pending, and the chunk is whole events.
            fast = self._whole_events(chunk)
            if fast is not None:
                return fast
        out = self._feed_lines(chunk)
        if self._buf and not (self._data or self._skip_lf) and self._event is None:
            # only a partial line pends: back to the fast path, the buffer moved, not copied
            self._raw, self._buf = self._buf, bytearray()
        return out

    def _whole_events(self, chunk: bytes) -> list[bytes] | None:
        """`chunk` (nothing pending before it) as whole `data:` events, each ended by a blank
        line, their payloads raw: two regex passes in C instead of a loop per line; the
        unparsed tail waits, raw, for the next chunk. None: the block is not only that."""
        cut = chunk.rfind(b"\n\n") + 2
        if cut > 1 and len(chunk) - cut <= self.max_size and b"\r" not in chunk:
            payloads: list[bytes] = _DATA_PAYLOAD.findall(chunk, 0, cut)
            # Every match is `data: ` + payload + `\n\n`: if they add up to the whole
            # block, nothing else was in it (findall skips what does not match).
            if sum(map(len, payloads)) + 8 * len(payloads) == cut:
                self._raw = chunk[cut:]
                return payloads
        return None

    def _feed_pending(self, raw: bytes, chunk: bytes) -> list[bytes]:
        """A raw tail holding whole lines: parse it now, so it pends as parser state."""
        self._raw = b""
        return [*self._feed_lines(raw), *self._feed_lines(chunk)]

    def _feed_lines(self, chunk: bytes) -> list[bytes]:
        """The general path: every line end and field kind, state kept across chunks."""
        if self._skip_lf and chunk:
            self._skip_lf = False
            if chunk[0] == 10:
                chunk = chunk[1:]
        if not chunk:
            return []
        if b"\r" in chunk:  # slow path: normalise every line end to \n
            self._skip_lf = chunk[-1] == 13
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        end = chunk.rfind(b"\n")
        if end < 0:
            self._buf += chunk
            if len(self._buf) > self.max_size:
                raise SSEError(f"an event-stream line exceeded {self.max_size} bytes")
            return []
        if self._buf:
            self.copied += len(self._buf)
            self._buf += chunk[:end]
            block = bytes(self._buf)
            self._buf.clear()
        else:
            block = chunk[:end]
        if end + 1 < len(chunk):
            self._buf += chunk[end + 1 :]
        return self._lines(block.split(b"\n"))

    def close(self) -> list[bytes]:
        """End of stream: finish the pending line and dispatch an unterminated event (its
        payload, as `payloads` gives them)."""
        out = []
        if self._raw:
            raw, self._raw = self._raw, b""
            out = self._feed_lines(bytes(raw))
        return out + self._close_lines()

    def _close_lines(self) -> list[bytes]:
        lines = [bytes(self._buf)] if self._buf else []
        self._buf.clear()
        self._skip_lf = False
        return self._lines([*lines, b""])

    def _lines(self, lines: list[bytes]) -> list[bytes]:
        out: list[bytes] = []
        if self._first and lines:
            self._first = False
            if lines[0].startswith(_BOM):
                lines[0] = lines[0][3:]
        data = self._data
        for line in lines:
            if not line:
                if data:
                    out.append(self._payload(self._event, data))
                    data.clear()
                    self._data_size = 0
                self._event = None
                continue
            if line.startswith(b"data:"):
                value = line[6:] if line[5:6] == b" " else line[5:]
            elif line[0] == 58:  # ":" comment
                continue
            else:
                name, colon, value = line.partition(b":")
                if colon and value[:1] == b" ":
                    value = value[1:]
                if name != b"data":
                    if name == b"event":
                        self._event = value
                    continue  # id, retry and unknown fields are ignored
            data.append(value)
            self._data_size += len(value) + 1
            if self._data_size > self.max_size:
                raise SSEError(f"an event-stream event exceeded {self.max_size} bytes")
        return out

    def _payload(self, event: bytes | None, data: list[bytes]) -> bytes:
        """One parsed event's payload: its data, named if it had a name."""
        raw = data[0] if len(data) == 1 else b"\n".join(data)
        if event:
            self.named += 1
            return NamedPayload(raw, event.decode("utf-8", "replace"))
        return raw


_prefixes: dict[str, bytes] = {}
_type, _data = itemgetter(0), itemgetter(1)  # an Event's fields, read in C


def _prefix(type_: str) -> bytes:
    prefix = _prefixes.get(type_)
    if prefix is None:
        prefix = b"event: " + type_.encode() + b"\ndata: "
        if len(_prefixes) < 1024:  # event types are a small closed set; never grow unbounded
            _prefixes[type_] = prefix
    return prefix


def encode(event: Event) -> bytes:
    """One event as `event: <type>\\ndata: <json>\\n\\n` (the JSON is already one line)."""
    return _prefix(event.type) + event.data + b"\n\n"


def encode_many(events: Iterable[Event]) -> bytes:
    """Several events as one buffer, for a single write per backend read.

    Consecutive events of one type (a read's deltas) are joined in one C pass, with their
    `event:` line as the separator: 4x less than three appends an event (bench_pipeline).
    The `encode` speed switch (core/speed.py); `encode_each` is its plain equivalent."""
    if not speed.fast("encode"):
        return encode_each(events)
    parts: list[bytes] = []
    append = parts.append
    for type_, group in groupby(events, _type):
        prefix = _prefix(type_)
        append(prefix)
        append((b"\n\n" + prefix).join(map(_data, group)))
        append(b"\n\n")
    return b"".join(parts)


def encode_each(events: Iterable[Event]) -> bytes:
    """`encode_many`, event by event: the reference it is tested against."""
    return b"".join(map(encode, events))
