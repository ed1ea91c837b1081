"""Responses WebSocket mode: lanes, limits and the connection's lifecycle, on loopback.

The scripted backend answers by content (`responder`), with sleeps, so that the order
in which frames reach the client shows what ran concurrently and what waited.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import time
import weakref
from typing import Any

import aiohttp
import orjson
import pytest
import websockets
from harness import GatewayHarness
from scripted_backend import DONE, HANG, ScriptedBackend, Sleep, finish, text_chunks, usage
from test_websocket import (
    TERMINAL,
    RawSocket,
    check_frame,
    final,
    only_session,
    open_socket,
    read_until_terminal,
    turn,
)

from streamer.frontends import websocket
from streamer.frontends.websocket import SESSIONS

END = [finish("stop"), usage(5, 2), DONE]


def paced(body: Any) -> list[Any]:
    """`slow:<label>` answers in three pieces 0.25 s apart; anything else at once."""
    text = body["messages"][-1]["content"]
    if text.startswith("slow:"):
        label = text[5:]
        return [*text_chunks([label]), Sleep(0.25), *text_chunks(["-"]), Sleep(0.25),
                *text_chunks(["end"]), *END]  # fmt: skip
    return [*text_chunks([f"re:{text}"]), *END]


def create(text: str, lane: str | None = None) -> dict[str, Any]:
    frame: dict[str, Any] = {"type": "response.create", "model": "m", "input": text, "store": False}
    if lane is not None:
        frame["stream_id"] = lane
    return frame


async def collect(sock: RawSocket, terminals: int) -> list[tuple[float, dict[str, Any]]]:
    """Frames with their arrival times until `terminals` responses have ended."""
    out: list[tuple[float, dict[str, Any]]] = []
    while terminals:
        frame = await asyncio.wait_for(sock.recv(), 10)
        out.append((time.monotonic(), frame))
        terminals -= frame["type"] in TERMINAL
    return out


def lane_task_count() -> int:
    return sum(1 for t in asyncio.all_tasks() if t.get_coro().__qualname__.startswith("Session."))


# -- lanes ------------------------------------------------------------------------------


async def test_lanes_run_concurrently_while_the_default_lane_is_fifo() -> None:
    backend = ScriptedBackend(responder=paced)
    async with GatewayHarness(backend=backend) as gw, open_socket(gw) as sock:
        for frame in (create("slow:d1"), create("slow:d2"), create("slow:a1", "a"),
                      create("slow:b1", "b"), create("slow:a2", "a")):  # fmt: skip
            await sock.send(frame)
        frames = await collect(sock, 5)

    created: dict[str, float] = {}
    span: dict[str, tuple[float, float]] = {}  # answer text -> (created, completed) times
    lane_of: dict[str, str | None] = {}
    for at, frame in frames:
        if frame["type"] == "response.created":
            created[frame["response"]["id"]] = at
        elif frame["type"] == "response.completed":
            response = frame["response"]
            text = response["output"][0]["content"][0]["text"]
            span[text] = (created[response["id"]], at)
            lane_of[text] = frame.get("stream_id")
    assert lane_of == {"d1-end": None, "d2-end": None, "a1-end": "a", "a2-end": "a", "b1-end": "b"}
    # Default lane and lane a: FIFO, the second starts only after the first ended.
    assert span["d2-end"][0] >= span["d1-end"][1]
    assert span["a2-end"][0] >= span["a1-end"][1]
    # Across lanes: a1 and b1 started before d1 ended, so they ran beside it.
    assert span["a1-end"][0] < span["d1-end"][1] and span["b1-end"][0] < span["d1-end"][1]
    # Every event echoes its lane: each lane's sequence numbers are whole runs from 0,
    # one per response on that lane (a missing stream_id would leave a gap).
    for lane, responses in ((None, 2), ("a", 2), ("b", 1)):
        numbers = [f["sequence_number"] for _, f in frames if f.get("stream_id") == lane]
        assert numbers.count(0) == responses, (lane, numbers)
        steps = itertools.pairwise(numbers)
        assert all(b == a + 1 or b == 0 for a, b in steps), (lane, numbers)


async def test_every_event_of_a_lane_carries_its_stream_id(gw: GatewayHarness) -> None:
    async with open_socket(gw, "sdk") as sock:
        frames = await turn(sock, input="hi", store=False, stream_id="lane.1-A_z")
        assert all(f["stream_id"] == "lane.1-A_z" for f in frames)
        missing = await turn(sock, input="hi", previous_response_id="resp_none", stream_id="x")
        assert missing[0]["type"] == "error" and missing[0]["stream_id"] == "x"
        plain = await turn(sock, input="hi", store=False)
        assert all("stream_id" not in f for f in plain)


async def test_at_most_sixteen_turns_in_flight() -> None:
    async with GatewayHarness() as gw, open_socket(gw) as sock:
        gw.backend.script(*[[Sleep(1.0), *text_chunks(["x"]), *END]] * 16)
        for i in range(17):
            await sock.send(create(f"q{i}", f"lane{i}"))
        frames = await collect(sock, 17)
    assert [f["type"] for _, f in frames].count("response.completed") == 17
    # Each of the first 16 holds the backend for 1 s: the 17th could only start after one ended.
    starts = [r.started_at for r in gw.backend.records]
    assert len(starts) == 17 and starts[16] - starts[0] >= 1.0
    first_done = min(at for at, f in frames if f["type"] == "response.completed")
    last_created = max(at for at, f in frames if f["type"] == "response.created")
    assert last_created >= first_done


@pytest.mark.parametrize("lane", ["", "has space", "x" * 257, 12, "ü"])
async def test_invalid_stream_id(lane: Any, gw: GatewayHarness) -> None:
    async with open_socket(gw) as sock:
        await sock.send({**create("hi"), "stream_id": lane})
        error = await sock.recv()
        assert error["type"] == "error" and error["status"] == 400
        assert (error["error"]["code"], error["error"]["param"]) == (
            "invalid_stream_id",
            "stream_id",
        )
        assert final(await turn(sock, input="hi", store=False, stream_id="x" * 256))["status"] == (
            "completed"
        )


async def test_the_33rd_lane_is_refused(gw: GatewayHarness) -> None:
    async with open_socket(gw) as sock:
        for i in range(32):
            await sock.send(create(f"q{i}", f"lane{i}"))
        frames = await collect(sock, 32)
        assert [f["type"] for _, f in frames].count("response.completed") == 32
        await sock.send(create("one too many", "lane32"))
        error = await sock.recv()
        assert error["error"]["code"] == "websocket_stream_limit_reached"
        assert error["stream_id"] == "lane32" and error["status"] == 400
        # Lanes already in use, and the default lane, still serve.
        assert final(await turn(sock, input="again", store=False, stream_id="lane7"))["status"] == (
            "completed"
        )
        assert final(await turn(sock, input="default", store=False))["status"] == "completed"
    assert len(gw.backend.requests) == 34


# -- closing, cancelling, freeing ---------------------------------------------------------


@pytest.mark.parametrize("lanes", [[None], ["a", "b"]])
async def test_client_close_cancels_backend_and_frees_session(
    lanes: list[str | None], gw: GatewayHarness
) -> None:
    gw.backend.script(*[[*text_chunks(["a"]), HANG]] * len(lanes))
    async with open_socket(gw) as sock:
        for lane in lanes:
            await sock.send(create("hi", lane))
        deltas = 0
        while deltas < len(lanes):
            deltas += (await sock.recv())["type"] == "response.output_text.delta"
        session = only_session(gw)
        assert len(session.workers) == len(lanes)
        ref = weakref.ref(session)
        del session
    for record in gw.backend.records:
        assert await record.wait_disconnect(timeout=5) < 5
    for _ in range(100):
        if not gw.runner.app[SESSIONS]:  # type: ignore[union-attr]
            break
        await asyncio.sleep(0.01)
    assert not gw.runner.app[SESSIONS]  # type: ignore[union-attr]
    gc.collect()
    assert ref() is None  # nothing holds the session's state any more
    assert lane_task_count() == 0


async def test_idle_socket_holds_no_task_of_its_own(gw: GatewayHarness) -> None:
    async with open_socket(gw) as sock:
        await turn(sock, input="hi", store=False)
        await turn(sock, input="hi", store=False, stream_id="a")
        session = only_session(gw)
        for _ in range(100):
            if not session.workers:
                break
            await asyncio.sleep(0.01)
        assert session.workers == set() and session.queues == {}
        assert lane_task_count() == 0
        assert len(session.remembered) == 2
        # The lane is reusable after its worker exited, and still counts as used.
        assert final(await turn(sock, input="again", store=False, stream_id="a"))["status"] == (
            "completed"
        )
        assert session.named == {"a"}


# -- limits -----------------------------------------------------------------------------


async def test_message_over_the_limit_closes_1009() -> None:
    async with GatewayHarness(ws_max_message_bytes=4096) as gw, open_socket(gw) as sock:
        fits = await turn(sock, input="x" * 3000, store=False)  # the whole frame is < 4096
        assert final(fits)["status"] == "completed"
        await sock.send(create("x" * 5000))
        with pytest.raises(websockets.ConnectionClosed):
            await asyncio.wait_for(sock.recv(), 5)
        assert sock.ws.close_code == 1009
    assert len(gw.backend.requests) == 1


async def test_connection_lifetime_limit() -> None:
    async with GatewayHarness(ws_lifetime=0.6) as gw, open_socket(gw) as sock:
        gw.backend.script([*text_chunks(["a"]), HANG])
        opened = time.monotonic()
        await sock.send(create("hi"))
        frames = []
        while not frames or frames[-1]["type"] != "error":
            frames.append(await asyncio.wait_for(sock.recv(), 5))
        error = frames[-1]
        assert error == {
            "type": "error",
            "status": 400,
            "error": {
                "type": "invalid_request_error",
                "code": "websocket_connection_limit_reached",
                "message": error["error"]["message"],
                "param": None,
            },
        }
        assert time.monotonic() - opened >= 0.5
        with pytest.raises(websockets.ConnectionClosedOK):
            await asyncio.wait_for(sock.recv(), 5)
        assert sock.ws.close_code == 1000
        # The turn in flight was cancelled with it.
        assert await gw.backend.records[-1].wait_disconnect(timeout=5) < 5


@pytest.mark.parametrize("compression", ["deflate", None])
@pytest.mark.parametrize("accepted", [True, False])
async def test_permessage_deflate_when_offered_and_accepted(
    compression: str | None, accepted: bool
) -> None:
    """--ws-compression (off by default: a compressor per open socket) takes the offer; a
    declined offer leaves the socket uncompressed, and the client none the worse."""
    async with GatewayHarness(ws_compression=accepted) as gw:
        gw.backend.script([*text_chunks(["squeezed " * 50]), *END])
        async with open_socket(gw, compression=compression) as sock:
            extensions = sock.ws.response.headers.get("Sec-WebSocket-Extensions", "")
            assert ("permessage-deflate" in extensions) == (compression == "deflate" and accepted)
            answer = final(await turn(sock, input="hi", store=False))
            assert answer["output"][0]["content"][0]["text"] == "squeezed " * 50


async def test_silent_peer_is_dropped_by_heartbeat(
    gw: GatewayHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(websocket, "HEARTBEAT", 0.2)
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(gw.ws_url, autoping=False) as ws,  # never answers a ping
    ):
        first = await asyncio.wait_for(ws.receive(), 5)
        assert first.type is aiohttp.WSMsgType.PING
        last = first
        while last.type not in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED,
                                aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.ERROR):  # fmt: skip
            last = await asyncio.wait_for(ws.receive(), 5)
    for _ in range(100):
        if not gw.runner.app[SESSIONS]:  # type: ignore[union-attr]
            break
        await asyncio.sleep(0.01)
    assert not gw.runner.app[SESSIONS]  # type: ignore[union-attr]


async def test_answering_peer_stays_connected(
    gw: GatewayHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(websocket, "HEARTBEAT", 0.1)
    async with open_socket(gw) as sock:  # websockets answers pings itself
        await asyncio.sleep(0.5)
        assert final(await turn(sock, input="hi", store=False))["status"] == "completed"


# -- the upgrade ------------------------------------------------------------------------


async def test_plain_get_is_405_in_openai_shape(gw: GatewayHarness) -> None:
    async with aiohttp.ClientSession() as session, session.get(gw.url + "/responses") as resp:
        assert resp.status == 405
        body = await resp.json()
    assert body["error"]["code"] == "method_not_allowed"
    assert set(body["error"]) == {"message", "type", "param", "code"}


async def test_upgrade_needs_the_api_key_and_can_forward_it() -> None:
    async with GatewayHarness(api_keys=("secret",), forward_authorization=True) as gw:
        with pytest.raises(websockets.InvalidStatus) as refused:
            async with websockets.connect(
                gw.ws_url, additional_headers={"Authorization": "Bearer no"}
            ):
                pass
        assert refused.value.response.status_code == 401
        assert b"invalid_api_key" in refused.value.response.body
        headers = {"Authorization": "Bearer secret"}
        async with websockets.connect(gw.ws_url, additional_headers=headers) as ws:
            sock = RawSocket(ws)
            assert final(await turn(sock, input="hi", store=False))["status"] == "completed"
    assert gw.backend.records[-1].headers["Authorization"] == "Bearer secret"


async def test_shutdown_finishes_turns_then_closes_1001() -> None:
    gw = await GatewayHarness().start()
    stopping: asyncio.Task[None] | None = None
    try:
        gw.backend.script([*text_chunks(["a"]), Sleep(0.3), *text_chunks(["b"]), *END])
        async with open_socket(gw) as busy, open_socket(gw) as idle:
            await busy.send(create("hi"))
            assert (await busy.recv())["type"] == "response.created"
            started = time.monotonic()
            stopping = asyncio.create_task(gw.stop())
            frames = await read_until_terminal(busy)
            assert final(frames)["output"][0]["content"][0]["text"] == "ab"
            for sock in (busy, idle):
                with pytest.raises(websockets.ConnectionClosed):
                    await asyncio.wait_for(sock.recv(), 10)
                assert sock.ws.close_code == 1001
            await asyncio.wait_for(stopping, 10)
            assert time.monotonic() - started < 10  # not the 60 s shutdown timeout
    finally:
        if stopping is None:
            await gw.stop()


def test_frames_are_checked_against_the_sdk() -> None:
    # The validator itself rejects what the SDK would: a created event without a response.
    with pytest.raises(ValueError):
        check_frame(orjson.dumps({"type": "response.created", "sequence_number": 0}))
