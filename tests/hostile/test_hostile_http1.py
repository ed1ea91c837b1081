"""A hostile backend against the HTTP/1.1 client (issue 13, rows 2 and 9, and the review
findings): desynchronised keep-alive connections, statuses out of range, chunk sizes and
transfer-codings the client must refuse, and `--upstream-keepalive off`.

Every backend here is a `RawBackend` (raw TCP on loopback); every client is aiohttp against
a real gateway (`GatewayHarness`), with two client keys where a leak between them is the
question.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import orjson
import pytest
from harness import GatewayHarness
from raw_backend import (
    RawBackend,
    RawConnection,
    RawRequest,
    chunked,
    http_response,
    sse_data,
    sse_head,
)
from scripted_backend import completion, finish, text_chunks, usage

KEY_A, KEY_B = "hostile-key-alpha-7f3a", "hostile-key-bravo-91c4"
LONG_IDLE = 3600.0  # no test may pass by waiting for the idle timeout

# -- what the backend says -------------------------------------------------------------------


def user_text(request: RawRequest) -> str:
    """The last user message of a chat request (what the backend echoes)."""
    body = request.json
    assert isinstance(body, dict)
    for message in reversed(body["messages"]):
        if message["role"] == "user":
            content = message["content"]
            if isinstance(content, str):
                return content
            return "".join(part.get("text", "") for part in content)
    return ""


def sse_answer(text: str) -> bytes:
    """A whole, well-framed chunked SSE answer saying `text`."""
    events = [*text_chunks([text]), finish("stop"), usage(3, 2)]
    body = b"".join(sse_data(e) for e in events) + sse_data(b"[DONE]") + chunked(b"")
    return sse_head() + body


def json_answer(text: str) -> bytes:
    """A whole Content-Length JSON completion saying `text`."""
    return http_response(orjson.dumps(completion(text)))


ANSWERS: dict[str, Callable[[str], bytes]] = {"sse": sse_answer, "json": json_answer}


def desynchronising(answer: Callable[[str], bytes]) -> Callable[[RawConnection], Awaitable[None]]:
    """A backend that, on every request after the first on a connection, first sends the
    previous answer again (bytes after the end of that answer, arriving only once the
    connection carries the next request), then the real answer."""

    async def handler(conn: RawConnection) -> None:
        previous = b""
        while (request := await conn.request()) is not None:
            reply = answer("echo:" + user_text(request))
            await conn.send(previous + reply)
            previous = reply

    return handler


# -- what the client sees ----------------------------------------------------------------------


async def ask(
    session: aiohttp.ClientSession, gw: GatewayHarness, key: str, text: str, *, stream: bool
) -> tuple[int, bytes]:
    """One turn through the gateway: its HTTP status and every byte the client received."""
    body = {"model": "m", "input": text, "stream": stream}
    headers = {"Authorization": f"Bearer {key}"}
    async with session.post(gw.url + "/responses", json=body, headers=headers) as resp:
        return resp.status, await resp.read()


@asynccontextmanager
async def gateway(
    handler: Callable[[RawConnection], Awaitable[None]], **settings: Any
) -> AsyncIterator[tuple[GatewayHarness, RawBackend, aiohttp.ClientSession]]:
    async with RawBackend(handler) as backend:
        options: dict[str, Any] = {"api_keys": (KEY_A, KEY_B), "idle_timeout": LONG_IDLE}
        options.update(settings)
        harness = GatewayHarness(upstream=backend.url, **options)
        async with harness as gw, aiohttp.ClientSession() as session:
            yield gw, backend, session


WORDS = {
    KEY_A: re.compile(rb"alpha-\d+-[0-9a-f]{12}"),
    KEY_B: re.compile(rb"bravo-\d+-[0-9a-f]{12}"),
}


def leaked(other: str, seen: bytes) -> int:
    """Bytes of the `other` key's words (any of its turns) in what a client saw."""
    return sum(len(word) for word in WORDS[other].findall(seen))


async def desync_attempts(
    framing: str, stream: bool, attempts: int, *, concurrent: bool = False
) -> tuple[int, int]:
    """Key A then key B, `attempts` times, against a desynchronising backend: the bytes of
    either key's words that reached the other, and how many turns were answered with the
    asking key's own words (the backend may still answer a key with its previous turn's)."""
    total, own = 0, 0
    async with gateway(desynchronising(ANSWERS[framing])) as (gw, _, session):
        for i in range(attempts):
            word_a = f"alpha-{i}-{secrets.token_hex(6)}"
            word_b = f"bravo-{i}-{secrets.token_hex(6)}"
            turn_a = ask(session, gw, KEY_A, word_a, stream=stream)
            turn_b = ask(session, gw, KEY_B, word_b, stream=stream)
            if concurrent:
                (status_a, seen_a), (status_b, seen_b) = await asyncio.gather(turn_a, turn_b)
            else:
                status_a, seen_a = await turn_a
                status_b, seen_b = await turn_b
            total += leaked(KEY_A, seen_b) + leaked(KEY_B, seen_a)
            own += status_a == 200 and bool(WORDS[KEY_A].search(seen_a))
            own += status_b == 200 and bool(WORDS[KEY_B].search(seen_b))
    return total, own


# -- row 2: desynchronised keep-alive connections -------------------------------------------


@pytest.mark.parametrize("stream", [True, False], ids=["sse", "json"])
async def test_extra_response_after_a_response_never_reaches_another_key(stream: bool) -> None:
    # the backend's chunked SSE answer is followed by a copy of itself, sent once the
    # connection carries the next request: on one shared pool, key B got key A's answer
    async with gateway(desynchronising(sse_answer)) as (gw, _, session):
        status, seen = await ask(session, gw, KEY_A, "alpha-secret-words", stream=stream)
        assert status == 200 and b"echo:alpha-secret-words" in seen
        status, seen = await ask(session, gw, KEY_B, "bravo-words", stream=stream)
        assert b"alpha-secret-words" not in seen
        assert status == 200 and b"echo:bravo-words" in seen  # B's own answer


@pytest.mark.parametrize("stream", [True, False], ids=["sse", "json"])
async def test_bytes_past_content_length_arriving_late_never_reach_another_key(
    stream: bool,
) -> None:
    # a JSON answer framed by Content-Length, and bytes past its end (a whole response
    # again) that arrive once the connection was reused
    async with gateway(desynchronising(json_answer)) as (gw, _, session):
        status, seen = await ask(session, gw, KEY_A, "alpha-secret-words", stream=stream)
        assert status == 200 and b"echo:alpha-secret-words" in seen
        status, seen = await ask(session, gw, KEY_B, "bravo-words", stream=stream)
        assert b"alpha-secret-words" not in seen
        assert status == 200 and b"echo:bravo-words" in seen


@pytest.mark.parametrize(
    ("framing", "stream", "concurrent"),
    [("sse", True, False), ("json", False, False), ("sse", False, True), ("json", True, True)],
)
async def test_desync_attempts_leak_nothing(framing: str, stream: bool, concurrent: bool) -> None:
    attempts = 13  # x 4 cases: ~50 attempts
    total, own = await desync_attempts(framing, stream, attempts, concurrent=concurrent)
    client = "sse" if stream else "json"
    print(f"\ndesync {framing} backend, {client} client: {attempts} attempts, {total} leaked bytes")
    assert total == 0
    assert own == 2 * attempts  # every turn answered, with the asking key's own words


@pytest.mark.slow
async def test_desync_soak_1000_attempts_leak_nothing() -> None:
    total, own = 0, 0
    for framing, stream in itertools.product(("sse", "json"), (True, False)):
        for concurrent in (False, True):
            leaked_bytes, answered = await desync_attempts(
                framing, stream, 125, concurrent=concurrent
            )
            total, own = total + leaked_bytes, own + answered
    print(f"\ndesync soak: 1000 attempts, {total} leaked bytes, own words {own}/2000 turns")
    assert total == 0 and own == 2000


# -- row 9: statuses out of range, endless informational heads ------------------------------


def answering_then_hanging(raw: bytes) -> Callable[[RawConnection], Awaitable[None]]:
    """Answer every request with `raw`, never close."""

    async def handler(conn: RawConnection) -> None:
        while await conn.request() is not None:
            await conn.send(raw)

    return handler


async def bad_gateway(session: aiohttp.ClientSession, gw: GatewayHarness, stream: bool) -> dict:
    # a guard, not a timing assertion: without the fix, "000" waits for the idle timeout
    async with asyncio.timeout(30):
        status, seen = await ask(session, gw, KEY_A, "hi", stream=stream)
    assert status == 502, (status, seen[:300])
    error = orjson.loads(seen)["error"]
    assert error["code"] == "upstream_error" and error["type"] == "server_error"
    return error


@pytest.mark.parametrize("code", ["600", "999", "000", "099"])
@pytest.mark.parametrize("stream", [True, False], ids=["sse", "json"])
async def test_status_out_of_range_is_a_502(code: str, stream: bool) -> None:
    raw = f"HTTP/1.1 {code} Odd\r\nContent-Type: application/json\r\n".encode()
    raw += b"Content-Length: 2\r\n\r\n{}"
    async with gateway(answering_then_hanging(raw)) as (gw, _, session):
        error = await bad_gateway(session, gw, stream)
        assert f"status code {code} out of range" in error["message"]


async def test_endless_informational_heads_are_a_502() -> None:
    async def handler(conn: RawConnection) -> None:
        await conn.request()
        while True:  # 100 Continue for ever: the idle timer never fires
            await conn.send(b"HTTP/1.1 100 Continue\r\n\r\n")

    async with gateway(handler) as (gw, _, session):
        error = await bad_gateway(session, gw, False)
        assert "informational" in error["message"]


# -- review findings: chunk sizes, transfer-codings -----------------------------------------


@pytest.mark.parametrize("size", ["0x%x", "+%x", "0_%x"])
async def test_odd_chunk_size_is_refused(size: str) -> None:
    # `int(b"0x1a", 16)` succeeds in Python: the bulk de-chunking path took such sizes
    payload = b'data: {"choices":[{"index":0,"delta":{"content":"smuggled"}}]}\n\n'
    body = (size % len(payload)).encode() + b"\r\n" + payload + b"\r\n"
    rest = [finish("stop"), usage(3, 2)]
    raw = sse_head() + body + b"".join(sse_data(e) for e in rest) + sse_data(b"[DONE]")
    raw += chunked(b"")
    async with gateway(answering_then_hanging(raw)) as (gw, _, session):
        status, seen = await ask(session, gw, KEY_A, "hi", stream=False)
        assert status == 200, seen[:300]  # the stream had started: the turn fails
        response = orjson.loads(seen)
        assert response["status"] == "failed", response
        error = response["error"]  # OpenAI's code for it; the gateway's own in `type`
        assert (error["code"], error["type"]) == ("server_error", "upstream_error"), error
        assert "bad chunk size" in error["message"]
        assert b"smuggled" not in seen


@pytest.mark.parametrize("coding", ["gzip, chunked", "chunked, gzip", "deflate"])
async def test_transfer_coding_other_than_chunked_is_a_502(coding: str) -> None:
    raw = sse_answer("compressed?").replace(
        b"Transfer-Encoding: chunked", f"Transfer-Encoding: {coding}".encode()
    )
    async with gateway(answering_then_hanging(raw)) as (gw, _, session):
        error = await bad_gateway(session, gw, True)
        other = "deflate" if coding == "deflate" else "gzip"
        assert f"transfer-coding {other}, which this gateway does not decode" in error["message"]


# -- --upstream-keepalive off ---------------------------------------------------------------


def echoing() -> tuple[Callable[[RawConnection], Awaitable[None]], list[RawRequest]]:
    requests: list[RawRequest] = []

    async def handler(conn: RawConnection) -> None:
        while (request := await conn.request()) is not None:
            requests.append(request)
            await conn.send(sse_answer("echo:" + user_text(request)))

    return handler, requests


@pytest.mark.parametrize("keepalive", [True, False], ids=["on", "off"])
async def test_keepalive_off_makes_one_connection_per_request(keepalive: bool) -> None:
    handler, requests = echoing()
    async with gateway(handler, upstream_keepalive=keepalive) as (gw, backend, session):
        for i in range(6):
            key = (KEY_A, KEY_B)[i % 2]
            status, seen = await ask(session, gw, key, f"turn-{i}", stream=i % 3 == 0)
            assert status == 200 and f"echo:turn-{i}".encode() in seen
        assert len(requests) == 6
        if keepalive:  # one connection per key, each reused
            assert backend.connections == 2
            assert {r.headers["connection"] for r in requests} == {"keep-alive"}
        else:
            assert backend.connections == 6
            assert {r.headers["connection"] for r in requests} == {"close"}
