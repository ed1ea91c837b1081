"""The fast path (`--fast-http`) against aiohttp's path for POST /v1/responses: the same
requests through both, side by side, then what only a raw socket shows (pipelining,
keep-alive, Connection: close, a head byte by byte, a client leaving, a slow reader)."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import re
import socket
from collections.abc import AsyncIterator
from typing import Any

import openai
import orjson
import pytest
from builders import parse_sse
from conformance import Collector
from harness import GatewayHarness
from multidict import CIMultiDict
from scripted_backend import HANG, ScriptedBackend, finish, text_chunks, usage

from streamer.frontends.fast_http import FAST_ROUTE, FastProtocol, FastRoute
from streamer.upstream.http1.wire import ChunkedDecoder, body_length, parse_head

KEY = "sk-fast-000"
SMALL_BODY = 4096


# -- a raw HTTP/1.1 client -------------------------------------------------------------


def post(
    body: bytes | dict[str, Any],
    *headers: str,
    path: str = "/v1/responses",
    content_type: str | None = "application/json",
) -> bytes:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    fields = ["Host: test", *headers, f"Content-Length: {len(raw)}"]
    if content_type is not None:
        fields.append(f"Content-Type: {content_type}")
    return (
        f"POST {path} HTTP/1.1\r\n{''.join(f + chr(13) + chr(10) for f in fields)}\r\n".encode(
            "latin-1"
        )
        + raw
    )


class Answer:
    def __init__(self, status: int, headers: CIMultiDict[str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    def events(self) -> list[dict[str, Any]]:
        return parse_sse(self.body)


async def read_answer(reader: asyncio.StreamReader) -> Answer:
    head = await reader.readuntil(b"\r\n\r\n")
    status, _reason, headers, _ = parse_head(head[:-4])
    length = body_length(status, headers)
    if length is None:
        return Answer(status, headers, await reader.read())
    if length >= 0:
        return Answer(status, headers, await reader.readexactly(length))
    decoder, parts = ChunkedDecoder(), []
    while not decoder.done:
        data = await reader.read(65536)
        assert data, "the chunked body ended early"
        parts.append(decoder.feed(data))
    return Answer(status, headers, b"".join(parts))


@contextlib.asynccontextmanager
async def connect(gw: GatewayHarness) -> AsyncIterator[tuple[asyncio.StreamReader, Any]]:
    host, port = gw.url.removeprefix("http://").removesuffix("/v1").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def exchange(gw: GatewayHarness, *requests: bytes) -> list[Answer]:
    """The requests pipelined in one write on one connection; their answers in order."""
    async with connect(gw) as (reader, writer):
        writer.write(b"".join(requests))
        await writer.drain()
        return [await read_answer(reader) for _ in requests]


def route(gw: GatewayHarness) -> FastRoute:
    assert gw.runner is not None
    return gw.runner.app[FAST_ROUTE]


# -- side by side -----------------------------------------------------------------------

_IDS = re.compile(r'"((?:resp|msg|fc|rs|req|call|ws)_[0-9a-zA-Z]+)"')
_TIMES = re.compile(r'"(created_at|completed_at)":\d+')


def normal(value: Any) -> Any:
    text = orjson.dumps(value).decode()
    return orjson.loads(_TIMES.sub(r'"\1":0', _IDS.sub('"ID"', text)))


def compared(answer: Answer) -> dict[str, Any]:
    """What a client sees of an answer, ids and clocks aside."""
    headers = {
        name: answer.headers.get(name)
        for name in (
            "Content-Type",
            "Cache-Control",
            "X-Accel-Buffering",
            "Transfer-Encoding",
            "Connection",
            "Server",
            "Allow",
            "Retry-After",
        )
    }
    headers["has-length"] = "Content-Length" in answer.headers
    headers["has-id"] = bool(answer.headers.get("X-Request-Id"))
    ctype = answer.headers.get("Content-Type", "")
    if ctype.startswith("text/event-stream"):
        body: Any = [normal(e) for e in answer.events()]
    else:
        body = normal(orjson.loads(answer.body)) if answer.body else None
    return {"status": answer.status, "headers": headers, "body": body}


TEXT = {"model": "m", "input": "hi"}
CASES: dict[str, bytes] = {
    "stream": post({**TEXT, "stream": True}),
    "json": post(TEXT),
    "request id": post(TEXT, "X-Request-Id: mine-1"),
    "bad json": post(b'{"model": "m",'),
    "empty body": post(b""),
    "not an object": post(b"[1, 2]"),
    "wrong input type": post({"model": "m", "input": 5}),
    "bad tool": post({**TEXT, "tools": [{"type": "function"}]}),
    "too large": post({**TEXT, "input": "x" * SMALL_BODY}),
    "text/plain": post(TEXT, content_type="text/plain"),
    "no content type": post(TEXT, content_type=None),
    "+json": post(TEXT, content_type="application/vnd.api+json"),
    "gzip": post(gzip.compress(orjson.dumps(TEXT)), "Content-Encoding: gzip"),
    "unknown coding": post(TEXT, "Content-Encoding: compress"),
    "background": post({**TEXT, "background": True}),
    "stream, then close": post({**TEXT, "stream": True}, "Connection: close"),
}
AUTH_CASES: dict[str, bytes] = {
    "no key": post(TEXT),
    "wrong key": post(TEXT, "Authorization: Bearer nope"),
    "right key": post({**TEXT, "stream": True}, f"Authorization: Bearer {KEY}"),
    "bad json, no key": post(b"{"),
}


async def side_by_side(cases: dict[str, bytes], **settings: Any) -> None:
    async with (
        GatewayHarness(fast_http=True, **settings) as fast,
        GatewayHarness(fast_http=False, **settings) as plain,
    ):
        assert plain.runner is not None and FAST_ROUTE not in plain.runner.app
        for name, raw in cases.items():
            (a,) = await exchange(fast, raw)
            (b,) = await exchange(plain, raw)
            assert compared(a) == compared(b), name
            if b"X-Request-Id: mine-1" in raw:
                assert a.headers["X-Request-Id"] == b.headers["X-Request-Id"] == "mine-1"
        assert route(fast).served > 0


async def test_the_fast_path_answers_as_aiohttp_does() -> None:
    await side_by_side(CASES, max_body_bytes=SMALL_BODY)


async def test_the_fast_path_checks_keys_as_aiohttp_does() -> None:
    await side_by_side(AUTH_CASES, api_keys=(KEY,))


async def test_the_request_metrics_are_the_same() -> None:
    async with (
        GatewayHarness(fast_http=True) as fast,
        GatewayHarness(fast_http=False) as plain,
    ):
        for gw in (fast, plain):
            await exchange(gw, CASES["stream"], CASES["json"], CASES["bad json"])
        rendered = [gw.gateway.metrics.render().decode() for gw in (fast, plain)]
        lines = [
            sorted(
                line
                for line in text.splitlines()
                if line.startswith("streamer_http_requests_total")
            )
            for text in rendered
        ]
        assert lines[0] == lines[1]
        assert 'route="/v1/responses",status="200"} 2' in "".join(lines[0])


# -- the real SDK -----------------------------------------------------------------------


async def test_the_openai_sdk_over_the_fast_path() -> None:
    async with GatewayHarness() as gw:
        client = openai.AsyncOpenAI(base_url=gw.url, api_key="unused", max_retries=0)
        try:
            response = await client.responses.create(model="m", input="hi")
            assert response.output_text == "Hello!"
            types = []
            async with await client.responses.create(model="m", input="hi", stream=True) as s:
                async for event in s:
                    types.append(event.type)
            assert types[0] == "response.created" and types[-1] == "response.completed"
            with pytest.raises(openai.BadRequestError) as caught:
                await client.responses.create(model="m", input=5)  # type: ignore[arg-type]
            assert caught.value.param == "input"
        finally:
            await client.close()
        assert route(gw).served == 3


# -- what only a raw socket shows --------------------------------------------------------


async def test_pipelined_requests_are_answered_in_order_across_the_hand_over() -> None:
    async with GatewayHarness() as gw:
        healthz = b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n"
        answers = await exchange(
            gw, CASES["stream"], CASES["json"], CASES["stream"], healthz, CASES["json"]
        )
        assert [a.status for a in answers] == [200] * 5
        assert answers[0].events()[-1]["type"] == "response.completed"
        assert orjson.loads(answers[1].body)["status"] == "completed"
        assert orjson.loads(answers[3].body)["status"] == "ok"
        # served here up to the GET; aiohttp had the connection from there on
        assert orjson.loads(answers[4].body)["object"] == "response"
        assert route(gw).served == 3


async def test_keep_alive_then_connection_close() -> None:
    async with GatewayHarness() as gw, connect(gw) as (reader, writer):
        for _ in range(3):
            writer.write(CASES["stream"])
            answer = await read_answer(reader)
            assert answer.events()[-1]["type"] == "response.completed"
            assert "Connection" not in answer.headers
        writer.write(post(TEXT, "Connection: close"))
        answer = await read_answer(reader)
        assert answer.status == 200 and answer.headers["Connection"] == "close"
        assert await reader.read() == b""  # the gateway closed it
        assert route(gw).served == 4


async def test_a_head_and_body_sent_byte_by_byte() -> None:
    async with GatewayHarness() as gw, connect(gw) as (reader, writer):
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for byte in CASES["stream"]:
            writer.write(bytes([byte]))
            await writer.drain()
        answer = await read_answer(reader)
        assert answer.events()[-1]["type"] == "response.completed"
        assert route(gw).served == 1


async def test_a_body_that_does_not_arrive_is_a_408_and_a_close() -> None:
    async with GatewayHarness(client_body_timeout=0.2) as gw, connect(gw) as (reader, writer):
        raw = CASES["json"]
        writer.write(raw[:-5])
        answer = await read_answer(reader)
        assert answer.status == 408 and answer.headers.getall("Connection") == ["close"]
        assert orjson.loads(answer.body)["error"]["code"] == "request_timeout"
        assert await reader.read() == b""


async def test_a_client_leaving_mid_stream_lets_the_backend_go() -> None:
    backend = ScriptedBackend(default_script=[*text_chunks(["Hel"]), HANG])
    async with GatewayHarness(backend=backend) as gw:
        async with connect(gw) as (reader, writer):
            writer.write(CASES["stream"])
            await reader.readuntil(b"response.output_text.delta")
        await backend.records[-1].wait_disconnect()
        assert route(gw).served == 1
        metrics = gw.gateway.metrics.render().decode()
        assert 'route="/v1/responses",status="499"} 1' in metrics


async def test_a_slow_reader_pauses_the_writer_and_gets_every_byte() -> None:
    words = ["x" * 2000] * 1500  # ~3 MB of deltas: far more than the socket buffers
    script = [*text_chunks(words), finish("stop"), usage(1, len(words)), b"data: [DONE]\n\n"]
    paused = asyncio.Event()
    original = FastProtocol.pause_writing

    def spy(self: FastProtocol) -> None:
        original(self)
        paused.set()

    backend = ScriptedBackend(default_script=script)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(FastProtocol, "pause_writing", spy)
        async with GatewayHarness(backend=backend) as gw, connect(gw) as (reader, writer):
            writer.write(CASES["stream"])
            await paused.wait()  # nothing read yet: the gateway's writes had to wait
            answer = await read_answer(reader)
    events = answer.events()
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == "".join(words) and events[-1]["type"] == "response.completed"


async def test_off_every_request_is_aiohttps() -> None:
    async with GatewayHarness(fast_http=False) as gw:
        (answer,) = await exchange(gw, CASES["stream"])
        assert answer.events()[-1]["type"] == "response.completed"
        assert gw.runner is not None and FAST_ROUTE not in gw.runner.app


async def test_what_the_fast_path_answers_is_checked_for_conformance(
    _conformance: Collector,
) -> None:
    async with GatewayHarness() as gw:
        await exchange(gw, CASES["stream"], CASES["json"], CASES["bad json"])
        assert route(gw).served == 3
    kinds = [kind for kind, _ in _conformance.records]
    assert kinds.count("json") == 1 and kinds.count("http_error") == 1
    assert kinds.count("event") == len(kinds) - 2 > 3


async def test_a_late_body_is_answered_as_aiohttp_does() -> None:
    async with (
        GatewayHarness(fast_http=True, client_body_timeout=0.2) as fast,
        GatewayHarness(fast_http=False, client_body_timeout=0.2) as plain,
    ):
        answers = []
        for gw in (fast, plain):
            async with connect(gw) as (reader, writer):
                writer.write(CASES["json"][:-5])
                answers.append(await read_answer(reader))
                assert await reader.read() == b""  # and the connection is closed
        assert compared(answers[0]) == compared(answers[1])
        assert answers[0].status == 408


async def test_shutdown_closes_idle_fast_connections() -> None:
    gw = await GatewayHarness().start()
    try:
        async with connect(gw) as (reader, writer):
            writer.write(CASES["json"])
            assert (await read_answer(reader)).status == 200  # kept alive, now idle
            assert len(route(gw).conns) == 1
            assert gw.runner is not None
            runner, gw.runner = gw.runner, None
            await runner.cleanup()
            assert await reader.read() == b""
    finally:
        await gw.stop()
