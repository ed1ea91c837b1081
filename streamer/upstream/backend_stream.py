"""A backend's 2xx answer as batches of deltas, whatever its kind (I/O only).

`BackendStream` reads the body and feeds the kind's sans-I/O `StreamDecoder` (Chat
Completions chunks, Responses events, ...); the decoding, the batch sizes and what the end
of the body means are the decoder's. It lets go of the connection: kept once the body is
read whole, cut on a failure.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import TracebackType

from streamer.core.batch import Batch
from streamer.core.deltas import Delta
from streamer.upstream.chat.stream import EndCause
from streamer.upstream.http1.connection import Response
from streamer.upstream.http1.content_coding import ContentCodingError, DecodedResponse
from streamer.upstream.http1.wire import HTTPClientError, ProtocolError, ServerDisconnected
from streamer.upstream.kind import StreamDecoder

_DRAIN_LIMIT = 1 << 16  # bytes read after [DONE] to reach EOF and keep the connection
_DRAIN_TIMEOUT = 0.1  # the end of the body follows [DONE] at once; never hold the caller longer


class _Whole:
    """The decoder of an answer decoded whole already (`BackendStream.answered`)."""

    __slots__ = ("ended", "failed")
    pending = False

    def __init__(self) -> None:
        self.ended, self.failed = True, False

    def feed(self, data: bytes) -> list[Delta]:
        return []

    def take(self) -> list[Delta]:
        return []

    def end(self, cause: EndCause, detail: str = "") -> list[Delta]:
        return []


class BackendStream:
    """A 2xx answer's deltas: `first`, the batch that came with the head (None if nothing
    did), then, iterated, one `Batch` per network read that completed something.

    The decoding, the batch sizes and what the end of the body means are the kind's
    decoder's; this shell only reads, feeds, and lets go of the connection: kept once the body is read
    whole, cut on a failure. A failure mid-stream (the backend closing early, an idle gap
    longer than `idle_timeout`, an error payload, malformed JSON) is the last batch, ending
    in `UpstreamError`.
    """

    def __init__(
        self,
        response: Response | DecodedResponse | None,
        decoder: StreamDecoder,
        *,
        on_raw: Callable[[bytes], None] | None = None,
        first: Batch | None = None,
        secrets: tuple[str, ...] = (),
    ) -> None:
        self._resp = response
        self._on_raw = on_raw
        self._decoder = decoder
        self._secrets = secrets  # out of the bytes a protocol error quotes
        self.first = first

    @classmethod
    async def reading(
        cls,
        response: Response | DecodedResponse,
        decoder: StreamDecoder,
        *,
        on_raw: Callable[[bytes], None] | None = None,
        secrets: tuple[str, ...] = (),
    ) -> BackendStream:
        """The stream of an event-stream answer read by `decoder`, its first batch decoded
        if its first bytes came with the head (that read does not wait)."""
        stream = cls(response, decoder, on_raw=on_raw, secrets=secrets)
        if response.buffered:
            deltas = await stream._read(response)
            decoder = stream._decoder
            if deltas or (decoder.ended and not decoder.pending):
                stream.first = stream._batch(deltas)
        return stream

    @classmethod
    def answered(cls, deltas: list[Delta]) -> BackendStream:
        """A whole (JSON) answer, decoded already: all of it is the first batch."""
        return cls(None, _Whole(), first=Batch(deltas, end=True))

    def __aiter__(self) -> BackendStream:
        return self

    async def __anext__(self) -> Batch:
        decoder = self._decoder
        while True:
            resp = self._resp
            if decoder.pending:
                deltas = decoder.take()
            elif resp is None:
                raise StopAsyncIteration
            elif decoder.ended:  # [DONE] came before the end of the body: read that too
                await self._drain()
                raise StopAsyncIteration
            else:
                deltas = await self._read(resp)
            if deltas:
                return self._batch(deltas)
            if decoder.ended and not decoder.pending and self._resp is None:
                raise StopAsyncIteration

    async def _read(self, resp: Response | DecodedResponse) -> list[Delta]:
        """One read, fed to the decoder; the end of the body, or its failure, ended there."""
        decoder = self._decoder
        detail = ""
        try:
            chunk = await resp.read()
        except asyncio.CancelledError:
            self._abort()
            raise
        except TimeoutError:
            cause = EndCause.TIMEOUT
        except ContentCodingError as exc:  # before ProtocolError: it is one
            cause, detail = EndCause.UNDECODABLE, exc.shown(self._secrets)
        except ProtocolError as exc:
            cause, detail = EndCause.INVALID, exc.shown(self._secrets)
        except ServerDisconnected:
            cause = EndCause.EOF
        except (HTTPClientError, OSError):
            cause = EndCause.RESET
        else:
            if chunk:
                if self._on_raw is not None:
                    self._on_raw(chunk)
                return decoder.feed(chunk)
            cause = EndCause.CLEAN
        deltas = decoder.end(cause, detail)
        if cause is EndCause.CLEAN and not decoder.failed:
            self._release()
        else:
            self._abort()
        return deltas

    def _batch(self, deltas: list[Delta]) -> Batch:
        """`deltas` as a batch, the last one if the decoder has ended and the body is in."""
        decoder = self._decoder
        if not decoder.ended or decoder.pending:
            return Batch(deltas)
        if decoder.failed:
            self._abort()
        elif self._resp is not None and not self._resp.complete:
            return Batch(deltas)  # [DONE] before the end of the body: the next call drains it
        self._release()
        return Batch(deltas, end=True)

    async def aclose(self) -> None:
        """Let go of the backend now: keep the connection if the stream is complete, else cut it."""
        self._decoder.ended = True
        self._release()

    async def __aenter__(self) -> BackendStream:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def _release(self) -> None:
        resp, self._resp = self._resp, None
        if resp is not None:
            resp.release()  # kept if the whole body is in, else cut

    def _abort(self) -> None:
        resp, self._resp = self._resp, None
        if resp is not None:
            resp.abort()

    async def _drain(self) -> None:
        """After [DONE]: read the (normally already there) end of the body, to reuse the connection."""
        resp, self._resp = self._resp, None
        if resp is None:
            return
        seen = 0
        try:
            if not resp.complete:
                async with asyncio.timeout(_DRAIN_TIMEOUT):
                    while seen <= _DRAIN_LIMIT and (chunk := await resp.read()):
                        seen += len(chunk)
        except (TimeoutError, HTTPClientError, OSError):
            pass
        except asyncio.CancelledError:
            resp.abort()
            raise
        resp.release()  # kept if the whole body is in, else cut
