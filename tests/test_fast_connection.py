"""The fast path's connection over plain bytes, without a socket: its states, which heads
it takes, when it refuses from the head, and what it hands to aiohttp (every read since
the request began, in order)."""

from __future__ import annotations

import gzip

import pytest

from streamer.core.errors import RequestError
from streamer.frontends.api_keys import refused
from streamer.frontends.fast_connection import (
    MAX_FIELDS,
    MAX_HEAD,
    FastConnection,
    Request,
    State,
    Step,
    media,
)
from streamer.frontends.request_body import BodyReader, check_coding

BODY = b'{"model":"m","input":"hi"}'
KEY = "Bearer k"


class Rules:
    """The endpoint's head rules, as plain values: one key, the body limits."""

    def __init__(self, max_decoded: int = 1 << 20) -> None:
        self.max_decoded = max_decoded
        self.admitted: list[Request] = []

    def admit(self, request: Request) -> None:
        if request.headers.get("authorization") != KEY:
            raise refused("You didn't provide an API key.")
        coding = check_coding(request.headers.get("content-encoding"))
        request.reader = BodyReader(coding, 1 << 20, self.max_decoded, request.length)
        request.who = "client"
        self.admitted.append(request)


def request(*fields: str, line: str = "POST /v1/responses HTTP/1.1", body: bytes = BODY) -> bytes:
    fields = fields or ("Host: x", f"Authorization: {KEY}", f"Content-Length: {len(body)}")
    return ("\r\n".join([line, *fields]) + "\r\n\r\n").encode("latin-1") + body


def plain(*more: str, body: bytes = BODY) -> bytes:
    return request("Host: x", f"Authorization: {KEY}", f"Content-Length: {len(body)}", *more)


def connection(rules: Rules | None = None) -> FastConnection:
    return FastConnection(rules or Rules(), max_field=8190, body_timeout=1.0)


def test_a_plain_request_is_served_and_the_connection_waits_for_the_next() -> None:
    conn = connection()
    assert conn.received(plain("X-Request-Id:  abc ", "content-type: application/json")) is (
        Step.SERVE
    )
    served = conn.request
    assert served is not None and conn.state is State.ANSWERING and conn.busy
    assert served.body == BODY and served.who == "client" and not served.close
    assert served.headers["x-request-id"] == "abc"  # as aiohttp reads it: blanks stripped
    assert served.mime == "application/json"
    assert conn.answered() is Step.WAIT
    assert conn.state is State.HEAD and not conn.busy
    assert conn.received(plain()) is Step.SERVE  # the next, on the same parser


def test_a_request_read_byte_by_byte_is_served_at_its_last_byte() -> None:
    conn, raw = connection(), plain()
    steps = [conn.received(raw[i : i + 1]) for i in range(len(raw))]
    assert steps[:-1] == [Step.WAIT] * (len(raw) - 1) and steps[-1] is Step.SERVE
    assert conn.request is not None and conn.request.body == BODY


def test_a_compressed_body_is_decoded_as_it_comes() -> None:
    body = gzip.compress(BODY * 100)
    conn = connection()
    raw = request("Host: x", f"Authorization: {KEY}", "Content-Encoding: gzip",
                  f"Content-Length: {len(body)}", body=body)  # fmt: skip
    assert conn.received(raw) is Step.SERVE
    assert conn.request is not None and conn.request.body == BODY * 100


NOT_TAKEN = {
    "another method": request(line="GET /v1/responses HTTP/1.1"),
    "a query": request(line="POST /v1/responses?x=1 HTTP/1.1"),
    "another route": request(line="POST /v1/responses/compact HTTP/1.1"),
    "HTTP/1.0": request(line="POST /v1/responses HTTP/1.0"),
    "no Host": request(f"Authorization: {KEY}", f"Content-Length: {len(BODY)}"),
    "two Hosts": plain("Host: y"),
    "a singleton twice": plain("User-Agent: a", "User-Agent: b"),
    "a field read twice": plain("X-Request-Id: a", "x-request-id: b"),
    "chunked": request("Host: x", "Transfer-Encoding: chunked", body=b"0\r\n\r\n"),
    "no length": request("Host: x", f"Authorization: {KEY}", body=b""),
    "Expect": plain("Expect: 100-continue"),
    "Upgrade": plain("Upgrade: websocket", "Connection: upgrade"),
    "another Connection token": plain("Connection: foo"),
    "a quoted media type": plain('Content-Type: application/json; charset="utf-8"'),
    "a list of media types": plain("Content-Type: application/json, text/plain"),
    "an empty media type": plain("Content-Type: "),
    "a field as long as aiohttp's limit": plain("X-A: " + "a" * 8190),
    "too many fields": plain(*(f"X-{i}: 1" for i in range(MAX_FIELDS))),
    "llhttp refuses it": plain("X A: 1"),
    "a bare LF": plain().replace(b"Host: x\r\n", b"Host: x\n"),
}


@pytest.mark.parametrize("name", sorted(NOT_TAKEN))
def test_anything_else_is_handed_to_aiohttp_with_every_read(name: str) -> None:
    raw = NOT_TAKEN[name]
    conn = connection()
    cut = len(raw) // 2
    steps = [conn.received(raw[:cut]), conn.received(raw[cut:])]
    assert Step.HAND_OVER in steps and not conn.busy
    assert b"".join(conn.handed) == raw[: len(b"".join(conn.handed))]
    assert conn.handed[0] == raw[:cut]  # read by read, as aiohttp would have had them
    assert conn.state is State.HANDED_OVER
    assert conn.received(b"more") is Step.WAIT  # not its bytes any more


FOLLOWED = {
    "a second request": plain() + plain(),
    "garbage": plain() + b"xyz\r\n\r\n",
    "a request after Connection: close": plain("Connection: close") + plain(),
    "a body longer than its length": plain()[:-2] .replace(
        b"Content-Length: 26", b"Content-Length: 20") + b'"}',
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(FOLLOWED))
def test_a_request_followed_by_more_in_the_same_read_is_aiohttps(name: str) -> None:
    conn = connection()
    assert conn.received(FOLLOWED[name]) is Step.HAND_OVER
    assert conn.handed == [FOLLOWED[name]]


def test_the_end_of_a_body_and_another_request_in_one_read_hand_over_both_reads() -> None:
    conn, raw = connection(), plain()
    assert conn.received(raw[:-5]) is Step.WAIT and conn.state is State.BODY and conn.busy
    assert conn.received(raw[-5:] + plain()) is Step.HAND_OVER
    assert conn.handed == [raw[:-5], raw[-5:] + plain()] and not conn.busy


def test_what_comes_while_answering_waits_for_the_answer() -> None:
    conn = connection()
    assert conn.received(plain()) is Step.SERVE
    assert conn.received(plain()[:10]) is Step.WAIT
    assert conn.received(plain()[10:]) is Step.WAIT  # a whole request, held
    assert conn.held == len(plain())
    assert conn.answered() is Step.SERVE  # served once the first answer ended


def test_a_broken_request_while_answering_is_handed_over_after_the_answer() -> None:
    conn = connection()
    assert conn.received(plain()) is Step.SERVE
    assert conn.received(b"nonsense\r\n\r\n") is Step.WAIT
    assert conn.answered() is Step.HAND_OVER and conn.handed == [b"nonsense\r\n\r\n"]


@pytest.mark.parametrize("after", [b"", plain()], ids=["nothing after", "a request after"])
def test_connection_close_closes_after_the_answer(after: bytes) -> None:
    conn = connection()
    assert conn.received(plain("Connection: keep-alive, close")) is Step.SERVE
    assert conn.request is not None and conn.request.close
    if after:
        assert conn.received(after) is Step.WAIT  # llhttp: data after close
    assert conn.answered() is Step.CLOSE and conn.state is State.CLOSED


def test_a_keyless_request_is_refused_from_its_head_and_its_body_dropped() -> None:
    body = b"x" * 1000
    raw = request("Host: x", f"Content-Length: {len(body)}", body=body)
    head = raw[: -len(body)]
    rules = Rules()
    conn = connection(rules)
    assert conn.received(head) is Step.REFUSE and not rules.admitted
    assert conn.request is not None and conn.request.error is not None
    assert conn.request.error.status == 401
    assert conn.request.error.headers == {"Connection": "close"}
    assert conn.answered() is Step.WAIT and conn.state is State.DISCARDING
    assert not conn.busy  # the door may close it, as it does a lingering aiohttp connection
    assert conn.received(body[:500]) is Step.WAIT
    assert conn.held == len(head)  # nothing of the body is kept
    assert conn.received(body[500:]) is Step.CLOSE  # dropped to its end, then the close


def test_a_refusal_with_the_body_already_read_closes_at_once() -> None:
    conn = connection()
    assert conn.received(request("Host: x", f"Content-Length: {len(BODY)}")) is Step.REFUSE
    assert conn.answered() is Step.CLOSE


def test_a_body_decoding_past_its_limit_is_refused_as_it_comes() -> None:
    body = gzip.compress(b" " * 100_000)
    raw = request("Host: x", f"Authorization: {KEY}", "Content-Encoding: gzip",
                  f"Content-Length: {len(body)}", body=body)  # fmt: skip
    conn = connection(Rules(max_decoded=50_000))
    assert conn.received(raw) is Step.REFUSE
    error = conn.request.error if conn.request is not None else None
    assert isinstance(error, RequestError) and error.status == 413
    assert "once decoded" in error.message


def test_a_late_body_is_a_408_then_the_close() -> None:
    conn = connection()
    assert conn.received(plain()[:-3]) is Step.WAIT and conn.state is State.BODY
    assert conn.expired() is Step.REFUSE
    assert conn.request is not None and conn.request.error is not None
    assert conn.request.error.status == 408
    assert conn.answered() is Step.CLOSE


def test_a_refused_body_that_never_ends_is_given_up() -> None:
    conn = connection()
    assert conn.received(request("Host: x", "Content-Length: 1000", body=b"x")) is Step.REFUSE
    assert conn.answered() is Step.WAIT
    assert conn.expired() is Step.CLOSE


def test_a_head_that_never_ends_is_aiohttps_past_the_limit() -> None:
    conn = connection()
    assert conn.received(b"POST /v1/responses HTTP/1.1\r\n") is Step.WAIT
    assert conn.received(b"X-A: " + b"a" * MAX_HEAD) is Step.HAND_OVER


def test_a_background_turn_is_given_back_with_its_reads() -> None:
    conn = connection()
    raw = plain()
    assert conn.received(raw) is Step.SERVE
    assert conn.hand_over() == [raw] and conn.state is State.HANDED_OVER and not conn.busy


@pytest.mark.parametrize(
    "value, mime",
    [
        (None, "application/octet-stream"),
        ("application/json", "application/json"),
        ("Application/JSON; charset=utf-8", "application/json"),
        ("application/vnd.x+json", "application/vnd.x+json"),
        ("text/plain", "text/plain"),  # taken: the endpoint's 415, as aiohttp's handler's
        ("", None),
        ("json", None),
        ("application/json;", None),
        ('application/json; charset="utf-8"', None),
        ("application/json, text/plain", None),
    ],
)
def test_media_types_spelt_plainly(value: str | None, mime: str | None) -> None:
    assert media(value) == mime


def test_header_bytes_are_read_as_aiohttp_reads_them() -> None:
    """Bytes that are not UTF-8 (obs-text, which llhttp takes): decoded with
    `surrogateescape`, as aiohttp decodes them; a DEL is llhttp's refusal, so aiohttp's."""
    conn = connection()
    assert conn.received(plain("X-Request-Id: caf\xe9 \t")) is Step.SERVE
    assert conn.request is not None and conn.request.headers["x-request-id"] == "caf\udce9"
    assert connection().received(plain("X-A: a\x7fb")) is Step.HAND_OVER
