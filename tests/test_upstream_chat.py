"""The Chat kind's client (the shared `BackendClient` over Chat's wire) against the scripted
backend, a real HTTP server on loopback."""

from __future__ import annotations

import asyncio
import socket
import traceback
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from scripted_backend import (
    DIE,
    DONE,
    HANG,
    DelayHeaders,
    ScriptedBackend,
    Sleep,
    Status,
    completion,
    error_chunk,
    finish,
    reasoning_chunks,
    refusing_url,
    text_chunks,
    tool_call_chunks,
    usage,
)

from streamer.core.deltas import (
    Delta,
    Finish,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    UpstreamError,
    Usage,
)
from streamer.core.errors import RequestError
from streamer.upstream.backend_client import BackendClient
from streamer.upstream.backend_stream import BackendStream
from streamer.upstream.chat.client import chat_client

SECRET = "sk-planted-secret-4242"
REQUEST: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
async def backend() -> AsyncIterator[ScriptedBackend]:
    async with ScriptedBackend() as b:
        yield b


@pytest.fixture
async def upstream(backend: ScriptedBackend) -> AsyncIterator[BackendClient]:
    up = chat_client(backend.base_url, api_key=SECRET)
    yield up
    await up.close()


async def batches(stream: BackendStream) -> list[list[Delta]]:
    """Every batch of the stream: `first` (if its first bytes came with the head), then the rest."""
    return [*([stream.first] if stream.first is not None else []), *[b async for b in stream]]


async def first_batch(stream: BackendStream) -> list[Delta]:
    """The stream's first batch, whether it came with the head or is read now."""
    return stream.first if stream.first is not None else await anext(stream)


async def run(up: BackendClient, request: dict[str, Any] | None = None) -> list[list[Delta]]:
    stream = await up.open(request or REQUEST)
    try:
        return await batches(stream)
    finally:
        await stream.aclose()


def flat(batches: list[list[Delta]]) -> list[Delta]:
    return [d for b in batches for d in b]


async def test_text_stream_and_request_shape(
    backend: ScriptedBackend, upstream: BackendClient
) -> None:
    backend.script(
        [
            *reasoning_chunks(["Let me", " think"]),
            *text_chunks(["Hel", "lo"]),
            finish("stop"),
            usage(7, 3),
            DONE,
        ]
    )
    request = {**REQUEST, "temperature": 0.5, "stream_options": {"other": 1}, "stream": False}
    deltas = flat(await run(upstream, request))
    assert deltas == [
        ReasoningDelta("Let me"),
        ReasoningDelta(" think"),
        TextDelta("Hel"),
        TextDelta("lo"),
        Finish("stop"),
        Usage(7, 3),
    ]
    (sent,) = backend.requests
    assert sent["stream"] is True
    assert sent["stream_options"] == {"other": 1, "include_usage": True}
    assert sent["temperature"] == 0.5 and sent["messages"] == REQUEST["messages"]
    assert request["stream"] is False  # the caller's dict is not modified
    headers = backend.records[0].headers
    assert headers["Authorization"] == f"Bearer {SECRET}"
    assert headers["Accept"] == "text/event-stream"


async def test_extra_headers_are_sent_and_override(
    backend: ScriptedBackend, upstream: BackendClient
) -> None:
    stream = await upstream.open(
        REQUEST, headers={"X-Request-Id": "req-1", "authorization": "Bearer client"}
    )
    await stream.aclose()
    headers = backend.records[0].headers
    assert headers["X-Request-Id"] == "req-1"
    assert headers["Authorization"] == "Bearer client"


async def test_tool_call_split_over_chunks(
    backend: ScriptedBackend, upstream: BackendClient
) -> None:
    backend.script(
        [
            *tool_call_chunks(0, "call_1", ["mcp__docs", "__sea", "rch"], ['{"q"', ': "x', '"}']),
            finish("tool_calls"),
            DONE,
        ]
    )
    calls = [d for d in flat(await run(upstream)) if isinstance(d, ToolCallDelta)]
    assert {d.index for d in calls} == {0}
    assert [d.id for d in calls if d.id] == ["call_1"]
    assert "".join(d.name or "" for d in calls) == "mcp__docs__search"
    assert orjson.loads("".join(d.arguments for d in calls)) == {"q": "x"}


async def test_usage_only_chunk(backend: ScriptedBackend, upstream: BackendClient) -> None:
    backend.script([*text_chunks(["a"]), finish("stop"), usage(10, 4, cached=6, reasoning=2), DONE])
    deltas = flat(await run(upstream))
    assert deltas[-1] == Usage(10, 4, cached_tokens=6, reasoning_tokens=2)


async def test_one_network_read_is_one_batch(
    backend: ScriptedBackend, upstream: BackendClient
) -> None:
    frames = b"".join(
        b"data: " + orjson.dumps(c) + b"\n\n"
        for c in [*text_chunks(["a", "b", "c"]), finish("stop")]
    )
    backend.script([frames + DONE])
    batches = await run(upstream)
    assert batches == [[TextDelta("a"), TextDelta("b"), TextDelta("c"), Finish("stop")]]


async def test_crlf_framing_comments_and_split_frames(
    backend: ScriptedBackend, upstream: BackendClient
) -> None:
    frame = b"data: " + orjson.dumps(text_chunks(["héllo"])[0]) + b"\r\n\r\n"
    backend.script(
        [b": ping\r\n\r\n", frame[:7], Sleep(0.01), frame[7:30], frame[30:], finish("stop"), DONE]
    )
    assert flat(await run(upstream)) == [TextDelta("héllo"), Finish("stop")]


async def test_backend_400_keeps_status_and_message(
    backend: ScriptedBackend, upstream: BackendClient
) -> None:
    error = {
        "message": "This model's maximum context length is 4096 tokens.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
    backend.script([Status(400, {"error": error})])
    with pytest.raises(RequestError) as info:
        await upstream.open(REQUEST)
    exc = info.value
    assert (exc.status, exc.message, exc.type, exc.param, exc.code) == (
        400,
        error["message"],
        "invalid_request_error",
        "messages",
        "context_length_exceeded",
    )


async def test_vllm_flat_error_and_plain_text_5xx(
    backend: ScriptedBackend, upstream: BackendClient
) -> None:
    backend.script(
        [
            Status(
                404,
                {
                    "object": "error",
                    "message": "The model `x` does not exist.",
                    "type": "NotFoundError",
                    "code": 404,
                },
            )
        ],
        [Status(503, "upstream overloaded")],
    )
    with pytest.raises(RequestError) as info:
        await upstream.open(REQUEST)
    assert (info.value.status, info.value.message, info.value.code) == (
        404,
        "The model `x` does not exist.",
        None,
    )
    with pytest.raises(RequestError) as info:
        await upstream.open(REQUEST)
    assert info.value.status == 503 and info.value.type == "server_error"
    assert "upstream overloaded" in info.value.message


async def test_429_keeps_retry_after(backend: ScriptedBackend, upstream: BackendClient) -> None:
    body = {
        "error": {
            "message": "Rate limit reached",
            "type": "requests",
            "code": "rate_limit_exceeded",
        }
    }
    backend.script([Status(429, body, {"Retry-After": "7", "X-RateLimit-Remaining-Requests": "0"})])
    with pytest.raises(RequestError) as info:
        await upstream.open(REQUEST)
    exc = info.value
    assert (
        exc.status == 429
        and exc.code == "rate_limit_exceeded"
        and exc.message == "Rate limit reached"
    )
    assert exc.headers["retry-after"] == "7"
    assert exc.headers["x-ratelimit-remaining-requests"] == "0"


async def test_refused_connection_is_502_without_the_key() -> None:
    up = chat_client(refusing_url(), api_key=SECRET, connect_timeout=2)
    try:
        with pytest.raises(RequestError) as info:
            await up.open(REQUEST)
        exc = info.value
        assert (exc.status, exc.type, exc.code) == (502, "server_error", "upstream_unreachable")
        assert "refused" in exc.message
        text = "".join(traceback.format_exception(exc)) + repr(exc) + str(exc.body()) + repr(up)
        assert SECRET not in text
        with pytest.raises(RequestError) as info:
            await up.get_models()
        assert info.value.status == 502
        assert await up.ping() is False
    finally:
        await up.close()


async def test_unresolvable_host_is_502() -> None:
    up = chat_client("http://no-such-host.invalid/v1", connect_timeout=3)
    try:
        with pytest.raises(RequestError) as info:
            await up.open(REQUEST)
        assert (info.value.status, info.value.code) == (502, "upstream_unreachable")
    finally:
        await up.close()


async def test_backend_dying_mid_stream(backend: ScriptedBackend, upstream: BackendClient) -> None:
    backend.script([*text_chunks(["partial"]), Sleep(0.02), DIE])
    deltas = flat(await run(upstream))
    assert deltas[0] == TextDelta("partial")
    assert isinstance(deltas[-1], UpstreamError)
    assert deltas[-1].code == "server_error" and "closed the stream" in deltas[-1].message


async def test_eof_without_done(backend: ScriptedBackend, upstream: BackendClient) -> None:
    backend.script([*text_chunks(["cut"])], [*text_chunks(["whole"]), finish("stop")])
    cut = flat(await run(upstream))
    assert cut[0] == TextDelta("cut") and isinstance(cut[-1], UpstreamError)
    # a finish reason without [DONE] is a complete answer
    assert flat(await run(upstream)) == [TextDelta("whole"), Finish("stop")]


async def test_idle_timeout_fails_and_cuts_the_backend(backend: ScriptedBackend) -> None:
    backend.script([*text_chunks(["first"]), Sleep(30), finish("stop"), DONE])
    up = chat_client(backend.base_url, idle_timeout=0.3)
    try:
        deltas = flat(await run(up))
        assert deltas[0] == TextDelta("first")
        assert isinstance(deltas[-1], UpstreamError) and deltas[-1].code == "upstream_timeout"
        await backend.records[0].wait_disconnect(timeout=5)
        assert not backend.records[0].completed
    finally:
        await up.close()


async def test_slow_headers_are_a_504(backend: ScriptedBackend) -> None:
    backend.script([DelayHeaders(30), *text_chunks(["late"]), DONE])
    up = chat_client(backend.base_url, idle_timeout=0.3)
    try:
        with pytest.raises(RequestError) as info:
            await up.open(REQUEST)
        assert (info.value.status, info.value.code) == (504, "upstream_timeout")
        await backend.records[0].wait_disconnect(timeout=5)
    finally:
        await up.close()


async def test_aclose_disconnects_the_backend_at_once(
    backend: ScriptedBackend, upstream: BackendClient
) -> None:
    backend.script([*text_chunks(["a"]), HANG])
    stream = await upstream.open(REQUEST)
    assert await first_batch(stream) == [TextDelta("a")]
    await stream.aclose()
    await backend.records[0].wait_disconnect(timeout=5)
    assert backend.disconnects == 1 and not backend.records[0].completed
    with pytest.raises(StopAsyncIteration):
        await anext(stream)


async def test_cancelling_the_reader_disconnects_the_backend(
    backend: ScriptedBackend, upstream: BackendClient
) -> None:
    backend.script([*text_chunks(["a"]), HANG])
    stream = await upstream.open(REQUEST)
    first = asyncio.Event()

    async def consume() -> None:
        if stream.first is not None:  # "a" came with the head
            first.set()
        async for _ in stream:
            first.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(first.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await backend.records[0].wait_disconnect(timeout=5)


async def test_non_streaming_json_answer_is_decoded(
    backend: ScriptedBackend, upstream: BackendClient
) -> None:
    body = completion(
        "Sure.", tool_calls=[("call_9", "crm__lookup", '{"id":7}')], finish_reason="tool_calls"
    )
    backend.script([Status(200, body)])
    stream = await upstream.open(REQUEST)
    assert stream.first is not None and stream.first.end  # a whole answer: one last batch
    assert flat(await batches(stream)) == [
        TextDelta("Sure."),
        ToolCallDelta(0, "call_9", "crm__lookup", '{"id":7}'),
        Finish("tool_calls"),
        Usage(5, 2),
    ]


async def test_error_payload_mid_stream_ends_the_stream(
    backend: ScriptedBackend, upstream: BackendClient
) -> None:
    backend.script(
        [
            *text_chunks(["a"]),
            error_chunk("CUDA out of memory", code="oom"),
            *text_chunks(["never"]),
            HANG,
        ]
    )
    batches = await run(upstream)
    deltas = flat(batches)
    assert deltas[-1] == UpstreamError("oom", "CUDA out of memory", "server_error")
    assert TextDelta("never") not in deltas
    await backend.records[0].wait_disconnect(timeout=5)


async def test_malformed_json_mid_stream(backend: ScriptedBackend, upstream: BackendClient) -> None:
    backend.script([*text_chunks(["a"]), '{"choices": [{"delta": ', HANG])
    deltas = flat(await run(upstream))
    assert isinstance(deltas[-1], UpstreamError) and deltas[-1].code == "invalid_upstream_chunk"
    await backend.records[0].wait_disconnect(timeout=5)


async def test_sequential_streams_reuse_one_connection(
    backend: ScriptedBackend, upstream: BackendClient
) -> None:
    for word in ("one", "two", "three"):
        backend.script([*text_chunks([word]), finish("stop"), usage(1, 1), DONE])
        assert flat(await run(upstream))[0] == TextDelta(word)
    peers = {r.peer for r in backend.records}
    assert len(peers) == 1
    assert backend.disconnects == 0


async def test_connection_has_tcp_nodelay(
    backend: ScriptedBackend, upstream: BackendClient
) -> None:
    backend.script([*text_chunks(["a"]), HANG])
    stream = await upstream.open(REQUEST)
    try:
        transport = stream._resp.transport  # type: ignore[union-attr]
        sock = transport.get_extra_info("socket")  # type: ignore[union-attr]
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    finally:
        await stream.aclose()


async def test_models_and_ping(backend: ScriptedBackend, upstream: BackendClient) -> None:
    status, body = await upstream.get_models()
    assert status == 200
    assert [m["id"] for m in orjson.loads(body)["data"]] == backend.models
    assert await upstream.ping() is True
    assert backend.records[0].headers["Authorization"] == f"Bearer {SECRET}"


async def test_concurrent_streams_on_one_pool(
    backend: ScriptedBackend, upstream: BackendClient
) -> None:
    backend.responder = lambda body: [
        *text_chunks([body["messages"][0]["content"]]),
        finish("stop"),
        DONE,
    ]

    async def one(i: int) -> list[Delta]:
        return flat(
            await run(upstream, {"model": "m", "messages": [{"role": "user", "content": f"n{i}"}]})
        )

    results = await asyncio.gather(*(one(i) for i in range(50)))
    assert [r[0] for r in results] == [TextDelta(f"n{i}") for i in range(50)]


async def test_stream_is_an_async_context_manager(
    backend: ScriptedBackend, upstream: BackendClient
) -> None:
    backend.script([*text_chunks(["a"]), HANG])
    async with await upstream.open(REQUEST) as stream:
        assert isinstance(stream, BackendStream)
        assert await first_batch(stream) == [TextDelta("a")]
    await backend.records[0].wait_disconnect(timeout=5)


async def test_backend_closing_before_answering_is_502(
    backend: ScriptedBackend, upstream: BackendClient
) -> None:
    backend.script([("refuse",)], [*text_chunks(["ok"]), ("sleep", 0.01), ("die",)])
    with pytest.raises(RequestError) as info:
        await upstream.open(REQUEST)
    assert (info.value.status, info.value.type, info.value.code) == (
        502,
        "server_error",
        "upstream_error",
    )
    # the tuple spellings of the steps work too
    deltas = flat(await run(upstream))
    assert deltas[0] == TextDelta("ok") and isinstance(deltas[-1], UpstreamError)


async def test_cancelled_open_disconnects_the_backend(
    backend: ScriptedBackend, upstream: BackendClient
) -> None:
    backend.script([DelayHeaders(30), DONE])
    task = asyncio.create_task(upstream.open(REQUEST))
    async with asyncio.timeout(5):
        while not backend.records:
            await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await backend.records[0].wait_disconnect(timeout=5)


async def test_event_stream_labelled_json_is_still_decoded(
    backend: ScriptedBackend, upstream: BackendClient
) -> None:
    frames = b"".join(
        b"data: " + orjson.dumps(c) + b"\n\n" for c in [*text_chunks(["x"]), finish("stop")]
    )
    backend.script([Status(200, frames + DONE, {"Content-Type": "application/json"})])
    assert flat(await run(upstream)) == [TextDelta("x"), Finish("stop")]


async def test_on_raw_sees_every_body_byte(
    backend: ScriptedBackend, upstream: BackendClient
) -> None:
    script = [*text_chunks(["a", "b"]), finish("stop"), DONE]
    backend.script(script, [Status(200, completion("whole"))])
    seen: list[bytes] = []
    stream = await upstream.open(REQUEST, on_raw=seen.append)
    assert flat(await batches(stream)) == [TextDelta("a"), TextDelta("b"), Finish("stop")]
    sent = b"".join(
        s if isinstance(s, bytes) else b"data: " + orjson.dumps(s) + b"\n\n" for s in script
    )
    assert b"".join(seen) == sent
    seen.clear()
    stream = await upstream.open(REQUEST, on_raw=seen.append)
    assert await batches(stream)
    assert orjson.loads(b"".join(seen)) == completion("whole")


async def test_stall_after_finish_ends_normally(backend: ScriptedBackend) -> None:
    backend.script([*text_chunks(["a"]), finish("stop"), HANG])
    up = chat_client(backend.base_url, idle_timeout=0.3)
    try:
        assert flat(await run(up)) == [TextDelta("a"), Finish("stop")]
        await backend.records[0].wait_disconnect(timeout=5)
    finally:
        await up.close()
