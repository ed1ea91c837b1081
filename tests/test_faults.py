"""Backend faults and client disconnects, against a real gateway and a real scripted backend.

Every fault is played by an HTTP server on loopback (tests/scripted_backend.py) and seen
through a real client over SSE, JSON and WebSocket. The client must always get a
well-formed end: a terminal event (`response.failed` with a meaningful `error.code`), or an
HTTP error in OpenAI's shape before streaming, never a hang or a torn SSE frame; nothing the
backend sent before the fault may be lost. A client that goes away must get its backend
request cancelled (the delays are measured into the ledger), and leave no task, socket, connection or buffer behind.

The helpers here (`sse_turn`, `json_turn`, `ws_turn`, `snapshot`, `settled`) are shared with
tests/test_load.py and tests/test_shutdown.py. `make soak` runs the long variants; set
`STREAMER_FAULT_TABLE=path` to have the fault table written as Markdown.
"""

from __future__ import annotations

import asyncio
import gc
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

import aiohttp
import orjson
import pytest
from builders import client_session, parse_sse
from harness import GatewayHarness
from openai.types.responses import ResponseError
from scripted_backend import (
    DIE,
    DONE,
    DROP,
    HANG,
    DelayHeaders,
    Sleep,
    Status,
    chunk,
    error_chunk,
    finish,
    refusing_url,
    text_chunks,
    usage,
)
from sdk_models import validate_event, validate_response

from streamer.core.errors import FAILURE_CODES
from streamer.core.output import OutputItemStreamer
from streamer.frontends.websocket import SESSIONS, Session
from streamer.turns.turn import Turn
from streamer.upstream.backend_stream import BackendStream

TERMINAL = frozenset({"response.completed", "response.failed", "response.incomplete"})
DEADLINE = 10.0  # no client waits longer than this for an end: a hang fails the test
# A client that leaves cancels its backend request well before the backend's script ends
# (30 s of chunks, or never): the bound tells cancellation from none, with room for a loaded
# machine; the measured delays (median, worst) go to the ledger.
CUT_WITHIN = 2.0
# The gateway's idle timeout in these tests: what a stall costs, and the most a loaded machine
# may delay a live backend's next chunk without the turn timing out.
IDLE = 1.0
SDK_CODES = frozenset(get_args(ResponseError.model_fields["code"].annotation))
BODY = {"model": "m", "input": "hi"}

# -- clients ------------------------------------------------------------------------


@dataclass
class Outcome:
    """What one client saw of one turn."""

    status: int  # HTTP status (WebSocket: 200, or the error event's `status`)
    code: str | None = None  # error.code of the HTTP error or of the failed response
    response: dict[str, Any] | None = None  # the final response, when one came
    headers: dict[str, str] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    via: str = "http"  # "ws": an error came as an `error` event, not an HTTP status

    @property
    def text(self) -> str:
        """Every output_text of the final response, joined: what the client keeps."""
        out = []
        for item in (self.response or {}).get("output", []):
            for part in item.get("content") or []:
                if part.get("type") == "output_text":
                    out.append(part["text"])
        return "".join(out)

    @property
    def seen(self) -> str:
        code = self.code or "code null"
        if self.response is not None:
            return f"response.{self.response['status']}" + (f" {code}" if self.code else "")
        if self.via == "ws":
            return f"error event, status {self.status}, {code}"
        return f"HTTP {self.status}, {code}"


def _sdk_view(obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` as the SDK models can check it: a gateway-specific `error.code` (outside the
    SDK's enum, such as `upstream_timeout`) is checked by the tests instead."""
    response = obj.get("response", obj)
    error = response.get("error") if isinstance(response, dict) else None
    if not error or error.get("code") in SDK_CODES:
        return obj
    fixed = {**response, "error": {**error, "code": "server_error"}}
    return {**obj, "response": fixed} if "response" in obj else fixed


def check_events(events: list[dict[str, Any]], *, validate: bool = True) -> dict[str, Any]:
    """A whole, well-formed stream: created first, one terminal last, numbered 0..n-1;
    with `validate`, every event checked against the SDK's models (slow: load tests sample)."""
    assert events, "no events"
    assert [e.get("sequence_number") for e in events] == list(range(len(events)))
    assert events[0]["type"] == "response.created", events[0]["type"]
    ends = [i for i, e in enumerate(events) if e["type"] in TERMINAL]
    assert ends == [len(events) - 1], [e["type"] for e in events]
    if validate:
        for event in events:
            validate_event(_sdk_view(event))
    return events[-1]["response"]


def check_error_body(body: Any) -> str | None:
    """OpenAI's error shape, exactly; returns its code."""
    assert isinstance(body, dict) and set(body) == {"error"}, body
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"], body
    return body["error"]["code"]


def _failure_code(response: dict[str, Any]) -> str | None:
    """The failure's meaningful code: a gateway-specific one travels in `error.type`
    under the spec's `server_error` (the SDK's enum has no room for it)."""
    if response["status"] == "failed":
        error = response["error"]
        code = error["code"]
        assert code in SDK_CODES or code in FAILURE_CODES, response
        assert isinstance(code, str) and code and error["message"], response
        return error.get("type") or code if code == "server_error" else code
    assert response.get("error") is None, response
    return None


async def sse_turn(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any] = BODY,
    *,
    validate: bool = True,
    deadline: float = DEADLINE,
) -> Outcome:
    """POST a streamed turn and read it to its end (or its HTTP error)."""
    async with asyncio.timeout(deadline):
        async with session.post(url + "/responses", json={**body, "stream": True}) as resp:
            raw = await resp.read()  # a torn chunked body raises ClientPayloadError
            headers = {k.lower(): v for k, v in resp.headers.items()}
    if resp.status != 200:
        return Outcome(resp.status, check_error_body(orjson.loads(raw)), headers=headers)
    assert resp.content_type == "text/event-stream", resp.content_type
    events = parse_sse(raw)
    response = check_events(events, validate=validate)
    return Outcome(200, _failure_code(response), response, headers, events)


async def json_turn(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any] = BODY
) -> Outcome:
    async with asyncio.timeout(DEADLINE):
        async with session.post(url + "/responses", json=body) as resp:
            data = orjson.loads(await resp.read())
            headers = {k.lower(): v for k, v in resp.headers.items()}
    if resp.status != 200:
        return Outcome(resp.status, check_error_body(data), headers=headers)
    validate_response(_sdk_view(data))
    assert data["status"] in ("completed", "failed", "incomplete"), data["status"]
    return Outcome(200, _failure_code(data), data, headers)


def check_ws_frame(data: dict[str, Any], *, validate: bool = True) -> None:
    if data["type"] == "error":
        assert set(data) <= {"type", "status", "error", "stream_id", "sequence_number"}, data
        assert {"message", "type", "param", "code"} <= set(data["error"]), data
    elif validate:
        validate_event(_sdk_view({k: v for k, v in data.items() if k != "stream_id"}))


async def ws_read_turn(
    ws: aiohttp.ClientWebSocketResponse, *, validate: bool = True, deadline: float = DEADLINE
) -> Outcome:
    """Read one turn's frames on an open socket, up to its terminal or error event."""
    events: list[dict[str, Any]] = []
    async with asyncio.timeout(deadline):
        while True:
            message = await ws.receive()
            assert message.type == aiohttp.WSMsgType.TEXT, message
            data = orjson.loads(message.data)
            check_ws_frame(data, validate=validate)
            if data["type"] == "error":
                assert not events, "an error event in the middle of a turn"
                # a WebSocket error always has a code (the spec's): its type's when it has
                # none of its own, which is the HTTP error's null code
                error = data["error"]
                code = None if error["code"] == error["type"] else error["code"]
                return Outcome(data["status"], code, events=[data], via="ws")
            events.append(data)
            if data["type"] in TERMINAL:
                break
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["type"] == "response.created"
    response = events[-1]["response"]
    return Outcome(200, _failure_code(response), response, events=events)


async def ws_turn(session: aiohttp.ClientSession, url: str, body: dict[str, Any] = BODY) -> Outcome:
    """Open a socket, run one `response.create`, close the socket normally."""
    ws_url = url.replace("http://", "ws://") + "/responses"
    async with session.ws_connect(ws_url, timeout=aiohttp.ClientWSTimeout(ws_close=DEADLINE)) as ws:
        await ws.send_bytes(orjson.dumps({"type": "response.create", **body}))
        return await ws_read_turn(ws)


TRANSPORTS: dict[str, Callable[..., Any]] = {"sse": sse_turn, "json": json_turn, "ws": ws_turn}

# -- what a gateway holds -------------------------------------------------------------

WATCHED = (Turn, BackendStream, OutputItemStreamer, Session)


def upstream_connections(gw: GatewayHarness) -> tuple[int, int]:
    """The gateway's connections to the backend: (in use, idle in the keep-alive pool)."""
    upstream = gw.gateway.upstreams.resolve()
    upstream = getattr(upstream, "inner", upstream)  # under the redacting wrapper
    pool = getattr(upstream, "_pools", None)
    if pool is not None:  # the http1 pools, one per client
        return pool.in_use_count, pool.idle_count
    session = getattr(upstream, "_session", None)  # an aiohttp session
    if session is None or session.closed:
        return 0, 0
    connector = session.connector
    return len(connector._acquired), sum(len(c) for c in connector._conns.values())


def snapshot(gw: GatewayHarness) -> dict[str, int]:
    """What a finished or abandoned turn could leave behind in this process (cheap counts).

    Idle keep-alive connections to the backend are the pool working, not a leak: each
    holds two descriptors here (the gateway's end and the backend's end), a backend
    connection and its task, so they are subtracted.
    """
    in_use, idle = upstream_connections(gw)
    active = sum(
        s.value
        for m in gw.gateway.metrics.active_streams.collect()
        for s in m.samples
        if s.name.endswith("streams")
    )
    assert gw.runner is not None and gw.backend._runner is not None
    return {
        "fds": len(os.listdir("/proc/self/fd")) - 2 * idle,
        "tasks": len(asyncio.all_tasks()) - idle,  # the backend serves each on a task
        "upstream_in_use": in_use,
        "gateway_connections": len(gw.runner.server.connections),  # type: ignore[union-attr]
        "backend_connections": len(gw.backend._runner.server.connections) - idle,  # type: ignore[union-attr]
        "ws_sessions": len(gw.runner.app[SESSIONS]),
        "active_streams": int(active),
    }


def census() -> dict[str, int]:
    """Live per-turn objects (streamers and their buffers, backend streams, sessions)."""
    gc.collect()
    live = Counter(type(o).__name__ for o in gc.get_objects() if isinstance(o, WATCHED))
    return {cls.__name__: live[cls.__name__] for cls in WATCHED}


async def settled(gw: GatewayHarness, baseline: dict[str, int], wait: float = 3.0) -> None:
    """Wait for the gateway to return to `baseline` (closing is asynchronous), then check it.

    Only growth is a leak: descriptors that earlier tests left to the collector may close
    meanwhile and bring a process-wide count below the baseline.
    """
    deadline = time.monotonic() + wait
    while True:
        now = snapshot(gw)
        leaked = {k: (baseline[k], v) for k, v in now.items() if v > baseline[k]}
        if not leaked or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.02)
    assert not leaked, f"left behind (before, after): {leaked}"


async def warm(gw: GatewayHarness, session: aiohttp.ClientSession) -> dict[str, int]:
    """One normal turn (opens the upstream pool), then the baseline snapshot."""
    ok = await sse_turn(session, gw.url)
    assert ok.response is not None and ok.response["status"] == "completed", ok.seen
    async with asyncio.timeout(5):  # the client has its answer; the turn's end runs after
        while (base := snapshot(gw))["active_streams"] or base["upstream_in_use"]:
            await asyncio.sleep(0.005)  # polling a real condition
    return base


# -- the fault table ------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    name: str  # as it reads in the table
    steps: Callable[[], list[Any]]
    status: int = 200  # the HTTP status the client sees (200: the stream started)
    code: str | None = None  # the error.code the client sees (None: completed)
    kept: str = ""  # text the backend sent before the fault: the client must keep it
    headers: tuple[tuple[str, str], ...] = ()  # headers an HTTP client must see
    cut: bool = False  # the gateway itself must hang up on a backend that would go on
    upstream: str | None = None  # another backend URL (a refusing port)


def _tail() -> list[Any]:
    return [finish("stop"), usage(3, 2), DONE]


FAULTS: tuple[Fault, ...] = (
    Fault("backend dies mid-stream", lambda: [*text_chunks(["Hel", "lo"]), Sleep(0.05), DIE],
          code="server_error", kept="Hello"),
    Fault("backend dies inside an SSE frame",
          lambda: [*text_chunks(["Hel"]), b'data: {"choices":[{"index":0,"del', Sleep(0.05), DIE],
          code="server_error", kept="Hel"),
    Fault("backend ends without finish or [DONE]", lambda: text_chunks(["Hel", "lo"]),
          code="server_error", kept="Hello"),
    Fault("backend stalls mid-stream (idle timeout)", lambda: [*text_chunks(["Hel"]), HANG],
          code="upstream_timeout", kept="Hel", cut=True),
    Fault("backend stalls after its headers", lambda: [HANG], code="upstream_timeout", cut=True),
    Fault("backend stalls before its headers", lambda: [DelayHeaders(3600)], status=504,
          code="upstream_timeout", cut=True),
    Fault("malformed JSON chunk", lambda: [*text_chunks(["Hel"]), "{not json", HANG],
          code="invalid_upstream_chunk", kept="Hel", cut=True),
    Fault("unknown chunk shapes (skipped)",
          lambda: [{"object": "mystery"}, {"choices": "nope"}, {"choices": [{"index": 0, "delta": "x"}]},
                   {"choices": [{"index": 0, "delta": {"content": {"odd": 1}, "tool_calls": "no"}}]},
                   {"choices": [None, 3]}, "[1, 2, 3]", "42", "null", '"text"',
                   *text_chunks(["Hel", "lo"]), *_tail()],
          kept="Hello"),
    Fault("error payload mid-stream", lambda: [*text_chunks(["Hel"]),
          error_chunk("Rate limit reached. Please try again in 2s.", code="rate_limit_exceeded"), HANG],
          code="rate_limit_exceeded", kept="Hel", cut=True),
    Fault("HTTP 429 with retry-after",
          lambda: [Status(429, {"error": {"message": "Rate limit reached. Please try again in 7s.",
                                          "type": "requests", "code": "rate_limit_exceeded"}},
                          {"Retry-After": "7", "x-ratelimit-remaining-requests": "0"})],
          status=429, code="rate_limit_exceeded",
          headers=(("retry-after", "7"), ("x-ratelimit-remaining-requests", "0"))),
    Fault("HTTP 429, plain text, retry-after-ms",
          lambda: [Status(429, "slow down", {"retry-after-ms": "1500"})],
          status=429, code="rate_limit_exceeded", headers=(("retry-after-ms", "1500"),)),
    Fault("HTTP 500 with an error body",
          lambda: [Status(500, {"error": {"message": "CUDA out of memory", "type": "server_error"}})],
          status=500),  # code null, as on OpenAI's own 5xx
    Fault("HTTP 503, text, retry-after",
          lambda: [Status(503, "overloaded", {"Retry-After": "3"})],
          status=503, headers=(("retry-after", "3"),)),
    Fault("HTTP 502, empty body", lambda: [Status(502)], status=502),
    Fault("connection dropped before answering", lambda: [DROP], status=502, code="upstream_error"),
    Fault("backend refuses connections", lambda: [], status=502, code="upstream_unreachable",
          upstream="refused"),
)  # fmt: skip


@dataclass
class Ledger:
    """Per fault and transport: rounds run, what the client saw, what was lost."""

    rows: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    # per transport: client disconnects, median and worst backend cut delay (seconds)
    cuts: dict[str, tuple[int, float, float]] = field(default_factory=dict)

    def add(self, fault: Fault, transport: str, outcome: Outcome, lost: int) -> None:
        row = self.rows.setdefault((fault.name, transport), {"n": 0, "seen": Counter(), "lost": 0})
        row["n"] += 1
        row["seen"][outcome.seen] += 1
        row["lost"] += lost

    def markdown(self) -> str:
        lines = [
            "| fault injected | transport | times | what the client saw | lost |",
            "|---|---|---|---|---|",
        ]
        for (name, transport), row in sorted(self.rows.items()):
            seen = ", ".join(f"{k} x{v}" for k, v in row["seen"].items())
            lost = "nothing" if row["lost"] == 0 else f"{row['lost']} rounds"
            lines.append(f"| {name} | {transport} | {row['n']} | {seen} | {lost} |")
        for transport, (count, median, worst) in sorted(self.cuts.items()):
            lines.append(
                f"| client leaves mid-turn | {transport} | {count} | backend request cancelled"
                f" in {median * 1000:.1f} ms (median), {worst * 1000:.1f} ms (worst);"
                " no task, socket, connection or turn object left | nothing |"
            )
        return "\n".join(lines)


LEDGER = Ledger()


@pytest.fixture(scope="module", autouse=True)
def fault_table() -> Iterator[Ledger]:
    yield LEDGER
    if LEDGER.rows or LEDGER.cuts:
        table = LEDGER.markdown()
        print("\n" + table)
        target = os.environ.get("STREAMER_FAULT_TABLE")
        if target:
            Path(target).write_text(table + "\n")


async def run_fault(fault: Fault, transport: str, rounds: int, concurrency: int) -> None:
    """Play `fault` `rounds` times over `transport`; check every end, and that nothing leaks."""
    extra = {"upstream": refusing_url()} if fault.upstream == "refused" else {}
    async with GatewayHarness(idle_timeout=IDLE, **extra) as gw, client_session() as session:
        if fault.upstream is None:
            baseline = await warm(gw, session)
        gw.backend.responder = lambda body: fault.steps()
        turn = TRANSPORTS[transport]
        gate = asyncio.Semaphore(concurrency)

        async def one() -> None:
            async with gate:
                outcome = await turn(session, gw.url)
            lost = 0 if fault.kept in outcome.text else 1
            LEDGER.add(fault, transport, outcome, lost)
            expected_status = fault.status if transport != "json" or fault.status != 200 else 200
            assert (outcome.status, outcome.code) == (expected_status, fault.code), outcome.seen
            assert not lost, f"the client lost {fault.kept!r}: it has {outcome.text!r}"
            if fault.status == 200:  # streamed: a response came, failed iff a code is expected
                assert outcome.response is not None
                want = "failed" if fault.code else "completed"
                assert outcome.response["status"] == want, outcome.response["status"]
            if transport != "ws":
                for name, value in fault.headers:
                    assert outcome.headers.get(name) == value, (name, outcome.headers)

        await asyncio.gather(*(one() for _ in range(rounds)))
        if fault.upstream is not None:
            return
        records = [r for r in gw.backend.records if r.path.endswith("/chat/completions")][1:]
        assert len(records) == rounds
        if fault.cut:  # the gateway hung up on a backend that would have gone on forever
            for rec in records:
                assert await rec.wait_disconnect(DEADLINE) < DEADLINE
        gw.backend.responder = None
        await settled(gw, baseline)
        after = await sse_turn(session, gw.url)  # and it still serves
        assert after.response is not None and after.response["status"] == "completed"


@pytest.mark.parametrize("transport", list(TRANSPORTS))
@pytest.mark.parametrize("fault", FAULTS, ids=[f.name for f in FAULTS])
async def test_backend_fault_ends_well(fault: Fault, transport: str) -> None:
    await run_fault(fault, transport, rounds=3, concurrency=3)


@pytest.mark.slow
@pytest.mark.parametrize("transport", list(TRANSPORTS))
@pytest.mark.parametrize("fault", FAULTS, ids=[f.name for f in FAULTS])
async def test_backend_fault_soak(fault: Fault, transport: str) -> None:
    await run_fault(fault, transport, rounds=100, concurrency=20)


# -- client disconnects -----------------------------------------------------------------


DISCONNECT_SCRIPTS: dict[str, Callable[[], list[Any]]] = {
    # the backend is silent: the gateway waits on it
    "idle": lambda: [*text_chunks(["Hel"]), HANG],
    # the backend streams steadily (a fast model, 100 chunks/s): the gateway is relaying
    "streaming": lambda: [
        *text_chunks(["Hel"]),
        *[chunk({"content": "x" * 64}), Sleep(0.01)] * 3000,
    ],
    # the backend has not even answered: the gateway waits for its headers
    "no-headers": lambda: [DelayHeaders(3600)],
}


def _marker(body: Any) -> str:
    return body["messages"][-1]["content"]


def _disconnect_responder(body: Any) -> list[Any]:
    return DISCONNECT_SCRIPTS[_marker(body).split("|")[0]]()


async def _backend_record(gw: GatewayHarness, marker: str) -> Any:
    """The backend's record of the request whose input is `marker`, once it has arrived."""
    while True:
        for rec in reversed(gw.backend.records):
            if isinstance(rec.body, dict) and _marker(rec.body) == marker:
                return rec
        await asyncio.sleep(0.001)


async def _disconnect_once(
    gw: GatewayHarness, session: aiohttp.ClientSession, marker: str, transport: str
) -> float:
    """One client that leaves mid-turn; returns how long its backend request outlived it."""
    body = {**BODY, "input": marker}
    waiting = marker.startswith("no-headers")
    if transport == "sse":
        post = asyncio.ensure_future(
            session.post(gw.url + "/responses", json={**body, "stream": True})
        )
        if waiting:  # no response headers will come: leave while the gateway waits for them
            rec = await _backend_record(gw, marker)
            left = time.monotonic()
            post.cancel()  # aiohttp drops the connection
        else:
            resp = await post
            seen = b""
            while b"output_text.delta" not in seen:
                data = await resp.content.readany()
                assert data, f"the stream ended early: {seen[-200:]!r}"
                seen += data
            rec = await _backend_record(gw, marker)
            left = time.monotonic()
            resp.close()  # drops the connection
    else:
        ws = await session.ws_connect(gw.ws_url)
        await ws.send_bytes(orjson.dumps({"type": "response.create", **body}))
        if not waiting:
            while "output_text.delta" not in (await ws.receive()).data:
                pass
        rec = await _backend_record(gw, marker)
        left = time.monotonic()
        if transport == "ws-close":  # a close frame, as a client that stops does
            await ws.close()
        else:  # the TCP connection just goes away, as a killed client's does
            assert ws._response.connection is not None
            ws._response.connection.transport.abort()  # type: ignore[union-attr]
            await ws.close()
    await rec.wait_disconnect(DEADLINE)
    assert rec.disconnected_at is not None
    return rec.disconnected_at - left


async def run_disconnects(transport: str, count: int, concurrency: int) -> list[float]:
    """`count` clients leave mid-turn (`concurrency` at a time, the three kinds interleaved)."""
    async with GatewayHarness() as gw, client_session() as session:
        baseline = await warm(gw, session)
        objects = census()
        # The SDK models this process holds would make each full collection a pause of
        # tens of ms, charged to whichever disconnect it lands on; the gateway has no such
        # heap of its own. Frozen objects are skipped by collections until unfrozen.
        gc.freeze()
        gw.backend.responder = _disconnect_responder
        kinds = list(DISCONNECT_SCRIPTS)
        gate = asyncio.Semaphore(concurrency)
        delays: list[tuple[float, str]] = []

        async def one(i: int) -> None:
            async with gate:
                marker = f"{kinds[i % len(kinds)]}|{i}"
                delays.append((await _disconnect_once(gw, session, marker, transport), marker))

        try:
            await asyncio.gather(*(one(i) for i in range(count)))
        finally:
            gc.unfreeze()
        assert gw.backend.disconnects == count
        gw.backend.responder = None
        await settled(gw, baseline)
        assert census() == objects
        after = await sse_turn(session, gw.url)
        assert after.response is not None and after.response["status"] == "completed"
    delays.sort()
    worst, which = delays[-1]
    median = delays[len(delays) // 2][0]
    LEDGER.cuts[transport] = (count, median, worst)
    assert worst < CUT_WITHIN, (
        f"the backend request of {which!r} outlived its client by {worst * 1000:.1f} ms"
        f" (median {median * 1000:.1f} ms, next {[round(d * 1000) for d, _ in delays[-5:-1]]})"
    )
    return [d for d, _ in delays]


@pytest.mark.parametrize("transport", ["sse", "ws-close", "ws-abort"])
async def test_disconnect_cancels_backend_and_leaves_nothing(transport: str) -> None:
    await run_disconnects(transport, count=99, concurrency=8)


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["sse", "ws-close", "ws-abort"])
async def test_disconnect_soak(transport: str) -> None:
    await run_disconnects(transport, count=1_000, concurrency=16)
