"""The HTTP client's contract with what stands between the gateway and its backend.

Real servers on loopback: a forward proxy written here (absolute-form requests and CONNECT
tunnels, recording what it saw), a TLS front with a self-signed certificate (the private
CA of `--upstream-ca-file`), raw backends that answer compressed bodies and decompression
bombs, a listener that never accepts (connect timeout), and a backend that counts its
open connections (`--upstream-max-connections`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gzip
import logging
import random
import select
import shutil
import socket
import ssl
import subprocess
import zlib
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import brotli
import orjson
import pytest
import uvloop
from harness import GatewayHarness
from raw_backend import RawBackend, RawConnection, chunked
from scripted_backend import DONE, ScriptedBackend, completion, finish, text_chunks, usage
from test_faults import BODY, Outcome, json_turn, sse_turn

try:
    from compression import zstd  # type: ignore[import-not-found]
except ImportError:
    from backports import zstd  # type: ignore[import-not-found,no-redef]

PROXY_USER, PROXY_PASSWORD = "gw-user", "proxy-pa55word-never-shown"
PROXY_TOKEN = base64.b64encode(f"{PROXY_USER}:{PROXY_PASSWORD}".encode()).decode()
CODINGS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": gzip.compress,
    "deflate": zlib.compress,
    "br": brotli.compress,
    "zstd": zstd.compress,
}
Open = dict[asyncio.Task[Any], asyncio.StreamWriter]  # connection handlers and their clients
needs_openssl = pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl")

# -- a forward proxy -------------------------------------------------------------------


@dataclass
class Seen:
    """One request head as the proxy got it (header names lower-cased)."""

    method: str
    target: str
    headers: dict[str, str]


@dataclass
class ForwardProxy:
    """An HTTP proxy: absolute-form requests and CONNECT; with `credentials`, 407 without them.

    After the first head of a connection it relays bytes both ways as they come, as a
    tunnel would; its 407 page echoes the credentials it got, as careless proxies do.
    """

    credentials: str | None = None  # the Proxy-Authorization value it wants
    seen: list[Seen] = field(default_factory=list)
    port: int = 0
    _server: asyncio.Server | None = None
    _open: Open = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> ForwardProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        await close_server(self._server, self._open)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with (
            tracked(self._open, writer),
            contextlib.suppress(ConnectionError, asyncio.IncompleteReadError, OSError),
        ):
            try:
                head = await reader.readuntil(b"\r\n\r\n")
                line, *fields = head.decode("latin-1").split("\r\n")
                method, target, _ = line.split(" ", 2)
                headers = {}
                for f in fields:
                    if ":" in f:
                        name, _, value = f.partition(":")
                        headers[name.strip().lower()] = value.strip()
                self.seen.append(Seen(method, target, headers))
                got = headers.get("proxy-authorization", "")
                if self.credentials is not None and got != self.credentials:
                    page = f"proxy authentication required; you sent {got!r}".encode()
                    writer.write(
                        b"HTTP/1.1 407 Proxy Authentication Required\r\nConnection: close\r\n"
                        b"Content-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s"
                        % (len(page), page)
                    )
                    await writer.drain()
                    return
                if method == "CONNECT":
                    host, _, port = target.rpartition(":")
                    up_reader, up_writer = await asyncio.open_connection(host, int(port))
                    writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                else:
                    parts = urlsplit(target)
                    assert parts.hostname and parts.port
                    up_reader, up_writer = await asyncio.open_connection(parts.hostname, parts.port)
                    up_writer.write(head)  # aiohttp takes absolute-form targets
                await relay(reader, writer, up_reader, up_writer)
            finally:
                writer.close()


@contextlib.contextmanager
def tracked(open_: Open, writer: asyncio.StreamWriter) -> Iterator[None]:
    """The current connection handler and its client are in `open_` while it runs."""
    task = asyncio.current_task()
    assert task is not None
    open_[task] = writer
    try:
        yield
    finally:
        open_.pop(task, None)


async def close_server(server: asyncio.Server, open_: Open) -> None:
    """Stop listening, cut every client (their relays then end), wait for the handlers."""
    server.close()
    tasks = list(open_)
    for writer in open_.values():
        writer.transport.abort()
    if tasks:
        _, stuck = await asyncio.wait(tasks, timeout=2)
        for task in stuck:
            task.cancel()
    await server.wait_closed()


async def relay(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    up_reader: asyncio.StreamReader,
    up_writer: asyncio.StreamWriter,
) -> None:
    """Bytes both ways until either side closes."""

    async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        dst.close()

    try:
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
    finally:
        up_writer.close()


# -- TLS with a private CA ---------------------------------------------------------------


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for localhost (it is its own CA) and its key."""
    tmp = tmp_path_factory.mktemp("tls")
    cert, key = tmp / "ca.pem", tmp / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt"),
            *("ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-subj", "/CN=localhost"),
            *("-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"),
            *("-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


@contextlib.asynccontextmanager
async def tls_front(backend_url: str, cert: Path, key: Path) -> AsyncIterator[str]:
    """An https:// URL for `backend_url`: TLS ends here, bytes go on to the backend as-is."""
    target = urlsplit(backend_url)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)

    open_: Open = {}

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with tracked(open_, writer), contextlib.suppress(ConnectionError, OSError):
            up_reader, up_writer = await asyncio.open_connection(target.hostname, target.port)
            await relay(reader, writer, up_reader, up_writer)
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=context)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"https://localhost:{port}/v1"
    finally:
        await close_server(server, open_)


# -- clients -------------------------------------------------------------------------------


async def post(gw: GatewayHarness, body: dict[str, Any] = BODY) -> tuple[int, dict[str, Any]]:
    """A non-streamed turn: status and the JSON body."""
    async with (
        aiohttp.ClientSession() as http,
        asyncio.timeout(10),
        http.post(gw.url + "/responses", json=body) as resp,
    ):
        return resp.status, orjson.loads(await resp.read())


def error_of(body: dict[str, Any]) -> tuple[str, str]:
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]["code"], body["error"]["message"]


# -- proxies -----------------------------------------------------------------------------


async def test_http_backend_through_the_environments_proxy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """HTTP_PROXY: absolute-form target and Proxy-Authorization from the URL's userinfo."""
    async with ForwardProxy(credentials=f"Basic {PROXY_TOKEN}") as proxy:
        monkeypatch.setenv(
            "HTTP_PROXY", f"http://{PROXY_USER}:{PROXY_PASSWORD}@127.0.0.1:{proxy.port}"
        )
        async with GatewayHarness() as gw, aiohttp.ClientSession() as http:
            outcome = await sse_turn(http, gw.url)
            assert (outcome.status, outcome.code, outcome.text) == (200, None, "Hello!")
            backend = urlsplit(gw.backend.base_url)
    assert proxy.seen, "the gateway went around the proxy"
    first = proxy.seen[0]
    assert first.method == "POST"
    assert first.target == f"http://127.0.0.1:{backend.port}/v1/chat/completions"
    assert first.headers["proxy-authorization"] == f"Basic {PROXY_TOKEN}"


async def tunnelled_turns(monkeypatch: pytest.MonkeyPatch, certificate: tuple[Path, Path]) -> None:
    """HTTPS_PROXY: CONNECT host:port, then TLS to the backend inside, verified by the CA file."""
    backend = ScriptedBackend()
    await backend.start()
    async with tls_front(backend.base_url, *certificate) as https_url, ForwardProxy() as proxy:
        monkeypatch.setenv("https_proxy", proxy.url)
        async with GatewayHarness(
            backend=backend, upstream=https_url, upstream_ca_file=str(certificate[0])
        ) as gw:
            for _ in range(2):  # the second reuses the tunnel
                status, body = await post(gw)
                assert status == 200, body
                assert body["output"][0]["content"][0]["text"] == "Hello!"
    port = urlsplit(https_url).port
    assert [(s.method, s.target) for s in proxy.seen] == [("CONNECT", f"localhost:{port}")]
    assert len(backend.requests) == 2


@needs_openssl
async def test_https_backend_through_a_connect_tunnel_trusting_the_ca_file(
    monkeypatch: pytest.MonkeyPatch, certificate: tuple[Path, Path]
) -> None:
    await tunnelled_turns(monkeypatch, certificate)


@needs_openssl
def test_the_tunnel_under_uvloop(
    monkeypatch: pytest.MonkeyPatch, certificate: tuple[Path, Path]
) -> None:
    """`streamer serve` runs on uvloop: its start_tls takes over the CONNECT connection too."""
    uvloop.run(tunnelled_turns(monkeypatch, certificate))


@needs_openssl
async def test_the_ca_file_is_what_https_backends_are_verified_against(
    certificate: tuple[Path, Path],
) -> None:
    backend = ScriptedBackend()
    await backend.start()
    async with tls_front(backend.base_url, *certificate) as https_url:
        # (the harness stops its backend: each gets an idle one, the real one is stopped below)
        async with GatewayHarness(backend=ScriptedBackend(), upstream=https_url) as gw:
            status, body = await post(gw)  # the system's CAs do not know this one
            assert status == 502, body
            assert "certificate verify failed" in error_of(body)[1]
        async with GatewayHarness(
            backend=ScriptedBackend(), upstream=https_url, upstream_ca_file=str(certificate[0])
        ) as gw:
            status, body = await post(gw)
            assert status == 200, body
    await backend.stop()


async def test_no_proxy_sends_matching_backends_direct(monkeypatch: pytest.MonkeyPatch) -> None:
    """NO_PROXY by domain suffix: `localhost` goes direct, 127.0.0.1 through the proxy."""
    async with ForwardProxy() as proxy:
        monkeypatch.setenv("http_proxy", proxy.url)
        monkeypatch.setenv("NO_PROXY", "example.com, .localhost:1,localhost")
        async with GatewayHarness() as proxied, aiohttp.ClientSession() as http:
            assert (await sse_turn(http, proxied.url)).text == "Hello!"
            backend = ScriptedBackend()
            port = urlsplit(await backend.start()).port
            async with GatewayHarness(
                backend=backend, upstream=f"http://localhost:{port}/v1"
            ) as gw:
                assert (await sse_turn(http, gw.url)).text == "Hello!"
    assert len(backend.requests) == 1  # reached directly
    assert [s.target.split("/")[2] for s in proxy.seen] == [
        urlsplit(proxied.backend.base_url).netloc
    ]


@needs_openssl
async def test_a_proxy_refusing_connect_is_a_502_naming_its_status_never_its_credentials(
    monkeypatch: pytest.MonkeyPatch,
    certificate: tuple[Path, Path],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    backend = ScriptedBackend()
    await backend.start()
    async with (
        tls_front(backend.base_url, *certificate) as https_url,
        ForwardProxy(credentials="Basic " + base64.b64encode(b"someone:else").decode()) as proxy,
    ):
        url = f"http://{PROXY_USER}:{PROXY_PASSWORD}@127.0.0.1:{proxy.port}"
        monkeypatch.setenv("HTTPS_PROXY", url)
        monkeypatch.setenv("HTTP_PROXY", url)
        seen: list[str] = []
        async with GatewayHarness(
            backend=backend, upstream=https_url, upstream_ca_file=str(certificate[0])
        ) as gw:
            status, body = await post(gw)
            assert status == 502, body
            code, message = error_of(body)
            assert code == "upstream_unreachable"
            assert f"proxy at 127.0.0.1:{proxy.port}" in message
            assert "407 Proxy Authentication Required" in message
            seen.append(orjson.dumps(body).decode())
        async with GatewayHarness() as gw:  # http backend: the proxy's own 407 answer
            status, body = await post(gw)
            assert status == 502, body
            assert "407" in error_of(body)[1]
            seen.append(orjson.dumps(body).decode())
        with never_accepting() as port:  # and a proxy that cannot be reached at all
            gone = f"http://{PROXY_USER}:{PROXY_PASSWORD}@127.0.0.1:{port}"
            async with GatewayHarness(upstream_proxy=gone, upstream_connect_timeout=0.3) as gw:
                status, body = await post(gw)
                assert status == 502, body
                assert f"through the proxy at 127.0.0.1:{port}" in error_of(body)[1]
                seen.append(orjson.dumps(body).decode())
    assert [s.method for s in proxy.seen] == ["CONNECT", "POST"]
    assert backend.requests == []
    for text in [*seen, caplog.text]:
        assert PROXY_PASSWORD not in text and PROXY_TOKEN not in text and PROXY_USER not in text


async def test_the_setting_names_the_proxy_or_turns_the_environments_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with ForwardProxy() as proxy, aiohttp.ClientSession() as http:
        async with GatewayHarness(upstream_proxy=proxy.url) as gw:
            assert (await sse_turn(http, gw.url)).text == "Hello!"
        assert len(proxy.seen) == 1
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        async with GatewayHarness(upstream_proxy="none") as gw:
            assert (await sse_turn(http, gw.url)).text == "Hello!"
        assert len(proxy.seen) == 1  # went direct


async def test_a_proxy_that_never_answers_connect_meets_the_connect_timeout() -> None:
    heads: list[bytes] = []
    open_: Open = {}

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with tracked(open_, writer), contextlib.suppress(ConnectionError, OSError):
            heads.append(await reader.readuntil(b"\r\n\r\n"))
            await reader.read()  # until the gateway gives up and closes

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with GatewayHarness(
            upstream="https://backend.internal/v1",
            upstream_proxy=f"127.0.0.1:{port}",
            upstream_connect_timeout=0.5,
        ) as gw:
            status, body = await post(gw)
    finally:
        await close_server(server, open_)
    assert status == 502, body
    code, message = error_of(body)
    assert code == "upstream_unreachable"
    assert "no connection within 0.5 s (through the proxy at 127.0.0.1:" in message
    assert heads == [b"CONNECT backend.internal:443 HTTP/1.1\r\nHost: backend.internal:443\r\n\r\n"]


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        ({"upstream_proxy": "https://proxy.internal:3128"}, r"https:// proxies .* not supported"),
        ({"upstream_proxy": "socks5://proxy.internal:1080"}, "only http:// proxy URLs"),
        ({"upstream_ca_file": "/no/such/ca.pem"}, "--upstream-ca-file /no/such/ca.pem: No such"),
        ({"upstream_connect_timeout": 0.0}, "--upstream-connect-timeout must be more than 0"),
        ({"upstream_max_connections": -1}, "--upstream-max-connections must be 0"),
    ],
)
async def test_unusable_client_settings_stop_the_gateway_at_startup(
    settings: dict[str, Any], says: str
) -> None:
    gw = GatewayHarness(upstream="https://backend.internal/v1", **settings)
    try:
        with pytest.raises(ValueError, match=says):
            await gw.start()
    finally:
        await gw.stop()


# -- Content-Encoding ----------------------------------------------------------------------


def sse_body(text: list[str]) -> bytes:
    steps = [*text_chunks(text), finish("stop"), usage(3, 2)]
    return b"".join(b"data: " + orjson.dumps(s) + b"\n\n" for s in steps) + DONE


def encoded_answer(body: bytes, coding: str, content_type: str, status: str = "200 OK") -> bytes:
    """A chunked answer whose payload is `body` compressed with `coding`, in small chunks."""
    data = CODINGS[coding](body) if coding in CODINGS else body
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Encoding: {coding}\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    ).encode()
    pieces = [chunked(data[i : i + 97]) for i in range(0, len(data), 97)]
    return head + b"".join(pieces) + chunked(b"")


def answering(answer: bytes) -> Callable[[RawConnection], Any]:
    async def handler(conn: RawConnection) -> None:
        while await conn.request() is not None:
            await conn.send(answer)

    return handler


@pytest.mark.parametrize("coding", list(CODINGS))
@pytest.mark.parametrize("kind", ["sse", "json"])
async def test_compressed_answers_decode_to_the_right_text(coding: str, kind: str) -> None:
    """A proxy that compresses anyway: SSE and whole JSON, each coding, decoded."""
    words = ["Com", "pressed ", "by ", coding]
    if kind == "sse":
        answer = encoded_answer(sse_body(words), coding, "text/event-stream")
    else:
        answer = encoded_answer(
            orjson.dumps(completion("".join(words))), coding, "application/json"
        )
    async with (
        RawBackend(answering(answer)) as backend,
        GatewayHarness(upstream=backend.url) as gw,
        aiohttp.ClientSession() as http,
    ):
        for outcome in (await sse_turn(http, gw.url), await json_turn(http, gw.url)):
            assert (outcome.status, outcome.code) == (200, None), outcome.seen
            assert outcome.text == "".join(words)


@pytest.mark.parametrize("coding", list(CODINGS))
async def test_a_compressed_error_body_keeps_its_status_and_message(coding: str) -> None:
    error = {"error": {"message": f"slow down ({coding})", "type": "rate_limit", "code": None}}
    answer = encoded_answer(orjson.dumps(error), coding, "application/json", "429 Too Many")
    async with RawBackend(answering(answer)) as backend, GatewayHarness(upstream=backend.url) as gw:
        status, body = await post(gw)
    assert status == 429, body
    assert error_of(body) == ("rate_limit_exceeded", f"slow down ({coding})")


async def test_an_unknown_coding_is_a_502_that_says_so() -> None:
    answer = encoded_answer(sse_body(["never read"]), "compress", "text/event-stream")
    async with RawBackend(answering(answer)) as backend, GatewayHarness(upstream=backend.url) as gw:
        status, body = await post(gw)
    assert status == 502, body
    code, message = error_of(body)
    assert code == "upstream_error"
    assert "Content-Encoding 'compress'" in message and "cannot decode" in message


@pytest.mark.parametrize("coding", list(CODINGS))
async def test_a_compressed_stream_cut_short_fails_the_turn_after_its_text(coding: str) -> None:
    """A whole HTTP body whose compressed stream stops half-way (a proxy cut it): the text
    decoded so far goes out and the turn ends `response.failed` saying why."""
    first = b"".join(
        b"data: " + orjson.dumps(c) + b"\n\n" for c in text_chunks(["Hello", " so far"])
    )
    data = CODINGS[coding](first + b": " + random.Random(13).randbytes(100_000).hex().encode())
    ends = range(0, len(data), 64)  # the first cut where the text is decodable
    cut = next(i for i in ends if first in decode_prefix(coding, data[:i]))
    head = (
        f"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Encoding: {coding}\r\n"
        f"Content-Length: {cut}\r\n\r\n"
    ).encode()
    async with (
        RawBackend(answering(head + data[:cut])) as backend,
        GatewayHarness(upstream=backend.url) as gw,
        aiohttp.ClientSession() as http,
    ):
        outcome = await sse_turn(http, gw.url)
    assert outcome.response is not None, outcome.seen
    assert (outcome.response["status"], outcome.text) == ("failed", "Hello so far")
    assert outcome.code == "invalid_upstream_encoding"
    message = outcome.response["error"]["message"]
    assert f"broke off: the {coding} body was cut short" in message, message


def decode_prefix(coding: str, data: bytes) -> bytes:
    """What the standard decoders make of the start of a compressed stream."""
    if coding in ("gzip", "deflate"):
        return zlib.decompressobj(
            16 + zlib.MAX_WBITS if coding == "gzip" else zlib.MAX_WBITS
        ).decompress(data)
    if coding == "br":
        return brotli.Decompressor().process(data)
    return zstd.ZstdDecompressor().decompress(data)


def gzip_bomb(prefix: bytes, size: int) -> bytes:
    """`prefix`, then `size` bytes of one endless SSE line: concatenated gzip members,
    each 16 MiB of "a" in ~16 KiB, so a 1 GiB line costs 1 MiB on the wire."""
    member = gzip.compress(b"a" * (16 << 20), 9)
    return gzip.compress(prefix + b"data: ") + member * (size // (16 << 20))


async def test_a_decompression_bomb_is_cut_at_the_line_limit() -> None:
    """1 GiB of one SSE line behind 1 MiB of gzip: decoded a bounded piece per read, it
    meets the 16 MiB line limit and the turn fails after the text that came before it."""
    bomb = gzip_bomb(sse_body(["Hello", " bomb"]).removesuffix(DONE), 1 << 30)
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Encoding: gzip\r\n"
        b"Content-Length: %d\r\n\r\n" % len(bomb)
    )
    sent = asyncio.Event()

    async def handler(conn: RawConnection) -> None:
        if await conn.request() is not None:
            sent.set()
            await conn.send(head + bomb)

    async with (
        RawBackend(handler) as backend,
        GatewayHarness(upstream=backend.url) as gw,
        aiohttp.ClientSession() as http,
    ):
        outcome = await sse_turn(http, gw.url)
    assert sent.is_set()
    assert outcome.response is not None and outcome.response["status"] == "failed"
    assert outcome.text == "Hello bomb"
    message = outcome.response["error"]["message"]
    assert "event-stream framing" in message, message


# -- connect timeout and the connection limit ----------------------------------------------


@contextlib.contextmanager
def never_accepting() -> Iterator[int]:
    """A port whose listener never accepts and whose queue is full: a SYN to it is dropped,
    so a connect neither succeeds nor fails. Probed until one connect stays pending."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    fillers: list[socket.socket] = []
    try:
        for _ in range(64):
            probe = socket.socket()
            probe.setblocking(False)
            fillers.append(probe)
            probe.connect_ex(("127.0.0.1", port))
            _, writable, _ = select.select([], [probe], [], 0.3)
            if not writable:  # still connecting: the queue is full
                break
        else:
            pytest.skip("could not fill a listen queue here")
        yield port
    finally:
        for s in fillers:
            s.close()
        server.close()


async def test_connect_timeout_ends_a_hanging_connect_with_a_502() -> None:
    with never_accepting() as port:
        async with GatewayHarness(
            upstream=f"http://127.0.0.1:{port}/v1", upstream_connect_timeout=0.5
        ) as gw:
            status, body = await post(gw)
    assert status == 502, body
    code, message = error_of(body)
    assert code == "upstream_unreachable"
    assert "no connection within 0.5 s" in message


async def test_max_connections_bounds_the_backend_connections() -> None:
    """Five turns at once, a limit of two: two connections reach the backend, three wait
    for them, and all five complete."""
    gate = asyncio.Event()
    open_now, most = 0, 0
    answer = encoded_answer(sse_body(["ok"]), "identity", "text/event-stream")

    async def handler(conn: RawConnection) -> None:
        nonlocal open_now, most
        open_now += 1
        most = max(most, open_now)
        try:
            while await conn.request() is not None:
                await gate.wait()
                await conn.send(answer)
        finally:
            open_now -= 1

    async with (
        RawBackend(handler) as backend,
        GatewayHarness(upstream=backend.url, upstream_max_connections=2) as gw,
        aiohttp.ClientSession() as http,
    ):
        limit = gw.gateway.upstreams.resolve().connection_limit
        turns = [asyncio.create_task(sse_turn(http, gw.url)) for _ in range(5)]
        async with asyncio.timeout(5):
            while (limit.in_use, limit.waiting) != (2, 3):
                await asyncio.sleep(0.01)  # polling a real condition
        gate.set()
        outcomes: list[Outcome] = await asyncio.gather(*turns)
    assert [o.text for o in outcomes] == ["ok"] * 5
    assert most == 2
    assert backend.connections == 2


# -- figures: peak RSS of a gateway process under decompression bombs ----------------------


def peak_rss(pid: int) -> int:
    """The process's peak resident memory so far (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@pytest.mark.slow
async def test_bombs_leave_the_gateway_processs_memory_bounded(tmp_path: Path) -> None:
    """A gateway process in front of 1 GiB gzip bombs: an SSE line and a JSON body (a whole
    completion, then 1 GiB of blanks). Each is decoded a bounded piece per read and cut at
    its limit (16 MiB line, 64 MiB JSON body); the peak RSS stays far below the bomb."""
    from builders import gateway_process

    sse = gzip_bomb(sse_body(["Hello", " bomb"]).removesuffix(DONE), 1 << 30)
    blanks = gzip.compress(b" " * (16 << 20), 9) * 64
    whole = gzip.compress(orjson.dumps(completion("Hello JSON bomb"))) + blanks
    bombs = [(b"text/event-stream", sse), (b"application/json", whole)]

    async def handler(conn: RawConnection) -> None:
        while await conn.request() is not None:
            content_type, body = bombs.pop(0)
            await conn.send(
                b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Encoding: gzip\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (content_type, len(body), body)
            )

    async with (
        RawBackend(handler) as backend,
        gateway_process(tmp_path / "gw.log", "--upstream", backend.url) as gw,
        aiohttp.ClientSession() as http,
    ):
        before = peak_rss(gw.process.pid)
        failed = await sse_turn(http, gw.url)
        after_sse = peak_rss(gw.process.pid)
        whole_json = await sse_turn(http, gw.url)
        after_json = peak_rss(gw.process.pid)
    assert failed.text == "Hello bomb" and failed.response is not None
    assert failed.response["status"] == "failed"
    assert whole_json.text == "Hello JSON bomb"
    mib = 1 << 20
    print(
        f"\npeak RSS: {before / mib:.1f} MiB at start, {after_sse / mib:.1f} MiB after the 1 GiB "
        f"SSE-line bomb, {after_json / mib:.1f} MiB after the 1 GiB JSON bomb"
    )
    assert after_json < 400 * mib  # 1 GiB each if decoded whole
