"""The fast path's request-head codec over plain bytes: what it takes, what it hands over."""

from __future__ import annotations

import pytest

from streamer.frontends.request_head import (
    HAND_OVER,
    MAX_HEAD,
    MORE,
    Head,
    chunk,
    json_type,
    parse,
    response_head,
)

BODY = b'{"model":"m","input":"hi"}'


def request(*fields: str, line: str = "POST /v1/responses HTTP/1.1", body: bytes = BODY) -> bytes:
    fields = fields or ("Host: x", "Content-Type: application/json", f"Content-Length: {len(body)}")
    return ("\r\n".join([line, *fields]) + "\r\n\r\n").encode("latin-1") + body


def take(raw: bytes, *, max_line: int = 8190, max_body: int = 1 << 20) -> Head:
    head = parse(raw, max_line=max_line, max_body=max_body)
    assert isinstance(head, Head), head
    return head


def test_a_plain_request_is_taken_with_its_fields_length_and_size() -> None:
    raw = request(
        "Host: x",
        "content-type: application/json",
        "Content-Length: 26",
        "X-Request-Id:  abc ",
        "Authorization: Bearer K",
        "X-A: 1",
        "x-a: 2",  # repeated, but not read here: aiohttp takes it too
    )
    head = take(raw)
    assert head.length == len(BODY) and raw[head.size :] == BODY
    assert head.headers == {  # the fields the fast path reads, values as sent
        "content-type": "application/json",
        "content-length": "26",
        "x-request-id": "abc",
        "authorization": "Bearer K",
    }
    assert not head.close


def test_every_prefix_of_a_head_asks_for_more_bytes() -> None:
    raw = request()
    end = raw.index(b"\r\n\r\n") + 4
    for cut in range(end):  # a head split byte by byte
        assert parse(raw[:cut], max_line=8190, max_body=1 << 20) is MORE, cut
    assert take(raw[:end]).size == end


def test_a_head_fed_piece_by_piece_is_searched_once() -> None:
    raw = request()
    buf, searched = bytearray(), 0
    for byte in raw:  # as the connection buffers it: each call searches the new bytes only
        buf.append(byte)
        parsed = parse(buf, max_line=8190, max_body=1 << 20, at=searched)
        if parsed is not MORE:
            break
        searched = len(buf)
    assert isinstance(parsed, Head) and parsed.size == raw.index(b"\r\n\r\n") + 4
    assert parsed == take(raw)


@pytest.mark.parametrize(
    "value, close",
    [("close", True), ("keep-alive", False), ("Keep-Alive, close", True), ("CLOSE", True)],
)
def test_connection_close_is_read(value: str, close: bool) -> None:
    raw = request("Content-Length: 26", f"Connection: {value}")
    assert take(raw).close is close


@pytest.mark.parametrize(
    "raw",
    [
        request(line="GET /v1/responses HTTP/1.1"),  # the WebSocket route, upgrades
        request(line="POST /v1/responses?x=1 HTTP/1.1"),
        request(line="POST /v1/responses/compact HTTP/1.1"),
        request(line="POST /v1/responses HTTP/1.0"),
        request(line="POST  /v1/responses HTTP/1.1"),
        b"\r\n" + request(),  # a leading empty line: aiohttp's call
        request("Transfer-Encoding: chunked"),
        request("Content-Length: 26", "Transfer-Encoding: chunked"),
        request("Content-Length: 26", "Expect: 100-continue"),
        request("Content-Length: 26", "Upgrade: websocket", "Connection: upgrade"),
        request("Content-Length: 26", "Connection: upgrade"),
        request("Content-Length: 26", "Content-Encoding: gzip"),
        request("Content-Length: 26", "Content-Type: text/plain"),
        request("Content-Length: 26", 'Content-Type: application/json; charset="utf-8"'),
        request("Content-Length: 26", "Content-Type: application/json, text/plain"),
        request("Host: x"),  # no Content-Length
        request("Content-Length: +26"),
        request("Content-Length: 26, 26"),
        request("Content-Length: 26", "Content-Length: 26"),  # a repeated field
        request("Content-Length: 26", "Authorization: a", "authorization: b"),
        request("Content-Length: 26", "X-Request-Id: a", "X-Request-ID: b"),
        request("Content-Length: 26", "Connection: close", "Connection: close"),
        request("Content-Length: 26", "TE: trailers"),
        request("Content-Length: 26", "Trailer: X"),
        request("Content-Length: 26", "X-A: 1", " folded"),  # an obsolete line fold
        request("Content-Length: 26", "X A: 1"),
        request("Content-Length: 26", "X-A : 1"),
        request("Content-Length: 26", "X-A: caf\xe9"),  # not ASCII: aiohttp decodes it
        request("Content-Length: 26", "X-A: a\x01b"),
        request("Content-Length: 26", "X-A: a\rb"),
        request("Content-Length: 26", "X-A: a\nb"),
        request("Content-Length: 26", ": empty name"),
    ],
)
def test_anything_else_or_odd_is_handed_over(raw: bytes) -> None:
    assert parse(raw, max_line=8190, max_body=1 << 20) is HAND_OVER


def test_the_request_line_is_refused_as_soon_as_it_differs() -> None:
    assert parse(b"G", max_line=8190, max_body=100) is HAND_OVER
    assert parse(b"POST /v1/m", max_line=8190, max_body=100) is HAND_OVER
    assert parse(b"POST /v1/r", max_line=8190, max_body=100) is MORE


def test_names_are_matched_whole_and_at_the_start_of_a_line() -> None:
    raw = request("Content-Length: 26", "X-Te: 1", "X-Upgrade: y", "X-A: upgrade:")
    assert take(raw).headers == {"content-length": "26"}
    assert take(request("Content-Length: 26", "X: \tclose\t")).close is False


def test_limits_hand_over_to_aiohttp_which_answers_them() -> None:
    long_line = request("Content-Length: 26", "X-A: " + "a" * 100)
    assert parse(long_line, max_line=50, max_body=1 << 20) is HAND_OVER
    assert isinstance(parse(long_line, max_line=105, max_body=1 << 20), Head)
    assert parse(request(), max_line=8190, max_body=len(BODY)) is HAND_OVER
    assert isinstance(parse(request(), max_line=8190, max_body=len(BODY) + 1), Head)
    endless = b"POST /v1/responses HTTP/1.1\r\n" + b"X-A: b\r\n" * (MAX_HEAD // 8)
    assert parse(endless, max_line=8190, max_body=100) is HAND_OVER


@pytest.mark.parametrize(
    "value, taken",
    [
        (None, True),
        ("application/json", True),
        ("Application/JSON; charset=utf-8", True),
        ("application/octet-stream", True),
        ("application/vnd.x+json", True),
        ("text/json", False),
        ("application/x-www-form-urlencoded", False),
        ("", False),  # aiohttp's own reading of it decides
    ],
)
def test_json_types(value: str | None, taken: bool) -> None:
    assert json_type(value) is taken


def test_chunks_and_heads() -> None:
    assert chunk(b"abc") == b"3\r\nabc\r\n"
    assert chunk(b"x" * 26, last=True) == b"1a\r\n" + b"x" * 26 + b"\r\n0\r\n\r\n"
    assert chunk(b"") == b""  # an empty chunk would end the body
    assert chunk(b"", last=True) == b"0\r\n\r\n"
    head = response_head(401, [("Content-Type", "application/json"), ("Content-Length", "2")])
    assert head == (
        b"HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n"
    )
    assert response_head(418, []).startswith(b"HTTP/1.1 418 I'm a Teapot\r\n")
