"""Load and backpressure: many concurrent turns, and one very slow client.

- Concurrent SSE streams and WebSocket sessions: every request declares its own namespace
  (`mcp__n{i}`) and a nonce; the backend answers each with a call on that request's first
  flat tool carrying the nonce, so a call that reached the wrong client, or came back under
  another request's name or namespace, is caught. Zero errors, zero misrouted calls, and
  nothing left behind afterwards.
- A slow client (one byte per millisecond, a 4 KiB receive buffer) on a 50 MB answer: the
  backend's writes block (TCP flow control reaches it through the gateway), the gateway's
  write buffer and its process memory stay bounded.

The default run uses ~200 of each; `make soak` runs the `*_load` variants with 1,000.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import socket
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from builders import gateway_process
from harness import GatewayHarness
from scripted_backend import (
    DONE,
    ScriptedBackend,
    chunk,
    finish,
    text_chunks,
    tool_call_chunks,
    usage,
)
from test_faults import (
    CUT_WITHIN,
    DEADLINE,
    Outcome,
    client_session,
    settled,
    sse_turn,
    warm,
    ws_read_turn,
)

from streamer.frontends.websocket import SESSIONS

# -- many concurrent turns ----------------------------------------------------------------

# A thousand turns at once share one event loop with their clients and the backend here:
# each may wait its turn for a while, but must still end.
LOAD_DEADLINE = 60.0


def raise_fd_limit(needed: int) -> None:
    """Each in-process stream holds four descriptors (client, gateway in, gateway out, backend)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            pytest.skip(f"needs {needed} open files, the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def tools_for(i: int) -> list[dict[str, Any]]:
    """Request i's tools: its own namespace first, then a shared top-level function."""
    params = {"type": "object", "properties": {"nonce": {"type": "string"}}}
    return [
        {
            "type": "namespace",
            "name": f"mcp__n{i}",
            "description": f"Server {i}.",
            "tools": [
                {"type": "function", "name": f"op{i % 7}", "parameters": params},
                {"type": "function", "name": "other", "parameters": params},
            ],
        },
        {"type": "function", "name": "exec_command", "parameters": params},
    ]


def expected_call(i: int) -> tuple[str, str]:
    return f"mcp__n{i}", f"op{i % 7}"


def call_responder(body: Any) -> list[Any]:
    """Call the request's first flat tool with its nonce; after a tool result, echo it."""
    last = body["messages"][-1]
    if last["role"] == "tool":
        return [*text_chunks(["done ", last["content"]]), finish("stop"), usage(9, 2), DONE]
    flat = body["tools"][0]["function"]["name"]
    nonce = last["content"]
    half = len(flat) // 2  # the name arrives in two pieces, as real backends send it
    return [
        *text_chunks(["Calling."]),
        *tool_call_chunks(0, f"call_{nonce}", [flat[:half], flat[half:]],
                          ['{"nonce":', orjson.dumps(nonce).decode() + "}"]),
        finish("tool_calls"),
        usage(7, 3),
        DONE,
    ]  # fmt: skip


def misrouted(outcome: Outcome, i: int, nonce: str) -> list[str]:
    """What is wrong with request i's call, as its client saw it (empty: nothing)."""
    response = outcome.response
    if response is None or response["status"] != "completed":
        return [f"no completed response: {outcome.seen}"]
    calls = [item for item in response["output"] if item["type"] == "function_call"]
    problems = []
    if len(calls) != 1:
        return [f"{len(calls)} calls"]
    (call,) = calls
    if (call.get("namespace"), call["name"]) != expected_call(i):
        problems.append(f"call {call.get('namespace')}/{call['name']}, expected {expected_call(i)}")
    if orjson.loads(call["arguments"]) != {"nonce": nonce} or call["call_id"] != f"call_{nonce}":
        problems.append(f"another request's call: {call['arguments']} {call['call_id']}")
    for event in outcome.events:  # every surface that names the call agrees
        item = event.get("item")
        if (
            item
            and item.get("type") == "function_call"
            and ((item.get("namespace"), item["name"]) != expected_call(i))
        ):
            problems.append(f"{event['type']} names {item.get('namespace')}/{item['name']}")
    return problems


def sampled(i: int) -> bool:
    """Every tenth turn is checked against the SDK's models too (the rest: framing,
    sequence numbers and identities); validating all would make the client the load."""
    return i % 10 == 0


async def concurrent_sse(count: int, deadline: float) -> None:
    raise_fd_limit(4 * count + 256)
    async with GatewayHarness() as gw, client_session() as session:
        baseline = await warm(gw, session)
        gw.backend.responder = call_responder
        start = asyncio.Event()

        async def one(i: int) -> list[str]:
            nonce = f"sse-{i}-{time.monotonic_ns()}"
            await start.wait()
            body = {"model": "m", "input": nonce, "tools": tools_for(i)}
            try:
                outcome = await sse_turn(
                    session, gw.url, body, validate=sampled(i), deadline=deadline
                )
            except Exception as exc:  # counted, not raised: the report lists every failure
                return [f"error: {exc!r}"]
            return misrouted(outcome, i, nonce)

        tasks = [asyncio.ensure_future(one(i)) for i in range(count)]
        start.set()  # all at once
        results = await asyncio.gather(*tasks)
        failures = {i: r for i, r in enumerate(results) if r}
        assert not failures, (
            f"{len(failures)} of {count} failed: {dict(list(failures.items())[:5])}"
        )
        assert len(gw.backend.requests) == count + 1
        gw.backend.responder = None
        await settled(gw, baseline, wait=10)


async def concurrent_ws(count: int, deadline: float) -> None:
    """Each session: a call, then its result in a continuation, on the same socket."""
    raise_fd_limit(4 * count + 256)
    async with GatewayHarness() as gw, client_session() as session:
        baseline = await warm(gw, session)
        gw.backend.responder = call_responder
        start = asyncio.Event()

        async def one(i: int) -> list[str]:
            nonce = f"ws-{i}-{time.monotonic_ns()}"
            try:
                async with session.ws_connect(gw.ws_url) as ws:
                    await start.wait()
                    create = {"type": "response.create", "model": "m", "tools": tools_for(i)}
                    await ws.send_bytes(orjson.dumps({**create, "input": nonce}))
                    first = await ws_read_turn(ws, validate=sampled(i), deadline=deadline)
                    problems = misrouted(first, i, nonce)
                    if problems:
                        return problems
                    assert first.response is not None
                    result = {"type": "function_call_output", "call_id": f"call_{nonce}",
                              "output": f"result {nonce}"}  # fmt: skip
                    await ws.send_bytes(orjson.dumps(
                        {**create, "previous_response_id": first.response["id"], "input": [result]}
                    ))  # fmt: skip
                    second = await ws_read_turn(ws, validate=sampled(i), deadline=deadline)
                    if second.text != f"done result {nonce}":
                        return [f"continuation answered {second.text!r} ({second.seen})"]
                    return []
            except Exception as exc:
                return [f"error: {exc!r}"]

        tasks = [asyncio.ensure_future(one(i)) for i in range(count)]
        while len(gw.runner.app[SESSIONS]) < count:  # type: ignore[union-attr]
            await asyncio.sleep(0.01)
        start.set()  # every socket is open: all sessions run their turns at once
        results = await asyncio.gather(*tasks)
        failures = {i: r for i, r in enumerate(results) if r}
        assert not failures, (
            f"{len(failures)} of {count} failed: {dict(list(failures.items())[:5])}"
        )
        assert len(gw.backend.requests) == 2 * count + 1
        gw.backend.responder = None
        await settled(gw, baseline, wait=10)


async def test_concurrent_streams_are_never_misrouted() -> None:
    await concurrent_sse(200, DEADLINE)


async def test_concurrent_websocket_sessions_are_never_misrouted() -> None:
    await concurrent_ws(200, DEADLINE)


@pytest.mark.slow
async def test_concurrent_streams_load() -> None:
    await concurrent_sse(1_000, LOAD_DEADLINE)


@pytest.mark.slow
async def test_concurrent_websocket_sessions_load() -> None:
    await concurrent_ws(1_000, LOAD_DEADLINE)


# -- one slow client --------------------------------------------------------------------

PIECE = "x" * 1000
FRAME = b"data: " + orjson.dumps(chunk({"content": PIECE})) + b"\n\n"
FRAMES = 50_000  # 50 MB of text, about 55 MB of backend SSE


def huge_answer(body: Any) -> list[Any]:
    return [FRAME] * FRAMES + [finish("stop"), DONE]


def _ws_create_frame(payload: bytes) -> bytes:
    """A client's (masked) text frame; the mask is all zeros, which leaves the bytes as
    they are, and is still a mask as the protocol demands."""
    assert 126 <= len(payload) < 65536
    return b"\x81\xfe" + len(payload).to_bytes(2, "big") + b"\x00\x00\x00\x00" + payload


@contextlib.asynccontextmanager
async def slow_client(port: int, mode: str = "sse") -> Any:
    """A raw client with a 4 KiB receive buffer, over SSE or a WebSocket (`mode`);
    `read_slowly(seconds)` reads one byte per millisecond (at most)."""
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", port))
    if mode == "ws":
        await loop.sock_sendall(
            sock,
            b"GET /v1/responses HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            b"Sec-WebSocket-Version: 13\r\n\r\n",
        )
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += await loop.sock_recv(sock, 1)
        assert answer.startswith(b"HTTP/1.1 101"), answer
        create = {"type": "response.create", "model": "m", "input": "a long answer, please"}
        await loop.sock_sendall(sock, _ws_create_frame(orjson.dumps(create).ljust(200)))
    else:
        body = orjson.dumps({"model": "m", "input": "a long answer, please", "stream": True})
        head = (
            b"POST /v1/responses HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
        )
        await loop.sock_sendall(sock, head + body)

    class Reader:
        received = b""

        async def read_slowly(self, seconds: float, each: Any = None) -> None:
            until = time.monotonic() + seconds
            while time.monotonic() < until:
                self.received += await loop.sock_recv(sock, 1)
                if each is not None:
                    each()
                await asyncio.sleep(0.001)

    try:
        yield Reader()
    finally:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        sock.close()  # with linger 0: a reset, as a killed client's


def _chat_record(backend: ScriptedBackend) -> Any:
    return [r for r in backend.records if r.path.endswith("/chat/completions")][-1]


@pytest.mark.parametrize("mode", ["sse", "ws"])
async def test_slow_client_backpressure_reaches_the_backend(mode: str) -> None:
    """In-process, so the gateway's own transport can be watched."""
    async with GatewayHarness() as gw, client_session() as session:
        baseline = await warm(gw, session)
        gw.backend.responder = huge_answer
        port = int(gw.url.rsplit(":", 1)[1].split("/")[0])
        buffered = [0]

        def watch() -> None:  # the gateway's unsent bytes towards this client
            for conn in gw.runner.server.connections:  # type: ignore[union-attr]
                if conn.transport is not None:
                    buffered[0] = max(buffered[0], conn.transport.get_write_buffer_size())

        async with slow_client(port, mode) as client:
            await client.read_slowly(1.0, watch)
            rec = _chat_record(gw.backend)
            at_one = rec.steps_written
            await client.read_slowly(1.0, watch)
            at_two = rec.steps_written
            left = time.monotonic()
        if mode == "sse":
            assert client.received.startswith(b"HTTP/1.1 200"), client.received[:200]
        else:  # the first text frame: response.created
            assert client.received.startswith(b"\x81"), client.received[:200]
            assert b'"type":"response.created"' in client.received[:400]
        assert not rec.completed and at_two < FRAMES * 0.4, (at_two, FRAMES)
        # blocked: in the last second it wrote what the client's second of reading freed
        assert at_two - at_one < FRAMES * 0.01, (at_one, at_two)
        # the gateway holds one batch of events at most, never the backlog
        assert buffered[0] < 1 << 20, buffered[0]
        await rec.wait_disconnect(DEADLINE)
        assert rec.disconnected_at is not None and rec.disconnected_at - left < CUT_WITHIN
        gw.backend.responder = None
        await settled(gw, baseline)


async def slow_client_memory(tmp_path: Path, seconds: float) -> None:
    async with ScriptedBackend() as backend:
        backend.responder = huge_answer
        async with gateway_process(tmp_path / "gw.log", "--upstream", backend.base_url) as gw:
            backend.script([*text_chunks(["warm"]), finish("stop"), usage(1, 1), DONE])
            async with client_session() as session:  # warm: imports, pools, first turn
                outcome = await sse_turn(session, gw.url)
                assert outcome.response is not None and outcome.response["status"] == "completed"
            base = gw.rss()
            peak = [base]

            def watch() -> None:
                peak[0] = max(peak[0], gw.rss())

            async with slow_client(gw.port) as client:
                await client.read_slowly(seconds - 1, watch)
                rec = _chat_record(backend)
                before = rec.steps_written
                await client.read_slowly(1.0, watch)
                after = rec.steps_written
            await rec.wait_disconnect(DEADLINE)
            assert not rec.completed and after < FRAMES * 0.4, (after, FRAMES)
            assert after - before < FRAMES * 0.01, (before, after)
            grown = peak[0] - base
            # Had the gateway read the whole answer it would hold 50 MB of text at least;
            # it holds what flow control let through (a few MB in socket buffers).
            assert grown < 24 << 20, f"gateway RSS grew by {grown >> 20} MB"
            assert gw.process.returncode is None, gw.log()


async def test_slow_client_gateway_memory_stays_bounded(tmp_path: Path) -> None:
    await slow_client_memory(tmp_path, 2.0)


@pytest.mark.slow
async def test_slow_client_memory_load(tmp_path: Path) -> None:
    await slow_client_memory(tmp_path, 20.0)
