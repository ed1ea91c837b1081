"""Graceful shutdown of a real `python -m streamer serve` process on SIGTERM.

The gateway must stop accepting connections at once, let the turns in flight (SSE, JSON,
WebSocket, background) finish until `--shutdown-grace` runs out, then end what is left
well: SSE and JSON turns as `response.failed`, WebSockets closed with 1001 (going away),
background responses failed in the store (Redis, read back by another process), and exit 0.
Every transport's turns are drained alike (one registry, one drain): the same grace, and
past it the same end (`response.failed`, the same message, stored the same).

`GatewayProcess` / `gateway_process` live in tests/builders.py.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from builders import GatewayProcess, client_session, gateway_process, parse_sse
from redis_server import RedisServer, requires_redis
from scripted_backend import (
    DONE,
    HANG,
    DelayHeaders,
    ScriptedBackend,
    Sleep,
    finish,
    text_chunks,
    usage,
)
from test_faults import BODY, DEADLINE, Outcome, check_error_body, check_events

from streamer.turns.gateway import SHUT_DOWN

REPO = Path(__file__).resolve().parents[1]


async def _stream_until_delta(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any]
) -> tuple[aiohttp.ClientResponse, bytes]:
    resp = await session.post(url + "/responses", json={**body, "stream": True})
    assert resp.status == 200, await resp.text()
    seen = b""
    while b"output_text.delta" not in seen:
        data = await resp.content.readany()
        assert data, seen
        seen += data
    return resp, seen


async def _finish_stream(resp: aiohttp.ClientResponse, seen: bytes) -> Outcome:
    async with asyncio.timeout(DEADLINE):
        seen += await resp.read()  # a torn body raises ClientPayloadError
    events = parse_sse(seen)
    response = check_events(events)
    code = response["error"]["code"] if response.get("error") else None
    return Outcome(200, code, response, events=events)


async def _ws_until_delta(
    session: aiohttp.ClientSession, gw: GatewayProcess, body: dict[str, Any]
) -> aiohttp.ClientWebSocketResponse:
    ws = await session.ws_connect(gw.ws_url)
    await ws.send_bytes(orjson.dumps({"type": "response.create", **body}))
    first = await ws.receive()  # response.created: the turn is in flight
    assert orjson.loads(first.data)["type"] == "response.created", first
    return ws


async def _ws_rest(ws: aiohttp.ClientWebSocketResponse) -> tuple[list[dict[str, Any]], int | None]:
    """Every frame until the server closes the socket, and the code of its close frame
    (None: the connection ended without one)."""
    frames = []
    async with asyncio.timeout(DEADLINE):
        while True:
            message = await ws.receive()
            if message.type == aiohttp.WSMsgType.CLOSE:
                return frames, message.data
            if message.type != aiohttp.WSMsgType.TEXT:
                return frames, None
            frames.append(orjson.loads(message.data))


async def _refused_within(gw: GatewayProcess, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not await asyncio.to_thread(gw.accepts):
            return True
        await asyncio.sleep(0.02)
    return False


def _slow_answer(text: str) -> list[Any]:
    """Text, a second of silence, more text, a normal end: a turn that takes ~1 s."""
    return [*text_chunks([text]), Sleep(1.0), *text_chunks([" done"], role=False),
            finish("stop"), usage(3, 2), DONE]  # fmt: skip


async def test_sigterm_lets_turns_finish_and_closes_sockets_1001(tmp_path: Path) -> None:
    async with ScriptedBackend() as backend:
        backend.responder = lambda body: _slow_answer(body["messages"][-1]["content"])
        async with (
            gateway_process(tmp_path / "gw.log", "--upstream", backend.base_url,
                            "--shutdown-grace", "10") as gw,
            client_session() as session,
        ):  # fmt: skip
            streams = [
                await _stream_until_delta(session, gw.url, {**BODY, "input": f"sse {i}"})
                for i in range(3)
            ]
            json_turn = asyncio.ensure_future(
                session.post(gw.url + "/responses", json={**BODY, "input": "json"})
            )
            busy = await _ws_until_delta(session, gw, {**BODY, "input": "ws"})
            idle = await session.ws_connect(gw.ws_url)
            while len(backend.requests) < 5:  # all five turns reached the backend
                await asyncio.sleep(0.01)

            signalled = time.monotonic()
            gw.process.send_signal(signal.SIGTERM)
            # every client keeps reading, as real ones do (a socket's close needs an answer)
            ends = asyncio.gather(
                *(_finish_stream(resp, seen) for resp, seen in streams),
                _ws_rest(busy),
                _ws_rest(idle),
            )
            assert await _refused_within(gw, 0.5), "still accepting connections after SIGTERM"

            *outcomes, (frames, code), (idle_frames, idle_code) = await ends
            for i, outcome in enumerate(outcomes):
                assert outcome.response is not None and outcome.response["status"] == "completed"
                assert outcome.text == f"sse {i} done"
            async with asyncio.timeout(DEADLINE):
                resp = await json_turn
                body = await resp.json()
            assert resp.status == 200 and body["status"] == "completed", body
            assert frames[-1]["type"] == "response.completed", frames[-1]
            assert frames[-1]["response"]["output"][0]["content"][0]["text"] == "ws done"
            assert code == 1001
            assert (idle_frames, idle_code) == ([], 1001)

            assert await gw.wait(DEADLINE) == 0, gw.log()
            # it left as soon as its turns were done, not at the end of its grace
            assert time.monotonic() - signalled < 10
            assert "Traceback" not in gw.log(), gw.log()
        assert backend.disconnects == 0  # no backend request was cut


async def test_sigterm_deadline_ends_turns_as_failed(tmp_path: Path) -> None:
    def answer(body: Any) -> list[Any]:
        if body["messages"][-1]["content"] == "unanswered":
            return [DelayHeaders(3600)]  # the backend never even answers
        return [*text_chunks(["Hel"]), HANG]

    async with ScriptedBackend() as backend:
        backend.responder = answer
        async with (
            gateway_process(tmp_path / "gw.log", "--upstream", backend.base_url,
                            "--shutdown-grace", "1") as gw,
            client_session() as session,
        ):  # fmt: skip
            resp, seen = await _stream_until_delta(session, gw.url, BODY)
            json_turn = asyncio.ensure_future(session.post(gw.url + "/responses", json=BODY))
            unanswered = asyncio.ensure_future(
                session.post(
                    gw.url + "/responses", json={**BODY, "input": "unanswered", "stream": True}
                )
            )
            ws = await _ws_until_delta(session, gw, BODY)
            while len(backend.requests) < 4:
                await asyncio.sleep(0.01)

            signalled = time.monotonic()
            gw.process.send_signal(signal.SIGTERM)
            socket_end = asyncio.ensure_future(_ws_rest(ws))
            outcome = await _finish_stream(resp, seen)  # well-formed to its last frame
            cut_at = time.monotonic() - signalled
            assert outcome.response is not None and outcome.response["status"] == "failed"
            assert outcome.code == "server_error"
            assert "shut down" in outcome.response["error"]["message"]
            assert outcome.text == "Hel"  # what was streamed is kept
            assert cut_at >= 0.9, f"ended {cut_at:.2f} s after SIGTERM, before its grace"
            async with asyncio.timeout(DEADLINE):
                resp = await json_turn
                body = await resp.json()
            assert resp.status == 200 and body["status"] == "failed", body
            assert body["error"]["code"] == "server_error"
            async with asyncio.timeout(DEADLINE):  # nothing was streamed yet: an HTTP error
                resp = await unanswered
                body = await resp.json()
            assert resp.status == 503 and check_error_body(body) == "server_shutting_down"
            frames, code = await socket_end
            assert code == 1001, (code, frames)

            assert await gw.wait(DEADLINE) == 0, gw.log()
            assert "Traceback" not in gw.log(), gw.log()
        for rec in backend.records[-4:]:  # and every backend request was let go
            await rec.wait_disconnect(DEADLINE)


@pytest.mark.redis
@requires_redis
async def test_sigterm_background_responses_are_not_lost(tmp_path: Path) -> None:
    async with RedisServer() as redis, ScriptedBackend() as backend:
        store = ["--store", redis.url]

        def answer(body: Any) -> list[Any]:
            text = body["messages"][-1]["content"]
            return _slow_answer(text) if text == "done" else [*text_chunks(["Hel"]), HANG]

        backend.responder = answer
        async with client_session() as session:
            async with gateway_process(tmp_path / "a.log", "--upstream", backend.base_url,
                                       "--shutdown-grace", "0.5", *store) as gw:  # fmt: skip
                ids = {}
                for text in ("done", "stuck"):
                    body = {**BODY, "input": text, "background": True}
                    async with session.post(gw.url + "/responses", json=body) as resp:
                        assert resp.status == 200, await resp.text()
                        ids[text] = (await resp.json())["id"]
                async with session.get(f"{gw.url}/responses/{ids['done']}?stream=true") as resp:
                    assert parse_sse(await resp.read())[-1]["type"] == "response.completed"
                # a stream in flight, so the shutdown has something to drain meanwhile
                stream, seen = await _stream_until_delta(session, gw.url, {**BODY, "input": "sse"})
                gw.process.send_signal(signal.SIGTERM)
                outcome = await _finish_stream(stream, seen)
                assert outcome.response is not None and outcome.response["status"] == "failed"
                assert await gw.wait(DEADLINE) == 0, gw.log()
                assert "Traceback" not in gw.log(), gw.log()
            # another instance, on the same store, reads what the first one left
            async with gateway_process(tmp_path / "b.log", "--upstream", backend.base_url,
                                       *store) as other:  # fmt: skip
                for text, status in (("done", "completed"), ("stuck", "failed")):
                    rid = ids[text]
                    async with session.get(f"{other.url}/responses/{rid}") as resp:
                        record = await resp.json()
                    assert record["status"] == status, record
                    async with session.get(f"{other.url}/responses/{rid}?stream=true") as resp:
                        events = parse_sse(await resp.read())
                    assert events[-1]["type"] == f"response.{status}", events[-1]
                    assert events[-1]["response"]["status"] == status
                    if status == "failed":
                        assert events[-1]["response"]["error"]["code"] == "server_error"
                        assert "shut down" in events[-1]["response"]["error"]["message"]


async def _backend_has(backend: ScriptedBackend, n: int) -> None:
    """Until `n` requests reached the backend (a hang fails the test at DEADLINE)."""
    async with asyncio.timeout(DEADLINE):
        while len(backend.requests) < n:
            await asyncio.sleep(0.01)


async def _stored(
    session: aiohttp.ClientSession, gw: GatewayProcess, rid: str
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """A response as another instance reads it: its record, and its last logged event for
    a background one (else None)."""
    async with session.get(f"{gw.url}/responses/{rid}") as resp:
        assert resp.status == 200, await resp.text()
        record = await resp.json()
    last = None
    if record.get("background"):
        async with session.get(f"{gw.url}/responses/{rid}?stream=true") as resp:
            last = parse_sse(await resp.read())[-1]
    return record, last


@pytest.mark.redis
@requires_redis
@pytest.mark.parametrize("fast_http", ["true", "false"])
async def test_every_transport_ends_a_shut_down_turn_the_same_way(
    tmp_path: Path, fast_http: str
) -> None:
    """SSE, JSON, WebSocket and background turns still running at the deadline: each ends
    with the same terminal event (`response.failed`, `server_error`, the same message) and
    is stored the same (failed, with that error), as another instance reads it."""
    async with RedisServer() as redis, ScriptedBackend() as backend:
        backend.responder = lambda body: [*text_chunks(["Hel"]), HANG]
        store = ["--store", redis.url]
        async with client_session() as session:
            async with gateway_process(tmp_path / "a.log", "--upstream", backend.base_url,
                                       "--shutdown-grace", "1", "--fast-http", fast_http,
                                       *store) as gw:  # fmt: skip
                resp, seen = await _stream_until_delta(session, gw.url, BODY)
                json_turn = asyncio.ensure_future(session.post(gw.url + "/responses", json=BODY))
                ws = await _ws_until_delta(session, gw, BODY)
                body = {**BODY, "background": True}
                async with session.post(gw.url + "/responses", json=body) as queued:
                    background_id = (await queued.json())["id"]
                await _backend_has(backend, 4)

                gw.process.send_signal(signal.SIGTERM)
                socket_end = asyncio.ensure_future(_ws_rest(ws))
                sse = await _finish_stream(resp, seen)
                async with asyncio.timeout(DEADLINE):
                    answer = await json_turn
                    assert answer.status == 200
                    whole = await answer.json()
                frames, code = await socket_end
                assert code == 1001, (code, frames)
                assert await gw.wait(DEADLINE) == 0, gw.log()
                assert "Traceback" not in gw.log(), gw.log()
            assert sse.events[-1]["type"] == frames[-1]["type"] == "response.failed"
            ended = {
                "sse": sse.events[-1]["response"],
                "json": whole,
                "websocket": frames[-1]["response"],
            }
            async with gateway_process(tmp_path / "b.log", "--upstream", backend.base_url,
                                       *store) as other:  # fmt: skip
                stored = {k: await _stored(session, other, r["id"]) for k, r in ended.items()}
                stored["background"] = await _stored(session, other, background_id)
    error = ended["sse"]["error"]
    assert (error["code"], error["message"]) == ("server_error", SHUT_DOWN)
    for transport, response in ended.items():
        assert (response["status"], response["error"]) == ("failed", error), transport
    for transport, (record, _) in stored.items():
        assert (record["status"], record["error"]) == ("failed", error), transport
    last = stored["background"][1]
    assert last is not None and last["type"] == "response.failed"
    assert last["response"]["error"] == error


@pytest.mark.redis
@requires_redis
async def test_sigterm_gives_a_background_turn_the_grace_a_stream_gets(tmp_path: Path) -> None:
    """A background turn alone in flight at SIGTERM with `--shutdown-grace 30`: the gateway
    waits for it, as it would for a stream, and it completes (issue 27, row 2: it ended
    `failed` at once)."""
    async with RedisServer() as redis, ScriptedBackend() as backend:
        backend.responder = lambda body: [  # past aiohttp's own 1 s wait for handlers
            *text_chunks(["background"]), Sleep(3.0), *text_chunks([" done"], role=False),
            finish("stop"), usage(3, 2), DONE,
        ]  # fmt: skip
        store = ["--store", redis.url]
        async with client_session() as session:
            async with gateway_process(tmp_path / "a.log", "--upstream", backend.base_url,
                                       "--shutdown-grace", "30", *store) as gw:  # fmt: skip
                body = {**BODY, "background": True}
                async with session.post(gw.url + "/responses", json=body) as queued:
                    rid = (await queued.json())["id"]
                await _backend_has(backend, 1)
                signalled = time.monotonic()
                gw.process.send_signal(signal.SIGTERM)
                assert await gw.wait(40) == 0, gw.log()
                assert time.monotonic() - signalled < 30  # it left once the turn was done
                assert "Traceback" not in gw.log(), gw.log()
            async with gateway_process(tmp_path / "b.log", "--upstream", backend.base_url,
                                       *store) as other:  # fmt: skip
                record, last = await _stored(session, other, rid)
    assert record["status"] == "completed", record
    assert record["output"][0]["content"][0]["text"] == "background done"
    assert last is not None and last["type"] == "response.completed"
