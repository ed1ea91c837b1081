"""Limits and malformed requests, against a real gateway on loopback.

Every limit is a setting; crossing it gets a clear 4xx in OpenAI's error shape (or close
1009 on a WebSocket), never a 500 or a dropped connection. Each test checks the request
just under the limit too, so the limit is where the setting says.
"""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest
import pytest_asyncio
from harness import GatewayHarness

pytestmark = pytest.mark.asyncio(loop_scope="module")

LIMITS: dict[str, Any] = {
    "max_body_bytes": 64 * 1024,
    "max_decoded_body_bytes": 96 * 1024,
    "ws_max_message_bytes": 32 * 1024,
    "max_tools": 8,
    "max_tool_bytes": 4096,
    "max_input_items": 5,
    "max_header_bytes": 2048,
}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw() -> AsyncIterator[GatewayHarness]:
    async with GatewayHarness(**LIMITS) as harness:
        yield harness


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def openai_error(body: bytes, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """The body is OpenAI's error shape (with this param and code, when given)."""
    parsed = orjson.loads(body)
    assert set(parsed) == {"error"}, parsed
    error = parsed["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"]
    assert error["type"] == "invalid_request_error"
    if param is not None:
        assert error["param"] == param, error
    if code is not None:
        assert error["code"] == code, error
    return error


async def post(
    http: aiohttp.ClientSession, gw: GatewayHarness, body: Any, **kwargs: Any
) -> tuple[int, bytes, aiohttp.typedefs.LooseHeaders]:
    data = orjson.dumps(body) if isinstance(body, dict | list) else body
    kwargs.setdefault("headers", {"Content-Type": "application/json"})
    async with http.post(gw.url + "/responses", data=data, **kwargs) as resp:
        return resp.status, await resp.read(), resp.headers


def padded(size: int) -> bytes:
    """A valid request body of exactly `size` bytes."""
    head = b'{"model":"m","input":"'
    tail = b'"}'
    return head + b"a" * (size - len(head) - len(tail)) + tail


# -- request body -------------------------------------------------------------------------


async def test_body_over_the_limit_is_413_in_openai_shape(
    gw: GatewayHarness, http: aiohttp.ClientSession
) -> None:
    limit = LIMITS["max_body_bytes"]
    status, body, _ = await post(http, gw, padded(limit))
    assert status == 200, body[:300]
    status, body, headers = await post(http, gw, padded(limit + 1))
    assert status == 413
    error = openai_error(body, code="request_too_large")
    assert str(limit) in error["message"]
    assert headers.get("X-Request-Id")


async def test_chunked_body_over_the_limit_is_413(
    gw: GatewayHarness, http: aiohttp.ClientSession
) -> None:
    """No Content-Length to check up front: the limit holds while the body streams in."""

    async def chunks() -> AsyncIterator[bytes]:
        data = padded(LIMITS["max_body_bytes"] * 2)
        for i in range(0, len(data), 8192):
            yield data[i : i + 8192]

    status, body, _ = await post(http, gw, chunks())  # type: ignore[arg-type]
    assert status == 413
    openai_error(body, code="request_too_large")


async def test_gzip_body_counts_decoded_size_and_bad_gzip_is_400(
    gw: GatewayHarness, http: aiohttp.ClientSession
) -> None:
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    small = gzip.compress(padded(1000))
    status, body, _ = await post(http, gw, small, headers=headers)
    assert status == 200, body[:300]
    decoded = LIMITS["max_decoded_body_bytes"]
    status, body, _ = await post(http, gw, gzip.compress(padded(decoded)), headers=headers)
    assert status == 200, body[:300]  # more than --max-body-bytes once decoded: its own limit
    bomb = gzip.compress(padded(decoded + 1))  # tiny on the wire
    assert len(bomb) < LIMITS["max_body_bytes"]
    status, body, _ = await post(http, gw, bomb, headers=headers)
    assert status == 413
    error = openai_error(body, code="request_too_large")
    assert "once decoded" in error["message"] and str(decoded) in error["message"]
    status, body, _ = await post(http, gw, b"not gzip at all", headers=headers)
    assert status == 400
    openai_error(body, code="invalid_body")


# -- WebSocket messages -------------------------------------------------------------------


async def test_websocket_message_over_the_limit_closes_1009(
    gw: GatewayHarness, http: aiohttp.ClientSession
) -> None:
    limit = LIMITS["ws_max_message_bytes"]
    async with http.ws_connect(gw.ws_url) as ws:
        head = b'{"type":"response.create","model":"m","input":"'
        # aiohttp refuses a message of exactly max_msg_size bytes: one byte under is the
        # largest that passes (reported; the setting's help says "beyond")
        raw = head + b"a" * (limit - 1 - len(head) - 2) + b'"}'
        assert len(raw) == limit - 1
        await ws.send_bytes(raw)
        while True:  # a message at the limit is served in full
            msg = await ws.receive(timeout=10)
            assert msg.type == aiohttp.WSMsgType.TEXT, (msg, ws.close_code)
            event = orjson.loads(msg.data)
            if event["type"] in ("response.completed", "error"):
                break
        assert event["type"] == "response.completed", event
        await ws.send_str('{"type":"response.create","input":"' + "a" * limit + '"}')
        msg = await ws.receive(timeout=10)
        assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
        assert ws.close_code == aiohttp.WSCloseCode.MESSAGE_TOO_BIG == 1009
    # and the gateway goes on serving
    status, body, _ = await post(http, gw, {"model": "m", "input": "hi"})
    assert status == 200, body[:300]


# -- tools and input items ----------------------------------------------------------------


def function(name: str, description: str = "") -> dict[str, Any]:
    return {"type": "function", "name": name, "description": description, "parameters": {}}


async def test_too_many_tools_is_400_on_tools(
    gw: GatewayHarness, http: aiohttp.ClientSession
) -> None:
    n = LIMITS["max_tools"]
    tools = [function(f"t{i}") for i in range(n)]
    before = len(gw.backend.requests)
    status, body, _ = await post(http, gw, {"model": "m", "input": "hi", "tools": tools})
    assert status == 200, body[:300]
    assert len(gw.backend.requests[-1]["tools"]) == n
    status, body, _ = await post(
        http, gw, {"model": "m", "input": "hi", "tools": [*tools, function("one_more")]}
    )
    assert status == 400
    error = openai_error(body, param="tools", code="array_above_max_length")
    assert str(n) in error["message"]
    # namespace members count one by one
    namespace = {"type": "namespace", "name": "mcp__x", "tools": [function(f"m{i}") for i in range(n + 1)]}  # fmt: skip
    status, body, _ = await post(http, gw, {"model": "m", "input": "hi", "tools": [namespace]})
    assert status == 400
    openai_error(body, param="tools", code="array_above_max_length")
    # tools carried by input items count as well
    items = [{"type": "additional_tools", "tools": tools}, {"role": "user", "content": "go"}]
    status, body, _ = await post(
        http, gw, {"model": "m", "input": items, "tools": [function("top")]}
    )
    assert status == 400
    openai_error(body, code="array_above_max_length")
    assert len(gw.backend.requests) == before + 1  # refused requests never reach the backend


async def test_tool_definitions_over_the_byte_budget_is_400(
    gw: GatewayHarness, http: aiohttp.ClientSession
) -> None:
    budget = LIMITS["max_tool_bytes"]
    status, body, _ = await post(
        http, gw, {"model": "m", "input": "hi", "tools": [function("small", "d" * (budget // 2))]}
    )
    assert status == 200, body[:300]
    status, body, _ = await post(
        http, gw, {"model": "m", "input": "hi", "tools": [function("big", "d" * budget)]}
    )
    assert status == 400
    error = openai_error(body, param="tools")
    assert str(budget) in error["message"] and "too large" in error["message"]


async def test_too_many_input_items_is_400_on_input(
    gw: GatewayHarness, http: aiohttp.ClientSession
) -> None:
    n = LIMITS["max_input_items"]
    items = [{"role": "user", "content": f"m{i}"} for i in range(n)]
    status, body, _ = await post(http, gw, {"model": "m", "input": items})
    assert status == 200, body[:300]
    previous = orjson.loads(body)["id"]
    status, body, _ = await post(http, gw, {"model": "m", "input": [*items, items[0]]})
    assert status == 400
    error = openai_error(body, param="input")
    assert str(n) in error["message"]
    # a continuation counts the history it carries: n + 1 (output) + 1 new item
    status, body, _ = await post(
        http, gw, {"model": "m", "input": "more", "previous_response_id": previous}
    )
    assert status == 400
    openai_error(body, param="input")


# -- headers ------------------------------------------------------------------------------


def status_of(answer: bytes) -> int:
    version, status, _ = answer.split(b" ", 2)
    assert version in (b"HTTP/1.0", b"HTTP/1.1"), answer[:100]
    return int(status)


async def raw_request(gw: GatewayHarness, head: bytes) -> bytes:
    """Send raw bytes; return everything the gateway answers before it closes."""
    host, port = gw.url.split("//")[1].split("/")[0].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(head)
        await writer.drain()
        return await asyncio.wait_for(reader.read(65536), 10)
    finally:
        writer.close()


async def test_oversized_header_gets_400_not_a_dropped_connection(
    gw: GatewayHarness, http: aiohttp.ClientSession
) -> None:
    limit = LIMITS["max_header_bytes"]
    ok = {"Content-Type": "application/json", "X-Big": "a" * (limit - 100)}
    status, body, _ = await post(http, gw, {"model": "m", "input": "hi"}, headers=ok)
    assert status == 200, body[:300]
    big = {"Content-Type": "application/json", "X-Big": "a" * (limit + 100)}
    status, body, _ = await post(http, gw, {"model": "m", "input": "hi"}, headers=big)
    assert status == 400, body[:300]
    # the same on a raw socket: an HTTP answer comes back before the connection closes
    answer = await raw_request(
        gw,
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (limit + 100) + b"\r\n\r\n",
    )
    assert status_of(answer) == 400, answer[:200]
    answer = await raw_request(
        gw, b"GET /" + b"a" * (limit + 100) + b" HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    assert status_of(answer) == 400, answer[:200]
    many = b"".join(b"X-H%d: v\r\n" % i for i in range(200))
    answer = await raw_request(gw, b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + many + b"\r\n")
    assert status_of(answer) == 400, answer[:200]


async def test_non_http_bytes_get_400(gw: GatewayHarness) -> None:
    answer = await raw_request(gw, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage\r\n\r\n")
    assert status_of(answer) == 400, answer[:200]


# -- malformed requests, methods, routes -------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "content_type", "status", "code"),
    [
        (b"{not json", "application/json", 400, "invalid_json"),
        (b"", "application/json", 400, "invalid_json"),
        (b'{"model":"m","input":"\xff"}', "application/json", 400, "invalid_json"),
        (b'{"model":"m"}{"model":"m"}', "application/json", 400, "invalid_json"),
        (b"[1, 2]", "application/json", 400, None),
        (b'{"model":"m","input":"hi"}', "text/plain", 415, "unsupported_media_type"),
        (b"model=m&input=hi", "application/x-www-form-urlencoded", 415, "unsupported_media_type"),
        (b'{"model":"m","input":"hi"}', "multipart/form-data; boundary=x", 415, "unsupported_media_type"),
    ],
)  # fmt: skip
async def test_malformed_bodies_and_content_types_are_4xx(
    gw: GatewayHarness,
    http: aiohttp.ClientSession,
    raw: bytes,
    content_type: str,
    status: int,
    code: str | None,
) -> None:
    got, body, headers = await post(http, gw, raw, headers={"Content-Type": content_type})
    assert got == status, body[:300]
    error = openai_error(body, code=code)
    assert error["param"] is None  # the body as a whole is at fault
    assert headers.get("X-Request-Id")


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("PUT", "/v1/responses", 405),
        ("PATCH", "/v1/responses", 405),
        ("DELETE", "/v1/models", 405),
        ("POST", "/v1/models", 405),
        ("GET", "/v1/responses", 405),  # no upgrade: not a WebSocket, and not a POST
        ("POST", "/healthz", 405),
        ("GET", "/v1/nope", 404),
        ("POST", "/v1/chat/completions", 404),
        ("GET", "/", 404),
        ("GET", "/v1/responses/resp_missing/nope", 404),
    ],
)
async def test_wrong_methods_and_unknown_routes_are_4xx_in_openai_shape(
    gw: GatewayHarness, http: aiohttp.ClientSession, method: str, path: str, status: int
) -> None:
    base = gw.url.removesuffix("/v1")
    async with http.request(method, base + path, data=b"{}") as resp:
        body = await resp.read()
        assert resp.status == status, body[:300]
        assert resp.content_type == "application/json"
        assert resp.headers.get("X-Request-Id")
        if status == 405 and (method, path) != ("GET", "/v1/responses"):
            assert resp.headers.get("Allow"), "a 405 says what the path accepts"
    error = openai_error(body, code="method_not_allowed" if status == 405 else "not_found")
    assert method in error["message"] or "POST" in error["message"]


async def test_websocket_upgrade_with_a_bad_handshake_is_4xx(gw: GatewayHarness) -> None:
    """An upgrade missing its key or version is refused with an HTTP answer, not a hang."""
    path = gw.url.split("//")[1].split("/", 1)[1]
    answer = await raw_request(
        gw,
        b"GET /%s/responses HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
        % path.encode(),
    )
    assert 400 <= status_of(answer) < 500, answer[:200]


async def test_default_limits_are_generous_but_finite() -> None:
    from streamer.config import Settings

    s = Settings()
    assert 1 << 20 <= s.max_body_bytes <= 1 << 30
    assert 1 << 20 <= s.ws_max_message_bytes <= 1 << 30
    assert s.max_tools > 0 and s.max_tool_bytes > 0 and s.max_input_items > 0
    assert 4096 <= s.max_header_bytes <= 65536
