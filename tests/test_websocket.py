"""Responses WebSocket mode against the real gateway on loopback: sessions and their state.

Two real clients drive the socket: the official SDK's `client.responses.connect()` and
the `websockets` library. Every frame either one receives is validated against the SDK's
typed models (`ResponsesServerEvent`, and `ResponseStreamEvent` for non-error events).
Lanes, limits and the connection lifecycle are in test_websocket_lanes.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any, Protocol

import aiohttp
import orjson
import pytest
import websockets
from harness import GatewayHarness
from openai import AsyncOpenAI
from openai.types.responses.responses_server_event import ResponsesServerEvent
from pydantic import TypeAdapter
from scripted_backend import (
    DIE,
    DONE,
    Status,
    finish,
    reasoning_chunks,
    text_chunks,
    tool_call_chunks,
    usage,
)
from sdk_models import validate_event

from streamer.frontends.websocket import SESSIONS, Session

TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed", "error"})
_SERVER_EVENTS: TypeAdapter[Any] = TypeAdapter(ResponsesServerEvent)

TOOLS: list[dict[str, Any]] = [
    {
        "type": "namespace",
        "name": "mcp__docs",
        "description": "Tools in the mcp__docs namespace.",
        "tools": [
            {
                "type": "function",
                "name": "search",
                "description": "Search the docs.",
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
            }
        ],
    },
    {"type": "function", "name": "exec_command", "parameters": {"type": "object"}},
]
BASE = {"role": "developer", "content": "You are a coding agent."}
END = [finish("stop"), usage(5, 2), DONE]
CALL_SCRIPT = [
    *tool_call_chunks(0, "call_1", ["mcp__docs__search"], ['{"q":', '"x"}']),
    finish("tool_calls"),
    usage(7, 3),
    DONE,
]


def check_frame(raw: str | bytes) -> dict[str, Any]:
    """One server frame, validated against the SDK's WebSocket and stream event models."""
    data = orjson.loads(raw)
    event = _SERVER_EVENTS.validate_json(raw)  # raises on any field the SDK would reject
    assert event.type == data["type"], (event.type, data["type"])
    if data["type"] == "error":
        assert set(data) <= {"type", "status", "error", "stream_id", "sequence_number"}, data
        assert set(data["error"]) == {"type", "code", "message", "param"}, data
    else:  # the same object the SSE route sends, plus the optional lane
        validate_event({k: v for k, v in data.items() if k != "stream_id"})
    return data


class Socket(Protocol):
    async def send(self, frame: dict[str, Any]) -> None: ...
    async def send_raw(self, data: str) -> None: ...
    async def recv(self) -> dict[str, Any]: ...


class RawSocket:
    """The `websockets` client: frames as JSON text, nothing else."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws

    async def send(self, frame: dict[str, Any]) -> None:
        await self.ws.send(orjson.dumps(frame).decode())

    async def send_raw(self, data: str) -> None:
        await self.ws.send(data)

    async def recv(self) -> dict[str, Any]:
        return check_frame(await self.ws.recv())


class SdkSocket:
    """The SDK's connection: creates go through `conn.response.create(...)`."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    async def send(self, frame: dict[str, Any]) -> None:
        if frame.get("type") == "response.create":
            await self.conn.response.create(**{k: v for k, v in frame.items() if k != "type"})
        else:
            await self.conn.send_raw(orjson.dumps(frame).decode())

    async def send_raw(self, data: str) -> None:
        await self.conn.send_raw(data)

    async def recv(self) -> dict[str, Any]:
        raw = await self.conn.recv_bytes()
        data = check_frame(raw)
        assert self.conn.parse_event(raw).type == data["type"]  # the SDK's own parse agrees
        return data


@contextlib.asynccontextmanager
async def open_socket(
    gw: GatewayHarness, kind: str = "websockets", **options: Any
) -> AsyncIterator[Any]:
    if kind == "sdk":
        async with (
            AsyncOpenAI(base_url=gw.url, api_key="test-key", max_retries=0) as client,
            client.responses.connect() as conn,
        ):
            yield SdkSocket(conn)
    else:
        async with websockets.connect(gw.ws_url, open_timeout=5, **options) as ws:
            yield RawSocket(ws)


@pytest.fixture(params=["sdk", "websockets"])
async def sock(request: pytest.FixtureRequest, gw: GatewayHarness) -> AsyncIterator[Socket]:
    async with open_socket(gw, request.param) as socket:
        yield socket


async def read_until_terminal(sock: Socket) -> list[dict[str, Any]]:
    frames = [await sock.recv()]
    while frames[-1]["type"] not in TERMINAL:
        frames.append(await sock.recv())
    return frames


async def turn(sock: Socket, **fields: Any) -> list[dict[str, Any]]:
    """Send one response.create and read its frames up to its terminal event."""
    await sock.send({"type": "response.create", "model": "test-model", **fields})
    return await read_until_terminal(sock)


def final(frames: list[dict[str, Any]]) -> dict[str, Any]:
    assert frames[-1]["type"] in TERMINAL - {"error"}, frames[-1]
    return frames[-1]["response"]


def only_session(gw: GatewayHarness) -> Session:
    (session,) = gw.runner.app[SESSIONS]  # type: ignore[union-attr]
    return session


def not_found(frame: dict[str, Any], response_id: str) -> bool:
    return (
        frame["type"] == "error"
        and frame["error"]["code"] == "previous_response_not_found"
        and response_id in frame["error"]["message"]
    )


# -- warm-up and chaining ---------------------------------------------------------------


async def test_warmup_then_chained_creates(sock: Socket, gw: GatewayHarness) -> None:
    warm = await turn(sock, input=[BASE], tools=TOOLS, store=False, generate=False)
    assert [f["type"] for f in warm] == ["response.created", "response.completed"]
    assert warm[0]["response"]["id"] == warm[1]["response"]["id"]
    done = final(warm)
    assert done["status"] == "completed" and done["output"] == []
    assert done["usage"]["input_tokens"] == done["usage"]["output_tokens"] == 0
    assert done["usage"]["total_tokens"] == 0
    assert gw.backend.requests == []  # a warm-up never reaches the backend

    gw.backend.script([*text_chunks(["Hel", "lo!"]), *END])
    second = await turn(
        sock, input=[{"role": "user", "content": "hi"}], tools=TOOLS, store=False,
        previous_response_id=done["id"],
    )  # fmt: skip
    assert second[0]["type"] == "response.created"
    answer = final(second)
    assert answer["previous_response_id"] == done["id"]
    assert answer["output"][0]["content"][0]["text"] == "Hello!"
    sent = gw.backend.requests[-1]["messages"]
    assert [m["content"] for m in sent] == ["You are a coding agent.", "hi"]

    gw.backend.script([*text_chunks(["ok"]), *END])
    third = await turn(
        sock, input=[{"role": "user", "content": "again"}], tools=TOOLS, store=False,
        previous_response_id=answer["id"],
    )  # fmt: skip
    assert final(third)["status"] == "completed"
    sent = gw.backend.requests[-1]["messages"]
    assert [m["role"] for m in sent][-3:] == ["user", "assistant", "user"]
    assert [m["content"] for m in sent][1:] == ["hi", "Hello!", "again"]
    assert len(gw.backend.requests) == 2
    assert gw.gateway.stats["ws_turns"] == 3 and gw.gateway.stats["http_turns"] == 0


async def test_namespaced_call_then_only_its_output(sock: Socket, gw: GatewayHarness) -> None:
    """Codex's pattern: warm-up, new items only, then only the function_call_output."""
    common: dict[str, Any] = {"tools": TOOLS, "store": False, "stream": True}  # Codex sends stream
    warm = final(await turn(sock, input=[BASE], generate=False, **common))

    gw.backend.script(CALL_SCRIPT, [*text_chunks(["found ", "it"]), *END])
    frames = await turn(
        sock, input=[{"role": "user", "content": "search x"}], previous_response_id=warm["id"],
        **common,
    )  # fmt: skip
    done_items = [f["item"] for f in frames if f["type"] == "response.output_item.done"]
    assert [(i["type"], i["namespace"], i["name"]) for i in done_items] == [
        ("function_call", "mcp__docs", "search")
    ]
    call = final(frames)["output"][0]
    assert (call["namespace"], call["name"], call["call_id"]) == ("mcp__docs", "search", "call_1")
    assert call["arguments"] == '{"q":"x"}'

    output = {
        "type": "function_call_output",
        "call_id": "call_1",
        "output": [{"type": "input_text", "text": "result A"}],
    }
    answer = final(
        await turn(sock, input=[output], previous_response_id=final(frames)["id"], **common)
    )
    assert answer["output"][0]["content"][0]["text"] == "found it"

    messages = gw.backend.requests[-1]["messages"]
    assert [m["role"] for m in messages][-3:] == ["user", "assistant", "tool"]
    assert messages[0]["content"] == "You are a coding agent."
    assert messages[-3]["content"] == "search x"
    assert messages[-2]["tool_calls"] == [
        {"id": "call_1", "type": "function",
         "function": {"name": "mcp__docs__search", "arguments": '{"q":"x"}'}}
    ]  # fmt: skip
    assert messages[-1]["tool_call_id"] == "call_1" and "result A" in messages[-1]["content"]
    flat = {t["function"]["name"] for t in gw.backend.requests[-1]["tools"]}
    assert flat == {"mcp__docs__search", "exec_command"}


async def test_sdk_iterates_typed_events(gw: GatewayHarness) -> None:
    from openai.types.responses.responses_server_event import ResponseWsCompleted, ResponseWsCreated

    gw.backend.script([*text_chunks(["typed"]), *END])
    async with (
        AsyncOpenAI(base_url=gw.url, api_key="k", max_retries=0) as client,
        client.responses.connect() as conn,
    ):
        await conn.response.create(model="m", input="hi", store=False)
        events = []
        async for event in conn:
            events.append(event)
            if event.type in TERMINAL:
                break
    assert isinstance(events[0], ResponseWsCreated)
    assert isinstance(events[-1], ResponseWsCompleted)
    assert events[-1].response.output_text == "typed"
    assert [e.sequence_number for e in events] == list(range(len(events)))


# -- previous_response_id: not found, eviction, the store, the bound ---------------------


async def test_previous_response_not_found_shape(sock: Socket, gw: GatewayHarness) -> None:
    await sock.send(
        {"type": "response.create", "model": "m", "input": "hi", "store": False,
         "previous_response_id": "resp_missing"}
    )  # fmt: skip
    frame = await sock.recv()  # the very first frame: no response.created before it
    assert frame == {
        "type": "error",
        "status": 400,
        "error": {
            "type": "invalid_request_error",
            "code": "previous_response_not_found",
            "message": frame["error"]["message"],
            "param": "previous_response_id",
        },
    }
    assert "resp_missing" in frame["error"]["message"]
    assert gw.backend.requests == []


FAILURES: dict[str, tuple[list[Any] | None, dict[str, Any], str]] = {
    # how the continuation fails: backend script, extra fields, the terminal event type
    "backend_refuses": ([Status(500, {"error": {"message": "boom", "type": "server_error"}})], {},
                        "error"),
    "backend_dies": ([*text_chunks(["par"]), DIE], {}, "response.failed"),
    "invalid_request": (None, {"tools": [{"type": "function"}]}, "error"),
}  # fmt: skip


@pytest.mark.parametrize("failure", list(FAILURES))
async def test_failed_continuation_evicts_parent(failure: str, gw: GatewayHarness) -> None:
    script, extra, terminal = FAILURES[failure]
    async with open_socket(gw) as sock:
        parent = final(await turn(sock, input="hi", store=False))["id"]
        if script is not None:
            gw.backend.script(script)
        frames = await turn(sock, input="more", store=False, previous_response_id=parent, **extra)
        assert frames[-1]["type"] == terminal
        if terminal == "error":
            assert frames == frames[-1:]  # nothing was created
            assert frames[0]["error"]["code"] != "previous_response_not_found"
        again = await turn(sock, input="more", store=False, previous_response_id=parent)
        assert again == again[-1:] and not_found(again[0], parent)
        assert parent not in only_session(gw).remembered


async def test_failed_fork_from_another_lane_keeps_parent(gw: GatewayHarness) -> None:
    async with open_socket(gw) as sock:
        parent = final(await turn(sock, input="hi", store=False, stream_id="a"))["id"]
        gw.backend.script([Status(500, {"error": {"message": "boom", "type": "server_error"}})])
        forked = await turn(
            sock, input="x", store=False, previous_response_id=parent, stream_id="b"
        )
        assert forked[-1]["type"] == "error" and forked[-1]["stream_id"] == "b"
        ok = await turn(sock, input="y", store=False, previous_response_id=parent, stream_id="a")
        assert final(ok)["previous_response_id"] == parent


async def test_continuation_falls_back_to_the_store(
    gw: GatewayHarness, client: AsyncOpenAI
) -> None:
    # Stored over HTTP, continued on a socket that never saw it.
    gw.backend.script([*text_chunks(["from http"]), *END])
    over_http = await client.responses.create(model="m", input="first", store=True)
    async with open_socket(gw) as sock:
        frames = await turn(sock, input="second", previous_response_id=over_http.id)
        assert final(frames)["status"] == "completed"
        assert over_http.id not in only_session(gw).remembered
    contents = [m["content"] for m in gw.backend.requests[-1]["messages"]]
    assert contents == ["first", "from http", "second"]

    # Stored from one socket, continued on another after the first closed.
    async with open_socket(gw) as first:
        stored = final(await turn(first, input="a", store=True))["id"]
        unstored = final(await turn(first, input="b", store=False))["id"]
    async with open_socket(gw, "sdk") as second:
        assert final(await turn(second, input="c", previous_response_id=stored))["status"] == (
            "completed"
        )
        missing = await turn(second, input="c", previous_response_id=unstored)
        assert not_found(missing[0], unstored)


async def test_remembered_responses_are_bounded() -> None:
    async with GatewayHarness(ws_remembered=2) as gw, open_socket(gw) as sock:
        ids = [final(await turn(sock, input=f"q{i}", store=False))["id"] for i in range(3)]
        session = only_session(gw)
        assert list(session.remembered) == ids[1:]  # oldest evicted first
        assert not_found((await turn(sock, input="x", store=False, previous_response_id=ids[0]))[0],
                         ids[0])  # fmt: skip
        resumed = await turn(sock, input="x", store=False, previous_response_id=ids[1])
        assert final(resumed)["status"] == "completed"
        assert len(session.remembered) == 2


async def test_remembered_history_is_not_altered_by_later_turns(gw: GatewayHarness) -> None:
    """History is shared by reference between remembered responses: it must stay intact."""
    async with open_socket(gw) as sock:
        first = final(await turn(sock, input=[BASE, {"role": "user", "content": "hi"}],
                                 tools=TOOLS, store=False))["id"]  # fmt: skip
        snapshot = orjson.dumps(only_session(gw).remembered[first])
        gw.backend.script(CALL_SCRIPT)
        second = final(await turn(sock, input="go", tools=TOOLS, store=False,
                                  previous_response_id=first))["id"]  # fmt: skip
        output = {"type": "function_call_output", "call_id": "call_1", "output": "r"}
        await turn(sock, input=[output], tools=TOOLS, store=False, previous_response_id=second)
        assert orjson.dumps(only_session(gw).remembered[first]) == snapshot


# -- errors keep the socket usable -------------------------------------------------------


async def test_errors_then_success_on_the_same_socket(sock: Socket, gw: GatewayHarness) -> None:
    bad_tools = [
        {"type": "namespace", "name": "ns", "description": "", "tools": [{"type": "function"}]}
    ]
    cases: list[tuple[dict[str, Any] | str, str | None, str | None]] = [
        ({"type": "response.create", "model": "m", "input": "hi", "tools": bad_tools},
         "tools[0].tools[0].name", None),
        ({"type": "response.cancel"}, "type", "unsupported_event_type"),
        ({"type": "response.steer", "previous_response_id": "resp_x", "input": []}, "type",
         "unsupported_event_type"),
        ({"type": "response.create", "model": "m", "input": "hi", "background": True},
         "background", None),
        ({"type": "response.create", "model": 7, "input": "hi"}, "model", "invalid_type"),
        ("{not json", None, "invalid_json"),
        ("[1, 2]", None, "invalid_event"),
    ]  # fmt: skip
    for frame, param, code in cases:
        if isinstance(frame, str):
            await sock.send_raw(frame)
        else:
            await sock.send(frame)
        error = await sock.recv()
        assert error["type"] == "error" and error["status"] == 400, (frame, error)
        assert error["error"]["type"] == "invalid_request_error"
        assert error["error"]["param"] == param, (frame, error)
        if code is not None:
            assert error["error"]["code"] == code, (frame, error)
    assert gw.backend.requests == []
    gw.backend.script([*text_chunks(["still ", "here"]), *END])
    frames = await turn(sock, input="hi", store=False)
    assert frames[0]["type"] == "response.created"
    assert final(frames)["output"][0]["content"][0]["text"] == "still here"


async def test_backend_refusal_is_an_error_event_with_its_status(gw: GatewayHarness) -> None:
    gw.backend.script([Status(429, {"error": {"message": "slow down", "type": "rate_limit"}})])
    async with open_socket(gw) as sock:
        frames = await turn(sock, input="hi", store=False)
        assert len(frames) == 1 and frames[0]["status"] == 429
        assert "slow down" in frames[0]["error"]["message"]
        assert final(await turn(sock, input="hi", store=False))["status"] == "completed"


# -- one pipeline, two encodings ----------------------------------------------------------

SCRIPTS: dict[str, list[Any]] = {
    "text": [*text_chunks(["Hel", "lo"]), *END],
    "reasoning_then_text": [*reasoning_chunks(["think", "ing"]), *text_chunks(["ok"]), *END],
    "namespaced_call": CALL_SCRIPT,
    "parallel_calls": [
        *tool_call_chunks(0, "call_a", ["mcp__docs__search"], ['{"q":"a"}']),
        *tool_call_chunks(1, "call_b", ["exec_command"], ['{"cmd":"ls"}']),
        finish("tool_calls"),
        DONE,
    ],
    "length": [*text_chunks(["trun"]), finish("length"), usage(5, 9), DONE],
    "backend_dies": [*text_chunks(["par", "tial"]), DIE],
}


def normalised(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ids become their order of first appearance; timestamps become 0."""
    ids: dict[str, str] = {}

    def walk(value: Any, key: str = "") -> Any:
        if isinstance(value, dict):
            return {k: walk(v, k) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        if key in ("created_at", "completed_at") and value is not None:
            return 0
        if key in ("id", "item_id") and isinstance(value, str):
            return ids.setdefault(value, f"id{len(ids)}")
        return value

    return [walk(e) for e in events]


async def sse_events(gw: GatewayHarness, body: dict[str, Any]) -> list[dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(gw.url + "/responses", json={**body, "stream": True}) as resp,
    ):
        assert resp.status == 200
        text = (await resp.read()).decode()
    return [orjson.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


@pytest.mark.parametrize("scenario", list(SCRIPTS))
async def test_same_events_over_websocket_and_sse(scenario: str, gw: GatewayHarness) -> None:
    body = {"model": "m", "input": "hi", "tools": TOOLS, "store": False}
    gw.backend.script(SCRIPTS[scenario])
    over_sse = await sse_events(gw, body)
    gw.backend.script(SCRIPTS[scenario])
    async with open_socket(gw) as sock:
        over_ws = await turn(sock, **body)
    for event in over_sse:
        validate_event(event)
    assert over_ws[-1]["type"] in TERMINAL - {"error"}
    assert normalised(over_ws) == normalised(over_sse)
    assert gw.backend.requests[0] == gw.backend.requests[1]  # and the same backend request


async def test_each_lanes_latest_response_outlasts_older_ones() -> None:
    """Eviction takes the least recently used first, but a lane's latest response last."""
    async with GatewayHarness(ws_remembered=2) as gw, open_socket(gw) as sock:
        parked = final(await turn(sock, input="a", store=False, stream_id="a"))["id"]
        busy = [
            final(await turn(sock, input=f"b{i}", store=False, stream_id="b"))["id"]
            for i in range(3)
        ]
        session = only_session(gw)
        assert list(session.remembered) == [parked, busy[-1]]
        resumed = await turn(sock, input="x", store=False, stream_id="a",
                             previous_response_id=parked)  # fmt: skip
        assert final(resumed)["status"] == "completed"
