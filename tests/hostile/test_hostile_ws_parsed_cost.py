"""Issue 25, row 3: the WebSocket queue budget counted text, and kept parsed frames.

Frames full of `{}` items are 3 bytes of text per item and 72 bytes of Python objects
once parsed, and permessage-deflate makes them ~1,000 times smaller still on the wire:
3 sockets sending 85 KiB of compressed frames held 2.2 GB while queued, ~22x
`--ws-max-queued-bytes`. A frame is now charged what it holds once parsed, worked out
from its text before it is parsed (`ws_queue.frame_cost`): such a frame is refused with
`websocket_queue_full` and never parsed, and the gateway's memory stays flat.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from builders import GatewayProcess, gateway_process
from scripted_backend import HANG, ScriptedBackend

QUEUE_FULL = "websocket_queue_full"
MiB = 2**20


def peak_rss(gw: GatewayProcess) -> int:
    """The gateway process's peak resident memory so far (VmHWM), in bytes."""
    for line in Path(f"/proc/{gw.process.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def empty_items(count: int) -> str:
    """A create of `count` `{}` input items: ~3 bytes of text each, 72 once parsed."""
    return (
        '{"type":"response.create","model":"m","store":false,"input":['
        + ",".join(["{}"] * count)
        + "]}"
    )


async def attack(url: str, frames: int, items: int) -> list[dict[str, Any]]:
    """One compressed socket: a create that runs (the backend never answers), then
    `frames` frames of `items` empty items queued behind it on the same lane, then a
    frame that is not JSON, whose error says every frame before it was dealt with.
    Returns the error events, in order."""
    running = orjson.dumps({"type": "response.create", "model": "m", "input": "hi"}).decode()
    bomb = empty_items(items)
    errors: list[dict[str, Any]] = []
    async with aiohttp.ClientSession() as http:
        ws = await http.ws_connect(url, compress=15, max_msg_size=0)
        await ws.send_str(running)
        for _ in range(frames):
            await ws.send_str(bomb)
        await ws.send_str("not json")
        async with asyncio.timeout(60):
            while True:
                message = await ws.receive()
                assert message.type == aiohttp.WSMsgType.TEXT, message
                event = orjson.loads(message.data)
                if event["type"] != "error":
                    continue
                errors.append(event)
                if event["error"]["code"] == "invalid_json":
                    break
        await ws.close()
    return errors


def check_refused(errors: list[dict[str, Any]], frames: int) -> None:
    """Every bomb frame refused on arrival with the documented error, then the sentinel."""
    assert [e["error"]["code"] for e in errors] == [QUEUE_FULL] * frames + ["invalid_json"]
    for event in errors[:-1]:
        assert event["status"] == 429
        assert event["error"]["type"] == "invalid_request_error"
        assert "once parsed" in event["error"]["message"]


async def test_compressed_frames_of_empty_items_are_refused_unparsed(tmp_path: Path) -> None:
    """Three 3 MB frames of `{}` items (a few KiB compressed) behind a running create,
    with an 8 MB bound: each is ~200 MB once parsed, so each is refused, unparsed. Before,
    two were taken (their text fits) and held ~150 MB of parsed objects."""
    async with (
        ScriptedBackend(responder=lambda body: [HANG]) as backend,
        gateway_process(
            tmp_path / "gateway.log", "--upstream", backend.base_url,
            "--ws-max-queued-bytes", str(8_000_000),
        ) as gw,
    ):  # fmt: skip
        before = gw.rss()
        errors = await attack(gw.ws_url, frames=3, items=1_000_000)
        peak = peak_rss(gw)
    print(
        f"\nws parsed cost 3 x 3 MB of {{}}: rss before {before >> 20} MiB, peak {peak >> 20} MiB"
    )
    check_refused(errors, 3)
    assert peak - before < 100 * MiB, (before, peak)  # one bomb's text at a time


@pytest.mark.slow
async def test_the_issue_figure_three_sockets_default_bounds(tmp_path: Path) -> None:
    """The issue's figure: 3 sockets, each three ~10 MiB frames of `{}` (~85 KiB
    compressed in all) behind a running create, default bounds; prints the peak RSS."""
    async with (
        ScriptedBackend(responder=lambda body: [HANG]) as backend,
        gateway_process(tmp_path / "gateway.log", "--upstream", backend.base_url) as gw,
    ):
        before = gw.rss()
        results = await asyncio.gather(
            *(attack(gw.ws_url, frames=3, items=3_400_000) for _ in range(3))
        )
        peak = peak_rss(gw)
    print(f"\nws parsed cost, 3 sockets: rss before {before >> 20} MiB, peak {peak >> 20} MiB")
    for errors in results:
        check_refused(errors, 3)
    assert peak - before < 300 * MiB, (before, peak)
