"""One Chat Completions stream's body bytes -> batches of deltas, and its end (pure).

`ChatDecoder` is the state machine the I/O shell drives: it frames the body as SSE, hands
the payloads to `ChatChunkDecoder` in batches (the first text leaves before a long read is
decoded whole) and says what the end of the body means (`EndCause`). The `/v1/responses`
decoder is the same machine over another payload decoder.
"""

from __future__ import annotations

from enum import Enum
from typing import Protocol

import orjson

from streamer.core import speed
from streamer.core.deltas import Delta, UpstreamError
from streamer.core.sse import SSEDecoder, SSEError
from streamer.upstream.chat.decoder import INVALID_CHUNK, ChatChunkDecoder, decode_completion

INVALID_ENCODING = "invalid_upstream_encoding"  # a compressed stream that stops decoding
FIRST_BATCH, MAX_BATCH = 4, 256  # events decoded per batch: the first few, then up to 256
# A read holding no more events than this is decoded whole: a short answer then leaves in
# one batch, one write (a first batch of 4 would only add a write and a pass of the loop).
WHOLE_READ = 16


class PayloadDecoder(Protocol):
    """What `ChatDecoder` hands the framed payloads to: `ChatChunkDecoder`, or the
    `/v1/responses` events' decoder. `done`: the stream's end marker came; `finished`: the
    answer is whole (a finish reason, or a terminal event)."""

    done: bool
    finished: bool

    def decode(self, messages: list[bytes]) -> list[Delta]: ...


class EndCause(Enum):
    """How a backend's body ended, as the I/O shell saw it."""

    CLEAN = "clean"  # its framing ended (a read returned b"")
    EOF = "eof"  # the connection closed before the body's end
    RESET = "reset"  # the connection broke (reset, or any other socket error)
    TIMEOUT = "timeout"  # nothing came for the idle timeout
    INVALID = "invalid"  # the HTTP framing broke (`detail` says how)
    UNDECODABLE = "undecodable"  # the content coding broke (`detail` says how)


_CLOSED_EARLY = ("server_error", "The backend closed the stream before it finished.")


class ChatDecoder:
    """One Chat Completions stream's body bytes -> batches of deltas, and its end (sans-I/O).

    `feed(data)` gives the deltas of the first few events `data` completes, so the first text
    leaves before a long read is decoded whole; the rest waits (`pending`) for `take()`, up to
    `MAX_BATCH` events each. `end(cause)` says what the end of the body means: nothing more
    when the answer was whole (`[DONE]`, or a finish reason and no `[DONE]`), else an
    `UpstreamError`. `ended`: no more deltas will come; `failed`: that was an error (the
    connection must be cut); `done`: `[DONE]` came (the rest of the body is only drained).
    """

    __slots__ = (
        "_at",
        "_backlog",
        "_batch",
        "_chat",
        "_fed",
        "_secrets",
        "_sse",
        "broken",
        "ended",
        "failed",
        "first_byte_timeout",
        "idle_timeout",
    )

    def __init__(
        self,
        idle_timeout: float = 300,
        first_byte_timeout: float | None = None,
        secrets: tuple[str, ...] = (),
    ) -> None:
        self._secrets = secrets  # the payload decoder takes them out of the backend's errors
        self._sse = self._framing()
        self._chat = self._payloads()
        self._backlog: list[bytes] = []  # events not decoded yet, from `_at` on
        self._at = 0
        self._batch = FIRST_BATCH
        self.ended = False
        self.failed = False
        self.broken = False  # ended without a whole answer: cut short, or its framing broke
        self.idle_timeout = idle_timeout
        self.first_byte_timeout = idle_timeout if first_byte_timeout is None else first_byte_timeout
        self._fed = False  # a body byte came: from then on the idle timeout is the one

    def _framing(self) -> SSEDecoder:
        """The body's SSE framing (a subclass gives its own)."""
        return SSEDecoder()

    def _payloads(self) -> PayloadDecoder:
        """The framed payloads' decoder (a subclass gives its own)."""
        return ChatChunkDecoder(runs=speed.fast("runs"), secrets=self._secrets)

    @property
    def done(self) -> bool:
        return self._chat.done

    @property
    def pending(self) -> bool:
        """Events are waiting for `take()`."""
        return self._at < len(self._backlog)

    def feed(self, data: bytes) -> list[Delta]:
        """The first batch of the deltas that `data` completes."""
        if self.ended:
            return []
        self._fed = True
        try:
            messages = self._sse.payloads(data)
        except SSEError as exc:
            return self._fail(
                [], INVALID_CHUNK, f"The backend broke the event-stream framing: {exc}."
            )
        if self.pending:  # not in the shell, which reads only once all is taken
            self._backlog = self._backlog[self._at :] + messages
        else:
            self._backlog = messages
        self._at = 0
        return self.take()

    def take(self) -> list[Delta]:
        """The next batch of waiting events' deltas (none when nothing waits)."""
        at, size = self._at, self._batch
        if len(self._backlog) - at <= WHOLE_READ:
            size = WHOLE_READ
        messages = self._backlog[at : at + size]
        self._at = at + size  # an index, not a shorter copy: a long backlog is taken in O(n)
        self._batch = MAX_BATCH
        return self._decoded(messages) if messages else []

    def end(self, cause: EndCause, detail: str = "") -> list[Delta]:
        """The body ended: the deltas still owed, ending in an `UpstreamError` if it was cut."""
        if self.ended:
            return []
        out: list[Delta] = []
        if self.pending:
            out = self._decoded(self._backlog[self._at :])
        if cause is EndCause.CLEAN and not self.ended:
            try:  # an event left unterminated at the end still counts (see sse.close)
                rest = self._sse.close()
            except SSEError as exc:
                message = f"The backend broke the event-stream framing: {exc}."
                return self._fail(out, INVALID_CHUNK, message)
            out += self._decoded(list(rest))
        if self.ended:
            return out
        self.ended = True
        if self._chat.finished:  # complete but for [DONE]: only the epilogue is lost
            return out
        return self._fail(out, *self._cut(cause, detail))

    def _cut(self, cause: EndCause, detail: str) -> tuple[str, str]:
        if cause is EndCause.TIMEOUT:
            seconds = self.idle_timeout if self._fed else self.first_byte_timeout
            return "upstream_timeout", f"The backend sent nothing for {seconds:g} s."
        if cause is EndCause.UNDECODABLE:
            return INVALID_ENCODING, f"The backend's answer broke off: {detail}."
        if cause is EndCause.INVALID:
            return "upstream_error", f"The backend sent an invalid HTTP answer: {detail}."
        return _CLOSED_EARLY

    def _decoded(self, messages: list[bytes]) -> list[Delta]:
        if self._sse.named:  # named events: one by one from now on (ChatChunkDecoder._runs)
            self._named()
        out = self._chat.decode(messages)
        if out and out[-1].__class__ is UpstreamError:
            self._drop()
            self.ended = self.failed = True
        elif self._chat.done:  # what follows [DONE] would decode to nothing
            self._drop()
            self.ended = True
        return out

    def _named(self) -> None:
        """The stream sent a named event: its payloads are decoded one by one (runs read no
        names). The other kinds' framings name no payload."""
        chat = self._chat
        if isinstance(chat, ChatChunkDecoder):
            chat.runs = False

    def _fail(self, out: list[Delta], code: str, message: str) -> list[Delta]:
        self._drop()
        self.ended = self.failed = self.broken = True
        out.append(UpstreamError(code, message))
        return out

    def _drop(self) -> None:
        self._backlog, self._at = [], 0


def decode_body(raw: bytes | bytearray, secrets: tuple[str, ...] = ()) -> list[Delta]:
    """A whole 2xx JSON body: a completion, or an event stream mislabelled as JSON
    (`secrets`: taken out of an error it reports)."""
    try:
        return decode_completion(orjson.loads(raw), secrets)
    except orjson.JSONDecodeError:
        pass
    if raw.lstrip().startswith(b"data:"):
        decoder = ChatDecoder(secrets=secrets)
        out = decoder.feed(bytes(raw))
        while decoder.pending:
            out += decoder.take()
        out += decoder.end(EndCause.CLEAN)
        if not decoder.broken:
            return out
    return [UpstreamError(INVALID_CHUNK, "The backend sent a malformed JSON body.")]
