"""Issue 13, rows 1, 7 and 10: what a hostile backend may make the gateway hold.

A backend that never stops, one that trickles forever, one that opens 100,000 tool
calls, ten that answer huge JSON bodies at once, one that sends a 100 MB SSE line. Each
turn must end well-formed (`incomplete` at an output limit, `failed` past the turn's
deadline, a clear 5xx for a body the gateway will not hold), the backend must be cut,
and the gateway's memory must stay bounded (RSS ceilings, generous margins, on a real
`python -m streamer serve` process). The figures are printed (`pytest -s`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from builders import ONE_FUNCTION as TOOLS
from builders import GatewayProcess, client_session, gateway_process, sse_events
from harness import GatewayHarness
from raw_backend import RawBackend, RawConnection, chunked, http_response, sse_data, sse_head
from sdk_models import validate_response
from test_faults import _sdk_view, check_error_body, check_events

import streamer.upstream.chat.stream as chat_module
from streamer.core.sse import SSEDecoder

MiB = 1 << 20
DEADLINE = 60.0  # a turn that has not ended by then never will: the test fails


def text_event(text: str) -> bytes:
    return b"data: " + orjson.dumps({"choices": [{"index": 0, "delta": {"content": text}}]})


def call_event(index: int) -> bytes:
    call = {"index": index, "id": f"call_{index}", "type": "function"}
    call["function"] = {"name": "f", "arguments": f'{{"n": {index}}}'}
    return b"data: " + orjson.dumps({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]})


def hwm(gateway: GatewayProcess) -> int:
    """Peak resident memory of the gateway process so far (VmHWM), in bytes."""
    for line in Path(f"/proc/{gateway.process.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def under_ceiling(gateway: GatewayProcess, ceiling: int, work: Awaitable[Any]) -> Any:
    """Run `work`, failing at once if the gateway's peak RSS passes `ceiling` meanwhile.

    A gateway without the bound grows by ~130 MB/s; the test must stop it early, not
    wait for the machine to run out of memory.
    """
    task = asyncio.ensure_future(work)
    try:
        async with asyncio.timeout(DEADLINE):
            while not task.done():
                peak = hwm(gateway)
                assert peak < ceiling, f"gateway peak RSS {peak / MiB:.0f} MiB >= {ceiling / MiB}"
                await asyncio.wait({task}, timeout=0.05)  # a bounded poll on a real condition
        return task.result()
    finally:
        task.cancel()
        with contextlib.suppress(BaseException):
            await task


def endless(cut: asyncio.Event, event: bytes, per_write: int = 16) -> Callable[..., Any]:
    """A backend that streams `event` as fast as the gateway reads, forever."""
    block = chunked(b"".join(event + b"\n\n" for _ in range(per_write)))

    async def handler(conn: RawConnection) -> None:
        if await conn.request() is None:
            return
        try:
            await conn.send(sse_head())
            while True:
                await conn.send(block)
        except ConnectionError:
            cut.set()  # the gateway let go of it
            raise

    return handler


async def json_answer(url: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with client_session() as session, session.post(url + "/responses", json=body) as resp:
        return resp.status, orjson.loads(await resp.read())


def output_text(response: dict[str, Any]) -> str:
    return "".join(
        part["text"]
        for item in response["output"]
        if item["type"] == "message"
        for part in item["content"]
    )


# -- row 1: the endless fast backend ---------------------------------------------------


@pytest.mark.parametrize("client", ["sse", "json"])
async def test_endless_backend_ends_incomplete_at_the_output_limit(
    tmp_path: Path, client: str
) -> None:
    """2,000-character deltas as fast as they go: cut at 4 MiB, `incomplete`, RSS bounded."""
    limit = 4 * MiB
    cut = asyncio.Event()
    async with (
        RawBackend(endless(cut, text_event("x" * 2000))) as backend,
        gateway_process(
            tmp_path / "gw.log", "--upstream", backend.url, "--max-output-bytes", str(limit)
        ) as gateway,
    ):
        body = {"model": "m", "input": "go"}
        if client == "sse":
            events = await under_ceiling(gateway, 200 * MiB, sse_events(gateway.url, body))
            response = check_events(events)
            assert events[-1]["type"] == "response.incomplete"
        else:
            status, response = await under_ceiling(
                gateway, 200 * MiB, json_answer(gateway.url, body)
            )
            assert status == 200, response
            validate_response(_sdk_view(response))
        async with asyncio.timeout(10):
            await cut.wait()  # the backend was cut, not left streaming
        peak = hwm(gateway)
        log = gateway.log()
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert len(output_text(response)) == limit  # the output so far is kept, to the limit
    assert "--max-output-bytes" in log
    print(f"\nendless backend ({client} client, --max-output-bytes 4 MiB): "
          f"peak RSS {peak / MiB:.0f} MiB")  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("client", ["sse", "json"])
async def test_endless_backend_at_the_default_limit(tmp_path: Path, client: str) -> None:
    """The same attack at the default 16 MiB: the figure for the report."""
    cut = asyncio.Event()
    async with (
        RawBackend(endless(cut, text_event("x" * 2000))) as backend,
        gateway_process(tmp_path / "gw.log", "--upstream", backend.url) as gateway,
    ):
        body = {"model": "m", "input": "go"}
        if client == "sse":
            events = await under_ceiling(gateway, 600 * MiB, sse_events(gateway.url, body))
            response = check_events(events, validate=False)
        else:
            _, response = await under_ceiling(gateway, 600 * MiB, json_answer(gateway.url, body))
        peak = hwm(gateway)
    assert response["status"] == "incomplete"
    assert len(output_text(response)) == 16 * MiB
    print(f"\nendless backend ({client} client, default 16 MiB): peak RSS {peak / MiB:.0f} MiB")


# -- the turn's deadline -----------------------------------------------------------------


def trickle(cut: asyncio.Event) -> Callable[..., Any]:
    """A backend that sends a small delta every 20 ms, forever: never idle, never done."""

    async def handler(conn: RawConnection) -> None:
        if await conn.request() is None:
            return
        try:
            await conn.send(sse_head())
            while True:
                await conn.send(sse_data(text_event("tick")[6:]))
                await asyncio.sleep(0.02)  # the attack's pace, not a synchronisation
        except ConnectionError:
            cut.set()
            raise

    return handler


@pytest.mark.parametrize("stream", [True, False])
async def test_trickling_backend_fails_at_the_turn_deadline(stream: bool) -> None:
    cut = asyncio.Event()
    async with (
        RawBackend(trickle(cut)) as backend,
        GatewayHarness(upstream=backend.url, max_turn_seconds=1.0) as gw,
    ):
        body = {"model": "m", "input": "go"}
        async with asyncio.timeout(DEADLINE):
            if stream:
                events = await sse_events(gw.url, body)
                response = check_events(events)
                assert events[-1]["type"] == "response.failed"
            else:
                status, response = await json_answer(gw.url, body)
                assert status == 200, response
                validate_response(_sdk_view(response))
            await cut.wait()
    assert response["status"] == "failed"
    error = response["error"]
    assert (error["code"], error["type"]) == ("server_error", "turn_timeout"), error
    assert "1 s" in error["message"]
    assert output_text(response).startswith("tick")  # what came before the deadline is kept


async def test_backend_that_never_answers_fails_at_the_turn_deadline() -> None:
    """The deadline also bounds the wait for the backend's head: a 504, nothing streamed."""
    gone = asyncio.Event()

    async def silent(conn: RawConnection) -> None:
        if await conn.request() is not None:
            await conn.request()  # returns at EOF: the gateway hung up
            gone.set()

    async with (
        RawBackend(silent) as backend,
        GatewayHarness(upstream=backend.url, max_turn_seconds=0.5) as gw,
    ):
        async with asyncio.timeout(DEADLINE):
            status, body = await json_answer(gw.url, {"model": "m", "input": "go"})
            await gone.wait()
    assert status == 504, body
    assert check_error_body(body) == "turn_timeout"


# -- row 7: 100,000 tool calls -----------------------------------------------------------


def many_calls(count: int) -> Callable[..., Any]:
    """One response of `count` parallel tool calls, ~110 bytes each, then the end."""
    events = [call_event(i) + b"\n\n" for i in range(count)]
    finish = {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}
    events.append(b"data: " + orjson.dumps(finish) + b"\n\ndata: [DONE]\n\n")
    blocks = [chunked(b"".join(events[i : i + 512])) for i in range(0, len(events), 512)]

    async def handler(conn: RawConnection) -> None:
        if await conn.request() is None:
            return
        await conn.send(sse_head())
        for block in blocks:
            await conn.send(block)
        await conn.send(chunked(b""))

    return handler


async def test_100k_tool_calls_are_cut_at_the_items_limit(tmp_path: Path) -> None:
    body = {"model": "m", "input": "go", "tools": TOOLS}
    async with (
        RawBackend(many_calls(100_000)) as backend,
        gateway_process(tmp_path / "gw.log", "--upstream", backend.url) as gateway,
    ):
        events = await under_ceiling(gateway, 300 * MiB, sse_events(gateway.url, body))
        peak = hwm(gateway)
        log = gateway.log()
    response = check_events(events, validate=False)
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    calls = [item for item in response["output"] if item["type"] == "function_call"]
    assert len(calls) == 2048  # the default --max-output-items, each call whole and in order
    assert [c["call_id"] for c in calls] == [f"call_{i}" for i in range(2048)]
    assert calls[-1]["arguments"] == '{"n": 2047}'
    assert "--max-output-items" in log
    print(f"\n100,000 tool calls (default limits): peak RSS {peak / MiB:.0f} MiB")


@pytest.mark.slow
async def test_100k_tool_calls_held_whole(tmp_path: Path) -> None:
    """The items limit raised past the attack: every call held, emitted, and bounded."""
    body = {"model": "m", "input": "go", "tools": TOOLS}
    async with (
        RawBackend(many_calls(100_000)) as backend,
        gateway_process(
            tmp_path / "gw.log", "--upstream", backend.url, "--max-output-items", "200000"
        ) as gateway,
    ):
        events = await under_ceiling(gateway, 1200 * MiB, sse_events(gateway.url, body))
        peak = hwm(gateway)
    response = check_events(events, validate=False)
    assert response["status"] == "completed"
    assert len(response["output"]) == 100_000
    print(f"\n100,000 tool calls (items limit raised): peak RSS {peak / MiB:.0f} MiB")


# -- row 10: huge JSON bodies at once, one huge SSE line ---------------------------------


def huge_json(size: int, arrived: list[int], together: asyncio.Event, count: int) -> Any:
    """A chat.completion of `size` bytes, chunked, sent in two halves: the second half
    waits until every one of `count` backends has sent (or failed to send) its first."""
    text = "x" * MiB
    padding = "p" * (size - len(text) - 200)
    completion = {"choices": [{"index": 0, "message": {"content": text}, "finish_reason": "stop"}]}
    raw = orjson.dumps({**completion, "padding": padding})
    half = len(raw) // 2

    async def handler(conn: RawConnection) -> None:
        if await conn.request() is None:
            return
        head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        try:
            await conn.send((head + "Transfer-Encoding: chunked\r\n\r\n").encode())
            await conn.send(chunked(raw[:half]))
        finally:
            arrived.append(1)
            if len(arrived) == count:
                together.set()
        await together.wait()
        await conn.send(chunked(raw[half:]) + chunked(b""))

    return handler


async def test_ten_huge_json_bodies_share_one_budget(tmp_path: Path) -> None:
    """Ten 12 MB bodies at once against a 32 MiB budget: some 503, the rest served."""
    arrived: list[int] = []
    together = asyncio.Event()
    async with (
        RawBackend(huge_json(12 * MiB, arrived, together, 10)) as backend,
        gateway_process(
            tmp_path / "gw.log",
            "--upstream",
            backend.url,
            "--max-backend-json-bytes",
            str(32 * MiB),
        ) as gateway,
    ):
        body = {"model": "m", "input": "go"}
        turns = asyncio.gather(*(json_answer(gateway.url, body) for _ in range(10)))
        answers = await under_ceiling(gateway, 400 * MiB, turns)
        peak = hwm(gateway)
        assert gateway.process.returncode is None
    statuses = sorted(status for status, _ in answers)
    refused = [body for status, body in answers if status == 503]
    served = [body for status, body in answers if status == 200]
    assert refused and served, statuses
    assert len(refused) + len(served) == 10, statuses
    for body in refused:
        assert check_error_body(body) == "upstream_response_too_large"
        assert "--max-backend-json-bytes" in body["error"]["message"]
    for body in served:
        assert body["status"] == "completed" and len(output_text(body)) == MiB
    print(f"\nten 12 MB JSON bodies, 32 MiB budget: {len(served)} served, {len(refused)} "
          f"refused (503); peak RSS {peak / MiB:.0f} MiB")  # fmt: skip


async def test_endless_json_body_is_refused_at_the_per_body_cap(tmp_path: Path) -> None:
    """A JSON body that never ends: 502 once past 4x --max-output-bytes, the backend cut."""
    cut = asyncio.Event()
    block = chunked(b" " * 65536)

    async def handler(conn: RawConnection) -> None:
        if await conn.request() is None:
            return
        head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        try:
            await conn.send((head + "Transfer-Encoding: chunked\r\n\r\n").encode() + chunked(b"{"))
            while True:
                await conn.send(block)
        except ConnectionError:
            cut.set()
            raise

    async with (
        RawBackend(handler) as backend,
        gateway_process(
            tmp_path / "gw.log", "--upstream", backend.url, "--max-output-bytes", str(MiB)
        ) as gateway,
    ):
        answer = json_answer(gateway.url, {"model": "m", "input": "go"})
        status, body = await under_ceiling(gateway, 200 * MiB, answer)
        async with asyncio.timeout(10):
            await cut.wait()
    assert status == 502, body
    assert check_error_body(body) == "upstream_response_too_large", body


async def test_declared_huge_json_body_is_refused_before_it_is_read() -> None:
    async def handler(conn: RawConnection) -> None:
        if await conn.request() is not None:
            head = http_response(b"", headers={})
            await conn.send(head.replace(b"Content-Length: 0", b"Content-Length: 104857600"))
            await conn.request()  # EOF: the gateway hung up without reading 100 MB

    async with RawBackend(handler) as backend, GatewayHarness(upstream=backend.url) as gw:
        async with asyncio.timeout(DEADLINE):
            status, body = await json_answer(gw.url, {"model": "m", "input": "go"})
    assert status == 502, body
    assert check_error_body(body) == "upstream_response_too_large", body


class CountingDecoder(SSEDecoder):
    """The gateway's own decoder, remembered so the test can read its `copied` counter."""

    made: list[SSEDecoder] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        CountingDecoder.made.append(self)


async def test_100mb_sse_line_is_rejected_in_linear_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """One `data:` line of 100 MB: refused at 16 MiB, each pending byte copied O(1) times."""
    monkeypatch.setattr(chat_module, "SSEDecoder", CountingDecoder)
    CountingDecoder.made = []
    cut = asyncio.Event()
    sent = [0]
    block = chunked(b"x" * 65536)

    async def handler(conn: RawConnection) -> None:
        if await conn.request() is None:
            return
        try:
            await conn.send(sse_head() + chunked(b"data: "))
            while sent[0] < 100 * MiB:
                await conn.send(block)
                sent[0] += 65536
        except ConnectionError:
            cut.set()
            raise

    started = os.times()
    async with RawBackend(handler) as backend, GatewayHarness(upstream=backend.url) as gw:
        async with asyncio.timeout(DEADLINE):
            events = await sse_events(gw.url, {"model": "m", "input": "go"})
            await cut.wait()
    ended = os.times()
    response = check_events(events)
    assert response["status"] == "failed"
    assert "exceeded 16777216 bytes" in response["error"]["message"], response["error"]
    (decoder,) = CountingDecoder.made
    fed = 16 * MiB + 2 * 65536  # at most this much reaches the decoder before it refuses
    assert decoder.copied <= 2 * fed, decoder.copied  # linear: the base copied ~ n²/2 bytes
    cpu = (ended.user - started.user) + (ended.system - started.system)
    print(f"\n100 MB SSE line: refused after {sent[0] / MiB:.0f} MiB sent; "
          f"{decoder.copied / MiB:.1f} MiB of pending bytes copied; "
          f"test process CPU {cpu:.2f} s (backend + gateway + client)")  # fmt: skip


@pytest.mark.slow
async def test_100mb_sse_line_gateway_cpu(tmp_path: Path) -> None:
    """The same line against a gateway process: its CPU seconds, for the report."""
    cut = asyncio.Event()
    block = chunked(b"x" * 65536)

    async def handler(conn: RawConnection) -> None:
        if await conn.request() is None:
            return
        try:
            await conn.send(sse_head() + chunked(b"data: "))
            for _ in range(1600):  # 100 MiB
                await conn.send(block)
        except ConnectionError:
            cut.set()
            raise

    async with (
        RawBackend(handler) as backend,
        gateway_process(tmp_path / "gw.log", "--upstream", backend.url) as gateway,
    ):
        before = cpu_seconds(gateway.process.pid)
        async with asyncio.timeout(DEADLINE):
            events = await sse_events(gateway.url, {"model": "m", "input": "go"})
            await cut.wait()
        used = cpu_seconds(gateway.process.pid) - before
    assert check_events(events)["status"] == "failed"
    print(f"\n100 MB SSE line: gateway CPU {used:.2f} s for the turn")


@pytest.mark.slow
async def test_ten_100mb_json_bodies_at_the_defaults(tmp_path: Path) -> None:
    """The issue's figure: ten 100 MB JSON bodies at once, default cap and budget."""
    block = chunked(b" " * MiB)

    async def handler(conn: RawConnection) -> None:
        if await conn.request() is None:
            return
        head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        await conn.send((head + "Transfer-Encoding: chunked\r\n\r\n").encode() + chunked(b"{"))
        for _ in range(100):
            await conn.send(block)
        await conn.send(chunked(b"}") + chunked(b""))

    async with (
        RawBackend(handler) as backend,
        gateway_process(tmp_path / "gw.log", "--upstream", backend.url) as gateway,
    ):
        body = {"model": "m", "input": "go"}
        turns = asyncio.gather(*(json_answer(gateway.url, body) for _ in range(10)))
        answers = await under_ceiling(gateway, 700 * MiB, turns)
        peak = hwm(gateway)
    statuses = sorted(status for status, _ in answers)
    assert set(statuses) <= {502, 503}, statuses
    for _, body in answers:
        assert check_error_body(body) == "upstream_response_too_large"
    print(
        f"\nten 100 MB JSON bodies (defaults): statuses {statuses}; peak RSS {peak / MiB:.0f} MiB"
    )
