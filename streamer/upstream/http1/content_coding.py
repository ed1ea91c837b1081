"""`Content-Encoding` of backend bodies, decoded incrementally with bounded output (sans I/O).

The gateway asks for `Accept-Encoding: identity`, but a proxy on the way may compress
anyway. `decoder_for(header)` gives `None` for identity (the hot path is untouched), a
`BodyDecoder` for gzip, x-gzip, deflate, br and zstd (layered codings in order), or raises
`UnsupportedCoding`.

No decompression bomb: `BodyDecoder.decode(data)` returns at most `max_output` bytes per
call (br: or its one 32 KiB block, if more), whatever the input, and keeps the rest of the
work for the next call (`pending` says there is more output without new input). So what
one read of the socket can make is bounded, and the decoded bytes flow into the same
limits as an identity body. The zstd window is held to 8 MiB (RFC 9659), so a frame
cannot make the decoder allocate more.

`DecodedResponse` is the thin async shell: an `http1.Response` whose `read()` returns
decoded bytes.
"""

from __future__ import annotations

import asyncio
import zlib
from typing import TYPE_CHECKING, Protocol

import brotli

from streamer.upstream.http1.wire import ProtocolError

try:  # Python 3.14 has it in the standard library
    from compression import zstd  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - the version in use decides
    from backports import zstd

if TYPE_CHECKING:
    from streamer.upstream.http1.connection import Response

MAX_OUTPUT = 256 << 10  # decoded bytes per `decode` call at most: 8 socket reads' worth
BROTLI_BLOCK = 32 << 10  # brotli's first output block: its smallest step of output
ZSTD_WINDOW_LOG_MAX = 23  # 8 MiB, the most RFC 9659 lets an HTTP zstd frame ask for
SUPPORTED = ("gzip", "deflate", "br", "zstd")


class ContentCodingError(ProtocolError):
    """A compressed body that does not decode (corrupt, cut short, or trailing bytes)."""


class UnsupportedCoding(ContentCodingError):
    """A `Content-Encoding` this gateway cannot decode."""

    def __init__(self, coding: str) -> None:
        self.coding = coding.encode("ascii", "replace").decode()  # the backend's header
        super().__init__(
            "the backend's answer is compressed with Content-Encoding {!r}, which the gateway "
            f"cannot decode (it asks for identity; it decodes {', '.join(SUPPORTED)})",
            self.coding,
            40,
        )


class _Stage(Protocol):
    """One coding: compressed bytes fed in, at most about `limit` decoded bytes per step."""

    pending: bool  # output can be had without feeding more input

    def feed(self, data: bytes) -> None: ...

    def step(self, limit: int) -> bytes: ...

    def finish(self) -> None: ...


class _Zlib:
    """gzip (several members allowed) or deflate (zlib-wrapped, or raw as some servers send)."""

    __slots__ = ("_d", "_gzip", "_input", "_name", "_started", "pending")

    def __init__(self, gzip: bool) -> None:
        self._gzip = gzip
        self._name = "gzip" if gzip else "deflate"
        self._d = zlib.decompressobj(16 + zlib.MAX_WBITS) if gzip else None
        self._input = b""  # fed and not yet consumed (zlib's unconsumed tail included)
        self._started = False  # bytes of the current member went into the decompressor
        self.pending = False

    def feed(self, data: bytes) -> None:
        self._input += data
        self.pending = bool(self._input)

    def step(self, limit: int) -> bytes:
        d = self._d
        if d is None:  # deflate: zlib-wrapped (RFC 9110) or raw (what IIS sent), by header
            if len(self._input) < 2:
                self.pending = False  # one byte: wait for the next
                return b""
            b0, b1 = self._input[0], self._input[1]
            wrapped = b0 & 0x0F == 8 and (b0 << 8 | b1) % 31 == 0
            d = self._d = zlib.decompressobj(zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS)
        data, self._input = self._input, b""
        self._started = self._started or bool(data)
        try:
            out = d.decompress(data, limit)
        except zlib.error as exc:
            raise ContentCodingError(f"the {self._name} body is corrupt ({exc})") from None
        self._input = d.unconsumed_tail
        if d.eof and d.unused_data:  # another gzip member follows
            if not self._gzip:
                raise ContentCodingError("bytes after the end of the deflate body")
            self._input = d.unused_data
            self._d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            self._started = False
        # a full output may have left decoded bytes inside zlib: ask again with no input
        self.pending = bool(self._input) or (len(out) >= limit and not d.eof)
        return out

    def finish(self) -> None:
        d = self._d
        if (d is None and self._input) or (d is not None and self._started and not d.eof):
            raise ContentCodingError(f"the {self._name} body was cut short")


class _Brotli:
    __slots__ = ("_d", "_input", "_started", "pending")

    def __init__(self) -> None:
        self._d = brotli.Decompressor()
        self._input = b""  # input that waits while the decoder still has output to give
        self._started = False
        self.pending = False

    def feed(self, data: bytes) -> None:
        self._input += data
        self.pending = bool(self._input)

    def step(self, limit: int) -> bytes:
        d = self._d
        if d.is_finished() and self._input:
            raise ContentCodingError("bytes after the end of the br body")
        # brotli grows its output in blocks (32 KiB, then doubling) and stops past the limit,
        # not at it: this keeps it within `limit` (256 KiB asked: 224 KiB at most given),
        # or one 32 KiB block for limits below 64 KiB
        half = max(1, limit // 2 - BROTLI_BLOCK)
        try:
            if d.can_accept_more_data():  # else it must be called with no input (brotli's rule)
                data, self._input = self._input, b""
                self._started = self._started or bool(data)
                out = d.process(data, output_buffer_limit=half)
            else:
                out = d.process(b"", output_buffer_limit=half)
        except brotli.error as exc:
            raise ContentCodingError(f"the br body is corrupt ({exc})") from None
        # brotli may hold decoded bytes even when it accepts input: the only sign of the
        # end of its output is a call that gives none
        self.pending = bool(self._input) or (bool(out) and not d.is_finished())
        return out

    def finish(self) -> None:
        if self._started and not self._d.is_finished():
            raise ContentCodingError("the br body was cut short")


class _Zstd:
    __slots__ = ("_d", "_input", "_started", "pending")

    def __init__(self) -> None:
        self._d = self._new()
        self._input = b""
        self._started = False
        self.pending = False

    @staticmethod
    def _new() -> zstd.ZstdDecompressor:
        window = {zstd.DecompressionParameter.window_log_max: ZSTD_WINDOW_LOG_MAX}
        return zstd.ZstdDecompressor(options=window)

    def feed(self, data: bytes) -> None:
        self._input += data
        self.pending = bool(self._input)

    def step(self, limit: int) -> bytes:
        d = self._d
        if d.eof:
            if not self._input:
                return b""
            d = self._d = self._new()  # another frame follows: a body may hold several
            self._started = False
        data = b""
        if d.needs_input:  # else it still holds input of its own: drain that first
            data, self._input = self._input, b""
        self._started = self._started or bool(data)
        try:
            out = d.decompress(data, limit)
        except zstd.ZstdError as exc:
            raise ContentCodingError(f"the zstd body is corrupt ({exc})") from None
        if d.eof:
            self._input = d.unused_data + self._input
        self.pending = bool(self._input) or (not d.eof and not d.needs_input)
        return out

    def finish(self) -> None:
        if self._started and not self._d.eof:
            raise ContentCodingError("the zstd body was cut short")


def _stage(name: str) -> _Stage:
    if name in ("gzip", "x-gzip"):
        return _Zlib(gzip=True)
    if name == "deflate":
        return _Zlib(gzip=False)
    if name == "br":
        return _Brotli()
    if name == "zstd":
        return _Zstd()
    raise UnsupportedCoding(name)


class BodyDecoder:
    """Decodes one body through its codings (the last one applied is undone first)."""

    __slots__ = ("_stages", "max_output", "name")

    def __init__(self, codings: list[str], max_output: int = MAX_OUTPUT) -> None:
        self.name = ", ".join(codings)
        self._stages = [_stage(c) for c in reversed(codings)]
        self.max_output = max_output

    @property
    def pending(self) -> bool:
        """Decoded output can be had without new input: call `decode(b"")`."""
        return any(s.pending for s in self._stages)

    def decode(self, data: bytes) -> bytes:
        """Compressed bytes (b"" for pending output) -> at most `max_output` decoded bytes.

        Feed new bytes only when not `pending`: then nothing holds more than one read's
        input, and each stage only takes more once it has given out what it had.
        """
        if data:
            self._stages[0].feed(data)
        return self._pull(len(self._stages) - 1)

    def _pull(self, i: int) -> bytes:
        stage = self._stages[i]
        if i and not stage.pending:
            stage.feed(self._pull(i - 1))
        return stage.step(self.max_output)

    def finish(self) -> None:
        """At the end of the body: raises if a coding's stream was cut short."""
        for stage in self._stages:
            if stage.pending:
                raise ContentCodingError("the body ended with decoded output still pending")
            stage.finish()


def decoder_for(content_encoding: str | None, max_output: int = MAX_OUTPUT) -> BodyDecoder | None:
    """The decoder for a `Content-Encoding` header value; None when it is identity."""
    if not content_encoding:
        return None
    codings = [c.strip().lower() for c in content_encoding.split(",")]
    codings = [c for c in codings if c and c != "identity"]
    return BodyDecoder(codings, max_output) if codings else None


class DecodedResponse:
    """An `http1.Response` whose body is read decoded: `read()` gives at most `max_output`
    decoded bytes, and takes from the socket only when the decoder has nothing pending."""

    __slots__ = ("_decoder", "_ended", "_resp", "content_type", "headers", "reason", "status")

    def __init__(self, resp: Response, decoder: BodyDecoder) -> None:
        self._resp = resp
        self._decoder = decoder
        self._ended = False
        self.status, self.reason, self.headers = resp.status, resp.reason, resp.headers
        self.content_type = resp.content_type

    @property
    def coding(self) -> str:
        return self._decoder.name

    @property
    def complete(self) -> bool:
        return self._resp.complete and not self._decoder.pending

    @property
    def buffered(self) -> bool:
        return self._decoder.pending or self._resp.buffered

    @property
    def transport(self) -> asyncio.Transport | None:
        return self._resp.transport

    async def read(self) -> bytes:
        """Decoded body bytes, waiting for some; b"" at the end (raises `ContentCodingError`)."""
        decoder = self._decoder
        while True:
            if decoder.pending:
                out = decoder.decode(b"")
            else:
                data = await self._resp.read()
                if not data:
                    if not self._ended:
                        self._ended = True
                        decoder.finish()
                    return b""
                out = decoder.decode(data)
            if out:
                return out

    async def read_all(self, limit: int) -> bytes:
        """The decoded body up to `limit` bytes (no more is decoded)."""
        parts: list[bytes] = []
        size = 0
        while size < limit:
            data = await self.read()
            if not data:
                break
            parts.append(data if size + len(data) <= limit else data[: limit - size])
            size += len(parts[-1])
        return b"".join(parts)  # one copy: the pieces and the whole, never more

    def release(self) -> None:
        self._resp.release()

    def abort(self) -> None:
        self._resp.abort()
