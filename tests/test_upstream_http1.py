"""The lean HTTP/1.1 client: its parsers (`http1_wire`) on plain bytes, then the pool
(`http1`) against raw servers on loopback, under asyncio and uvloop."""

from __future__ import annotations

import asyncio
import itertools
import shutil
import ssl
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import uvloop
from hypothesis import given, settings
from hypothesis import strategies as st

from streamer.core.deltas import Finish, TextDelta
from streamer.core.errors import RequestError
from streamer.upstream.chat.client import chat_client
from streamer.upstream.http1.connection import HIGH_WATER, Response
from streamer.upstream.http1.connection_limit import OpenConnections
from streamer.upstream.http1.pool import ClientPools, ConnectionPool
from streamer.upstream.http1.wire import (
    ChunkedDecoder,
    ConnectError,
    ProtocolError,
    ReadTimeout,
    ServerDisconnected,
    body_length,
    parse_head,
)

# -- the chunked decoder ------------------------------------------------------------------


def chunked(*pieces: bytes, last: bytes = b"0\r\n\r\n") -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + last


def feed_all(parts: list[bytes]) -> tuple[bytes, ChunkedDecoder]:
    dec = ChunkedDecoder()
    out = b"".join(dec.feed(p) for p in parts)
    return out, dec


SSE = [b'data: {"choices":[{"delta":{"content":"tok%d"}}]}\n\n' % i for i in range(40)]


def test_chunked_in_one_piece_and_split_at_every_position() -> None:
    wire = chunked(*SSE) + b"EXTRA"
    out, dec = feed_all([wire])
    assert out == b"".join(SSE) and dec.done and dec.tail == b"EXTRA"
    for cut in range(1, len(wire)):
        out, dec = feed_all([wire[:cut], wire[cut:]])
        assert out == b"".join(SSE), cut
        assert dec.done and dec.tail == b"EXTRA", cut


def test_chunked_byte_by_byte_with_crlf_inside_data() -> None:
    pieces = [b"a\r\nb", b"\r\n", b"data: x\r\n\r\n", b"\r", b"\n\r\n"]
    wire = chunked(*pieces)
    out, dec = feed_all([wire[i : i + 1] for i in range(len(wire))])
    assert out == b"".join(pieces) and dec.done and dec.tail == b""
    out, dec = feed_all([wire])
    assert out == b"".join(pieces) and dec.done


def test_chunk_extensions_trailers_and_odd_sizes() -> None:
    wire = (
        b"5;name=value\r\nhello\r\n"
        b"00006 ; ext\r\n world\r\n"
        b"A\r\n0123456789\r\n"
        b"0;last\r\nX-Checksum: abc\r\nX-Other: 1\r\n\r\n"
    )
    for cut in range(1, len(wire)):
        out, dec = feed_all([wire[:cut], wire[cut:]])
        assert out == b"hello world0123456789" and dec.done and dec.tail == b"", cut


def test_payload_is_streamed_before_its_chunk_ends() -> None:
    dec = ChunkedDecoder()
    assert dec.feed(b"10\r\n0123") == b"0123"
    assert dec.feed(b"456789") == b"456789"
    assert dec.feed(b"abcdef\r") == b"abcdef"
    assert not dec.done
    assert dec.feed(b"\n3\r\nxyz\r\n0\r\n") == b"xyz"
    assert not dec.done
    assert dec.feed(b"\r\n") == b"" and dec.done


@pytest.mark.parametrize(
    "wire",
    [
        b"zz\r\nhello\r\n",  # not hex
        b"-5\r\nhello\r\n",  # negative
        b"\r\nhello\r\n",  # empty size
        b"5\r\nhelloXY0\r\n\r\n",  # data not followed by CRLF
        b"5 5\r\nhello\r\n",  # two sizes
        b"1" * 5000,  # a size line without end
        b"0\r\n" + b"X-T: y\r\n" * 3000,  # trailers without end
    ],
)
def test_malformed_chunked_is_a_protocol_error(wire: bytes) -> None:
    with pytest.raises(ProtocolError):
        feed_all([wire])
    with pytest.raises(ProtocolError):
        feed_all([wire[i : i + 7] for i in range(0, len(wire), 7)])


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.binary(min_size=1, max_size=40), max_size=12),
    st.lists(st.integers(min_value=0, max_value=600), max_size=8),
    st.booleans(),
)
def test_chunked_any_data_any_split(pieces: list[bytes], cuts: list[int], crlf: bool) -> None:
    pieces = [p + b"\r\n" if crlf else p for p in pieces]
    wire = chunked(*pieces) + b"tail"
    marks = sorted({0, len(wire), *(c % (len(wire) + 1) for c in cuts)})
    out, dec = feed_all([wire[a:b] for a, b in itertools.pairwise(marks)])
    assert out == b"".join(pieces)
    assert dec.done and dec.tail == b"tail"


# -- heads and framing ----------------------------------------------------------------------


def test_parse_head() -> None:
    status, reason, headers, http11 = parse_head(
        b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 7\r\ncontent-type:  text/plain \r\n"
        b"Set-Cookie: a\r\nSet-Cookie: b"
    )
    assert (status, reason, http11) == (429, "Too Many Requests", True)
    assert headers["retry-after"] == "7" and headers["Content-Type"] == "text/plain"
    assert headers.getall("set-cookie") == ["a", "b"]
    assert parse_head(b"HTTP/1.0 200")[0::3] == (200, False)


@pytest.mark.parametrize(
    "head",
    [
        b"garbage",
        b"HTTP/2 200 OK",
        b"HTTP/1.1 20 OK",
        b"HTTP/1.1 abc OK",
        b"HTTP/1.1 200 OK\r\nNo-Colon",
        b"HTTP/1.1 200 OK\r\nName : value",
        b"HTTP/1.1 200 OK\r\nA: b\r\n  folded",
        b"HTTP/1.1 200 OK\r\nA: b\nInjected: c",
        b"HTTP/1.1 200 OK" + b"\r\nA: b" * 300,
    ],
)
def test_bad_heads(head: bytes) -> None:
    with pytest.raises(ProtocolError):
        parse_head(head)


def test_body_length_rules() -> None:
    def length(status: int, raw: bytes) -> int | None:
        return body_length(status, parse_head(b"HTTP/1.1 %d X%s" % (status, raw))[2])

    assert length(200, b"\r\nContent-Length: 12") == 12
    assert length(200, b"\r\nContent-Length: 5, 5") == 5
    assert length(200, b"\r\nTransfer-Encoding: chunked") == -1
    assert length(200, b"\r\nTransfer-Encoding: gzip, Chunked\r\nContent-Length: 3") == -1
    assert length(200, b"\r\nTransfer-Encoding: gzip") is None  # until the close
    assert length(200, b"") is None
    assert length(204, b"\r\nContent-Length: 9") == 0
    assert length(304, b"") == 0
    for bad in (b"\r\nContent-Length: 5\r\nContent-Length: 6", b"\r\nContent-Length: -1"):
        with pytest.raises(ProtocolError):
            length(200, bad)


# -- loopback servers ---------------------------------------------------------------------

Handler = Callable[["RawServer", asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class RawServer:
    """A loopback server playing `handler(server, reader, writer)` on every connection."""

    def __init__(self, handler: Handler, ssl_context: ssl.SSLContext | None = None) -> None:
        self.handler = handler
        self.ssl = ssl_context
        self.connections = 0
        self.gone: list[asyncio.Event] = []  # one per connection, set when it has ended
        self.heads: list[bytes] = []
        self._server: asyncio.Server | None = None

    async def start(self) -> RawServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.ssl)
        self.port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        return self

    def close(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        gone = asyncio.Event()
        self.gone.append(gone)
        try:
            await self.handler(self, reader, writer)
            while not writer.is_closing() and await reader.read(65536):
                pass  # until the client goes away
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # cancelled: the test is over
        finally:
            gone.set()
            writer.close()

    async def request(self, reader: asyncio.StreamReader) -> bytes:
        """Read one request (head and Content-Length body); return its head."""
        head = await reader.readuntil(b"\r\n\r\n")
        self.heads.append(head)
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                await reader.readexactly(int(line.split(b":")[1]))
        return head


def answering(*responses: bytes, then: str = "hang") -> Handler:
    """Answer the requests on each connection with `responses`; then `hang` (read on, answer
    nothing more), `close` at once, or `drop` (close when the next request has come)."""

    async def handler(
        server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        for response in responses:
            await server.request(reader)
            writer.write(response)
            await writer.drain()
        if then == "drop":
            await server.request(reader)
        if then != "hang":
            writer.close()

    return handler


async def serve(handler: Handler) -> RawServer:
    return await RawServer(handler).start()


def post(pool: ConnectionPool, body: bytes = b"{}") -> bytes:
    head = pool.head(
        "POST", "/v1/chat/completions", [("Content-Type", "application/json")], len(body)
    )
    return head + body


OK_CL = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
OK_CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(*SSE)


async def read_body(resp: object) -> bytes:
    return await resp.read_all(1 << 30)  # type: ignore[attr-defined]


async def test_request_head_and_keep_alive_reuse() -> None:
    server = await serve(answering(OK_CL, OK_CHUNKED, OK_CL))
    pool = ConnectionPool(server.url)
    try:
        for want in (b"hello", b"".join(SSE), b"hello"):
            resp = await pool.request(post(pool, b'{"a":1}'), 5)
            assert resp.status == 200 and await read_body(resp) == want
            assert resp.complete
            resp.release()
            assert pool.idle_count == 1 and pool.in_use_count == 0
        assert server.connections == 1
        head = server.heads[0]
        assert head.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
        assert f"\r\nHost: 127.0.0.1:{server.port}\r\n".encode() in head
        assert b"\r\nConnection: keep-alive\r\n" in head and b"\r\nContent-Length: 7\r\n" in head
        with pytest.raises(ValueError):
            pool.head("POST", "/", [("X-Evil", "a\r\nInjected: 1")], 0)
    finally:
        await pool.close()


async def test_close_delimited_body_and_informational_heads() -> None:
    response = (
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: all of it\n\n"
    )
    server = await serve(answering(response, then="close"))
    pool = ConnectionPool(server.url)
    try:
        resp = await pool.request(post(pool), 5)
        assert resp.status == 200 and resp.content_type == "text/event-stream"
        assert await read_body(resp) == b"data: all of it\n\n"
        resp.release()
        assert pool.idle_count == 0  # ended by the close: not reusable
    finally:
        await pool.close()


async def test_head_and_body_trickling_in() -> None:
    async def handler(
        server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await server.request(reader)
        for i in range(len(OK_CHUNKED)):
            writer.write(OK_CHUNKED[i : i + 1])
            if i % 97 == 0:
                await writer.drain()
                await asyncio.sleep(0.001)
        await asyncio.sleep(3600)

    server = await serve(handler)
    pool = ConnectionPool(server.url)
    try:
        resp = await pool.request(post(pool), 5)
        assert await read_body(resp) == b"".join(SSE)
        resp.release()
        assert pool.idle_count == 1
    finally:
        await pool.close()


async def test_response_split_at_every_position() -> None:
    response = (
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"
        b"Content-Type: text/event-stream\r\n\r\n" + chunked(*SSE[:3])
    )

    async def handler(
        server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        for cut in range(1, len(response)):
            await server.request(reader)
            writer.write(response[:cut])
            await writer.drain()
            await asyncio.sleep(0.001)  # two reads on the other side
            writer.write(response[cut:])

    server = await serve(handler)
    pool = ConnectionPool(server.url)
    try:
        for cut in range(1, len(response)):
            resp = await pool.request(post(pool), 5)
            assert resp.status == 200 and resp.content_type == "text/event-stream", cut
            assert await read_body(resp) == b"".join(SSE[:3]), cut
            resp.release()
        assert server.connections == 1
    finally:
        await pool.close()


@pytest.mark.parametrize(
    ("response", "where"),
    [
        (b"SSH-2.0-OpenSSH_9.0\r\n\r\n", "head"),
        (b"HTTP/1.1 200 OK\r\n" + b"X-Big: " + b"a" * (70 << 10), "head"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", "head"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX", "body"),
    ],
)
async def test_garbage_is_a_protocol_error(response: bytes, where: str) -> None:
    server = await serve(answering(response, then="hang"))
    pool = ConnectionPool(server.url)
    try:
        if where == "head":
            with pytest.raises(ProtocolError):
                await pool.request(post(pool), 5)
        else:
            resp = await pool.request(post(pool), 5)
            with pytest.raises(ProtocolError):
                await read_body(resp)
            resp.release()
        await asyncio.wait_for(server.gone[0].wait(), 5)  # the connection was dropped
        assert pool.idle_count == 0 and pool.in_use_count == 0
    finally:
        await pool.close()


async def test_server_closing_before_answering_is_not_retried_on_a_new_connection() -> None:
    server = await serve(answering(then="drop"))
    pool = ConnectionPool(server.url)
    try:
        with pytest.raises(ServerDisconnected):
            await pool.request(post(pool), 5)
        assert server.connections == 1
    finally:
        await pool.close()


async def test_stale_keep_alive_connection_is_retried_once() -> None:
    # each connection answers one request and drops the next, as a server closing an
    # idle connection just as a request arrives on it does
    server = await serve(answering(OK_CL, then="drop"))
    pool = ConnectionPool(server.url, stale_after=0.05)
    try:
        for _ in range(2):
            resp = await pool.request(post(pool), 5)
            assert await read_body(resp) == b"hello"
            resp.release()
            await asyncio.sleep(0.1)  # idle long enough to be suspected
        # the second request went to the first connection, then again to a new one
        assert (len(server.heads), server.connections) == (3, 2)
        # a connection reused sooner is not retried: the failure is the server's answer
        resp = await pool.request(post(pool), 5)
        assert await read_body(resp) == b"hello"
        resp.release()
        with pytest.raises(ServerDisconnected):
            await pool.request(post(pool), 5)
        assert (len(server.heads), server.connections) == (6, 3)
    finally:
        await pool.close()


async def test_idle_connections_expire_and_closed_ones_are_skipped() -> None:
    server = await serve(answering(OK_CL, OK_CL, OK_CL))
    pool = ConnectionPool(server.url, keepalive=0.2)
    try:
        resp = await pool.request(post(pool), 5)
        await read_body(resp)
        resp.release()
        assert pool.idle_count == 1
        await asyncio.wait_for(server.gone[0].wait(), 5)  # dropped by the pool after 0.2 s
        assert pool.idle_count == 0
    finally:
        await pool.close()

    closing = await serve(answering(OK_CL, then="close"))  # answers once, then closes
    pool = ConnectionPool(closing.url)
    try:
        for _ in range(2):
            resp = await pool.request(post(pool), 5)
            assert await read_body(resp) == b"hello"
            resp.release()
            await asyncio.wait_for(closing.gone[-1].wait(), 5)
            await asyncio.sleep(0.01)
            assert pool.idle_count == 0  # the server's close was noticed while idle
        assert closing.connections == 2
    finally:
        await pool.close()


async def test_connection_close_and_extra_bytes_are_not_reused() -> None:
    close = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"
    extra = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\n"
    for response in (close, extra):
        server = await serve(answering(response))
        pool = ConnectionPool(server.url)
        try:
            resp = await pool.request(post(pool), 5)
            assert await read_body(resp) == b"ok"
            resp.release()
            assert pool.idle_count == 0
            await asyncio.wait_for(server.gone[0].wait(), 5)
        finally:
            await pool.close()


async def test_abort_mid_body_disconnects_at_once() -> None:
    server = await serve(
        answering(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n", then="hang"
        )
    )
    pool = ConnectionPool(server.url)
    try:
        resp = await pool.request(post(pool), 5)
        assert await resp.read() == b"first"
        assert not resp.complete
        resp.abort()
        await asyncio.wait_for(server.gone[0].wait(), 1)
        assert pool.in_use_count == 0 and pool.idle_count == 0
        assert await resp.read() == b""
    finally:
        await pool.close()


async def test_timeouts() -> None:
    server = await serve(answering(then="hang"))  # never answers
    pool = ConnectionPool(server.url)
    try:
        with pytest.raises(ReadTimeout):
            await pool.request(post(pool), 0.2)
        await asyncio.wait_for(server.gone[0].wait(), 5)
    finally:
        await pool.close()

    stalls = await serve(
        answering(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n", then="hang")
    )
    pool = ConnectionPool(stalls.url)
    try:
        resp = await pool.request(post(pool), 0.2)
        assert await resp.read() == b"abc"
        with pytest.raises(TimeoutError):
            await resp.read()
        await asyncio.wait_for(stalls.gone[0].wait(), 5)
    finally:
        await pool.close()


async def test_connect_errors() -> None:
    probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()
    pool = ConnectionPool(f"http://127.0.0.1:{port}/v1", connect_timeout=2)
    with pytest.raises(ConnectError, match="refused"):
        await pool.request(b"GET / HTTP/1.1\r\n\r\n", 5)
    pool = ConnectionPool("http://no-such-host.invalid/v1", connect_timeout=3)
    with pytest.raises(ConnectError):
        await pool.request(b"GET / HTTP/1.1\r\n\r\n", 5)


async def test_connection_limit() -> None:
    async def handler(
        server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        while True:
            await server.request(reader)
            await asyncio.sleep(0.05)
            writer.write(OK_CL)

    server = await serve(handler)
    pool = ConnectionPool(server.url, limit=2)
    try:

        async def one() -> bytes:
            resp = await pool.request(post(pool), 5)
            assert pool.in_use_count <= 2
            try:
                return await read_body(resp)
            finally:
                resp.release()

        assert await asyncio.gather(*(one() for _ in range(6))) == [b"hello"] * 6
        assert server.connections == 2
    finally:
        await pool.close()


class FakeConnection:
    """What `OpenConnections` needs of a connection; an abort reports itself closed, as a
    pool's `forget` does."""

    def __init__(self, cap: OpenConnections) -> None:
        self.cap = cap
        self.aborted = False

    def abort(self) -> None:
        self.aborted = True
        self.cap.closed(self)


async def opened(cap: OpenConnections) -> FakeConnection:
    await cap.reserve()
    conn = FakeConnection(cap)
    cap.opened(conn)
    return conn


async def test_open_connections_cap_waits_then_hands_over() -> None:
    cap = OpenConnections(2)
    a, b = await opened(cap), await opened(cap)
    third = asyncio.create_task(opened(cap))
    await asyncio.sleep(0)  # let it queue (it has nothing else to wait on)
    assert not third.done() and cap.waiting == 1 and cap.open == 2
    a.abort()  # gone: its room goes to the one waiting
    c = await asyncio.wait_for(third, 5)
    assert cap.open == 2 and cap.waiting == 0
    for conn in (b, c):
        conn.abort()
    assert cap.open == 0


async def test_open_connections_close_the_longest_idle_to_make_room() -> None:
    cap = OpenConnections(2)
    a, b = await opened(cap), await opened(cap)
    cap.idle(a)
    cap.idle(b)
    cap.busy(b)  # taken again: no longer idle
    c = await asyncio.wait_for(opened(cap), 5)  # a is closed for it, at once
    assert a.aborted and not b.aborted and cap.open == 2
    cap.idle(b)
    waiter = asyncio.create_task(opened(cap))  # b is closed for it
    d = await asyncio.wait_for(waiter, 5)
    assert b.aborted and cap.open == 2 and {c.aborted, d.aborted} == {False}


async def test_open_connections_going_idle_while_others_wait_are_closed() -> None:
    cap = OpenConnections(1)
    a = await opened(cap)
    waiter = asyncio.create_task(opened(cap))
    await asyncio.sleep(0)
    cap.idle(a)  # kept for reuse, it would hold the descriptor the waiter needs
    assert a.aborted
    await asyncio.wait_for(waiter, 5)
    assert cap.open == 1


async def test_open_connections_cancelled_waits_and_failed_connects_leak_nothing() -> None:
    cap = OpenConnections(1)
    a = await opened(cap)
    waiter = asyncio.create_task(opened(cap))
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    a.abort()
    assert cap.open == 0 and cap.waiting == 0
    await cap.reserve()
    cap.unreserve()  # the connect failed
    assert cap.open == 0
    with pytest.raises(ValueError):
        OpenConnections(0)


async def test_open_connections_bound_every_pool_together() -> None:
    """Two clients' pools under one cap of 2: the second client's requests close the first
    one's idle connections (never more than 2 open at the server); three requests at once
    take turns."""

    async def handler(
        server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        while True:
            await server.request(reader)
            await asyncio.sleep(0.02)
            writer.write(OK_CL)

    server = await serve(handler)
    cap = OpenConnections(2)
    pools = [ConnectionPool(server.url, open_limit=cap) for _ in range(2)]
    most = 0

    async def one(pool: ConnectionPool) -> bytes:
        nonlocal most
        resp = await pool.request(post(pool), 5)
        most = max(most, sum(p.idle_count + p.in_use_count for p in pools))
        try:
            return await read_body(resp)
        finally:
            resp.release()

    try:
        assert await asyncio.gather(one(pools[0]), one(pools[0])) == [b"hello"] * 2
        assert pools[0].idle_count == 2 and cap.open == 2
        assert await one(pools[1]) == b"hello"  # one of the first pool's idle ones made room
        assert pools[0].idle_count == 1 and pools[1].idle_count == 1
        results = await asyncio.gather(*(one(pools[i % 2]) for i in range(6)))
        assert results == [b"hello"] * 6
        assert most <= 2 and cap.open <= 2
    finally:
        for pool in pools:
            await pool.close()
    assert cap.open == 0


async def flow_control() -> None:
    """A consumer that does not read pauses the socket (the server's writes block), and the
    idle timeout does not run while it is paused."""
    total = 24 << 20
    sent = 0

    async def handler(
        server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        nonlocal sent
        await server.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (total + 1))
        block = bytes(range(256)) * 256
        while sent < total:
            writer.write(block)
            sent += len(block)
            await writer.drain()
        await asyncio.sleep(3600)  # one byte short: a stalled backend

    server = await serve(handler)
    pool = ConnectionPool(server.url)
    try:
        resp = await pool.request(post(pool), 0.3)
        await asyncio.sleep(0.6)  # longer than the idle timeout, but paused by us
        assert sent < total  # the server is blocked: backpressure went through TCP
        assert resp.transport is not None and not resp.transport.is_closing()
        got = 0
        first = await resp.read()
        assert HIGH_WATER < len(first) <= 2 * HIGH_WATER + (1 << 20)  # bounded, not everything
        got += len(first)
        with pytest.raises(TimeoutError):
            while data := await resp.read():
                got += len(data)
        assert got == total
    finally:
        await pool.close()


async def interleaved_reads(streams: int = 8, pieces: int = 60) -> None:
    """Connections of one pool share its read buffer: reads interleaved piece by piece
    across many connections must still give each response its own bytes."""

    async def handler(
        server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        head = await server.request(reader)
        which = head.split(b"X-Stream: ")[1].split(b"\r\n")[0]
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for i in range(pieces):
            writer.write(chunked(b"%s:%d;" % (which, i), last=b""))
            await writer.drain()
            await asyncio.sleep(0)  # let the other connections' pieces in between
        writer.write(b"0\r\n\r\n")

    server = await serve(handler)
    pool = ConnectionPool(server.url)

    async def one(n: int) -> bytes:
        head = pool.head("POST", "/v1/chat/completions", [("X-Stream", str(n))], 0)
        resp = await pool.request(head, 5)
        parts = []
        while chunk := await resp.read():
            parts.append(chunk)
        resp.release()
        return b"".join(parts)

    try:
        bodies = await asyncio.gather(*(one(n) for n in range(streams)))
        for n, body in enumerate(bodies):
            assert body == b"".join(b"%d:%d;" % (n, i) for i in range(pieces))
        assert server.connections == streams
    finally:
        await pool.close()
        server.close()


async def test_connections_share_the_pool_read_buffer_safely() -> None:
    await interleaved_reads()


async def test_flow_control_pauses_and_the_idle_timeout_waits() -> None:
    await flow_control()


def test_under_uvloop() -> None:
    async def main() -> None:
        await flow_control()
        await interleaved_reads()
        await test_request_head_and_keep_alive_reuse()
        await test_abort_mid_body_disconnects_at_once()

    uvloop.run(main())


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"),
            *("-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


@pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl to make a certificate")
async def test_https(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    server = await RawServer(answering(OK_CHUNKED, OK_CL), server_ctx).start()
    port = server.port
    try:
        untrusted = ConnectionPool(f"https://localhost:{port}/v1", connect_timeout=5)
        with pytest.raises(ConnectError):
            await untrusted.request(post(untrusted), 5)
        pool = ConnectionPool(
            f"https://localhost:{port}/v1", ssl_context=ssl.create_default_context(cafile=cert)
        )
        try:
            for want in (b"".join(SSE), b"hello"):
                resp = await pool.request(post(pool), 5)
                assert await read_body(resp) == want
                resp.release()
            assert server.connections == 1  # kept alive
            assert f"\r\nHost: localhost:{port}\r\n".encode() in server.heads[0]
        finally:
            await pool.close()
    finally:
        server.close()


# -- through the Chat client ------------------------------------------------------------------


async def test_chat_stream_over_a_content_length_body_and_garbage_as_502() -> None:
    events = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
    events += (
        b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
    )
    sse = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n"
    server = await serve(answering(sse % len(events) + events, b"HTTP/1.1 OK\r\n\r\n"))
    up = chat_client(server.url, api_key="sk-test")
    try:
        stream = await up.open({"model": "m", "messages": []})
        assert [*(stream.first or []), *[d async for batch in stream for d in batch]] == [
            TextDelta("hi"),
            Finish("stop"),
        ]
        await stream.aclose()
        assert up.pool.idle_count == 1  # read to its end: kept
        assert b"\r\nAuthorization: Bearer sk-test\r\n" in server.heads[0]
        with pytest.raises(RequestError) as info:
            await up.open({"model": "m", "messages": []})
        assert (info.value.status, info.value.code) == (502, "upstream_error")
        assert "invalid HTTP" in info.value.message
    finally:
        await up.close()


# -- pools per client ------------------------------------------------------------------------


async def use(pool: ConnectionPool, *, release: bool = True) -> Response:
    resp = await pool.request(post(pool), 5)
    assert await read_body(resp) == b"hello"
    if release:
        resp.release()
    return resp


async def test_client_pools_keep_clients_apart_and_stay_bounded() -> None:
    server = await serve(answering(OK_CL, OK_CL, OK_CL))
    pools = ClientPools(lambda: ConnectionPool(server.url), max_pools=2)
    try:
        a = pools.get("a")
        await use(a)
        b = pools.get("b")
        assert a is not b and pools.get("a") is a and len(pools) == 2
        await use(b)
        assert server.connections == 2  # one connection per client, never shared
        assert pools.idle_count == 2 and pools.in_use_count == 0
        assert pools.get("a") is a
        c = pools.get("c")  # at the cap: the least recently used ("b": "a" was asked last) goes
        assert "b" not in pools and "a" in pools and len(pools) == 2
        await asyncio.wait_for(server.gone[1].wait(), 5)  # b's idle connection was closed
        await use(pools.get("a"))
        assert server.connections == 2  # "a" still had its own
        pools.get("d")  # "c" is empty: dropped first, before any pool in use
        assert "c" not in pools and "a" in pools and c.empty
    finally:
        await pools.close()


async def test_a_retired_pool_lets_its_requests_finish_and_keeps_nothing() -> None:
    server = await serve(answering(OK_CL, OK_CL))
    pools = ClientPools(lambda: ConnectionPool(server.url), max_pools=1)
    try:
        resp = await use(pools.get("a"), release=False)
        assert resp.complete
        pools.get("b")  # "a" is retired while its response is still held
        assert "a" not in pools
        resp.release()  # whole and clean, but its pool keeps nothing more: cut
        await asyncio.wait_for(server.gone[0].wait(), 5)
        assert pools.idle_count == 0
    finally:
        await pools.close()


async def test_pool_without_reuse_closes_every_connection() -> None:
    server = await serve(answering(OK_CL, OK_CL))
    pool = ConnectionPool(server.url, reuse=False)
    try:
        for _ in range(3):
            await use(pool)
            assert pool.idle_count == 0
        assert server.connections == 3
        assert all(b"\r\nConnection: close\r\n" in head for head in server.heads)
    finally:
        await pool.close()


async def test_chat_upstream_pools_per_client() -> None:
    events = (
        b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
    )
    sse = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n"
    server = await serve(answering(*[sse % len(events) + events] * 4))
    up = chat_client(server.url, client_pools=8)
    try:
        for client in ("k1", "k2", "k1", "k2"):
            stream = await up.open({"model": "m", "messages": []}, client=client)
            assert [*(stream.first or []), *[d async for batch in stream for d in batch]] == [
                Finish("stop")
            ]
            await stream.aclose()
        assert server.connections == 2 and len(up.pools) == 2
        assert up.pools.idle_count == 2
    finally:
        await up.close()


async def test_bytes_arriving_while_idle_discard_the_connection() -> None:
    idle = asyncio.Event()

    async def handler(
        server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await server.request(reader)
        writer.write(OK_CL)
        await idle.wait()  # the client has put the connection back in its pool
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstale")

    server = await serve(handler)
    pool = ConnectionPool(server.url)
    try:
        await use(pool)
        assert pool.idle_count == 1
        idle.set()
        await asyncio.wait_for(server.gone[0].wait(), 5)  # cut by the client, not kept
        assert pool.idle_count == 0
        # nothing stale is read as the next answer: that one comes on a new connection
        server.handler = answering(OK_CL)
        await use(pool)
        assert server.connections == 2
    finally:
        await pool.close()


async def test_the_answer_to_a_head_request_has_no_body() -> None:
    server = await serve(answering(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", OK_CL))
    pool = ConnectionPool(server.url)
    try:
        resp = await pool.request(pool.head("HEAD", "/v1/models", [], None), 5)
        assert resp.status == 200 and resp.complete and await read_body(resp) == b""
        resp.release()
        await use(pool)  # the same connection, in step
        assert server.connections == 1
    finally:
        await pool.close()
