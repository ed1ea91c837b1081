"""The HTTP/1.1 response cycle (`http1_parser.ResponseParser`) and the chunked decoder on
plain bytes: framing, the keep-alive decision, what is refused, and the bulk de-chunking
path against the per-chunk loop."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamer.upstream.http1.parser import (
    BODY,
    BROKEN,
    DONE,
    END,
    HEAD,
    IDLE,
    MAX_INFORMATIONAL,
    Event,
    Head,
    ResponseParser,
)
from streamer.upstream.http1.wire import ChunkedDecoder, ProtocolError, ServerDisconnected


def chunked(*pieces: bytes, last: bytes = b"0\r\n\r\n") -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + last


def head(status: str = "200 OK", *headers: str) -> bytes:
    return ("\r\n".join([f"HTTP/1.1 {status}", *headers]) + "\r\n\r\n").encode()


def run(parts: list[bytes], *, no_body: bool = False) -> tuple[Head, bytes, bool, ResponseParser]:
    """Feed `parts` for one request: the head, the body, whether END came, the parser."""
    parser = ResponseParser()
    parser.start(no_body=no_body)
    events: list[Event] = []
    for part in parts:
        events += parser.feed(part)
    heads = [e for e in events if isinstance(e, Head)]
    assert len(heads) == 1, events
    assert events[0] is heads[0]
    ends = [i for i, e in enumerate(events) if e is END]
    assert len(ends) <= 1 and (not ends or ends[0] == len(events) - 1), events
    body = b"".join(e for e in events if isinstance(e, bytes))
    assert all(e for e in events if isinstance(e, bytes)), "no empty data events"
    return heads[0], body, bool(ends), parser


def splits(wire: bytes) -> list[list[bytes]]:
    """The wire whole, in two at every position, and byte by byte."""
    out = [[wire], [wire[i : i + 1] for i in range(len(wire))]]
    out += [[wire[:cut], wire[cut:]] for cut in range(1, len(wire))]
    return out


SSE = [b'data: {"choices":[{"delta":{"content":"tok%d"}}]}\n\n' % i for i in range(5)]
CHUNKED_WIRE = (
    head("100 Continue")
    + head("103 Early Hints", "Link: </x>")
    + head("200 OK", "Content-Type: text/event-stream", "Transfer-Encoding: chunked")
    + chunked(*SSE, b"a\r\nb")
)
LENGTH_WIRE = head("200 OK", "Content-Length: 11") + b"hello world"


@pytest.mark.parametrize("wire", [CHUNKED_WIRE, LENGTH_WIRE], ids=["chunked", "length"])
def test_split_at_every_byte_boundary(wire: bytes) -> None:
    want = b"".join(SSE) + b"a\r\nb" if wire is CHUNKED_WIRE else b"hello world"
    for parts in splits(wire):
        got, body, ended, parser = run(parts)
        assert (got.status, body, ended) == (200, want, True), parts
        assert parser.state == DONE and parser.keep_alive and parser.reusable
        assert parser.informational == (2 if wire is CHUNKED_WIRE else 0)


def test_the_cycle_repeats_on_a_kept_connection() -> None:
    parser = ResponseParser()
    assert parser.state == IDLE and parser.reusable
    for _ in range(3):
        parser.start()
        assert parser.state == HEAD and not parser.reusable
        events = parser.feed(LENGTH_WIRE[:20])
        assert parser.state == HEAD and events == []
        events = parser.feed(LENGTH_WIRE[20:])
        assert isinstance(events[0], Head) and events[1:] == [b"hello world", END]
        assert parser.ended and parser.reusable


@pytest.mark.parametrize("wire", [CHUNKED_WIRE, LENGTH_WIRE], ids=["chunked", "length"])
@pytest.mark.parametrize(
    "garbage", [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nno", b"\r\n", b"x"]
)
def test_bytes_after_the_end_make_the_connection_unusable(wire: bytes, garbage: bytes) -> None:
    # pipelined with the response (same read), or arriving later while it sits idle
    for parts in ([wire + garbage], [wire, garbage], [wire[:-1], wire[-1:] + garbage]):
        got, _, ended, parser = run(parts)
        assert got.status == 200 and ended and parser.ended  # the response itself stands
        assert not parser.keep_alive and not parser.reusable
        with pytest.raises(RuntimeError):
            parser.start()


def test_bytes_with_no_request_outstanding_make_the_connection_unusable() -> None:
    parser = ResponseParser()
    assert parser.feed(b"") == [] and parser.reusable
    assert parser.feed(b"HTTP/1.1 200 OK\r\n") == []
    assert not parser.reusable
    with pytest.raises(RuntimeError):
        parser.start()


def test_body_until_the_close() -> None:
    wire = head("200 OK", "Content-Type: text/event-stream") + b"data: all of it\n\n"
    for parts in splits(wire):
        _, body, ended, parser = run(parts)
        assert parser.state == BODY and not ended and not parser.keep_alive
        assert parser.eof() == [END] and parser.ended and not parser.reusable
        assert body == b"data: all of it\n\n"
    _, _, _, parser = run([wire])
    with pytest.raises(ServerDisconnected, match="middle"):
        parser.eof(clean=False)  # a reset is not the end of the body


@pytest.mark.parametrize(
    ("wire", "where"),
    [
        (b"", "before answering"),
        (b"HTTP/1.1 200 OK\r\nContent-", "in the middle"),
        (head("100 Continue"), "in the middle"),
        (LENGTH_WIRE[:-3], "in the middle"),
        (CHUNKED_WIRE[:-5], "in the middle"),
    ],
)
def test_close_mid_response_is_server_disconnected(wire: bytes, where: str) -> None:
    parser = ResponseParser()
    parser.start()
    parser.feed(wire)
    with pytest.raises(ServerDisconnected, match=where):
        parser.eof()
    assert parser.state == BROKEN and isinstance(parser.error, ServerDisconnected)


@pytest.mark.parametrize("status", ["204 No Content", "304 Not Modified"])
def test_no_body_statuses(status: str) -> None:
    wire = head(status, "Content-Length: 9", "Transfer-Encoding: gzip")
    _, body, ended, parser = run([wire])
    assert (body, ended, parser.reusable) == (b"", True, True)
    _, _, _, parser = run([wire + b"123456789"])
    assert not parser.keep_alive  # what looked like a body is bytes out of turn


def test_response_to_a_head_request_has_no_body() -> None:
    wire = head("200 OK", "Content-Length: 5")
    _, body, ended, parser = run([wire], no_body=True)
    assert (body, ended, parser.reusable) == (b"", True, True)
    _, _, _, parser = run([wire + b"hello"], no_body=True)
    assert not parser.keep_alive


@pytest.mark.parametrize(
    ("headers", "keep"),
    [
        (("Content-Length: 0",), True),
        (("Content-Length: 0", "Connection: close"), False),
        (("Content-Length: 0", "Connection: Keep-Alive, Close"), False),
        (("Transfer-Encoding: chunked", "Content-Length: 5"), False),  # both framings
    ],
)
def test_keep_alive_decision(headers: tuple[str, ...], keep: bool) -> None:
    wire = head("200 OK", *headers)
    if "Transfer-Encoding: chunked" in headers:
        wire += b"0\r\n\r\n"
    _, _, ended, parser = run([wire])
    assert ended and parser.keep_alive is keep


def test_http10_keeps_only_when_asked() -> None:
    for extra, keep in ((b"", False), (b"Connection: keep-alive\r\n", True)):
        wire = b"HTTP/1.0 200 OK\r\n" + extra + b"Content-Length: 2\r\n\r\nok"
        _, body, ended, parser = run([wire])
        assert (body, ended, parser.keep_alive) == (b"ok", True, keep)


@pytest.mark.parametrize("code", [b"600", b"999", b"000", b"099", b"20x", b"2000", b"-20"])
def test_status_outside_100_to_599_is_refused(code: bytes) -> None:
    parser = ResponseParser()
    parser.start()
    with pytest.raises(ProtocolError):
        parser.feed(b"HTTP/1.1 " + code + b" Odd\r\nContent-Length: 0\r\n\r\n")
    assert parser.state == BROKEN and not parser.reusable
    with pytest.raises(ProtocolError):  # and stays refused
        parser.feed(b"HTTP/1.1 200 OK\r\n\r\n")


def test_informational_heads_are_skipped_a_few_at_most() -> None:
    few = b"".join(head(s) for s in ("100 Continue", "102 Processing", "199 Whatever"))
    got, body, _, parser = run([few + LENGTH_WIRE])
    assert (got.status, body, parser.informational) == (200, b"hello world", 3)
    parser = ResponseParser()
    parser.start()
    with pytest.raises(ProtocolError, match="informational"):
        for _ in range(MAX_INFORMATIONAL + 1):
            parser.feed(head("100 Continue"))
    parser = ResponseParser()
    parser.start()
    with pytest.raises(ProtocolError, match="101"):
        parser.feed(head("101 Switching Protocols", "Upgrade: h2c"))


@pytest.mark.parametrize(
    ("coding", "named"),
    [
        ("gzip, chunked", "gzip"),
        ("chunked, gzip", "gzip"),
        ("gzip", "gzip"),
        ("identity", "identity"),
        ("chunked, chunked", None),
    ],
)
def test_only_chunked_alone_is_decoded(coding: str, named: str | None) -> None:
    parser = ResponseParser()
    parser.start()
    match = f"transfer-coding {named}, which" if named else "bad transfer-encoding"
    with pytest.raises(ProtocolError) as info:
        parser.feed(head("200 OK", f"Transfer-Encoding: {coding}") + b"0\r\n\r\n")
    assert match in info.value.shown()  # the coding is named where the message is shown
    for ok in ("chunked", "Chunked", " chunked ,", "chunked\r\nTransfer-Encoding: "):
        _, body, ended, _ = run([head("200 OK", f"Transfer-Encoding: {ok}") + chunked(b"x")])
        assert (body, ended) == (b"x", True), ok


def test_an_error_after_the_head_in_the_same_bytes_comes_after_the_head() -> None:
    parser = ResponseParser()
    parser.start()
    wire = head("200 OK", "Transfer-Encoding: chunked") + b"5\r\nhelloXX"
    events = parser.feed(wire)
    assert len(events) == 1 and isinstance(events[0], Head)
    assert parser.state == BROKEN and isinstance(parser.error, ProtocolError)
    with pytest.raises(ProtocolError):
        parser.feed(b"more")


def test_head_limits() -> None:
    parser = ResponseParser()
    parser.start()
    with pytest.raises(ProtocolError, match="too large"):
        for _ in range(80):  # a head that never ends, 1 KiB at a time
            parser.feed(b"X-Long: " + b"a" * 1016 + b"\r\n")


# -- one chunk-size rule on every path ----------------------------------------------------


@pytest.mark.parametrize(
    "size", [b"0x5", b"+5", b" 5", b"5 ", b"0_5", b"5\t", b"", b"0000000000000005"]
)
@pytest.mark.parametrize("bulk", [True, False], ids=["bulk", "loop"])
def test_chunk_size_is_hex_digits_only(size: bytes, bulk: bool) -> None:
    wire = size + b"\r\nhello\r\n0\r\n\r\n"
    for parts in ([wire], [wire[:1], wire[1:]], [wire[i : i + 1] for i in range(len(wire))]):
        decoder = ChunkedDecoder(bulk=bulk)
        with pytest.raises(ProtocolError, match="chunk size"):
            for part in parts:
                decoder.feed(part)


@pytest.mark.parametrize("bulk", [True, False], ids=["bulk", "loop"])
def test_a_long_size_matching_a_large_chunk_is_refused(bulk: bool) -> None:
    # 16 digits with only 11 leading zeros: the value is the length of a 64 KiB chunk
    data = b"x" * 0x10000
    wire = b"0000000000010000\r\n" + data + b"\r\n" + chunked(b"y")
    with pytest.raises(ProtocolError, match="chunk size"):
        ChunkedDecoder(bulk=bulk).feed(wire)
    decoder = ChunkedDecoder(bulk=bulk)  # 15 digits is the most, and fine
    assert decoder.feed(wire[1:]) == data + b"y" and decoder.done


@pytest.mark.parametrize("size", [b"5", b"05", b"000000000000005", b"5;ext", b"5 ; a=b", b"5;"])
@pytest.mark.parametrize("bulk", [True, False], ids=["bulk", "loop"])
def test_chunk_sizes_that_are_fine(size: bytes, bulk: bool) -> None:
    decoder = ChunkedDecoder(bulk=bulk)
    assert decoder.feed(size + b"\r\nhello\r\n0\r\n\r\n") == b"hello" and decoder.done


# -- the bulk path against the per-chunk loop ----------------------------------------------

SIZES = st.sampled_from(
    ["%x", "%X", "0%x", "0x%x", "+%x", " %x", "%x ", "%x;e=1", "%x ;e", "1_%x", "0" * 15 + "%x"]
)
PIECE = st.tuples(SIZES, st.binary(max_size=24), st.booleans())


def wire_of(pieces: list[tuple[str, bytes, bool]], ending: bytes, tail: bytes) -> bytes:
    out = b""
    for size, data, crlf_inside in pieces:
        data = data + b"\r\n" if crlf_inside else data
        out += (size % len(data) if "%" in size else size).encode() + b"\r\n" + data + b"\r\n"
    return out + ending + tail


def outcome(wire: bytes, marks: list[int], bulk: bool) -> tuple[object, ...]:
    decoder = ChunkedDecoder(bulk=bulk)
    out = b""
    try:
        for a, b in itertools.pairwise(marks):
            out += decoder.feed(wire[a:b])
    except ProtocolError:
        return ("error", out)
    return (out, decoder.done, decoder.tail if decoder.done else b"")


@settings(max_examples=400, deadline=None)
@given(
    st.lists(PIECE, max_size=8),
    st.sampled_from([b"0\r\n\r\n", b"0\r\nX-T: 1\r\n\r\n", b"0;x\r\n\r\n", b"", b"0x0\r\n\r\n"]),
    st.sampled_from([b"", b"HTTP/1.1 200 OK\r\n\r\n", b"5\r\nhello\r\n", b"\r\n"]),
    st.lists(st.integers(min_value=0, max_value=400), max_size=6),
)
def test_bulk_path_matches_the_per_chunk_loop(
    pieces: list[tuple[str, bytes, bool]], ending: bytes, tail: bytes, cuts: list[int]
) -> None:
    wire = wire_of(pieces, ending, tail)
    marks = sorted({0, len(wire), *(c % (len(wire) + 1) for c in cuts)})
    fast, slow = outcome(wire, marks, True), outcome(wire, marks, False)
    if fast[0] == "error" or slow[0] == "error":
        # the same verdict; what was streamed before the fault may differ by batch
        assert fast[0] == slow[0] == "error", (wire, marks)
        return
    assert fast == slow, (wire, marks)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.lists(st.integers(min_value=0, max_value=200), max_size=4))
def test_bulk_path_matches_the_loop_on_any_bytes(wire: bytes, cuts: list[int]) -> None:
    marks = sorted({0, len(wire), *(c % (len(wire) + 1) for c in cuts)})
    fast, slow = outcome(wire, marks, True), outcome(wire, marks, False)
    assert (fast[0] == "error") == (slow[0] == "error"), (wire, marks)
    if fast[0] != "error":
        assert fast == slow, (wire, marks)


@pytest.mark.parametrize("length", [0xFFF, 0x1000, 70000])
@pytest.mark.parametrize("size", ["%x", "%X", "0%x"])
def test_bulk_path_past_the_size_table(length: int, size: str) -> None:
    """Sizes the bulk path looks up (lowercase, under 4 KiB) and ones it parses."""
    data = bytes(range(256)) * (length // 256) + b"x" * (length % 256)
    data = data.replace(b"\r\n", b"\r.")
    wire = (size % length).encode() + b"\r\n" + data + b"\r\n" + b"3\r\nabc\r\n0\r\n\r\n"
    for bulk in (True, False):
        decoder = ChunkedDecoder(bulk=bulk)
        assert decoder.feed(wire) == data + b"abc" and decoder.done
