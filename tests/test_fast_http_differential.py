"""Both servers answer every head alike: `streamer serve --fast-http true` and `false`,
side by side on loopback, over request heads and pipelines that hypothesis generates
(issue 25 row 14, issue 26 item 1).

A generated request is mostly a plain `POST /v1/responses` with some rules bent: the
request line (method, target, version), Host (none, two), Content-Length (off by some
bytes, twice, odd digits, none), Transfer-Encoding (chunked bodies), Connection,
Content-Type, Content-Encoding (each coding applied, bytes that are not one, unknown and
layered codings), the key (right, wrong, none, not ASCII), X-Request-Id, Expect, Upgrade,
a field aiohttp allows once given twice, made-up fields with any byte in them, an obsolete
line fold, a bare LF, blank lines before the request. A pipeline is one to three of them
in one write, sometimes with garbage after. What a client sees (each answer's status, the
headers it reads and its body, ids and clocks aside, then whether the server closed) must
be the same from both; hypothesis shrinks any difference to a small example.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator
from typing import Any

import brotli
import orjson
import pytest
from gateway_process import GatewayProcess, gateway_process_sync
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from raw_http import compared, sync_pipeline

try:
    from compression import zstd  # type: ignore[import-not-found]
except ImportError:
    from backports import zstd  # type: ignore[import-not-found,no-redef]

KEY = "sk-differential-3b1"
FLAGS = ("--api-key", KEY, "--client-body-timeout", "0.3", "--client-header-timeout", "1")

ENCODE = {
    "gzip": gzip.compress,
    "GZip": gzip.compress,
    "deflate": zlib.compress,
    "br": lambda data: brotli.compress(data, quality=2),
    "zstd": zstd.compress,
}
CODINGS = [None] * 16 + [*ENCODE, "identity", "compress", "gzip, br", "x-gzip", "bad-gzip"]
TYPES = [b"application/json"] * 24 + [
    None,
    b"",
    b"application/json; charset=utf-8",
    b"Application/JSON",
    b"application/vnd.api+json",
    b"text/plain",
    b"application/json, text/plain",
    b'application/json; charset="utf-8"',
    b"application/json;",
    b"json",
    b"application/x-www-form-urlencoded",
    b"application/octet-stream",
]
KEYS = [b"Bearer " + KEY.encode()] * 16 + [
    None,
    b"Bearer nope",
    b"bearer " + KEY.encode(),
    b"Bearer  " + KEY.encode(),
    b"Bearer caf\xe9",
    b"Basic abc",
    b"Bearer " + KEY.encode() + b" ",
]
CONNECTIONS = [None] * 8 + [
    b"close",
    b"keep-alive",
    b"Keep-Alive, close",
    b"upgrade",
    b"foo",
    b"close, close",
    b"CLOSE",
]
IDS = [None] * 6 + [b"mine-1", b"two words", b"caf\xe9", b"x" * 300]
LINES = [b"POST /v1/responses HTTP/1.1"] * 120 + [
    b"GET /v1/responses HTTP/1.1",
    b"PUT /v1/responses HTTP/1.1",
    b"post /v1/responses HTTP/1.1",
    b"FOO /v1/responses HTTP/1.1",
    b"POST /v1/responses?x=1 HTTP/1.1",
    b"POST /v1/responses/ HTTP/1.1",
    b"POST //v1/responses HTTP/1.1",
    b"POST /v1/responses/compact HTTP/1.1",
    b"POST http://x/v1/responses HTTP/1.1",
    b"POST /v1/responses HTTP/1.0",
    b"POST /v1/responses HTTP/2.0",
    b"POST /v1/responses HTTP/1.2",
    b"POST  /v1/responses HTTP/1.1",
    b"GET /v1/models HTTP/1.1",
    b"POST /v1/models HTTP/1.1",
]
LENGTHS = ["right"] * 80 + ["none", "short", "long", "twice", "two values", "plus", "hex", "list"]
TOKEN_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-!#$%&'*+.^_`|~"
VALUE_BYTES = [bytes([b]) for b in (*b"az AZ09-;=,\t", 0x7F, 0x80, 0xE9, 0xFF, 0x00, 0x01)]


def rarely(n: int) -> st.SearchStrategy[bool]:
    """True about once in `n + 1` draws (not at an end of the range, which hypothesis
    draws more often than the rest)."""
    return st.integers(0, n).map(lambda i: i == n // 2)


def mostly(pool: list[Any]) -> st.SearchStrategy[Any]:
    """One of `pool`, whose first element is the common case: it is also put last, as
    hypothesis draws the ends of a range more often than the rest."""
    return st.sampled_from([*pool, pool[0]])


def _body(kind: str) -> bytes:
    turn: dict[str, Any] = {"model": "m", "input": "hi"}
    if kind == "stream":
        turn["stream"] = True
    elif kind == "background":
        turn["background"] = True
    elif kind == "bad input":
        turn["input"] = 5
    elif kind == "big":
        turn["input"] = "word " * 30_000
    return {
        "bad json": b'{"model": "m",',
        "empty": b"",
        "list": b"[1, 2]",
    }.get(kind) or orjson.dumps(turn)


@st.composite
def extra_field(draw: st.DrawFn) -> bytes:
    name = draw(st.text(TOKEN_CHARS, min_size=1, max_size=10)).encode()
    value = b"".join(draw(st.lists(st.sampled_from(VALUE_BYTES), max_size=12)))
    return name + b": " + value


def _length(choice: str, size: int) -> list[bytes]:
    n = b"%d" % size
    return {
        "right": [b"Content-Length: " + n],
        "none": [],
        "short": [b"Content-Length: %d" % max(0, size - 4)],
        "long": [b"Content-Length: %d" % (size + 7)],
        "twice": [b"Content-Length: " + n, b"content-length: " + n],
        "two values": [b"Content-Length: " + n, b"Content-Length: %d" % (size + 1)],
        "plus": [b"Content-Length: +" + n],
        "hex": [b"Content-Length: 0x%x" % size],
        "list": [b"Content-Length: " + n + b", " + n],
    }[choice]


def _chunked(body: bytes) -> bytes:
    pieces = [body[i : i + 7] for i in range(0, len(body), 7)]
    return b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


@st.composite
def request(draw: st.DrawFn) -> bytes:
    body = _body(draw(mostly(["turn"] * 6 + ["stream"] * 4 + [
        "background", "bad json", "empty", "list", "bad input", "big"])))  # fmt: skip
    fields: list[bytes] = []
    coding = draw(mostly(CODINGS))
    if coding is not None:
        body = ENCODE[coding](body) if coding in ENCODE else body
        body = b"\x1f\x8b not gzip" if coding == "bad-gzip" else body
        fields.append(b"Content-Encoding: " + coding.replace("bad-", "").encode())
    chunked = draw(mostly([None] * 40 + [b"chunked", b"gzip, chunked", b"identity"]))
    if chunked is not None:
        fields.append(b"Transfer-Encoding: " + chunked)
        body = _chunked(body) if chunked.endswith(b"chunked") else body
    fields += _length(draw(mostly(LENGTHS)), len(body)) if chunked is None else []
    fields += [b"Host: x"] * draw(mostly([1] * 30 + [0, 2]))
    for name, pool in (
        (b"Content-Type", TYPES),
        (b"Authorization", KEYS),
        (b"Connection", CONNECTIONS),
        (b"X-Request-Id", IDS),
    ):
        value = draw(mostly(pool))
        fields += [name + b": " + value] if value is not None else []
    fields += draw(st.lists(extra_field(), max_size=2)) if draw(rarely(5)) else []
    fields += draw(mostly([[]] * 40 + [
        [b"User-Agent: a", b"User-Agent: b"], [b"Expect: 100-continue"],
        [b"Upgrade: websocket"], [b"X-Folded: a", b" b"], [b"X-Space : a"], [b"TE: trailers"],
    ]))  # fmt: skip
    fields = draw(st.permutations(fields))
    line = draw(mostly(LINES))
    ends = [b"\r\n"] * (len(fields) + 1)
    if draw(rarely(40)):  # one line ending in a bare LF
        ends[draw(st.integers(0, len(fields)))] = b"\n"
    lines = [line, *fields]
    head = b"".join(text + end for text, end in zip(lines, ends, strict=True))
    return head + b"\r\n" + body


@st.composite
def pipelines(draw: st.DrawFn) -> tuple[bytes, int]:
    """A pipeline in one write, and the most answers it can get."""
    requests = [draw(request()) for _ in range(draw(mostly([1] * 12 + [2, 3])))]
    tail = draw(mostly([b""] * 40 + [b"xyz", b"\r\n", b"GET\r\n\r\n"]))
    lead = draw(mostly([b""] * 40 + [b"\r\n"]))
    return lead + b"".join(requests) + tail, len(requests) + bool(tail.strip())


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayProcess, ...]]:
    logs = tmp_path_factory.mktemp("differential")
    with (
        gateway_process_sync(logs / "fast.log", *FLAGS, "--fast-http", "true") as fast,
        gateway_process_sync(logs / "aiohttp.log", *FLAGS, "--fast-http", "false") as plain,
    ):
        yield fast, plain


def seen(server: GatewayProcess, raw: bytes, most: int) -> tuple[list[dict[str, Any]], bool]:
    answers, closed = sync_pipeline(server.url, raw, most)
    return [compared(a) for a in answers], closed


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(pipelines())
def test_both_servers_answer_every_head_alike(
    servers: tuple[GatewayProcess, GatewayProcess], pipeline: tuple[bytes, int]
) -> None:
    fast, plain = servers
    raw, most = pipeline
    assert seen(fast, raw, most) == seen(plain, raw, most)


def _served(server: GatewayProcess) -> int:
    (health,), _ = sync_pipeline(server.url, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", 1)
    return int(orjson.loads(health.body)["stats"].get("fast_http_requests", 0))


@settings(max_examples=20, deadline=None)
@given(st.sampled_from(["turn", "stream", "bad input"]), st.sampled_from([None, "zstd", "gzip"]))
def test_the_common_case_is_the_fast_paths(
    servers: tuple[GatewayProcess, GatewayProcess], kind: str, coding: str | None
) -> None:
    """The comparison means something only where the fast path answers: a plain request
    (the generator's common case) is counted as its own in /healthz."""
    fast, plain = servers
    body = _body(kind)
    fields = [b"Host: x", b"Authorization: Bearer " + KEY.encode()]
    if coding is not None:
        body = ENCODE[coding](body)
        fields.append(b"Content-Encoding: " + coding.encode())
    fields.append(b"Content-Length: %d" % len(body))
    raw = b"POST /v1/responses HTTP/1.1\r\n" + b"".join(f + b"\r\n" for f in fields)
    raw += b"\r\n" + body
    before = _served(fast)
    assert seen(fast, raw, 1) == seen(plain, raw, 1)
    assert _served(fast) == before + 1 and _served(plain) == 0
