"""A raw HTTP/1.1 client for tests that need what a library would hide: exact heads,
pipelines in one write, answers read one by one, and whether the server closed.

`compared` is what a client sees of an answer with ids and clocks aside: two servers that
answer alike give equal `compared` values.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
from collections.abc import AsyncIterator
from typing import Any

import orjson
from builders import parse_sse
from multidict import CIMultiDict

from streamer.upstream.http1.wire import ChunkedDecoder, body_length

DEADLINE = 10.0  # no answer in these tests takes longer: a server that stays silent fails


def post(
    body: bytes | dict[str, Any],
    *headers: str,
    path: str = "/v1/responses",
    content_type: str | None = "application/json",
    host: bool = True,
) -> bytes:
    """A whole POST: Host, the given fields, Content-Length and Content-Type, the body."""
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    fields = [*(["Host: test"] if host else []), *headers, f"Content-Length: {len(raw)}"]
    if content_type is not None:
        fields.append(f"Content-Type: {content_type}")
    head = f"POST {path} HTTP/1.1\r\n" + "".join(f + "\r\n" for f in fields) + "\r\n"
    return head.encode("latin-1") + raw


def parse_head(head: bytes) -> tuple[bytes, int, CIMultiDict[str]]:
    """An answer's status line and fields, taken as they come (even `HTTP/2.0 200`)."""
    lines = head.split(b"\r\n")
    version, status, *_ = lines[0].split(b" ", 2)
    headers: CIMultiDict[str] = CIMultiDict()
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers.add(name.decode("latin-1"), value.strip(b" \t").decode("latin-1"))
    return version, int(status), headers


class Answer:
    def __init__(
        self, status: int, headers: CIMultiDict[str], body: bytes, version: bytes = b"HTTP/1.1"
    ) -> None:
        self.status, self.headers, self.body, self.version = status, headers, body, version

    def events(self) -> list[dict[str, Any]]:
        return parse_sse(self.body)

    def error(self) -> dict[str, Any]:
        error: dict[str, Any] = orjson.loads(self.body)["error"]
        return error

    def __repr__(self) -> str:
        return f"Answer({self.status}, {self.body[:120]!r})"


async def read_answer(reader: asyncio.StreamReader) -> Answer:
    head = await reader.readuntil(b"\r\n\r\n")
    version, status, headers = parse_head(head[:-4])
    length = body_length(status, headers)
    if length is None:
        return Answer(status, headers, await reader.read(), version)
    if length >= 0:
        return Answer(status, headers, await reader.readexactly(length), version)
    parts = []  # chunk by chunk: what follows the last one is the next answer's
    while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
        parts.append(await reader.readexactly(size))
        assert await reader.readexactly(2) == b"\r\n"
    while await reader.readuntil(b"\r\n") != b"\r\n":
        pass  # trailers
    return Answer(status, headers, b"".join(parts), version)


def address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split("/")[0].split(":")
    return host, int(port)


@contextlib.asynccontextmanager
async def connect(url: str) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    reader, writer = await asyncio.open_connection(*address(url), limit=1 << 24)
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def answers_until_closed(
    reader: asyncio.StreamReader, most: int
) -> tuple[list[Answer], bool]:
    """Answers until `most` came or the server closed: (answers, closed)."""
    answers: list[Answer] = []
    async with asyncio.timeout(DEADLINE):
        while len(answers) < most:
            try:
                answers.append(await read_answer(reader))
            except (asyncio.IncompleteReadError, ConnectionError):
                return answers, True
    return answers, False


async def exchange(url: str, *requests: bytes) -> list[Answer]:
    """The requests pipelined in one write on one connection; their answers in order."""
    async with connect(url) as (reader, writer):
        writer.write(b"".join(requests))
        await writer.drain()
        async with asyncio.timeout(DEADLINE):
            return [await read_answer(reader) for _ in requests]


async def pipeline(url: str, raw: bytes, most: int) -> tuple[list[Answer], bool]:
    """`raw` in one write; up to `most` answers, and whether the server then closed."""
    async with connect(url) as (reader, writer):
        writer.write(raw)
        await writer.drain()
        return await answers_until_closed(reader, most)


_IDS = re.compile(r'"((?:resp|msg|fc|rs|req|call|ws|cmp)_[0-9a-zA-Z]{16,})"')
_TIMES = re.compile(r'"(created_at|completed_at)":\d+')
_SEALED = re.compile(r'"encrypted_content":"[^"]*"')  # sealed with a key of each process
SEEN_HEADERS = (
    "Content-Type",
    "Cache-Control",
    "X-Accel-Buffering",
    "Transfer-Encoding",
    "Connection",
    "Server",
    "Allow",
    "Retry-After",
)


def normal(value: Any) -> Any:
    text = orjson.dumps(value).decode()
    text = _SEALED.sub('"encrypted_content":"SEALED"', _IDS.sub('"ID"', text))
    return orjson.loads(_TIMES.sub(r'"\1":0', text))


def compared(answer: Answer) -> dict[str, Any]:
    """What a client sees of an answer, ids and clocks aside."""
    headers: dict[str, Any] = {name: answer.headers.get(name) for name in SEEN_HEADERS}
    headers["has-length"] = "Content-Length" in answer.headers
    headers["has-id"] = bool(answer.headers.get("X-Request-Id"))
    ctype = answer.headers.get("Content-Type", "")
    body: Any
    if ctype.startswith("text/event-stream"):
        body = [normal(e) for e in answer.events()]
    elif ctype.startswith("application/json") and answer.body:
        body = normal(orjson.loads(answer.body))
    else:
        body = answer.body  # aiohttp's own plain-text 400s
    return {"version": answer.version, "status": answer.status, "headers": headers, "body": body}


class _Buffered:
    """A blocking socket read through a buffer, for `sync_pipeline`."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buf = sock, bytearray()

    def _more(self) -> None:
        data = self.sock.recv(1 << 16)
        if not data:
            raise EOFError
        self.buf += data

    def until(self, mark: bytes) -> bytes:
        while (at := self.buf.find(mark)) < 0:
            self._more()
        out = bytes(self.buf[: at + len(mark)])
        del self.buf[: at + len(mark)]
        return out

    def exactly(self, size: int) -> bytes:
        while len(self.buf) < size:
            self._more()
        out = bytes(self.buf[:size])
        del self.buf[:size]
        return out

    def rest(self) -> bytes:
        with contextlib.suppress(EOFError):
            while True:
                self._more()
        return bytes(self.buf)

    def answer(self) -> Answer:
        head = self.until(b"\r\n\r\n")
        version, status, headers = parse_head(head[:-4])
        length = body_length(status, headers)
        if length is None:
            return Answer(status, headers, self.rest(), version)
        if length >= 0:
            return Answer(status, headers, self.exactly(length), version)
        decoder, parts = ChunkedDecoder(), []
        while not decoder.done:
            if not self.buf:
                self._more()
            parts.append(decoder.feed(bytes(self.buf)))
            self.buf[:] = decoder.tail  # what follows the body: the next answer
            decoder.tail = b""
        return Answer(status, headers, b"".join(parts), version)


def sync_pipeline(url: str, raw: bytes, most: int) -> tuple[list[Answer], bool]:
    """`pipeline` with a blocking socket (for hypothesis, which runs no event loop)."""
    with socket.create_connection(address(url), timeout=DEADLINE) as sock:
        sock.sendall(raw)
        reader = _Buffered(sock)
        answers: list[Answer] = []
        try:
            while len(answers) < most:
                answers.append(reader.answer())
        except (EOFError, ConnectionError):
            return answers, True
        return answers, False
