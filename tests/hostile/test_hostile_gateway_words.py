"""Row 10 of issue 25: the scrubber must never rewrite what the gateway itself wrote.

With `--upstream-api-key sk-upstream-…` the old scrubber turned the gateway's own error code
`upstream_error` into `[redacted]_error` and "check the upstream URL" into "check the
[redacted] URL" (any 8 characters of a key, wherever they were); a client key that is a word
(`backend`) took that word out of every message the gateway wrote. A machine-read code
broke, and the output showed which words a key contains. Only what the backend chose is
scrubbed, where it enters; the gateway's codes and messages leave as written.
"""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import pytest
from harness import GatewayHarness
from raw_backend import RawBackend, RawConnection, http_response, sse_data, sse_head

UPSTREAM_KEY = "sk-upstream-HOSTILE-0123456789abcd"
WORD_KEY = "backend"  # a client key that is a word of the gateway's messages


async def redirect(conn: RawConnection) -> None:
    while await conn.request() is not None:
        await conn.send(http_response(b"", status="302 Found", headers={"Location": "/x"}))


async def closes_mid_stream(conn: RawConnection) -> None:
    if await conn.request() is not None:
        first = {"choices": [{"index": 0, "delta": {"content": "Hel"}, "finish_reason": None}]}
        await conn.send(sse_head() + sse_data(first))
        conn.close()


async def quotes_the_key(conn: RawConnection) -> None:
    """The backend's own words are still scrubbed: a 500 whose text holds the key."""
    while await conn.request() is not None:
        text = f"proxy: upstream key {UPSTREAM_KEY} refused".encode()
        await conn.send(http_response(text, status="500 Oops", content_type="text/plain"))


def unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def answer(url: str, stream: bool) -> tuple[int, Any]:
    """The status and the error a client gets (the JSON error, or `response.failed`'s)."""
    body = {"model": "m", "input": "hi", "stream": stream}
    headers = {"Authorization": f"Bearer {WORD_KEY}"}
    async with (
        aiohttp.ClientSession(headers=headers) as http,
        http.post(url + "/responses", json=body) as resp,
    ):
        raw = await resp.read()
    if not stream:
        return resp.status, orjson.loads(raw)["error"]
    events = [orjson.loads(line[6:]) for line in raw.splitlines() if line.startswith(b"data: ")]
    (failed,) = [e for e in events if e["type"] == "response.failed"]
    return resp.status, failed["response"]["error"]


Handler = Callable[[RawConnection], Awaitable[None]]
CASES: list[tuple[str, Handler | None, bool, dict[str, str]]] = [
    (
        "redirect",
        redirect,
        False,
        {"code": "upstream_error", "says": "(a redirect); check the upstream URL."},
    ),
    (
        "unreachable",
        None,
        False,
        {"code": "upstream_unreachable", "says": "Could not connect to the backend at 127.0.0.1:"},
    ),
    (
        "closed mid-stream",
        closes_mid_stream,
        True,
        {"code": "server_error", "says": "The backend closed the stream before it finished."},
    ),
]


@pytest.mark.parametrize(
    ("name", "handler", "stream", "expected"), CASES, ids=[c[0] for c in CASES]
)
async def test_the_gateways_own_codes_and_messages_leave_as_written(
    name: str, handler: Handler | None, stream: bool, expected: dict[str, str]
) -> None:
    options = {"upstream_api_key": UPSTREAM_KEY, "api_keys": (WORD_KEY,)}
    if handler is None:
        async with GatewayHarness(upstream=f"http://127.0.0.1:{unused_port()}/v1", **options) as gw:
            status, error = await answer(gw.url, stream)
    else:
        async with (
            RawBackend(handler) as backend,
            GatewayHarness(upstream=backend.url, **options) as gw,
        ):
            status, error = await answer(gw.url, stream)
    print(f"\n{name}: {status} {error}")
    assert error["code"] == expected["code"]
    assert expected["says"] in error["message"]
    assert "[redacted]" not in orjson.dumps(error).decode()


async def test_what_the_backend_wrote_is_still_scrubbed() -> None:
    options = {"upstream_api_key": UPSTREAM_KEY, "api_keys": (WORD_KEY,)}
    async with (
        RawBackend(quotes_the_key) as backend,
        GatewayHarness(upstream=backend.url, **options) as gw,
    ):
        status, error = await answer(gw.url, False)
    assert status == 500
    assert UPSTREAM_KEY not in error["message"] and "[redacted] refused" in error["message"]
    # the gateway's own words around it stay whole
    assert error["message"].startswith("The backend answered HTTP 500: proxy: upstream key ")
