"""The response side of one HTTP/1.1 connection as a sans-I/O state machine (h11 is the model).

`ResponseParser` is fed the bytes of one connection as they arrive and returns events: one
`Head` (the final status line and headers; 100-199 informational heads are skipped, a few at
most), body data as plain `bytes` (de-chunked), then `END`. It owns the framing
(Content-Length, chunked, until the close; no body after 1xx, 204, 304 or a HEAD request)
and the keep-alive decision: after `END`, `keep_alive` says whether the connection may
carry the next request. That is so only if the response was framed exactly and nothing
arrived after its end: any byte after the end, or while no request is outstanding, turns it
off for good, since such bytes could be taken for the answer to the next request.

    IDLE --start()--> HEAD --Head--> BODY --END--> DONE --start()--> HEAD ...
                         (any state) --ProtocolError--> BROKEN

Bad bytes raise `ProtocolError` (`ServerDisconnected` from `eof()` mid-response) and the
parser is then `BROKEN`, its `error` set. Events completed before the fault, in the same
bytes, are not lost: `feed` returns them, and the error is raised by the next call (check
`state` or `error` after acting on them). No I/O here: `http1.Connection` feeds the bytes
and acts on the events.
"""

from __future__ import annotations

from dataclasses import dataclass

from multidict import CIMultiDict

from streamer.upstream.http1.wire import (
    MAX_HEAD,
    ChunkedDecoder,
    ProtocolError,
    ServerDisconnected,
    body_length,
    parse_head,
)

MAX_INFORMATIONAL = 8  # 1xx heads skipped before a final one; more is a server looping

IDLE, HEAD, BODY, DONE, BROKEN = range(5)  # parser states
STATE_NAMES = ("IDLE", "HEAD", "BODY", "DONE", "BROKEN")


@dataclass(frozen=True, slots=True)
class Head:
    """The final status line and headers of a response."""

    status: int
    reason: str
    headers: CIMultiDict[str]
    http11: bool


class End:
    """The response ended (its body, if any, is complete)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "END"


END = End()
Event = Head | bytes | End


class ResponseParser:
    """The responses on one connection, one request at a time (see the module docstring)."""

    __slots__ = (
        "_chunked",
        "_left",
        "_no_body",
        "_pending",
        "error",
        "informational",
        "keep_alive",
        "state",
    )

    def __init__(self) -> None:
        self.state = IDLE
        self.keep_alive = True  # the connection may carry a(nother) request
        self.informational = 0  # 1xx heads skipped in the current response
        self.error: ProtocolError | ServerDisconnected | None = None  # why it is BROKEN
        self._pending = bytearray()  # a head split over reads
        self._left: int | None = 0  # body bytes to come; None: until the close
        self._chunked: ChunkedDecoder | None = None
        self._no_body = False

    def __repr__(self) -> str:
        return f"<ResponseParser {STATE_NAMES[self.state]} keep_alive={self.keep_alive}>"

    @property
    def reusable(self) -> bool:
        """A request may be sent now: nothing is outstanding and the connection is clean."""
        return self.keep_alive and self.state in (IDLE, DONE)

    @property
    def ended(self) -> bool:
        """The current response has been read whole."""
        return self.state == DONE

    def start(self, *, no_body: bool = False) -> None:
        """A request was sent: what follows is its response (`no_body`: it was a HEAD)."""
        if not self.reusable:
            raise RuntimeError(f"no request can be sent in {self!r}")
        self.state = HEAD
        self.informational = 0
        self._pending.clear()
        self._chunked = None
        self._no_body = no_body

    def feed(self, data: bytes) -> list[Event]:
        """The events completed by `data`, the next bytes from the server."""
        state = self.state
        if state == BROKEN and self.error is not None:
            raise self.error
        if not data:
            return []
        try:
            if state == BODY:  # first: the hot path, once per read of a long stream
                return self._body(data)
            if state == HEAD:
                return self._head(data)
        except ProtocolError as exc:
            self._break(exc)
            raise
        self.keep_alive = False  # out of turn: after the end, or with no request outstanding
        return []

    def _break(self, exc: ProtocolError | ServerDisconnected) -> None:
        self.state, self.keep_alive, self.error = BROKEN, False, exc

    def eof(self, *, clean: bool = True) -> list[Event]:
        """The server closed the connection (`clean`: not reset): the end of a body delimited
        by the close, else, mid-response, `ServerDisconnected`."""
        self.keep_alive = False
        state = self.state
        if state == BODY and self._left is None and self._chunked is None and clean:
            self.state = DONE
            return [END]
        if state in (HEAD, BODY):
            begun = state == BODY or self._pending or self.informational
            where = "in the middle of the response" if begun else "before answering"
            self._break(ServerDisconnected(f"the server closed the connection {where}"))
            raise self.error  # type: ignore[misc]
        return []

    # -- the head ----------------------------------------------------------------------------

    def _head(self, data: bytes) -> list[Event]:
        pending = self._pending
        if pending:  # accumulate in place: a head trickling in is not copied over and over
            start = max(0, len(pending) - 3)
            pending += data
            if pending.find(b"\r\n\r\n", start) < 0:
                if len(pending) > MAX_HEAD:
                    raise ProtocolError("response head too large")
                return []
            data = bytes(pending)
            pending.clear()
        while True:
            end = data.find(b"\r\n\r\n")
            if end < 0:
                if len(data) > MAX_HEAD:
                    raise ProtocolError("response head too large")
                pending += data
                return []
            if end > MAX_HEAD:
                raise ProtocolError("response head too large")
            status, reason, headers, http11 = parse_head(data[:end])
            data = data[end + 4 :]
            if status >= 200:
                break
            if status == 101:
                raise ProtocolError("unexpected protocol switch (101)")
            self.informational += 1  # 1xx: informational, the real head follows
            if self.informational > MAX_INFORMATIONAL:
                raise ProtocolError(f"more than {MAX_INFORMATIONAL} informational (1xx) heads")
        head = Head(status, reason, headers, http11)
        self._frame(head)
        events: list[Event] = [head]
        if self.state == BODY:
            if data:
                try:
                    events += self._body(data)
                except ProtocolError as exc:  # the head stands; the error comes next
                    self._break(exc)
        else:
            events.append(END)
            if data:  # bytes after a response without a body
                self.keep_alive = False
        return events

    def _frame(self, head: Head) -> None:
        """How the body is delimited, and whether the connection can be kept after it."""
        headers = head.headers
        tokens = _tokens(headers.getall("Connection", ()))
        keep = "close" not in tokens and (head.http11 or "keep-alive" in tokens)
        left = 0 if self._no_body else body_length(head.status, headers)
        if left != 0 and "Transfer-Encoding" in headers:
            _check_transfer_coding(headers)
        if left is None:
            keep = False  # delimited by the close
        elif left == -1:
            self._chunked = ChunkedDecoder()
            if "Content-Length" in headers:
                keep = False  # both framings: do not trust what may follow
        self._left = None if left is None else max(left, 0)
        self.keep_alive = self.keep_alive and keep
        self.state = DONE if left == 0 else BODY

    # -- the body ----------------------------------------------------------------------------

    def _body(self, data: bytes) -> list[Event]:
        chunked = self._chunked
        if chunked is not None:
            payload = chunked.feed(data)
            if not chunked.done:
                return [payload] if payload else []
            tail = chunked.tail
        else:
            left = self._left
            if left is None:  # until the close
                return [data]
            if len(data) < left:
                self._left = left - len(data)
                return [data]
            payload, tail = (data, b"") if len(data) == left else (data[:left], data[left:])
            self._left = 0
        self.state = DONE
        if tail:  # whatever follows the end belongs to no request of ours
            self.keep_alive = False
        return [payload, END] if payload else [END]


def _tokens(values: list[str] | tuple[()]) -> set[str]:
    return {t.strip().lower() for value in values for t in value.split(",")}


def _check_transfer_coding(headers: CIMultiDict[str]) -> None:
    """Only `chunked`, alone, is decoded here; any other transfer-coding is refused."""
    codings = [c.strip().lower() for v in headers.getall("Transfer-Encoding") for c in v.split(",")]
    codings = [c for c in codings if c]  # empty list elements are allowed and ignored
    if codings == ["chunked"]:
        return
    other = next((c for c in codings if c != "chunked"), "")
    if other:
        message = "the backend used transfer-coding {}, which this gateway does not decode"
        raise ProtocolError(message, other, 40)
    raise ProtocolError("bad transfer-encoding", ", ".join(codings), 60)
