"""Hostile clients at the request door, round 3 (issue 25, rows 2, 6, 7, 9, 13 and 14).

- row 2: a keyless request is a 401 from its head alone, with `Connection: close`: nothing
  of its body is buffered or parsed (30 MB `[{},…]` bodies, bodies with the last byte
  withheld), on both servers; the gateway's peak RSS (VmHWM) is printed;
- row 6: a compressed body is charged its decoded size against `--max-decoded-body-bytes`,
  while it is decoded (a 1 GiB bomb: 413, and the peak RSS printed);
- row 7: an Authorization header that is not printable ASCII (`Bearer caf\\xe9`) is a 401,
  also under `--forward-authorization`, never a 500;
- row 9: no `Host`, or two, is a 400 on both servers (RFC 9112 §3.2);
- row 13: the `/metrics` method label comes from a closed set, also with aiohttp's
  pure-Python parser (`AIOHTTP_NO_EXTENSIONS=1`);
- row 14: `Connection: close` then a second request, a body longer or shorter than its
  Content-Length: both servers answer alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
import zlib
from collections.abc import Callable
from pathlib import Path

import brotli
import orjson
import pytest
from gateway_process import GatewayProcess, gateway_process
from harness import GatewayHarness
from raw_http import DEADLINE, compared, connect, exchange, pipeline, post, read_answer

try:
    from compression import zstd  # type: ignore[import-not-found]
except ImportError:
    from backports import zstd  # type: ignore[import-not-found,no-redef]

KEY = "sk-door-round3-7f3a"
TEXT = {"model": "m", "input": "hi"}
BOTH = pytest.mark.parametrize("fast", [True, False], ids=["fast", "aiohttp"])


def keyless_head(length: int, *fields: bytes) -> bytes:
    lines = [b"POST /v1/responses HTTP/1.1", b"Host: x", b"Content-Type: application/json"]
    lines += [*fields, b"Content-Length: %d" % length]
    return b"\r\n".join(lines) + b"\r\n\r\n"


def costly_json(size: int) -> bytes:
    """`[{},{},…]` of about `size` bytes: the most values per byte JSON allows."""
    return b"[" + b"{}," * (size // 3 - 1) + b"{}]"


def flag(fast: bool) -> str:
    return "true" if fast else "false"


# -- row 2: the key before the body ----------------------------------------------------------


async def _refused_from_head(gw: GatewayProcess, body: bytes, send: int) -> None:
    """One keyless request: its head, then `send` bytes of `body`: a 401 that says close."""
    async with connect(gw.url) as (reader, writer):
        writer.write(keyless_head(len(body)))
        with contextlib.suppress(ConnectionError):
            for at in range(0, send, 1 << 20):
                writer.write(body[at : min(send, at + (1 << 20))])
                await writer.drain()
        async with asyncio.timeout(DEADLINE):
            answer = await read_answer(reader)
        assert answer.status == 401 and answer.error()["code"] == "invalid_api_key", answer
        assert answer.headers.get("Connection") == "close"


@BOTH
async def test_a_keyless_request_is_a_401_from_its_head_alone(tmp_path: Path, fast: bool) -> None:
    args = ("--api-key", KEY, "--fast-http", flag(fast))
    async with gateway_process(tmp_path / "gw.log", *args) as gw:
        body = costly_json(30_000_000)
        idle = gw.peak_rss_mb()
        # the head alone: the answer comes with not a byte of the announced body sent
        await _refused_from_head(gw, body, 0)
        # three keyless 30 MB bodies at once, sent whole: nothing of them is kept
        await asyncio.gather(*(_refused_from_head(gw, body, len(body)) for _ in range(3)))
        # twenty with the last byte withheld: nothing waits for it
        cut = body[: 4 << 20]
        await asyncio.gather(*(_refused_from_head(gw, cut + b"]", len(cut)) for _ in range(20)))
        peak = gw.peak_rss_mb()
        print(f"\n--fast-http {flag(fast)}: peak RSS {idle:.0f} MB idle, {peak:.0f} MB after")
        assert peak - idle < 48, (idle, peak)
        # and a keyed client is served as ever
        (answer,) = await exchange(gw.url, post(TEXT, f"Authorization: Bearer {KEY}"))
        assert answer.status == 200 and orjson.loads(answer.body)["status"] == "completed"


@BOTH
async def test_expect_100_continue_invites_the_body_only_with_a_key(fast: bool) -> None:
    async with GatewayHarness(fast_http=fast, api_keys=(KEY,)) as gw:
        body = orjson.dumps(TEXT)
        async with connect(gw.url) as (reader, writer):
            writer.write(keyless_head(len(body), b"Expect: 100-continue"))
            answer = await read_answer(reader)  # no "100 Continue": the 401, from the head
            assert answer.status == 401 and answer.headers["Connection"] == "close"
        async with connect(gw.url) as (reader, writer):
            writer.write(keyless_head(len(body), b"Expect: 100-continue",
                                      f"Authorization: Bearer {KEY}".encode()))  # fmt: skip
            assert (await read_answer(reader)).status == 100
            writer.write(body)
            answer = await read_answer(reader)
            assert answer.status == 200 and orjson.loads(answer.body)["status"] == "completed"


# -- row 6: the decoded size ------------------------------------------------------------------


def _padded(size: int) -> bytes:
    head, tail = b'{"model":"m","input":"', b'"}'
    return head + b"a" * (size - len(head) - len(tail)) + tail


CODINGS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": gzip.compress,
    "deflate": zlib.compress,
    "br": lambda data: brotli.compress(data, quality=4),
    "zstd": zstd.compress,
}


@BOTH
@pytest.mark.parametrize("coding", sorted(CODINGS))
async def test_a_compressed_body_is_charged_its_decoded_size(fast: bool, coding: str) -> None:
    limit = 1 << 20
    async with GatewayHarness(fast_http=fast, max_decoded_body_bytes=limit) as gw:
        encode = CODINGS[coding]
        small, bomb = encode(_padded(limit)), encode(_padded(8 * limit))
        assert len(bomb) < limit // 50  # tiny on the wire
        header = f"Content-Encoding: {coding}"
        ok, over = await exchange(gw.url, post(small, header), post(bomb, header))
        assert ok.status == 200, ok
        assert over.status == 413 and over.error()["code"] == "request_too_large", over
        assert "decoded" in over.error()["message"] and str(limit) in over.error()["message"]
        assert len(gw.backend.requests) == 1


def _zstd_bomb(size: int) -> bytes:
    compressor, piece = zstd.ZstdCompressor(level=3), b" " * (1 << 20)
    frames = [compressor.compress(piece) for _ in range(size >> 20)]
    return b"".join(frames) + compressor.flush()


@BOTH
async def test_a_1_gib_bomb_is_refused_while_it_is_decoded(tmp_path: Path, fast: bool) -> None:
    bomb = _zstd_bomb(1 << 30)
    async with gateway_process(tmp_path / "gw.log", "--fast-http", flag(fast)) as gw:
        idle = gw.peak_rss_mb()
        (answer,) = await exchange(gw.url, post(bomb, "Content-Encoding: zstd"))
        peak = gw.peak_rss_mb()
        print(f"\n--fast-http {flag(fast)}: 1 GiB zstd bomb ({len(bomb)} B): peak RSS {idle:.0f} "
              f"MB idle, {peak:.0f} MB after")  # fmt: skip
        assert answer.status == 413 and answer.error()["code"] == "request_too_large", answer
        assert peak - idle < 80, (idle, peak)  # the 32 MiB default, decoded, and no more


# -- row 7: header bytes that are not text ------------------------------------------------------


ROUTES = [
    post(TEXT, "Authorization: Bearer caf\xe9"),
    b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer caf\xe9\r\n\r\n",
    b"GET /v1/responses/resp_1 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer caf\xe9\r\n\r\n",
    b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\xfe\x80\r\n\r\n",
]


@BOTH
@pytest.mark.parametrize("keyed", [True, False], ids=["api-key", "forward-authorization"])
async def test_an_authorization_that_is_not_text_is_a_401(
    caplog: pytest.LogCaptureFixture, fast: bool, keyed: bool
) -> None:
    caplog.set_level(logging.ERROR)
    settings = {"api_keys": (KEY,)} if keyed else {"forward_authorization": True}
    async with GatewayHarness(fast_http=fast, **settings) as gw:  # type: ignore[arg-type]
        for raw in ROUTES:
            (answer,) = await exchange(gw.url, raw)
            assert answer.status == 401, (raw, answer)
            error = answer.error()
            assert set(error) == {"message", "type", "param", "code"}
            assert error["code"] == "invalid_api_key"
        good = f"Authorization: Bearer {KEY}" if keyed else "Authorization: Bearer any-key"
        (answer,) = await exchange(gw.url, post(TEXT, good, "X-Request-Id: caf\xe9"))
        assert answer.status == 200 and answer.headers["X-Request-Id"].startswith("req_")
    ours = [r for r in caplog.records if r.name.startswith(("aiohttp", "streamer"))]
    assert not ours, caplog.text


@BOTH
@pytest.mark.parametrize("value", [b"caf\xe9", b"\xff\xfe", b"100-continue\x80"])
async def test_an_expect_that_is_not_text_is_a_417(
    caplog: pytest.LogCaptureFixture, fast: bool, value: bytes
) -> None:
    caplog.set_level(logging.ERROR)
    async with GatewayHarness(fast_http=fast) as gw:
        for line in (b"POST /v1/responses", b"GET /v1/models", b"GET /healthz"):
            raw = b"%s HTTP/1.1\r\nHost: x\r\nExpect: %s\r\n" % (line, value)
            (answer,) = await exchange(gw.url, raw + b"Content-Length: 2\r\n\r\n{}")
            assert answer.status == 417 and answer.error()["code"] == "expectation_failed"
    ours = [r for r in caplog.records if r.name.startswith(("aiohttp", "streamer"))]
    assert not ours, caplog.text


# -- row 9: Host --------------------------------------------------------------------------------


@BOTH
async def test_no_host_or_two_hosts_is_a_400(fast: bool) -> None:
    async with GatewayHarness(fast_http=fast) as gw:
        bare = post(TEXT, host=False)
        twice = post(TEXT, "Host: other")
        for raw in (bare, twice, post({**TEXT, "stream": True}, host=False)):
            answers, closed = await pipeline(gw.url, raw, 2)
            assert [a.status for a in answers] == [400] and closed, (raw, answers)
        (answer,) = await exchange(gw.url, post(TEXT))
        assert answer.status == 200


# -- row 13: the metrics labels -----------------------------------------------------------------


async def test_made_up_methods_do_not_grow_the_metrics(tmp_path: Path) -> None:
    env = {"AIOHTTP_NO_EXTENSIONS": "1"}  # aiohttp's pure-Python parser takes any token
    async with gateway_process(tmp_path / "gw.log", "--api-key", KEY, env=env) as gw:
        for i in range(200):  # the 401 closes each connection: one request per connection
            raw = b"M%d /v1/responses HTTP/1.1\r\nHost: x\r\n\r\n" % i
            answers, _ = await pipeline(gw.url, raw, 1)
            assert [a.status for a in answers] == [401], answers
        (metrics,) = await exchange(gw.url, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        lines = [
            line
            for line in metrics.body.decode().splitlines()
            if line.startswith("streamer_http_requests_total")
        ]
        assert not [line for line in lines if 'method="M' in line], lines[:5]
        assert len(lines) <= 3, lines
        assert [line for line in lines if 'method="other"' in line and line.endswith(" 200.0")]


# -- row 14: what follows a request ---------------------------------------------------------------


def _cut(raw: bytes, by: int) -> bytes:
    """`raw` with a Content-Length `by` bytes off the body's real length."""
    head, _, body = raw.partition(b"\r\n\r\n")
    head = head.replace(b"Content-Length: %d" % len(body), b"Content-Length: %d" % (len(body) + by))
    return head + b"\r\n\r\n" + body


FOLLOWED = {
    "close, then a second request": post(TEXT, "Connection: close") + post(TEXT),
    "close, then garbage": post(TEXT, "Connection: close") + b"xyz",
    "a body longer than its length": _cut(post(TEXT), -5),
    "a body longer, with a second request": _cut(post(TEXT), -5) + post(TEXT),
    "a body shorter, then a second request": _cut(post(TEXT), 30) + post(TEXT),
    "a stream, then garbage": post({**TEXT, "stream": True}) + b"GET\r\n\r\n",
}


@pytest.mark.parametrize("name", sorted(FOLLOWED))
async def test_what_follows_a_request_is_answered_alike(name: str) -> None:
    raw = FOLLOWED[name]
    async with (
        GatewayHarness(fast_http=True, client_body_timeout=1.0) as fast,
        GatewayHarness(fast_http=False, client_body_timeout=1.0) as plain,
    ):
        seen = []
        for gw in (fast, plain):
            answers, closed = await pipeline(gw.url, raw, 2)
            seen.append(([compared(a) for a in answers], closed))
        assert seen[0] == seen[1], name
