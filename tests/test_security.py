"""Security: gateway API keys, secrets that never leak, loopback binding, inert tool names.

- `--api-key` (repeatable) and `--api-key-file`: a missing or wrong key is a 401 in OpenAI's
  shape on HTTP and on the WebSocket upgrade; every configured key works; keys are compared
  with `hmac.compare_digest`, all of them every time.
- Planted secrets (the backend key, a client key forwarded with `--forward-authorization`)
  never appear in answers (JSON, SSE, WebSocket frames, errors), in stored responses, in
  tap recordings or in the logs of a gateway at `--log-level debug`, even when the backend
  echoes them back in its errors.
- A client-declared tool, whatever its name or type, reaches nothing but the backend, and
  only as a flat function with a name of `[A-Za-z0-9_-]`.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from aiohttp import web
from builders import gateway_process
from harness import GatewayHarness
from hypothesis import given, settings
from hypothesis import strategies as st
from scripted_backend import (
    DONE,
    ScriptedBackend,
    Status,
    error_chunk,
    finish,
    text_chunks,
    tool_call_chunks,
    usage,
)

from streamer.config import Settings
from streamer.core.lowering import lower
from streamer.core.tools import NamingConfig, ResponsesToolNames
from streamer.frontends import api_keys

UPSTREAM_KEY = "sk-upstream-PLANTED-7f3a9c2e11"
CLIENT_KEY = "sk-client-PLANTED-51be0d44aa"
FILE_KEY = "sk-file-PLANTED-0c9d8e7f66"
SECRETS = (UPSTREAM_KEY, CLIENT_KEY, FILE_KEY)
LEGAL_FLAT = re.compile(r"[A-Za-z0-9_-]{1,64}")
TEXT = [*text_chunks(["Hel", "lo"]), finish("stop"), usage(3, 2), DONE]


def echoing_401(key: str) -> Status:
    """A backend that quotes the key it was sent, as OpenAI itself does on a bad key."""
    return Status(
        401,
        {
            "error": {
                "message": f"Incorrect API key provided: {key}. Check your key.",
                "type": "invalid_request_error",
                "param": None,
                "code": "invalid_api_key",
            }
        },
    )


def assert_clean(label: str, data: bytes | str) -> None:
    text = data if isinstance(data, str) else data.decode("utf-8", "replace")
    for secret in SECRETS:
        assert secret not in text, f"{label} leaks a planted secret"


# -- API keys -----------------------------------------------------------------------------


@pytest.fixture
async def keyed(tmp_path: Path) -> AsyncIterator[GatewayHarness]:
    key_file = tmp_path / "keys"
    key_file.write_text(f"# client keys\n\n  {FILE_KEY}  \n")
    async with GatewayHarness(
        api_keys=(CLIENT_KEY, "second-key-000"), api_key_file=str(key_file)
    ) as gw:
        yield gw


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def check_401(body: bytes, message: str) -> None:
    parsed = orjson.loads(body)
    assert parsed == {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": ""},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer "},
        {"Authorization": "Bearer wrong-key"},
        {"Authorization": f"Bearer {CLIENT_KEY[:-1]}"},  # a prefix
        {"Authorization": f"Bearer {CLIENT_KEY}x"},  # an extension
        {"Authorization": f"Bearer {CLIENT_KEY.upper()}"},
        {"Authorization": f"Basic {CLIENT_KEY}"},  # the right key, the wrong scheme
        {"Authorization": f"{CLIENT_KEY}"},
        {"X-Api-Key": CLIENT_KEY},
    ],
)
async def test_missing_or_wrong_key_is_401_in_openai_shape(
    keyed: GatewayHarness, headers: dict[str, str]
) -> None:
    base = keyed.url
    async with aiohttp.ClientSession() as http:
        for method, url, body in [
            ("POST", base + "/responses", {"model": "m", "input": "hi"}),
            ("GET", base + "/models", None),
            ("GET", base + "/responses/resp_x", None),
            ("GET", base + "/no/such/route", None),  # 401 before routing: nothing to probe
        ]:
            async with http.request(method, url, json=body, headers=headers) as resp:
                raw = await resp.read()
                assert resp.status == 401, (method, url, raw[:200])
                assert resp.headers.get("X-Request-Id")
            token = headers.get("Authorization", "")
            named = token[:7].lower() == "bearer " and token[7:].strip()
            check_401(
                raw, "Incorrect API key provided." if named else "You didn't provide an API key."
            )
            assert_clean("a 401", raw)
    assert keyed.backend.requests == []  # nothing reached the backend


async def test_every_configured_key_works_and_operator_routes_stay_open(
    keyed: GatewayHarness,
) -> None:
    for key in (CLIENT_KEY, "second-key-000", FILE_KEY):
        async with openai.AsyncOpenAI(base_url=keyed.url, api_key=key, max_retries=0) as sdk:
            response = await sdk.responses.create(model="m", input="hi")
            assert response.status == "completed"
            models = await sdk.models.list()
            assert models.data
    async with aiohttp.ClientSession() as http:
        root = keyed.url.removesuffix("/v1")
        for path in ("/healthz", "/readyz", "/metrics"):  # operators' routes need no key
            async with http.get(root + path) as resp:
                assert resp.status == 200, path


async def test_sdk_sees_an_authentication_error(keyed: GatewayHarness) -> None:
    async with openai.AsyncOpenAI(base_url=keyed.url, api_key="nope", max_retries=0) as sdk:
        with pytest.raises(openai.AuthenticationError) as caught:
            await sdk.responses.create(model="m", input="hi")
    assert caught.value.status_code == 401
    assert caught.value.code == "invalid_api_key"


async def test_websocket_upgrade_needs_the_key(keyed: GatewayHarness) -> None:
    async with aiohttp.ClientSession() as http:
        for headers in ({}, bearer("wrong"), {"Authorization": f"Basic {CLIENT_KEY}"}):
            with pytest.raises(aiohttp.WSServerHandshakeError) as caught:
                await http.ws_connect(keyed.ws_url, headers=headers)
            assert caught.value.status == 401
        # the refusal's body is OpenAI's shape too
        upgrade = {
            "Upgrade": "websocket",
            "Connection": "Upgrade",
            "Sec-WebSocket-Version": "13",
            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
        }
        async with http.get(keyed.ws_url.replace("ws://", "http://"), headers=upgrade) as resp:
            assert resp.status == 401
            check_401(await resp.read(), "You didn't provide an API key.")
        async with http.ws_connect(keyed.ws_url, headers=bearer(FILE_KEY)) as ws:
            await ws.send_str('{"type":"response.create","model":"m","input":"hi"}')
            while True:
                event = orjson.loads((await ws.receive(timeout=10)).data)
                if event["type"] in ("response.completed", "error"):
                    break
            assert event["type"] == "response.completed"


async def test_keys_are_compared_in_constant_time_every_key_every_time(
    keyed: GatewayHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The code path, not the timing: hmac.compare_digest against every key, no early exit."""
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(api_keys.hmac, "compare_digest", spy)
    body = {"model": "m", "input": "hi"}
    async with aiohttp.ClientSession() as http:
        for key, status in ((CLIENT_KEY, 200), ("wrong", 401), (FILE_KEY, 200)):
            calls.clear()
            async with http.get(keyed.url + "/models", headers=bearer(key)) as resp:
                assert resp.status == status
            assert len(calls) == 3, "every configured key is compared, whichever matches"
            calls.clear()  # the same on the fast path (POST /v1/responses)
            async with http.post(keyed.url + "/responses", json=body, headers=bearer(key)) as resp:
                assert resp.status == status
            assert len(calls) == 3, "every configured key is compared, whichever matches"
            assert {b for _, b in calls} == {
                CLIENT_KEY.encode(),
                FILE_KEY.encode(),
                b"second-key-000",
            }
            assert all(a == key.encode() for a, _ in calls)


def test_blank_keys_admit_nobody(tmp_path: Path) -> None:
    key_file = tmp_path / "keys"
    key_file.write_text("\n   \n# comment only\n")
    assert Settings(api_keys=("", "  "), api_key_file=str(key_file)).client_keys() == frozenset()
    keys = Settings(api_keys=("", " real-key "), api_key_file=str(key_file)).client_keys()
    assert keys == {"real-key"}


async def test_blank_configured_key_does_not_let_an_empty_bearer_in() -> None:
    async with GatewayHarness(api_keys=("", "real-key")) as gw, aiohttp.ClientSession() as http:
        for headers in ({}, {"Authorization": "Bearer "}, {"Authorization": "Bearer  "}):
            async with http.get(gw.url + "/models", headers=headers) as resp:
                assert resp.status == 401
        async with http.get(gw.url + "/models", headers=bearer("real-key")) as resp:
            assert resp.status == 200


# -- secrets never leak -------------------------------------------------------------------


async def read_ws(ws: aiohttp.ClientWebSocketResponse, frames: list[str]) -> dict[str, Any]:
    while True:
        msg = await ws.receive(timeout=10)
        assert msg.type == aiohttp.WSMsgType.TEXT, msg
        frames.append(msg.data)
        event = orjson.loads(msg.data)
        if event["type"] in ("response.completed", "response.failed", "error"):
            return event


async def exercise(gw: GatewayHarness, client_key: str, echoed: str) -> list[tuple[str, bytes]]:
    """Successes and every kind of backend error that quotes `echoed`; all that came back."""
    seen: list[tuple[str, bytes]] = []
    http_scripts = [
        ("json ok", TEXT, {}),
        ("sse ok", TEXT, {"stream": True}),
        ("json 401 echo", [echoing_401(echoed)], {}),
        ("sse 401 echo", [echoing_401(echoed)], {"stream": True}),
        ("text 500 echo", [Status(500, f"upstream proxy: bad key {echoed}")], {}),
        ("429 header echo", [Status(429, {"error": {"message": "slow down"}}, {"retry-after": "1", "x-ratelimit-key": echoed})], {}),
        ("sse error chunk echo", [*text_chunks(["a"]), error_chunk(f"key {echoed} revoked", "invalid_api_key"), DONE], {"stream": True}),
        ("json error chunk echo", [error_chunk(f"key {echoed} revoked", echoed)], {}),
        ("background echo", [error_chunk(f"key {echoed} revoked")], {"background": True}),
    ]  # fmt: skip
    headers = bearer(client_key)
    async with aiohttp.ClientSession(headers=headers) as http:
        for label, script, extra in http_scripts:
            gw.backend.script(script)
            body = {"model": "m", "input": "hi", **extra}
            async with http.post(gw.url + "/responses", json=body) as resp:
                raw = await resp.read()
                seen.append((label, raw))
                seen.append((label + " headers", str(dict(resp.headers)).encode()))
            if extra.get("background"):
                response_id = orjson.loads(raw)["id"]
                for _ in range(100):
                    async with http.get(f"{gw.url}/responses/{response_id}") as resp:
                        stored = await resp.read()
                    if orjson.loads(stored)["status"] not in ("queued", "in_progress"):
                        break
                    await asyncio.sleep(0.02)
                seen.append(("stored background", stored))
                async with http.get(f"{gw.url}/responses/{response_id}?stream=true") as resp:
                    seen.append(("background replay", await resp.read()))
        async with http.get(gw.url + "/models") as resp:
            seen.append(("models", await resp.read()))
        frames: list[str] = []
        async with http.ws_connect(gw.ws_url) as ws:
            for script in (
                TEXT,
                [echoing_401(echoed)],
                [error_chunk(f"key {echoed} revoked"), DONE],
            ):
                gw.backend.script(script)
                await ws.send_str('{"type":"response.create","model":"m","input":"hi"}')
                await read_ws(ws, frames)
        seen += [("ws frame", f.encode()) for f in frames]
    return seen


@pytest.mark.parametrize("forward", [False, True], ids=["upstream-key", "forwarded-client-key"])
async def test_planted_secrets_never_reach_answers_stores_or_recordings(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, forward: bool
) -> None:
    caplog.set_level(logging.DEBUG)
    backend = ScriptedBackend(models=["scripted", CLIENT_KEY if forward else UPSTREAM_KEY])
    options: dict[str, Any] = {"api_keys": (CLIENT_KEY,), "tap_dir": str(tmp_path / "tap")}
    if forward:
        options["forward_authorization"] = True
    else:
        options["upstream_api_key"] = UPSTREAM_KEY
    echoed = CLIENT_KEY if forward else UPSTREAM_KEY
    async with GatewayHarness(backend=backend, **options) as gw:
        seen = await exercise(gw, CLIENT_KEY, echoed)
        sent = {
            r.headers.get("Authorization")
            for r in gw.backend.records
            if r.path.endswith("/chat/completions")
        }
    # the test means something: the backend got the secret, and its errors came through
    assert sent == {f"Bearer {echoed}"}
    joined = b"\n".join(raw for _, raw in seen).decode()
    assert joined.count("[redacted]") >= 8, joined[:2000]
    # a backend's 401 is worded by the gateway: whatever it quoted of the key stays out
    assert "The backend refused the credentials it was sent (HTTP 401)" in joined
    assert "Incorrect API key provided" not in joined
    for label, raw in seen:
        assert_clean(label, raw)
    recordings = list((tmp_path / "tap").glob("*.jsonl"))
    assert len(recordings) >= 5
    for path in recordings:
        assert_clean(f"tap recording {path.name}", path.read_bytes())
    assert caplog.records, "the gateway logged at debug level"
    for record in caplog.records:
        assert_clean(f"log record {record.name}", record.getMessage())
        if record.exc_text:
            assert_clean("log traceback", record.exc_text)


async def test_secrets_never_reach_the_logs_of_a_debug_gateway(tmp_path: Path) -> None:
    """A real `streamer serve --log-level debug`: its whole stderr is grepped."""
    key_file = tmp_path / "keys"
    key_file.write_text(FILE_KEY + "\n")
    async with ScriptedBackend(models=["scripted"]) as backend:
        backend.script(
            TEXT,
            [echoing_401(UPSTREAM_KEY)],
            [*text_chunks(["a"]), error_chunk(f"key {UPSTREAM_KEY} revoked"), DONE],
            [Status(502, f"<html>bad gateway for {UPSTREAM_KEY}</html>")],
        )
        args = (
            "--upstream", backend.base_url, "--upstream-api-key", UPSTREAM_KEY,
            "--api-key", CLIENT_KEY, "--api-key-file", str(key_file),
            "--log-level", "debug", "--tap-dir", str(tmp_path / "tap"),
        )  # fmt: skip
        async with gateway_process(tmp_path / "gateway.log", *args, graceful=True) as proc:
            url = f"http://127.0.0.1:{proc.port}/v1"
            answers: list[bytes] = []
            async with aiohttp.ClientSession() as http:
                for key, stream in (
                    (CLIENT_KEY, False),
                    (FILE_KEY, False),
                    (CLIENT_KEY, True),
                    (FILE_KEY, False),
                ):
                    body = {"model": "m", "input": "hi", "stream": stream}
                    async with http.post(
                        url + "/responses", json=body, headers=bearer(key)
                    ) as resp:
                        answers.append(await resp.read())
                for wrong in ("sk-wrong-PLANTED", f"{CLIENT_KEY}-but-longer"):
                    async with http.get(url + "/models", headers=bearer(wrong)) as resp:
                        assert resp.status == 401
                async with http.get(url + "/models", headers=bearer(CLIENT_KEY)) as resp:
                    answers.append(await resp.read())
        assert {r.headers.get("Authorization") for r in backend.records} == {
            f"Bearer {UPSTREAM_KEY}"
        }
        log = proc.stderr()
        assert '"logger":"streamer.access"' in log and "/v1/responses" in log, log[-2000:]
        assert_clean("the gateway's stderr", log)
        assert_clean("the gateway's stdout", proc.stdout())
        assert "sk-wrong-PLANTED" not in log  # nor a wrong key a client tried
        for raw in answers:
            assert_clean("an answer", raw)
        for path in (tmp_path / "tap").glob("*.jsonl"):
            assert_clean("a recording", path.read_bytes())


async def test_models_listing_forwards_the_client_key() -> None:
    async with GatewayHarness(forward_authorization=True) as gw, aiohttp.ClientSession() as http:
        async with http.get(gw.url + "/models", headers=bearer(CLIENT_KEY)) as resp:
            assert resp.status == 200
        assert gw.backend.records[-1].headers.get("Authorization") == f"Bearer {CLIENT_KEY}"


# -- loopback by default -------------------------------------------------------------------


def listening_hosts(port: int) -> set[str]:
    """The addresses a TCP socket LISTENs on at `port`, from /proc/net/tcp{,6}."""
    hosts: set[str] = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            local, state = row.split()[1], row.split()[3]
            address, hexport = local.split(":")
            if state != "0A" or int(hexport, 16) != port:
                continue
            if width == 8:
                hosts.add(".".join(str(b) for b in reversed(bytes.fromhex(address))))
            else:
                hosts.add("v6:" + address)
    return hosts


async def test_binds_to_loopback_unless_told_otherwise(tmp_path: Path) -> None:
    if not Path("/proc/net/tcp").exists():
        pytest.skip("needs Linux /proc/net/tcp")
    assert Settings().host == "127.0.0.1"
    async with ScriptedBackend() as backend:
        args = ("--upstream", backend.base_url)
        async with gateway_process(tmp_path / "default.log", *args) as gw:
            assert listening_hosts(gw.port) == {"127.0.0.1"}
        # told otherwise (another loopback address, so nothing is exposed by the test)
        async with gateway_process(tmp_path / "told.log", *args, "--host", "127.0.0.2") as gw:
            assert listening_hosts(gw.port) == {"127.0.0.2"}


# -- tools reach nothing but the backend, as flat functions --------------------------------

HOSTILE = [
    "../../etc/passwd", "http://127.0.0.1:1/x", "file:///etc/shadow", "__proto__", "constructor",
    "名前", "emoji😀", "a b", "\u202eevil", "tool\x00x", "$(rm -rf /)", "x" * 300, "a.b", "-",
    "functions", "mcp__docs__search", "<script>", "'; DROP TABLE tools; --",
]  # fmt: skip
NAMES = st.sampled_from(HOSTILE) | st.text(min_size=1, max_size=80)


@settings(max_examples=300, deadline=None)
@given(
    names=st.lists(st.tuples(st.none() | NAMES, NAMES), min_size=1, max_size=12, unique=True),
    style=st.sampled_from(["codex", "double-underscore", "llamacpp"]),
)
def test_any_declared_name_lowers_to_a_legal_flat_function(
    names: list[tuple[str | None, str]], style: str
) -> None:
    """Pure core, many examples: whatever the names, the backend sees `[A-Za-z0-9_-]{1,64}`."""
    tools: list[dict[str, Any]] = []
    namespaces: dict[str, list[dict[str, Any]]] = {}
    for ns, name in names:
        member = {"type": "function", "name": name, "parameters": {"type": "object"}}
        if ns is None:
            tools.append(member)
        else:
            namespaces.setdefault(ns, []).append(member)
    tools += [{"type": "namespace", "name": ns, "tools": m} for ns, m in namespaces.items()]
    try:
        table = ResponsesToolNames.convert(tools, config=NamingConfig(style=style))  # type: ignore[arg-type]
    except Exception as exc:  # only a duplicate may be refused, as a 400
        assert getattr(exc, "status", None) == 400 and "Duplicate" in str(exc), exc
        return
    chat = lower({"model": "m"}, [{"type": "message", "role": "user", "content": "hi"}], table)
    flat = [t["function"]["name"] for t in chat["tools"]]
    assert len(flat) == len(set(flat)) == len(names)
    for tool in chat["tools"]:
        assert tool["type"] == "function" and set(tool) == {"type", "function"}
        assert LEGAL_FLAT.fullmatch(tool["function"]["name"]), tool
    for (ns, name), flat_name in zip(names_in_order(tools), flat, strict=True):
        assert table.decode(flat_name).name == name and table.decode(flat_name).namespace == ns


def names_in_order(tools: list[dict[str, Any]]) -> list[tuple[str | None, str]]:
    out: list[tuple[str | None, str]] = []
    for tool in tools:
        if tool["type"] == "namespace":
            out += [(tool["name"], m["name"]) for m in tool["tools"]]
        else:
            out.append((None, tool["name"]))
    return out


async def test_hostile_tools_reach_only_the_backend_as_flat_functions() -> None:
    """Hosted tools that name URLs are never contacted by the gateway: an MCP server on a
    loopback address is refused (a 424: --mcp-allow does not list it), a file search is a
    400 (the gateway cannot run it); client tools with hostile names reach the backend as
    legal flat functions and come back under their own names."""
    canary_hits: list[str] = []

    async def canary(request: web.Request) -> web.Response:
        canary_hits.append(f"{request.method} {request.path}")
        return web.Response(text="{}")

    canary_app = web.Application()
    canary_app.router.add_route("*", "/{tail:.*}", canary)
    runner = web.AppRunner(canary_app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    canary_url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    refused: list[tuple[dict[str, Any], int]] = [
        (
            {
                "type": "mcp",
                "server_label": "evil",
                "server_url": canary_url + "/mcp",
                "require_approval": "never",
            },
            424,
        ),
        ({"type": "file_search", "vector_store_ids": [canary_url]}, 400),
        ({"type": "image_generation"}, 400),
    ]
    tools: list[dict[str, Any]] = [
        {"type": "web_search"},  # optional (--optional-hosted-tool): left out
        {"type": "function", "name": canary_url + "/fn", "parameters": {"type": "object"}},
        *({"type": "function", "name": name} for name in HOSTILE),
        {"type": "namespace", "name": "../../ns", "tools": [{"type": "function", "name": "__proto__"}, {"type": "custom", "name": "http://x/y"}]},
    ]  # fmt: skip
    try:
        async with GatewayHarness() as gw:
            async with openai.AsyncOpenAI(base_url=gw.url, api_key="k", max_retries=0) as sdk:
                for tool, status in refused:
                    with pytest.raises(openai.APIStatusError) as error:
                        await sdk.responses.create(model="m", input="hi", tools=[tool])  # type: ignore[list-item]
                    assert error.value.status_code == status
                    assert error.value.body["param"] == "tools[0]"  # type: ignore[index]
                first = await sdk.responses.create(model="m", input="hi", tools=tools)  # type: ignore[arg-type]
                assert first.status == "completed"
                offered = gw.backend.requests[-1]["tools"]
                assert len(offered) == 1 + len(HOSTILE) + 2  # client functions only
                for tool in offered:
                    assert set(tool) == {"type", "function"} and tool["type"] == "function"
                    assert LEGAL_FLAT.fullmatch(tool["function"]["name"]), tool
                # the backend calls the hostile namespaced tool by its flat name
                flat = offered[-2]["function"]["name"]
                gw.backend.script(
                    [*tool_call_chunks(0, "call_1", [flat], ["{}"]), finish("tool_calls"), DONE]
                )
                second = await sdk.responses.create(model="m", input="go", tools=tools)  # type: ignore[arg-type]
                call = second.output[0]
                assert call.type == "function_call"
                assert (call.name, getattr(call, "namespace", None)) == ("__proto__", "../../ns")
            assert [r.path for r in gw.backend.records] == ["/v1/chat/completions"] * 2
    finally:
        await runner.cleanup()
    assert canary_hits == [], "the gateway never contacts what a tool names"
