"""`streamer tap`: exit statuses, timeline, --json and --follow, over files, stdin, HTTP and WS."""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from streamer.tap import command
from streamer.tap.command import main, run_tap

ROOT = Path(__file__).parent.parent
STREAMS = Path(__file__).parent / "fixtures" / "streams"
REQUEST = str(STREAMS / "request.json")


def fixture(name: str) -> str:
    return str(STREAMS / name)


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = main(argv)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def run_cli(argv: list[str], stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "streamer.tap.command", *argv],
        input=stdin,
        capture_output=True,
        env=env,
        cwd=ROOT,
        timeout=60,
    )


def broken_copy(tmp_path: Path, name: str, old: str, new: str) -> str:
    text = (STREAMS / name).read_text()
    assert old in text
    path = tmp_path / name
    path.write_text(text.replace(old, new, 1))
    return str(path)


# -- files ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "text.sse",
        "reasoning.sse",
        "namespaced_call.sse",
        "parallel_calls.sse",
        "refusal.sse",
        "incomplete.sse",
        "failed.sse",
        "error.sse",
        "ws_turn.jsonl",
        "ws_session.jsonl",
        "recorded.jsonl",
    ],
)
def test_clean_fixtures_exit_0(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run([fixture(name), "--tools", REQUEST], capsys)
    assert status == 0, out
    assert "violations 0" in out
    assert "\x1b[" not in out  # not a terminal: no colour


def test_timeline_collapses_items_and_names_calls(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run([fixture("parallel_calls.sse"), "--tools", REQUEST], capsys)
    assert status == 0
    lines = out.splitlines()
    assert lines[0].startswith("#0 ") and "response.created  resp_calls_001" in lines[0]
    assert any(
        line.startswith("#8-12 ")
        and "mcp__docs/fetch call_b1" in line
        and 'arguments {"url":"https://docs/retry"} (2 deltas)' in line
        for line in lines
    )
    assert any("editor/apply_patch call_b2" in line and "(2 deltas)" in line for line in lines)
    assert "calls      mcp__docs/fetch ×1, editor/apply_patch ×1, shell ×1" in out  # noqa: RUF001
    assert "tokens     input 200 (cached 0) · output 40 (reasoning 0) · total 240" in out
    assert "timing" not in out  # a regular file has no real timings


def test_violation_exits_1_and_is_shown_where_it_occurs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = broken_copy(tmp_path, "text.sse", '"text":"Retries back off', '"text":"Retries back of')
    status, out, _ = run([path], capsys)
    assert status == 1
    lines = out.splitlines()
    item = next(i for i, line in enumerate(lines) if line.startswith("#2-10 "))
    assert lines[item + 1].strip().startswith("! #8 done.mismatch:")
    assert "violations 1" in out


def test_namespace_dropped_is_caught_with_the_tool_map(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = (STREAMS / "namespaced_call.sse").read_text()
    path = tmp_path / "flat.sse"
    path.write_text(
        text.replace('"name":"search","namespace":"mcp__docs"', '"name":"mcp__docs__search"')
    )
    status, out, _ = run([str(path)], capsys)
    assert status == 0  # without the tool map a consistent flat name cannot be judged
    status, out, _ = run([str(path), "--tools", REQUEST], capsys)
    assert status == 1
    assert "! #2 tool.flat_name:" in out
    assert "mcp__docs__search → mcp__docs/search" in out


def test_json_output_parses_with_identity_and_violations(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = broken_copy(
        tmp_path,
        "namespaced_call.sse",
        '"call_id":"call_a1","name":"search","namespace":"mcp__docs","arguments":"{',
        '"call_id":"call_zz","name":"search","namespace":"mcp__docs","arguments":"{',
    )
    status, out, _ = run([path, "--json", "--tools", REQUEST], capsys)
    assert status == 1
    records = [json.loads(line) for line in out.splitlines()]
    events, summary = records[:-1], records[-1]["summary"]
    assert [r["position"] for r in events] == list(range(9))
    assert [r["type"] for r in events] == [r["event"]["type"] for r in events]
    ident = {"namespace": "mcp__docs", "name": "search", "kind": "function"}
    assert events[2]["identity"] == ident and events[3]["identity"] == ident
    assert events[0]["identity"] is None
    assert events[7]["violations"] == [
        {"rule": "call.id_changed", "message": events[7]["violations"][0]["message"]}
    ]
    assert sum(len(r["violations"]) for r in events) == 1
    assert summary["violations"] == 1 and summary["calls"] == {"mcp__docs/search": 1}
    assert summary["tokens"]["total"] == 138 and summary["format"] == "responses-sse"


def test_chat_completions_stream_shows_decoded_model_deltas(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, out, _ = run([fixture("chat.sse"), "--tools", REQUEST], capsys)
    assert status == 0
    assert "tool_call[0] call_c1 mcp__docs__search → mcp__docs/search" in out
    assert 'arguments {"query":"retry"} (4 deltas)' in out
    assert "chat-sse" in out and "ended tool_calls" in out
    status, out, _ = run([fixture("chat.sse"), "--json"], capsys)
    records = [json.loads(line) for line in out.splitlines()]
    assert records[-2]["type"] == "chat.done"
    assert records[2]["event"]["name"] == "mcp__docs__"
    assert records[-1]["summary"]["calls"] == {"mcp__docs__search": 1}


def test_recording_supplies_tools_and_timings(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run([fixture("recorded.jsonl")], capsys)
    assert status == 0
    assert "tap-recording" in out
    assert "timing     first event after 50ms" in out
    assert "0.070s    +10ms #2-6" in out


def test_color_always(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run([fixture("text.sse"), "--color", "always"], capsys)
    assert status == 0 and "\x1b[32mcompleted\x1b[0m" in out


@pytest.mark.parametrize(
    "argv",
    [
        [str(STREAMS / "nope.sse")],
        [fixture("text.sse"), "--tools", str(STREAMS / "nope.json")],
        [fixture("text.sse"), "--tools", fixture("text.sse")],
        [fixture("text.sse"), "--header", "no-colon"],
        ["ftp://example.com/stream"],
        ["ws://127.0.0.1:9/v1/responses"],  # a WebSocket source needs --data
    ],
)
def test_unreadable_sources_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(argv, capsys)
    assert status == 2
    assert err.startswith("streamer tap: ") and out == ""


def test_invalid_tools_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"tools": [{"type": "namespace", "name": "x", "tools": []}]}))
    status, _, err = run([fixture("text.sse"), "--tools", str(bad)], capsys)
    assert status == 2 and "tools" in err


# -- stdin, through the real module entry point ------------------------------------------------


def test_stdin_clean_broken_and_garbage() -> None:
    clean = (STREAMS / "text.sse").read_bytes()
    done = run_cli(["-"], clean)
    assert done.returncode == 0, done.stderr
    assert b"#2-10 " in done.stdout and b"violations 0" in done.stdout
    cut = clean[: clean.rindex(b"event: response.completed")]
    done = run_cli(["-", "--json"], cut)
    assert done.returncode == 1
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert records[-1]["summary"]["end_violations"][0]["rule"] == "terminal.missing"
    assert records[-1]["summary"]["end_violations"][0]["position"] == 11
    done = run_cli(["-"], b"<html>not a stream</html>\n")
    assert done.returncode == 2 and b"not an SSE stream" in done.stderr


def test_empty_stream_has_no_terminal() -> None:
    done = run_cli(["-"], b"")
    assert done.returncode == 1
    assert b"terminal.missing" in done.stdout


# -- live sources on loopback --------------------------------------------------------------------


def events_of(name: str) -> list[dict[str, Any]]:
    path = STREAMS / name
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text().splitlines()]
    return [
        json.loads(block.split("data: ", 1)[1])
        for block in path.read_text().split("\n\n")
        if block.strip()
    ]


class Watch(io.StringIO):
    """Output that signals when a given text has been written (to prove live printing)."""

    def __init__(self, needle: str) -> None:
        super().__init__()
        self.needle = needle
        self.seen = asyncio.Event()

    def write(self, text: str) -> int:
        n = super().write(text)
        if self.needle in self.getvalue():
            self.seen.set()
        return n


class Server:
    """A tiny Responses server: SSE on POST, WebSocket on GET, both replaying a fixture."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.release: asyncio.Event | None = None  # if given, hold the stream after event 2
        self.status = 200
        self.fixture = "namespaced_call.sse"
        self.url = ""

    async def post(self, request: web.Request) -> web.StreamResponse:
        self.headers.append(dict(request.headers))
        self.requests.append(await request.json())
        if self.status != 200:
            body = {
                "error": {
                    "message": "nope",
                    "type": "invalid_request_error",
                    "param": None,
                    "code": None,
                }
            }
            return web.json_response(body, status=self.status)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i, event in enumerate(events_of(self.fixture)):
            if i == 3 and self.release is not None:
                await self.release.wait()
            await response.write(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())
        await response.write_eof()
        return response

    async def get(self, request: web.Request) -> web.StreamResponse:
        if request.headers.get("Upgrade", "").lower() != "websocket" or self.status != 200:
            return web.Response(status=426, text="use SSE")
        self.headers.append(dict(request.headers))
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        self.requests.append(orjson.loads((await ws.receive()).data))
        for i, event in enumerate(events_of("ws_turn.jsonl")):
            if i == 3 and self.release is not None:
                await self.release.wait()
            await ws.send_str(json.dumps(event))
        await ws.receive()  # the socket stays open: the tap must stop at the terminal event
        return ws


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    srv = Server()
    app = web.Application()
    app.router.add_post("/v1/responses", srv.post)
    app.router.add_get("/v1/responses", srv.get)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    srv.url = f"127.0.0.1:{port}/v1/responses"
    yield srv
    await runner.cleanup()


def tap_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    command.configure(parser)
    return parser.parse_args(list(argv))


async def tap(out: io.StringIO, *argv: str) -> int:
    return await asyncio.wait_for(run_tap(tap_args(*argv), out=out), 30)


async def test_http_source_posts_data_with_headers(server: Server) -> None:
    out = io.StringIO()
    status = await tap(
        out, f"http://{server.url}", "--data", REQUEST, "--header", "Authorization: Bearer k1"
    )
    assert status == 0, out.getvalue()
    assert server.headers[0]["Authorization"] == "Bearer k1"
    assert server.headers[0]["Accept"] == "text/event-stream"
    assert server.requests[0]["stream"] is True and server.requests[0]["model"] == "qwen3-8b"
    text = out.getvalue()
    assert "mcp__docs/search call_a1" in text and "timing     first event after" in text


async def test_http_error_status_exits_2(
    server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    server.status = 401
    out = io.StringIO()
    assert await tap(out, f"http://{server.url}", "--data", REQUEST) == 2
    assert "HTTP 401" in capsys.readouterr().err and out.getvalue() == ""


async def test_refused_connection_exits_2(server: Server) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        assert (
            await tap(io.StringIO(), f"http://127.0.0.1:{port}/v1/responses", "--data", REQUEST)
            == 2
        )
        assert (
            await tap(io.StringIO(), f"ws://127.0.0.1:{port}/v1/responses", "--data", REQUEST) == 2
        )


@pytest.mark.parametrize("scheme", ["http", "ws"])
async def test_follow_prints_each_event_as_it_arrives(server: Server, scheme: str) -> None:
    server.release = asyncio.Event()
    out = Watch("response.output_item.added")  # a timeline would hold it until the item is done
    task = asyncio.create_task(tap(out, f"{scheme}://{server.url}", "--data", REQUEST, "--follow"))
    await asyncio.wait_for(out.seen.wait(), 20)  # printed while the server still holds the rest
    assert "response.completed" not in out.getvalue()
    server.release.set()
    assert await task == 0, out.getvalue()
    # one timed line per event: "   0.004s    +1ms #3       response.function_call_arguments…"
    positions = re.findall(r"^ +[\d.]+s +(?:\+[\d.]+ms)? +#(\d+) +response\.", out.getvalue(), re.M)
    assert [int(p) for p in positions] == list(range(9 if scheme == "http" else 8))
    if scheme == "ws":
        sent = server.requests[0]
        assert sent["type"] == "response.create" and sent["model"] == "qwen3-8b"


async def test_websocket_json_stops_at_the_terminal_event(server: Server) -> None:
    out = io.StringIO()
    assert await tap(out, f"ws://{server.url}", "--data", REQUEST, "--json") == 0
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert records[-2]["type"] == "response.completed"
    assert all(isinstance(r["t"], float) for r in records[:-1])
    assert records[-1]["summary"]["format"] == "websocket-log"


async def test_websocket_upgrade_refused_exits_2(
    server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    server.status = 426
    assert await tap(io.StringIO(), f"ws://{server.url}", "--data", REQUEST) == 2
    assert "426" in capsys.readouterr().err


def test_add_tap_parser_wires_a_subcommand() -> None:
    parser = argparse.ArgumentParser(prog="streamer")
    sub = parser.add_subparsers(dest="command")
    command.add_tap_parser(sub)
    args = parser.parse_args(["tap", "-", "--json", "--header", "A: b", "--header", "C:d"])
    assert args.command == "tap" and args.source == "-" and args.json
    assert args.header == ["A: b", "C:d"]


def test_help_lists_every_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for flag in ("--data", "--tools", "--json", "--follow", "--color", "--header"):
        assert flag in out


# -- the real gateway ------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["http", "ws"])
async def test_follow_a_live_gateway(gw: Any, scheme: str) -> None:
    """The gateway in front of a scripted backend whose call comes under a split flat name."""
    from scripted_backend import (
        DONE,
        finish,
        reasoning_chunks,
        text_chunks,
        tool_call_chunks,
        usage,
    )

    gw.backend.script(
        [
            *reasoning_chunks(["Look ", "it up."]),
            *text_chunks(["Searching", "."]),
            *tool_call_chunks(
                0, "call_live1", ["mcp__docs__", "search"], ['{"query":', '"retry"}']
            ),
            finish("tool_calls"),
            usage(40, 12),
            DONE,
        ]
    )
    url = gw.ws_url if scheme == "ws" else gw.url + "/responses"
    out = io.StringIO()
    status = await tap(out, url, "--data", REQUEST, "--follow")
    text = out.getvalue()
    assert status == 0, text
    assert "violations 0" in text
    assert "response.output_item.added" in text and "mcp__docs/search" in text
    assert "calls      mcp__docs/search ×1" in text  # noqa: RUF001
    sent = gw.backend.requests[-1]
    assert "mcp__docs__search" in orjson.dumps(sent["tools"]).decode()
    # the same stream as JSON: positions run 0..n-1 and the call carries its identity
    gw.backend.script(
        [
            *tool_call_chunks(0, "call_live2", ["mcp__docs__search"], ["{}"]),
            finish("tool_calls"),
            DONE,
        ]
    )
    out = io.StringIO()
    assert await tap(out, url, "--data", REQUEST, "--json") == 0, out.getvalue()
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["position"] for r in records[:-1]] == list(range(len(records) - 1))
    added = next(r for r in records if r["type"] == "response.output_item.added")
    assert added["identity"] == {"namespace": "mcp__docs", "name": "search", "kind": "function"}
    assert records[-1]["summary"]["violations"] == 0
