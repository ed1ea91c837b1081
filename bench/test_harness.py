"""Tests of the benchmark harness itself: `pytest bench/test_harness.py`.

Real servers on loopback (the load backend, the raw relay, a small aiohttp Responses server
standing in for a gateway), real clients; no timing assertions.
"""

from __future__ import annotations

import asyncio
import os
import random
import socket
import sys
import threading
import time
from pathlib import Path

import orjson
import pytest
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_history
import breakdown
import history_workload
import load_backend
import load_messages
import load_responses
import probe_responses
import procstat
import raw_relay
import report
import responses_targets
import targets
from load_client import SseSink, jobs, request_body
from meter import Meter, judge, merge, meter_fields, summarize
from sse_client import HttpStatusError, StreamConnection, build_request

FLAT = "mcp__bench__lookup"


def sse_events(n: int, m: int, name: str) -> bytes:
    chunks = [b"data: " + orjson.dumps(c) + b"\n\n" for c in load_backend.chat_chunks(n, m, name)]
    return b"".join(chunks) + b"data: [DONE]\n\n"


class _Done:
    def __init__(self) -> None:
        self.set = False

    def done(self) -> bool:
        return self.set

    def set_result(self, _: object) -> None:
        self.set = True


def _decode(parts: list[bytes]) -> tuple[bytes, bool]:
    """Feed a chunked body to a connection in these reads: (body delivered, ended)."""
    conn = StreamConnection()
    got: list[bytes] = []
    conn.on_body = got.append
    conn._status, conn._in_body, conn._chunked = 200, True, True
    conn.done = _Done()  # type: ignore[assignment]
    for p in parts:
        conn.data_received(p)
    return b"".join(got), conn.done.set  # type: ignore[union-attr]


def test_chunked_decoding_is_exact_at_every_read_boundary() -> None:
    raw = load_backend.encode_stream(3, 2, "x")
    body = raw[raw.find(b"\r\n\r\n") + 4 :]
    want = sse_events(3, 2, "x")
    for i in range(len(body) + 1):
        assert _decode([body[:i], body[i:]]) == (want, True), i
    rnd = random.Random(7)
    for _ in range(500):
        a, b, c = sorted(rnd.sample(range(len(body) + 1), 3))
        assert _decode([body[:a], body[a:b], body[b:c], body[c:]]) == (want, True)
    assert _decode([body[i : i + 1] for i in range(len(body))]) == (want, True)
    assert _decode([body[:-1]]) == (want, False)  # the final CRLF has not come yet


def test_backend_stream_calls_the_first_tool_and_joins_into_json() -> None:
    chunks = load_backend.chat_chunks(5, 4, FLAT)
    texts = [c["choices"][0]["delta"].get("content") for c in chunks if c["choices"]]
    assert [t for t in texts if t] == [f"tok{i} " for i in range(5)]
    calls = [
        c["choices"][0]["delta"]["tool_calls"][0]
        for c in chunks[1:-1]
        if c["choices"] and "tool_calls" in c["choices"][0]["delta"]
    ]
    assert calls[0]["function"]["name"] == FLAT
    assert len(calls) == 1 + 4
    args = "".join(c["function"]["arguments"] for c in calls)
    assert orjson.loads(args) == {"query": "abcd" * 2}
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["usage"]["completion_tokens"] == 9
    for m in (1, 2, 3):
        assert isinstance(orjson.loads("".join(load_backend.argument_fragments(m))), dict)
    chat_tools = {"tools": [{"type": "function", "function": {"name": "a__b"}}]}
    assert load_backend.first_tool_name(chat_tools) == "a__b"
    assert load_backend.first_tool_name({"tools": [{"type": "namespace", "name": "ns"}]}) == "ns"


async def _post(port: int, path: str, body: bytes) -> bytes:
    host, port, payload = build_request(f"http://127.0.0.1:{port}{path}", body, {})
    conn = await StreamConnection.open(host, port)
    got: list[bytes] = []
    try:
        await conn.request(payload, got.append)
    finally:
        conn.close()
    return b"".join(got)


async def test_raw_relay_returns_the_backend_stream_byte_for_byte() -> None:
    backend = load_backend.Backend(n=40, m=7)
    b_srv = await load_backend.start(backend)
    b_port = b_srv.sockets[0].getsockname()[1]
    r_srv = await raw_relay.start(f"http://127.0.0.1:{b_port}/v1")
    r_port = r_srv.sockets[0].getsockname()[1]
    try:
        body = orjson.dumps(request_body("bench", ws=False))
        direct = await _post(b_port, "/v1/chat/completions", body)
        relayed = await _post(r_port, "/v1/responses", body)
        assert relayed == direct == sse_events(40, 7, "mcp__bench")  # Responses-shaped tools
        # many requests on one kept-alive relay connection, N changed in between
        host, port, payload = build_request(f"http://127.0.0.1:{r_port}/v1/responses", body, {})
        conn = await StreamConnection.open(host, port)
        for n in (3, 0, 250):
            backend.n = n
            got: list[bytes] = []
            await conn.request(payload, got.append)
            assert b"".join(got) == sse_events(n, 7, "mcp__bench")
        conn.close()
        with pytest.raises(HttpStatusError):
            host, port, payload = build_request(f"http://127.0.0.1:{b_port}/nope", b"", {})
            conn = await StreamConnection.open(host, port)
            await conn.request(payload, lambda d: None)
    finally:
        for srv in (r_srv, b_srv):
            srv.close()
            await srv.wait_closed()


def _responses_stream(namespace: str | None) -> list[dict]:
    call = {"type": "function_call", "name": "lookup", "arguments": '{"query":"x"}'}
    if namespace:
        call["namespace"] = namespace
    out = [{"type": "response.created", "sequence_number": 0}]
    out += [{"type": "response.output_text.delta", "delta": "hi", "sequence_number": 1}]
    done = {"status": "completed", "output": [{"type": "message"}, call]}
    out.append({"type": "response.completed", "sequence_number": 2, "response": done})
    return out


def test_judge_reads_the_terminal_event_even_before_a_done_sentinel() -> None:
    ok, bad = _responses_stream("mcp__bench"), _responses_stream(None)
    sse = b"".join(b"event: x\ndata: " + orjson.dumps(e) + b"\n\n" for e in ok)
    assert judge(sse, "responses") == ("response.completed", "ok")
    assert judge(sse + b"data: [DONE]\n\n", "responses") == ("response.completed", "ok")
    assert judge(orjson.dumps(bad[-1]), "responses")[1] == "name='lookup' namespace=None"
    failed = orjson.dumps({"type": "response.failed", "response": {}})
    assert judge(failed, "responses") == ("response.failed", None)
    assert judge(b"data: {}\n\ndata: [DONE]\n\n", "raw") == ("[DONE]", None)


def test_sse_sink_counts_events_split_anywhere() -> None:
    stream = b"".join(
        b"data: " + orjson.dumps(e) + b"\n\n" for e in _responses_stream("mcp__bench")
    )
    for cut in range(1, len(stream)):
        m = Meter("responses", 0.0, float("inf"))
        sink = SseSink(m)
        sink(stream[:cut])
        sink(stream[cut:])
        assert m.events == 3
        assert sink.text is not None
        m.done(sink.t_send, bytes(sink.pending))
        assert (m.ok, m.ns_ok) == (1, 1), cut


async def _fake_gateway(namespace: str | None) -> tuple[web.AppRunner, int]:
    """A stand-in gateway: a canned Responses stream over SSE and WebSocket."""
    events = _responses_stream(namespace)

    async def post(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        assert body["tools"][0]["type"] == "namespace"  # the namespace tool comes first
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for e in events:
            await resp.write(
                b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n"
            )
        return resp

    async def ws(request: web.Request) -> web.WebSocketResponse:
        sock = web.WebSocketResponse()
        await sock.prepare(request)
        async for msg in sock:
            assert orjson.loads(msg.data)["type"] == "response.create"
            for e in events:
                await sock.send_str(orjson.dumps(e).decode())
        return sock

    app = web.Application()
    app.router.add_post("/v1/responses", post)
    app.router.add_get("/v1/responses", ws)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, runner.addresses[0][1]


@pytest.mark.parametrize("ws", [False, True])
@pytest.mark.parametrize("namespace", ["mcp__bench", None])
async def test_load_client_counts_and_checks_the_namespace(ws: bool, namespace: str | None) -> None:
    from argparse import Namespace

    import aiohttp

    runner, port = await _fake_gateway(namespace)
    try:
        args = Namespace(
            url=f"http://127.0.0.1:{port}",
            path="/v1/responses",
            model="bench",
            ws=ws,
            api_key="",
            store=False,
            concurrency=3,
        )
        m = Meter("responses", 0.0, float("inf"))
        async with aiohttp.ClientSession() as session:
            await asyncio.wait_for(asyncio.gather(*jobs(args, session, m, [7])), 20)
    finally:
        await runner.cleanup()
    r = summarize(
        meter_fields(m) | {"window_s": 1.0, "events": m.events, "bytes": m.nbytes, "cpu_s": {}},
        {"expect": "responses"},
    )
    assert r["requests"] == 7 and r["failures"] == 0
    assert r["events"] == 7 * 3
    assert r["namespace"] == ("yes" if namespace else "no")
    assert r["latency_ms"]["p50"] is not None
    both = merge([meter_fields(m) | {"window_s": 1.0, "events": 1, "bytes": 2, "cpu_s": {}}] * 2)
    assert both["requests"] == 14 and len(both["samples"]["latency"]) == 14


def test_procstat_sees_this_process() -> None:
    me = os.getpid()
    before = procstat.cpu_seconds([me])
    t = time.process_time()
    while time.process_time() - t < 0.2:
        pass
    assert procstat.cpu_seconds([me]) > before
    assert me in procstat.tree(me)
    blob = bytearray(64 * 1024 * 1024)
    peak = procstat.peak_rss_mb([me])
    assert peak >= 64
    del blob
    if procstat.reset_peak_rss([me]):
        assert procstat.peak_rss_mb([me]) < peak
    busy = procstat.busy_seconds()
    assert busy["machine"] > 0 and "core0" in busy


async def test_pids_listening_on_finds_the_server() -> None:
    srv = await load_backend.start(load_backend.Backend())
    try:
        port = srv.sockets[0].getsockname()[1]
        assert procstat.pids_listening_on(port) == [os.getpid()]
    finally:
        srv.close()
        await srv.wait_closed()


# --- the /v1/responses side (issue 18) ---------------------------------------------------


@pytest.mark.parametrize("namespace", [None, "mcp__bench"])
def test_responses_stream_is_n_text_deltas_then_a_call_then_completed(
    namespace: str | None,
) -> None:
    name = "lookup" if namespace else FLAT
    events = load_responses.responses_events(6, 5, name, namespace)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    kinds = [e["type"] for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds.count("response.output_text.delta") == 6
    assert kinds.count("response.function_call_arguments.delta") == 5
    assert kinds[-1] == "response.completed"
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    args = "".join(
        e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"
    )
    output = events[-1]["response"]["output"]
    assert output[0]["content"][0]["text"] == text == "".join(f"tok{i} " for i in range(6))
    call = output[1]
    assert call["arguments"] == args and orjson.loads(args) == {"query": "abcd" * 3}
    assert call["name"] == name and call.get("namespace") == namespace
    assert events[-1]["response"]["usage"]["output_tokens"] == 11
    flat = {"tools": [{"type": "function", "name": "agentic_ns__mcp__bench__lookup"}]}
    assert load_responses.first_tool(flat) == ("agentic_ns__mcp__bench__lookup", None)
    native = {"tools": request_body("bench", ws=False)["tools"]}
    assert load_responses.first_tool(native) == ("lookup", "mcp__bench")
    assert load_responses.first_tool({}) == ("lookup", None)


def _responses_sse(n: int, m: int, name: str, namespace: str | None) -> bytes:
    return b"".join(
        b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n"
        for e in load_responses.responses_events(n, m, name, namespace)
    )


async def test_responses_relay_returns_the_backend_responses_stream_byte_for_byte() -> None:
    backend = load_backend.Backend(n=30, m=4)
    b_srv = await load_backend.start(backend)
    b_port = b_srv.sockets[0].getsockname()[1]
    r_srv = await raw_relay.start(f"http://127.0.0.1:{b_port}/v1", api="responses")
    r_port = r_srv.sockets[0].getsockname()[1]
    try:
        body = orjson.dumps(request_body("bench", ws=False))
        direct = await _post(b_port, "/v1/responses", body)
        relayed = await _post(r_port, "/v1/responses", body)
        assert relayed == direct == _responses_sse(30, 4, "lookup", "mcp__bench")
        assert backend.responses_requests == 2 and backend.requests == 0
        flat = {"model": "bench", "stream": True, "tools": [{"type": "function", "name": FLAT}]}
        assert await _post(r_port, "/v1/responses", orjson.dumps(flat)) == _responses_sse(
            30, 4, FLAT, None
        )
        kind, verdict = judge(relayed, "raw-responses")
        assert (kind, verdict) == ("response.completed", None)
        fields = meter_fields(Meter("raw-responses", 0.0, 1.0))
        summary = summarize(
            fields | {"window_s": 1.0, "events": 0, "bytes": 0, "cpu_s": {}},
            {"expect": "raw-responses"},
        )
        assert summary["namespace"] == "n/a"
    finally:
        for srv in (r_srv, b_srv):
            srv.close()
            await srv.wait_closed()


async def test_probe_reports_what_a_namespaced_tool_comes_back_as() -> None:
    backend = load_backend.Backend(n=12, m=3)
    srv = await load_backend.start(backend)
    port = srv.sockets[0].getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    try:  # the backend itself answers natively: a namespace tool comes back restored
        result = await asyncio.to_thread(probe_responses.probe, url, url)
    finally:
        srv.close()
        await srv.wait_closed()
    stream, whole = result["stream"], result["json"]
    assert stream["status"] == 200 and stream["text_delta_events"] == 12
    assert stream["argument_delta_events"] == 3
    assert stream["call_in_completed"] == [
        {"type": "function_call", "name": "lookup", "namespace": "mcp__bench", "arguments_ok": True}
    ]
    assert stream["upstream"]["path"] == "/v1/responses"
    assert stream["upstream"]["tools"][0] == {
        "type": "namespace",
        "name": "mcp__bench",
        "tools": ["lookup"],
    }
    assert whole["calls"][0]["namespace"] == "mcp__bench"
    line = probe_responses.verdict(result, 12)
    assert line.startswith("namespace restored") and "streams (12 text deltas" in line
    flat = {"stream": {"call_in_completed": [{"name": FLAT}], "text_delta_events": 1}}
    assert "NOT restored" in probe_responses.verdict(flat, 12)
    assert "does not stream" in probe_responses.verdict(flat, 12)


def test_ratios_are_to_the_relay_of_the_same_upstream_api() -> None:
    def cell(target: str, kind: str, relay: str, rps: float) -> dict:
        return {
            "target": target,
            "kind": kind,
            "relay": relay,
            "n": 200,
            "c": 1,
            "median": {"requests_per_s": rps, "events_per_s": rps * 10},
        }

    cells = [
        cell("raw relay", "baseline", "raw relay", 100.0),
        cell("streamer", "gateway", "raw relay", 25.0),
        cell("raw relay (responses)", "baseline", "raw relay (responses)", 200.0),
        cell("agentic-api", "peer", "raw relay (responses)", 50.0),
    ]
    del cells[1]["relay"]  # cells of older runs have no relay: the Chat one
    report.add_ratios(cells)
    assert [c["median"]["ratio"] for c in cells] == [1.0, 0.25, 1.0, 0.25]


def test_history_ratios_are_same_run_and_less_the_send_floors_growth() -> None:
    def cell(ms: float) -> dict:
        return {"median": ms}

    cells = {
        "streamer|full|10": cell(1.0), "streamer|full|2000": cell(4.0),
        "codex-relay|full|2000": cell(40.0),
        "streamer|ws|10": cell(1.0), "streamer|ws|2000": cell(2.5),
        "streamer|prev|10": cell(2.0), "streamer|prev|2000": cell(3.0),
    }  # fmt: skip
    got = bench_history.ratios(cells, {10: 0.1, 2000: 2.0}, {10: 0.1, 2000: 0.7}, [10, 2000])
    values = {r["target"]: (round(r["value"], 3), r["ok"]) for r in got}
    assert values == {
        "HTTP full replay, K=2000: CPU / orjson floor": (2.0, True),
        "HTTP full replay, K=2000: CPU / codex-relay's": (0.1, True),
        "WebSocket, previous_response_id: CPU per turn at K=2000 / at K=10": (2.5, False),
        "WebSocket, previous_response_id: CPU per turn at K=2000 / at K=10, less the send "
        "floor's growth": (1.9, True),
        "HTTP, previous_response_id: CPU per turn at K=2000 / at K=10": (1.5, True),
        "HTTP, previous_response_id: CPU per turn at K=2000 / at K=10, less the send "
        "floor's growth": (1.2, True),
    }
    missing = bench_history.ratios({}, {}, {}, [10, 2000])
    assert [r["value"] for r in missing] == [None] * 6
    assert not any(r["ok"] for r in missing)


def test_the_history_client_sends_every_byte_of_a_body_its_socket_takes_in_parts() -> None:
    a, b = socket.socketpair()
    with a, b:
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        a.settimeout(5)  # a socket with a timeout: a vectored write may take part only
        body = bytes(range(256)) * 4096  # 1 MiB
        head = b"HEAD\r\n"
        got = bytearray()

        def read() -> None:
            while len(got) < len(head) + len(body):
                got.extend(b.recv(65536))

        reader = threading.Thread(target=read)
        reader.start()
        history_workload._send_all(a, [memoryview(head), memoryview(body)])
        reader.join(10)
    assert bytes(got) == head + body


def _fake_streamer(tmp: Path, help_text: str) -> Path:
    pkg = tmp / "streamer"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "cli.py").write_text("")
    (pkg / "__main__.py").write_text(f"print({help_text!r})\n")
    return tmp


@pytest.mark.parametrize(
    ("help_text", "missing"),
    [
        ("  --upstream URL\n  --upstream-api-key KEY  Bearer key", True),
        ("  --upstream-api {chat,responses}\n  --upstream-api-key KEY", False),
    ],
)
def test_the_responses_gateway_row_is_guarded_by_the_flag(
    tmp_path: Path, help_text: str, missing: bool
) -> None:
    root = _fake_streamer(tmp_path, help_text)
    why = responses_targets.gateway_flag_missing(root)
    assert bool(why) is missing
    if missing:
        assert "no --upstream-api flag" in why
        target = responses_targets.start_gateway("http://x/v1", None, tmp_path, [], root)
        assert target.status == "not available" and target.reason == why
        assert target.relay == "raw relay (responses)"


PIP_FAILURE = """\
WARNING: Location 'file:///opt/pypi/simple/codex-relay/' is ignored: it is neither a file nor a directory.
ERROR: Could not find a version that satisfies the requirement codex-relay==9.9.9 (from versions: 0.5.7, 0.5.8)
ERROR: No matching distribution found for codex-relay==9.9.9

[notice] A new release of pip is available: 24.0 -> 25.3
"""


def test_the_log_tail_is_the_installers_last_error_lines() -> None:
    tail = targets.log_tail(PIP_FAILURE)
    assert tail.startswith("ERROR: Could not find a version")
    assert tail.endswith("ERROR: No matching distribution found for codex-relay==9.9.9")
    assert "WARNING" not in tail and "notice" not in tail
    # no line says error: the last lines; never a "|" (the tail goes into a Markdown table)
    assert targets.log_tail("a\nb | c\n\nd\ne\n") == "b / c / d / e"
    assert targets.log_tail("x" * 1000, limit=50) == "…" + "x" * 50


def test_a_peer_that_failed_to_install_is_skipped_with_the_installers_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(targets, "PEERS", tmp_path)
    (tmp_path / "codex-relay").mkdir()  # the venv exists, the package does not
    (tmp_path / "codex-relay.install.log").write_text(PIP_FAILURE)
    t = targets.start_codex_relay("http://127.0.0.1:1/v1", None, tmp_path / "logs", 5)
    assert t.status == "skipped" and not t.proc
    assert t.reason.startswith("install failed: ERROR: Could not find a version")
    assert "No matching distribution found for codex-relay==9.9.9" in t.reason
    assert "codex-relay.install.log" in t.reason
    # never installed: says how to
    t = targets.start_ds4codex("http://127.0.0.1:1/v1", None, tmp_path / "logs", 5)
    assert t.status == "skipped"
    assert t.reason.startswith("not installed (scripts/install-peers.sh ds4codex")
    line = report.markdown(
        {
            "meta": {
                "started": "",
                "command": "",
                "machine": "",
                "pinning": "",
                "settings": {"runs": 1, "duration": 1, "warmup": 0, "m": 50, "n": [200]},
                "logs": "",
            },
            "targets": [t.describe()],
            "cells": [],
            "probes": {},
            "extras": {},
        }
    )
    assert "- **ds4codex** [peer, sse]: skipped: not installed" in line


def test_breakdown_puts_a_sample_in_its_innermost_named_layer() -> None:
    run = "serve (streamer/app.py:407)"
    server = "RequestHandler._handle_request (aiohttp/web_protocol.py:577)"
    feed = "OutputItemStreamer.feed (streamer/core/output.py:195)"
    write = "StreamWriter._writelines (aiohttp/http_writer.py:116)"
    decode = "ChatChunkDecoder.decode (streamer/upstream/chat/decoder.py:137)"
    assert breakdown.layer_of([run, server, feed]) == "streamer (events)"
    assert breakdown.layer_of([run, server, write]) == "socket writes"
    assert breakdown.layer_of([run, server]) == "HTTP server and middlewares"
    assert breakdown.layer_of([run]) == "event loop"
    assert breakdown.layer_of(["<lambda> (<string>:1)"]) == "other"
    raw = f"{run};{server};{feed} 3\n{run};{decode} 2\n{run} 1\n"
    assert breakdown.tally(raw) == {
        "streamer (events)": 3,
        "decoding the backend stream": 2,
        "event loop": 1,
    }


# --- the Anthropic /v1/messages side (issue 29) --------------------------------------------


async def test_messages_relay_returns_the_backend_messages_stream_which_the_gateway_decodes() -> (
    None
):
    """The load backend's Messages stream, through the raw relay byte for byte, decodes in the
    gateway's own decoder to N text deltas and the call on the first tool by its flat name."""
    from streamer.core.deltas import TextDelta, ToolCallDelta, expand
    from streamer.upstream.anthropic.stream import MessagesDecoder
    from streamer.upstream.chat.stream import EndCause

    raw = b"".join(
        b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n"
        for e in load_messages.message_events(30, 4, FLAT)
    )
    backend = load_backend.Backend(n=30, m=4)
    b_srv = await load_backend.start(backend)
    b_port = b_srv.sockets[0].getsockname()[1]
    r_srv = await raw_relay.start(f"http://127.0.0.1:{b_port}/v1", api="messages")
    r_port = r_srv.sockets[0].getsockname()[1]
    try:
        body = {"model": "bench", "stream": True, "max_tokens": 64, "messages": [],
                "tools": [{"name": FLAT, "input_schema": {"type": "object"}}]}  # fmt: skip
        relayed = await _post(r_port, "/v1/messages", orjson.dumps(body))
        assert relayed == await _post(b_port, "/v1/messages", orjson.dumps(body)) == raw
        assert judge(relayed, "raw-messages") == ("message_stop", None)
        assert backend.last["path"] == "/v1/messages"
    finally:
        for srv in (r_srv, b_srv):
            srv.close()
            await srv.wait_closed()
    decoder = MessagesDecoder()
    deltas = decoder.feed(raw)
    while decoder.pending:
        deltas += decoder.take()
    deltas = expand(deltas + decoder.end(EndCause.CLEAN))
    assert [d.text for d in deltas if type(d) is TextDelta] == [f"tok{i} " for i in range(30)]
    calls = [d for d in deltas if isinstance(d, ToolCallDelta)]
    assert calls[0].name == FLAT and orjson.loads("".join(c.arguments for c in calls)) == {
        "query": "abcd" * 2
    }
