"""Where a tapped stream comes from: a file, stdin, an HTTP(S) POST or a WebSocket turn.

`Source.arrivals()` yields `Arrival(t, event)` as the bytes come in, so `--follow` can print
live. The format is detected from the content, not the file name:

- Responses SSE (`event:`/`data:` lines): each `data:` payload is an event dict;
- JSON lines: a WebSocket frame log (one event per line), or a `streamer serve --tap-dir`
  recording (objects with a `kind`; the `client_event` ones are the events);
- a backend kind's SSE that is not Responses events (Chat Completions: `data:` chunks with
  `choices`, `[DONE]`): model deltas through the kind's tap decoder (its row's `tap`,
  streamer/upstream/kind.py), the way the gateway sees its backend.

A frame that is not JSON is yielded as its text, so the checker can report it in place.
"""

from __future__ import annotations

import asyncio
import os
import stat
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import aiohttp
import orjson
import websockets
from websockets.asyncio.client import connect as ws_connect

from streamer.core.events import STREAM_END_TYPES
from streamer.core.sse import SSEDecoder, SSEError
from streamer.core.sse import message as sse_message
from streamer.upstream.kind import TapDecoder, TapReading
from streamer.upstream.kinds import KINDS

RESPONSES_SSE = "responses-sse"
WEBSOCKET_LOG = "websocket-log"
RECORDING = "tap-recording"
TAP_READINGS: tuple[TapReading, ...] = tuple(k.tap for k in KINDS.values() if k.tap is not None)
DELTA_FORMATS = frozenset(reading.format for reading in TAP_READINGS)
"""The formats read as model deltas (a backend kind's own stream), not as events."""
CHUNK = 64 * 1024
SSE_FIELDS = (b"event:", b"data:", b":", b"id:", b"retry:")


class SourceError(Exception):
    """The source cannot be read at all (exit status 2)."""


@dataclass(frozen=True, slots=True)
class ChatDone:
    """The `data: [DONE]` sentinel of a Chat Completions stream."""


class Arrival(NamedTuple):
    t: float  # seconds since the source was opened (a recording: since its first record)
    event: Any  # an event dict, a malformed frame's text, or (chat) a Delta / ChatDone


class _Decoder:
    """Bytes in, arrivals out; the format is fixed by the first bytes (and first message)."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.pending = b""
        self.mode: str | None = None  # "sse" or "jsonl"
        self.sse = SSEDecoder()
        self.chat: TapDecoder | None = None  # a backend kind's stream (not Responses events)
        self.t0: float | None = None  # a recording's first timestamp

    def feed(self, chunk: bytes, t: float) -> list[Arrival]:
        if self.mode is None:
            self.pending += chunk
            head = self.pending.lstrip(b"\xef\xbb\xbf \t\r\n")
            if not head or (len(head) < 6 and chunk):
                return []  # wait for enough bytes to tell
            if head.startswith(b"{"):
                self.mode = "jsonl"
            elif head.startswith(SSE_FIELDS):
                self.mode = "sse"
            else:
                raise SourceError(f"not an SSE stream or JSON lines: {head[:40]!r}")
            chunk, self.pending = self.pending, b""
        if self.mode == "sse":
            try:
                messages = (
                    self.sse.feed(chunk) if chunk else list(map(sse_message, self.sse.close()))
                )
            except SSEError as err:
                raise SourceError(str(err)) from err
            return [a for m in messages for a in self._sse_message(m.event, m.data, t)]
        self.pending += chunk
        lines = self.pending.split(b"\n")
        self.pending = lines.pop() if chunk else b""
        return [a for line in lines if line.strip() for a in self._line(line, t)]

    def close(self, t: float) -> list[Arrival]:
        """End of input: flush, deciding the format of a short stream on what there is."""
        return self.feed(b"", t) if self.mode or self.pending.strip() else []

    def _sse_message(self, name: str | None, data: str, t: float) -> list[Arrival]:
        source = self.source
        if source.format is None:
            source.format = RESPONSES_SSE
            for reading in TAP_READINGS:
                if reading.looks_like(data):
                    source.format, self.chat = reading.format, reading.decoder()
                    break
        if self.chat is not None:
            deltas: list[Any] = list(self.chat.feed(data, name))
            if self.chat.done and not deltas:
                deltas = [ChatDone()]
            return [Arrival(t, d) for d in deltas]
        return [Arrival(t, _parse(data))]

    def _line(self, line: bytes, t: float) -> list[Arrival]:
        obj = _parse(line)
        source = self.source
        if source.format is None:
            recording = isinstance(obj, dict) and "kind" in obj and "type" not in obj
            source.format = RECORDING if recording else WEBSOCKET_LOG
            source.timed = source.timed or recording
        if source.format != RECORDING:
            return [Arrival(t, obj)]
        if not isinstance(obj, dict):
            return [Arrival(t, obj)]
        stamp = obj.get("t")
        if isinstance(stamp, int | float):
            self.t0 = stamp if self.t0 is None else self.t0
            t = float(stamp - self.t0)
        kind = obj.get("kind")
        if kind == "client_request" and source.request is None:
            body = obj.get("body", obj.get("request"))
            source.request = body if isinstance(body, dict) else None
        if kind == "abandoned":
            source.abandoned = True
            source.note = "the client went away before the terminal event (abandoned)"
        if kind == "error":  # answered with an error instead of a stream: as the error event
            body = obj.get("body")
            error = body.get("error") if isinstance(body, dict) else body
            return [Arrival(t, {"type": "error", "status": obj.get("status"), "error": error})]
        if kind != "client_event":
            return []
        event = obj.get("event", obj.get("data"))
        return [Arrival(t, _parse(event) if isinstance(event, str | bytes) else event)]


def _parse(data: str | bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return data.decode("utf-8", "replace") if isinstance(data, bytes) else data


class Source:
    """One tap source. Construct, then iterate `arrivals()` once."""

    def __init__(
        self,
        spec: str,
        *,
        data: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        connect_timeout: float = 10.0,
    ) -> None:
        self.spec = spec
        self.data = data
        self.headers = dict(headers or {})
        self.connect_timeout = connect_timeout
        self.format: str | None = None
        self.request: dict[str, Any] | None = None  # found in a recording
        self.note: str | None = None  # a transport failure after the stream started
        self.abandoned = False  # a recording of a turn its client left before the end
        scheme = spec.split("://", 1)[0].lower() if "://" in spec else ""
        if scheme in ("http", "https"):
            self.kind = "http"
        elif scheme in ("ws", "wss"):
            self.kind = "websocket"
            self.format = WEBSOCKET_LOG
        elif scheme:
            raise SourceError(f"unsupported URL scheme {scheme!r} (use http(s):// or ws(s)://)")
        else:
            self.kind = "stdin" if spec == "-" else "file"
        self.timed = self.kind in ("http", "websocket")
        self.started = 0.0

    @property
    def session(self) -> bool:
        """Frame logs may hold several turns of one socket; a live turn is one response."""
        return self.format in (WEBSOCKET_LOG, RECORDING) and self.kind != "websocket"

    async def arrivals(self) -> AsyncIterator[Arrival]:
        self.started = time.monotonic()
        decoder = _Decoder(self)
        got_any = False
        try:
            async for chunk in self._chunks():
                now = time.monotonic() - self.started
                for arrival in decoder.feed(chunk, now):
                    got_any = True
                    yield arrival
            for arrival in decoder.close(time.monotonic() - self.started):
                yield arrival
        except SourceError:
            raise
        except (OSError, aiohttp.ClientError, websockets.WebSocketException, TimeoutError) as err:
            message = _describe(err)
            if not got_any:
                raise SourceError(f"{self.spec}: {message}") from err
            self.note = f"the stream broke off: {message}"

    async def _chunks(self) -> AsyncIterator[bytes]:
        if self.kind == "http":
            async for chunk in self._http():
                yield chunk
        elif self.kind == "websocket":
            async for chunk in self._websocket():
                yield chunk
        else:
            async for chunk in self._file():
                yield chunk

    async def _file(self) -> AsyncIterator[bytes]:
        if self.kind == "stdin":
            fileobj = sys.stdin.buffer
        else:
            try:
                fileobj = open(self.spec, "rb")  # noqa: SIM115 - closed below
            except OSError as err:
                raise SourceError(f"{self.spec}: {err.strerror or err}") from err
        try:
            mode = os.fstat(fileobj.fileno()).st_mode
            if stat.S_ISREG(mode):
                while chunk := fileobj.read(CHUNK):
                    yield chunk
                return
            # a pipe, FIFO or terminal: read as it arrives, with real timings
            self.timed = True
            loop = asyncio.get_running_loop()
            reader = asyncio.StreamReader(limit=CHUNK)
            protocol = asyncio.StreamReaderProtocol(reader)
            transport, _ = await loop.connect_read_pipe(lambda: protocol, fileobj)
            try:
                while chunk := await reader.read(CHUNK):
                    yield chunk
            finally:
                transport.close()
        finally:
            if fileobj is not sys.stdin.buffer:
                fileobj.close()

    async def _http(self) -> AsyncIterator[bytes]:
        headers = {"Accept": "text/event-stream", **self.headers}
        body = None
        if self.data is not None:
            body = orjson.dumps({"stream": True, **self.data})
            headers.setdefault("Content-Type", "application/json")
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout)
        try:
            async with (
                aiohttp.ClientSession(timeout=timeout) as session,
                session.request(
                    "POST" if body is not None else "GET", self.spec, data=body, headers=headers
                ) as response,
            ):
                if response.status >= 400:
                    text = (await response.text(errors="replace"))[:300]
                    raise SourceError(f"{self.spec}: HTTP {response.status}: {text}")
                ctype = response.headers.get("Content-Type", "")
                if (
                    "event-stream" not in ctype
                    and "json-seq" not in ctype
                    and "ndjson" not in ctype
                ):
                    text = (await response.text(errors="replace"))[:200]
                    raise SourceError(
                        f"{self.spec}: not a stream ({ctype or 'no content type'}): {text}"
                    )
                async for chunk in response.content.iter_any():
                    yield chunk
        except (aiohttp.InvalidURL, ValueError) as err:
            raise SourceError(f"bad URL {self.spec!r}: {err}") from err

    async def _websocket(self) -> AsyncIterator[bytes]:
        if self.data is None:
            raise SourceError("a WebSocket source needs --data with the response.create body")
        frame = {"type": "response.create", **self.data}
        try:
            async with ws_connect(
                self.spec,
                additional_headers=self.headers,
                open_timeout=self.connect_timeout,
                max_size=None,
                compression=None,
            ) as ws:
                await ws.send(orjson.dumps(frame).decode())
                async for message in ws:
                    raw = message.encode() if isinstance(message, str) else message
                    yield raw.strip() + b"\n"  # one frame, one line
                    event = _parse(raw)
                    kind = event.get("type") if isinstance(event, dict) else None
                    if isinstance(kind, str) and kind in STREAM_END_TYPES:
                        return
        except (websockets.InvalidURI, ValueError) as err:
            raise SourceError(f"bad URL {self.spec!r}: {err}") from err
        except websockets.InvalidStatus as err:
            status = err.response.status_code
            body = (err.response.body or b"")[:300].decode("utf-8", "replace")
            raise SourceError(
                f"{self.spec}: HTTP {status} on the WebSocket upgrade: {body}"
            ) from err


def _describe(err: BaseException) -> str:
    if isinstance(err, TimeoutError):
        return "timed out"
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    return str(err) or type(err).__name__
