"""Access lines by default (issue 32): one JSON line per request at the default level, with
the request id the answer named, and for a turn its response id, model, replica, the
status the client was told (a failed turn answered 200 says `failed`), tokens and times;
a WebSocket turn and a background turn a line each. Read from a real gateway process's
stderr after its exit (`--access-log off`: tests/test_operators.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import orjson
import websockets
from builders import gateway_process
from scripted_backend import DONE, ScriptedBackend, error_chunk, finish, text_chunks, usage

from streamer.turns.genai_spans import replica_name

TEXT = [*text_chunks(["Hel", "lo"]), finish("stop"), usage(9, 4), DONE]
FAILING = [*text_chunks(["a"]), error_chunk("engine died", "engine_dead"), DONE]


async def _post(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[str, Any]:
    async with http.post(url + "/responses", json=body) as resp:
        raw = await resp.read()
        return resp.headers["X-Request-Id"], raw


async def _websocket_turn(ws_url: str) -> str:
    async with websockets.connect(ws_url) as ws:
        await ws.send(orjson.dumps({"type": "response.create", "model": "m", "input": "hi"}))
        while True:
            event = orjson.loads(await ws.recv())
            if event["type"] == "response.completed":
                return str(event["response"]["id"])


async def test_one_access_line_per_request_with_its_turn_and_one_per_socket_or_background_turn(
    tmp_path: Path,
) -> None:
    async with ScriptedBackend(default_script=TEXT) as backend:
        backend.script(TEXT, TEXT, FAILING)
        async with gateway_process(tmp_path / "gw.log", "--upstream", backend.base_url) as gw:
            async with aiohttp.ClientSession() as http:
                ok_id, ok = await _post(http, gw.url, {"model": "m", "input": "hi"})
                sse_id, _ = await _post(http, gw.url, {"model": "m", "input": "hi", "stream": True})
                failed_id, failed = await _post(http, gw.url, {"model": "m", "input": "hi"})
                bad_id, _ = await _post(http, gw.url, {"model": "m", "input": 5})
                _, queued = await _post(http, gw.url, {"model": "m", "input": "hi",
                                                       "background": True})  # fmt: skip
            socket_response = await _websocket_turn(gw.ws_url)
            assert await gw.terminate() == 0  # the drain ends the background turn first
            lines = gw.log_lines()
    assert {line["logger"] for line in lines} == {"streamer.access"}, lines
    by_id = {line["request_id"]: line for line in lines if "method" in line}
    replica = replica_name(backend.base_url)
    line = by_id[ok_id]
    response = orjson.loads(ok)
    assert (line["method"], line["path"], line["status"]) == ("POST", "/v1/responses", 200)
    assert line["level"] == "info" and line["msg"] == "POST /v1/responses 200"
    assert line["response_id"] == response["id"] and line["model"] == "m"
    assert line["replica"] == replica and line["response_status"] == "completed"
    assert (line["input_tokens"], line["output_tokens"]) == (9, 4)
    assert line["first_token_ms"] <= line["turn_ms"] <= line["ms"]
    assert by_id[sse_id]["response_status"] == "completed"
    line = by_id[failed_id]
    assert line["status"] == 200 and line["response_status"] == "failed"  # as the client saw it
    failed = orjson.loads(failed)
    assert line["error_code"] == failed["error"]["code"] and line["response_id"] == failed["id"]
    assert by_id[bad_id]["status"] == 400 and "response_id" not in by_id[bad_id]
    turns = {line["transport"]: line for line in lines if "transport" in line}
    assert set(turns) == {"websocket", "background"}, turns
    assert turns["websocket"]["response_id"] == socket_response
    assert turns["websocket"]["msg"] == "turn websocket completed"
    assert turns["background"]["response_id"] == orjson.loads(queued)["id"]
    assert turns["background"]["response_status"] == "completed"
    assert turns["background"]["replica"] == replica
