"""Issue 13, row 4: one WebSocket floods the gateway with large frames against a slow backend.

Before the fix every frame was parsed and queued on its lane without a bound: 150 frames
of 15 MB took the gateway's RSS linearly to 2.4 GB. Now a socket holds at most
`--ws-max-queued-frames` frames and `--ws-max-queued-bytes` bytes (queued or running);
a frame beyond gets a `websocket_queue_full` error event and is dropped unparsed, and
after `--ws-max-rejected-frames` rejections in a row the next one closes the socket 1008.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from builders import GatewayProcess, gateway_process
from harness import GatewayHarness
from raw_backend import RawBackend, RawConnection, chunked, http_response, sse_data, sse_head
from scripted_backend import HANG, ScriptedBackend, finish, text_chunks, usage

QUEUE_FULL = "websocket_queue_full"
MB = 1_000_000


def create(text: str, lane: str | None = None) -> dict[str, Any]:
    frame: dict[str, Any] = {"type": "response.create", "model": "m", "input": text, "store": False}
    if lane is not None:
        frame["stream_id"] = lane
    return frame


def peak_rss(gw: GatewayProcess) -> int:
    """The gateway process's peak resident memory so far (VmHWM), in bytes."""
    for line in Path(f"/proc/{gw.process.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


async def flood(url: str, count: int, size: int) -> tuple[list[dict[str, Any]], int | None, int]:
    """Send `count` create frames of about `size` bytes on one socket, as fast as the socket
    takes them, reading meanwhile. Returns the frames the gateway sent, its close code
    (None: no close frame) and how many frames were sent before the socket closed."""
    frame = orjson.dumps(create("x" * size)).decode()
    sent = 0
    received: list[dict[str, Any]] = []
    async with aiohttp.ClientSession() as http:
        ws = await http.ws_connect(url, compress=0, max_msg_size=0)

        async def send_all() -> None:
            nonlocal sent
            with contextlib.suppress(ConnectionError, aiohttp.ClientError):
                for _ in range(count):
                    await ws.send_str(frame)
                    sent += 1

        sender = asyncio.create_task(send_all())
        try:
            async with asyncio.timeout(60):
                while (message := await ws.receive()).type == aiohttp.WSMsgType.TEXT:
                    received.append(orjson.loads(message.data))
        finally:
            sender.cancel()
            await asyncio.wait({sender})
        code = (
            ws.close_code
            if message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
            else None
        )
        await ws.close()
    return received, code, sent


def check_flood(received: list[dict[str, Any]], code: int | None, rejections: int) -> None:
    """Error events for the frames over the bound, then a 1008 close."""
    errors = [f for f in received if f["type"] == "error"]
    assert len(errors) == rejections + 1, [f["type"] for f in received]
    for event in errors:
        assert event["status"] == 429
        assert event["error"]["code"] == QUEUE_FULL
        assert event["error"]["type"] == "invalid_request_error"
        assert "at most" in event["error"]["message"]
    assert code == aiohttp.WSCloseCode.POLICY_VIOLATION  # 1008


async def test_flood_of_large_frames_is_rejected_then_closed(tmp_path: Path) -> None:
    """40 frames of 4 MB against a backend that never answers, small bounds: two frames are
    held, the next five get `websocket_queue_full`, the fifth closes 1008; RSS stays low."""
    async with ScriptedBackend(responder=lambda body: [HANG]) as backend:
        args = ("--upstream", backend.base_url, "--ws-max-queued-bytes", str(10 * MB),
                "--ws-max-queued-frames", "8", "--ws-max-rejected-frames", "4")  # fmt: skip
        async with gateway_process(tmp_path / "gateway.log", *args) as gw:
            before = gw.rss()
            received, code, sent = await flood(gw.ws_url, 40, 4 * MB)
            peak = peak_rss(gw)
            # The held turns were cut with the socket: their backend requests went away.
            for record in [r for r in backend.records if r.path.endswith("/chat/completions")]:
                await record.wait_disconnect(timeout=10)
    print(
        f"\nws flood 40 x 4 MB: sent {sent}, rss before {before >> 20} MiB, peak {peak >> 20} MiB"
    )
    check_flood(received, code, rejections=4)
    # Unbounded, 40 parsed 4 MB frames alone are 160 MB; bounded, two are held at a time.
    assert peak - before < 120 * 2**20, (before, peak)


@pytest.mark.slow
async def test_flood_150_frames_of_15_mb_default_limits(tmp_path: Path) -> None:
    """The issue's figure: 150 frames of 15 MB with the default bounds (prints the peak RSS)."""
    async with (
        ScriptedBackend(responder=lambda body: [HANG]) as backend,
        gateway_process(tmp_path / "gateway.log", "--upstream", backend.base_url) as gw,
    ):
        before = gw.rss()
        received, code, sent = await flood(gw.ws_url, 150, 15 * MB)
        peak = peak_rss(gw)
    print(
        f"\nws flood 150 x 15 MB: sent {sent}, rss before {before >> 20} MiB, peak {peak >> 20} MiB"
    )
    check_flood(received, code, rejections=8)
    assert peak - before < 400 * 2**20, (before, peak)


class HeldBackend:
    """Answers every chat request with "ok", each only once `release` is set."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.requests = 0
        self.started = asyncio.Condition()

    async def __call__(self, conn: RawConnection) -> None:
        while (request := await conn.request()) is not None:
            if "/models" in request.line:
                await conn.send(http_response(orjson.dumps({"object": "list", "data": []})))
                continue
            async with self.started:
                self.requests += 1
                self.started.notify_all()
            await conn.send(sse_head())
            await self.release.wait()
            for part in (*text_chunks(["ok"]), finish("stop"), usage(3, 1)):
                await conn.send(sse_data(part))
            await conn.send(sse_data(b"[DONE]") + chunked(b""))

    async def wait_requests(self, n: int) -> None:
        async with self.started:
            await self.started.wait_for(lambda: self.requests >= n)


async def test_rejected_frames_leave_the_socket_usable() -> None:
    """Over the frame bound: an error event on the spot, the held turns go on, and once
    they end the socket takes new frames again (lanes and their order are untouched)."""
    held = HeldBackend()
    async with (
        RawBackend(held) as backend,
        GatewayHarness(
            upstream=backend.url, ws_max_queued_frames=2, ws_max_rejected_frames=3
        ) as gw,
        aiohttp.ClientSession() as http,
        asyncio.timeout(20),
    ):
        ws = await http.ws_connect(gw.ws_url)
        await ws.send_json(create("one", "a"))
        await ws.send_json(create("two", "b"))
        await held.wait_requests(2)  # both are running: the socket holds two frames
        await ws.send_json(create("three", "c"))
        while (rejected := orjson.loads((await ws.receive()).data))["type"] != "error":
            assert rejected["type"] in ("response.created", "response.in_progress"), rejected
        assert rejected["error"]["code"] == QUEUE_FULL
        assert "2 frames" in rejected["error"]["message"]
        held.release.set()
        done: dict[str, str] = {}
        while len(done) < 2:
            event = orjson.loads((await ws.receive()).data)
            if event["type"] == "response.completed":
                done[event["stream_id"]] = event["response"]["output"][0]["content"][0]["text"]
        assert done == {"a": "ok", "b": "ok"}
        await ws.send_json(create("three", "c"))  # room again: accepted and run
        while (event := orjson.loads((await ws.receive()).data))["type"] != "response.completed":
            assert event["type"] != "error", event
        assert event["stream_id"] == "c"
        assert gw.gateway.stats["ws_turns"] == 3
        await ws.close()
