"""Row 5 of issue 13: a backend's rate-limit headers holding control characters.

A 429/503 whose `Retry-After` or `x-ratelimit-*` value carries a control character (or is
absurdly long) used to be copied onto the client's answer, where aiohttp refused it: the
client got 0 bytes and aiohttp logged an unhandled exception. Now an illegal header is
dropped, the legal ones are kept, and the client always gets a well-formed JSON error.
"""

from __future__ import annotations

import logging

import aiohttp
import orjson
import pytest
from harness import GatewayHarness
from raw_backend import RawBackend, RawConnection, http_response

# Bytes the backend's HTTP parser lets through (it refuses only CR, LF and NUL).
ILLEGAL = {
    "soh": "1\x01",
    "escape": "\x1b[31m1",
    "del": "1\x7f",
    "vtab": "1\x0b2",
    "formfeed": "\x0c1",
    "latin1": "1\xe9",
    "long": "9" * 5000,
}
LEGAL = {"x-ratelimit-limit-requests": "100", "x-ratelimit-reset-tokens": "6m0s"}


def backend_with(status: str, name: str, value: str) -> RawBackend:
    """A backend that answers every chat request with `status` and one hostile header."""

    async def handler(conn: RawConnection) -> None:
        body = orjson.dumps({"error": {"message": "slow down", "type": "rate_limit"}})
        headers = {name: value, **LEGAL}
        while await conn.request() is not None:
            await conn.send(http_response(body, status=status, headers=headers))

    return RawBackend(handler)


@pytest.mark.parametrize("status", ["429 Too Many Requests", "503 Service Unavailable"])
@pytest.mark.parametrize("name", ["Retry-After", "x-ratelimit-remaining-requests"])
@pytest.mark.parametrize("kind", sorted(ILLEGAL))
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_illegal_rate_limit_header_gives_a_well_formed_error(
    caplog: pytest.LogCaptureFixture, status: str, name: str, kind: str, stream: bool
) -> None:
    caplog.set_level(logging.ERROR)
    async with (
        backend_with(status, name, ILLEGAL[kind]) as backend,
        GatewayHarness(upstream=backend.url) as gw,
        aiohttp.ClientSession() as http,
    ):
        body = {"model": "m", "input": "hi", "stream": stream}
        async with http.post(gw.url + "/responses", json=body) as resp:
            raw = await resp.read()
            assert resp.status == int(status[:3]), raw
            assert resp.content_type == "application/json"
            error = orjson.loads(raw)["error"]
            assert set(error) == {"message", "type", "param", "code"}
            assert error["message"] == "slow down"
            # the illegal header is gone, the legal ones came through
            assert name.lower() not in {k.lower() for k in resp.headers}
            for key, value in LEGAL.items():
                assert resp.headers.get(key) == value
    # aiohttp's "Error handling request" and anything of ours; the raw backend's own
    # teardown (asyncio) is not the gateway's doing
    ours = [r for r in caplog.records if r.name.startswith(("aiohttp", "streamer"))]
    assert not [r for r in ours if r.levelno >= logging.ERROR], caplog.text


async def test_legal_rate_limit_headers_pass_unchanged() -> None:
    async def handler(conn: RawConnection) -> None:
        while await conn.request() is not None:
            headers = {"Retry-After": "7", "retry-after-ms": "7000", **LEGAL}
            await conn.send(http_response(b'{"error": "busy"}', status="429 Busy", headers=headers))

    body = {"model": "m", "input": "hi"}
    async with (
        RawBackend(handler) as backend,
        GatewayHarness(upstream=backend.url) as gw,
        aiohttp.ClientSession() as http,
        http.post(gw.url + "/responses", json=body) as resp,
    ):
        assert resp.status == 429
        assert resp.headers["Retry-After"] == "7"
        assert resp.headers["retry-after-ms"] == "7000"
        for key, value in LEGAL.items():
            assert resp.headers[key] == value
        assert (await resp.json())["error"]["code"] == "rate_limit_exceeded"
