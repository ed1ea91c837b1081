"""The fast path (`--fast-http`) on a real gateway: what only a raw socket shows (a
pipeline, keep-alive then another route, Connection: close, a head byte by byte, a
refusal before the body, a late body, a client leaving, a slow reader, shutdown).
Both servers answering every head alike is tests/test_fast_http_differential.py's."""

from __future__ import annotations

import asyncio
import socket

import openai
import orjson
import pytest
from conformance import Collector
from harness import GatewayHarness
from raw_http import compared, connect, exchange, post, read_answer
from scripted_backend import HANG, ScriptedBackend, finish, text_chunks, usage

from streamer.frontends.fast_http import FAST_ROUTE, FastProtocol, FastRoute

try:
    from compression import zstd  # type: ignore[import-not-found]
except ImportError:
    from backports import zstd  # type: ignore[import-not-found,no-redef]

KEY = "sk-fast-000"


def route(gw: GatewayHarness) -> FastRoute:
    assert gw.runner is not None
    return gw.runner.app[FAST_ROUTE]


TEXT = {"model": "m", "input": "hi"}
CASES: dict[str, bytes] = {
    "stream": post({**TEXT, "stream": True}),
    "json": post(TEXT),
    "bad json": post(b'{"model": "m",'),
}


async def test_the_request_metrics_are_the_same() -> None:
    async with (
        GatewayHarness(fast_http=True) as fast,
        GatewayHarness(fast_http=False) as plain,
    ):
        for gw in (fast, plain):
            for raw in (CASES["stream"], CASES["json"], CASES["bad json"]):
                await exchange(gw.url, raw)
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
        assert route(fast).served == 3


async def test_a_zstd_body_as_codex_sends_it_is_the_fast_paths() -> None:
    async with GatewayHarness() as gw:
        raw = post(zstd.compress(orjson.dumps({**TEXT, "stream": True})), "Content-Encoding: zstd")
        (answer,) = await exchange(gw.url, raw)
        assert answer.events()[-1]["type"] == "response.completed"
        assert route(gw).served == 1


async def test_a_refusal_from_the_head_is_answered_before_the_body() -> None:
    async with GatewayHarness(api_keys=(KEY,)) as gw, connect(gw.url) as (reader, writer):
        head = post(b"x" * 100_000)[:-100_000]
        writer.write(head)
        answer = await read_answer(reader)  # not a byte of the body sent
        assert answer.status == 401 and answer.headers["Connection"] == "close"
        writer.write(b"x" * 100_000)  # the body, dropped as it comes; then the close
        assert await reader.read() == b""
        assert route(gw).served == 1


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


HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n"


async def test_a_pipeline_in_one_read_is_aiohttps_whole() -> None:
    """Two requests in the same bytes: aiohttp reads them all (and would answer only a 400
    if the second were broken), so it is given them all."""
    async with GatewayHarness() as gw:
        answers = await exchange(
            gw.url, CASES["stream"], CASES["json"], CASES["stream"], HEALTHZ, CASES["json"]
        )
        assert [a.status for a in answers] == [200] * 5
        assert answers[0].events()[-1]["type"] == "response.completed"
        assert orjson.loads(answers[1].body)["status"] == "completed"
        assert orjson.loads(answers[3].body)["status"] == "ok"
        assert orjson.loads(answers[4].body)["object"] == "response"
        assert route(gw).served == 0


async def test_requests_one_by_one_are_the_fast_paths_until_another_route() -> None:
    async with GatewayHarness() as gw, connect(gw.url) as (reader, writer):
        for raw in (CASES["stream"], CASES["json"], HEALTHZ, CASES["json"]):
            writer.write(raw)
            answer = await read_answer(reader)
            assert answer.status == 200
        assert orjson.loads(answer.body)["object"] == "response"
        assert route(gw).served == 2  # aiohttp has had the connection since the GET


async def test_keep_alive_then_connection_close() -> None:
    async with GatewayHarness() as gw, connect(gw.url) as (reader, writer):
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
    async with GatewayHarness() as gw, connect(gw.url) as (reader, writer):
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for byte in CASES["stream"]:
            writer.write(bytes([byte]))
            await writer.drain()
        answer = await read_answer(reader)
        assert answer.events()[-1]["type"] == "response.completed"
        assert route(gw).served == 1


async def test_a_body_that_does_not_arrive_is_a_408_and_a_close() -> None:
    async with GatewayHarness(client_body_timeout=0.2) as gw, connect(gw.url) as (reader, writer):
        raw = CASES["json"]
        writer.write(raw[:-5])
        answer = await read_answer(reader)
        assert answer.status == 408 and answer.headers.getall("Connection") == ["close"]
        assert orjson.loads(answer.body)["error"]["code"] == "request_timeout"
        assert await reader.read() == b""


async def test_a_client_leaving_mid_stream_lets_the_backend_go() -> None:
    backend = ScriptedBackend(default_script=[*text_chunks(["Hel"]), HANG])
    async with GatewayHarness(backend=backend) as gw:
        async with connect(gw.url) as (reader, writer):
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
        async with GatewayHarness(backend=backend) as gw, connect(gw.url) as (reader, writer):
            writer.write(CASES["stream"])
            await paused.wait()  # nothing read yet: the gateway's writes had to wait
            answer = await read_answer(reader)
    events = answer.events()
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == "".join(words) and events[-1]["type"] == "response.completed"


async def test_off_every_request_is_aiohttps() -> None:
    async with GatewayHarness(fast_http=False) as gw:
        (answer,) = await exchange(gw.url, CASES["stream"])
        assert answer.events()[-1]["type"] == "response.completed"
        assert gw.runner is not None and FAST_ROUTE not in gw.runner.app


async def test_what_the_fast_path_answers_is_checked_for_conformance(
    _conformance: Collector,
) -> None:
    async with GatewayHarness() as gw:
        for raw in (CASES["stream"], CASES["json"], CASES["bad json"]):
            await exchange(gw.url, raw)
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
            async with connect(gw.url) as (reader, writer):
                writer.write(CASES["json"][:-5])
                answers.append(await read_answer(reader))
                assert await reader.read() == b""  # and the connection is closed
        assert compared(answers[0]) == compared(answers[1])
        assert answers[0].status == 408


async def test_shutdown_closes_idle_fast_connections() -> None:
    gw = await GatewayHarness().start()
    try:
        async with connect(gw.url) as (reader, writer):
            writer.write(CASES["json"])
            assert (await read_answer(reader)).status == 200  # kept alive, now idle
            assert len(route(gw).conns) == 1
            assert gw.runner is not None
            runner, gw.runner = gw.runner, None
            await runner.cleanup()
            assert await reader.read() == b""
    finally:
        await gw.stop()
