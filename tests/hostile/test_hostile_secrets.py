"""Row 6 of issue 13: a backend that echoes the `--upstream-api-key` back.

The key must not reach anything a client, an operator or a disk sees: the bytes a client
gets (SSE, JSON, WebSocket, headers included), the stored response, the `--tap-dir`
recording and the logs. Fragments count: every substring of the key of 8 characters that
reaches past its prefix `sk-upstream-` is looked for, and none may appear. (The prefix says
what the key is, as `sk-proj-` does, and `upstream` is a word of the gateway's own, as in
its code `upstream_error`: that is no leak, and the gateway's words are never rewritten.) The backend is a raw TCP one, so it can put the key
where it hurts: across the cut of a long error text, across the cut of a malformed chunk's
quote or of a bad header line, across two reads of an error, across output deltas (text, reasoning, refusal, tool
arguments) and in a whole JSON completion.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from harness import GatewayHarness
from raw_backend import RawBackend, RawConnection, chunked, http_response, sse_data, sse_head

from streamer.turns.recorder import ExchangeRecorder

KEY = "sk-upstream-HOSTILE-0123456789abcd"  # 34 characters, as in the issue
CLIENT_KEY = "sk-client-of-the-gateway-000000"
PUBLIC = len("sk-upstream-")
FRAGMENTS = {KEY[i : i + 8] for i in range(len(KEY) - 7) if i + 8 > PUBLIC}
HALF = len(KEY) // 2
TOOLS = [{"type": "function", "name": "lookup", "parameters": {"type": "object"}}]


def delta(**fields: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": fields, "finish_reason": None}]}


def end(reason: str = "stop") -> bytes:
    stop = {"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]}
    return sse_data(stop) + chunked(b"data: [DONE]\n\n") + chunked(b"")


def pieces(text: str) -> list[str]:
    """`text` cut in three, two cuts inside the key."""
    at = text.index(KEY)
    return [text[: at + 5], text[at + 5 : at + HALF + 3], text[at + HALF + 3 :]]


@dataclass
class Scenario:
    """The writes of one backend answer; a `None` write waits until the gateway has read
    (and recorded) everything before it, so the next write is a read of its own."""

    name: str
    writes: list[bytes | None]
    tools: bool = False


def scenarios() -> list[Scenario]:
    long_text = "upstream proxy error: " + "x" * (500 - 22 - 10) + KEY + " (rejected)" + "y" * 300
    # the HTTP client quotes 80 bytes of a bad header line: the key straddles the cut
    bad_header = b"HTTP/1.1 200 OK\r\nX-Echo: " + b"q" * 60 + KEY.encode() + b"\0\r\n\r\n"
    bad_chunk = b"data: {oops " + b"z" * (120 - 12 - 9) + KEY.encode() + b" rest}\n\n"
    error = orjson.dumps({"error": {"message": f"bad key {KEY}", "code": "invalid_api_key"}})
    cut = error.index(KEY.encode()) + HALF
    split_error = [
        sse_head() + sse_data(delta(content="Hello")) + chunked(b"data: " + error[:cut]),
        None,
        chunked(error[cut:] + b"\n\n") + chunked(b""),
    ]

    def streamed(field_name: str, text: str) -> list[bytes | None]:
        return [
            sse_head() + b"".join(sse_data(delta(**{field_name: p})) for p in pieces(text)) + end()
        ]

    args = [f'{{"q": "{KEY[:9]}', f"{KEY[9:25]}", f'{KEY[25:]}"}}']
    first = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "lookup"}}
    tool = [delta(tool_calls=[{**first, "function": {"name": "lookup", "arguments": ""}}])]
    tool += [delta(tool_calls=[{"index": 0, "function": {"arguments": a}}]) for a in args]
    whole = {
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": f"it is {KEY}."}}],
    }
    return [
        Scenario(
            "long error text",
            [http_response(long_text.encode(), status="500 Oops", content_type="text/plain")],
        ),
        Scenario("malformed chunk", [sse_head() + chunked(bad_chunk) + chunked(b"")]),
        Scenario("bad header line", [bad_header]),
        Scenario("error split over reads", split_error),
        Scenario("text", streamed("content", f"The key is {KEY}, keep it.")),
        Scenario("reasoning", streamed("reasoning_content", f"I was sent {KEY} as key")),
        Scenario("refusal", streamed("refusal", f"I will not say {KEY}")),
        Scenario(
            "tool arguments",
            [sse_head() + b"".join(map(sse_data, tool)) + end("tool_calls")],
            tools=True,
        ),
        Scenario("json completion", [http_response(orjson.dumps(whole))]),
    ]


@dataclass
class Hostile:
    """The backend's state: what to answer next, and a wake-up when the gateway read it."""

    scenario: Scenario | None = None
    read: asyncio.Event = field(default_factory=asyncio.Event)
    sent_keys: list[str] = field(default_factory=list)

    async def handle(self, conn: RawConnection) -> None:
        while (request := await conn.request()) is not None:
            self.sent_keys.append(request.headers.get("authorization", ""))
            assert self.scenario is not None
            self.read.clear()
            for write in self.scenario.writes:
                if write is None:
                    await asyncio.wait_for(self.read.wait(), 10)
                else:
                    await conn.send(write)


def watch_recordings(gw: GatewayHarness, hostile: Hostile) -> None:
    """Tell the backend when the gateway has recorded a read (the recorder is the last
    stop of every backend byte, so then that read is over)."""
    tap = gw.gateway.tap
    assert tap is not None
    opener = tap.open

    def open_watched(response_id: str) -> ExchangeRecorder:
        recorder = opener(response_id)
        record: Callable[[bytes], None] = recorder.backend_chunk

        def backend_chunk(data: bytes) -> None:
            record(data)
            hostile.read.set()

        recorder.backend_chunk = backend_chunk  # type: ignore[method-assign]
        return recorder

    tap.open = open_watched  # type: ignore[method-assign]


async def run_http(
    http: aiohttp.ClientSession, gw: GatewayHarness, body: dict[str, Any], seen: list[bytes]
) -> set[str]:
    async with http.post(gw.url + "/responses", json=body) as resp:
        raw = await resp.read()
        seen += [raw, str(dict(resp.headers)).encode()]
    return set(_response_ids(raw))


async def run_ws(
    http: aiohttp.ClientSession, gw: GatewayHarness, body: dict[str, Any], seen: list[bytes]
) -> set[str]:
    async with http.ws_connect(gw.ws_url) as ws:
        await ws.send_str(orjson.dumps({"type": "response.create", **body}).decode())
        while True:
            message = await ws.receive(timeout=10)
            assert message.type == aiohttp.WSMsgType.TEXT, message
            seen.append(message.data.encode())
            event = orjson.loads(message.data)
            if event["type"] in ("response.completed", "response.failed", "error"):
                return set(_response_ids(message.data.encode()))


def _response_ids(raw: bytes) -> list[str]:
    found = []
    for part in raw.split(b'"id":"resp_')[1:]:
        found.append("resp_" + part.split(b'"', 1)[0].decode())
    return found


def leaks(material: bytes | str) -> int:
    """How many times any 8-character piece of the key occurs in `material`."""
    text = material.decode("utf-8", "replace") if isinstance(material, bytes) else material
    return sum(text.count(fragment) for fragment in FRAGMENTS)


@contextlib.asynccontextmanager
async def hostile_gateway(tmp_path: Path) -> AsyncIterator[tuple[GatewayHarness, Hostile]]:
    hostile = Hostile()
    async with RawBackend(hostile.handle) as backend:
        options = {"upstream_api_key": KEY, "api_keys": (CLIENT_KEY,)}
        async with GatewayHarness(
            upstream=backend.url, tap_dir=str(tmp_path / "tap"), **options
        ) as gw:
            watch_recordings(gw, hostile)
            yield gw, hostile


@pytest.mark.parametrize("transport", ["sse", "json", "ws"])
async def test_no_fragment_of_the_backend_key_leaves_the_gateway(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, transport: str
) -> None:
    caplog.set_level(logging.DEBUG)
    counts: dict[str, int] = {}
    redacted = 0
    headers = {"Authorization": f"Bearer {CLIENT_KEY}"}
    async with (
        hostile_gateway(tmp_path) as (gw, hostile),
        aiohttp.ClientSession(headers=headers) as http,
    ):
        for scenario in scenarios():
            hostile.scenario = scenario
            seen: list[bytes] = []
            body: dict[str, Any] = {"model": "m", "input": "hi", "stream": transport == "sse"}
            if scenario.tools:
                body["tools"] = TOOLS
            run = run_ws if transport == "ws" else run_http
            ids = await run(http, gw, body, seen)
            for response_id in ids:  # what the store kept of it
                async with http.get(f"{gw.url}/responses/{response_id}") as resp:
                    seen.append(await resp.read())
            counts[scenario.name] = sum(map(leaks, seen))
            redacted += sum(part.count(b"[redacted]") for part in seen)
    # the test means something: the backend was sent the key, and echoed it every time
    assert set(hostile.sent_keys) == {f"Bearer {KEY}"}
    recordings = sorted((tmp_path / "tap").glob("*.jsonl"))
    assert recordings
    counts["recordings"] = sum(leaks(path.read_bytes()) for path in recordings)
    counts["logs"] = leaks(caplog.text)
    print(f"\n{transport}: key fragments (>= 8 chars) found: {counts}; [redacted] seen {redacted}")
    assert counts == dict.fromkeys(counts, 0)
    assert redacted >= len(scenarios()) - 1  # the client saw where the key was taken out


async def test_recordings_stay_whole_but_for_the_key(tmp_path: Path) -> None:
    """A key split across reads is scrubbed, and every other byte is still recorded."""
    async with (
        hostile_gateway(tmp_path) as (gw, hostile),
        aiohttp.ClientSession(headers={"Authorization": f"Bearer {CLIENT_KEY}"}) as http,
    ):
        hostile.scenario = next(s for s in scenarios() if s.name == "error split over reads")
        await run_http(http, gw, {"model": "m", "input": "hi", "stream": True}, [])
    (path,) = (tmp_path / "tap").glob("*.jsonl")
    lines = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    chunks = [line["data"] for line in lines if line["kind"] == "backend_chunk"]
    assert len(chunks) >= 2  # two reads
    error = {"error": {"message": f"bad key {KEY}", "code": "invalid_api_key"}}
    body = b"data: %s\n\ndata: %s\n\n" % (orjson.dumps(delta(content="Hello")), orjson.dumps(error))
    assert "".join(chunks) == body.decode().replace(KEY, "[redacted]")
