"""`ChatDecoder`, the sans-I/O Chat Completions stream decoder: plain bytes in, deltas out,
at every split point of a stream and for every way its body can end."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from streamer.core.deltas import (
    Delta,
    Finish,
    TextDelta,
    ToolCallDelta,
    UpstreamError,
    Usage,
    expand,
)
from streamer.upstream.chat.stream import MAX_BATCH, ChatDecoder, EndCause


def event(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return {"id": "c1", "object": "chat.completion.chunk", "choices": [choice], **extra}


CALL = {"index": 0, "id": "call_1", "function": {"name": "f", "arguments": ""}}
BODY = b"".join(
    [
        b": a comment\n\n",
        event(chunk({"role": "assistant", "content": "h\u00e9"})),
        event(chunk({"content": "llo \u2603"})),
        b"event: message\ndata: " + orjson.dumps(chunk({"content": "!"})) + b"\r\n\r\n",
        event(chunk({"tool_calls": [CALL]})),
        event(chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"a":'}}]})),
        event(chunk({"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]})),
        event(chunk({}, "tool_calls")),
        event({"id": "c1", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}}),
        b"data: [DONE]\n\n",
    ]
)
WHOLE: list[Delta] = [
    TextDelta("h\u00e9"),
    TextDelta("llo \u2603"),
    TextDelta("!"),
    ToolCallDelta(0, "call_1", "f", ""),
    ToolCallDelta(0, None, None, '{"a":'),
    ToolCallDelta(0, None, None, "1}"),
    Finish("tool_calls"),
    Usage(3, 4),
]


def fed(decoder: ChatDecoder, data: bytes) -> list[Delta]:
    """One read's deltas, every batch of them."""
    out = decoder.feed(data)
    while decoder.pending:
        out += decoder.take()
    return out


def run(decoder: ChatDecoder, reads: list[bytes], cause: EndCause = EndCause.CLEAN) -> list[Delta]:
    """What a shell does: feed each read, take what waits, then end."""
    out: list[Delta] = []
    for data in reads:
        out += decoder.feed(data)
        while decoder.pending:
            out += decoder.take()
    return out + decoder.end(cause)


def test_the_whole_stream_in_one_read() -> None:
    decoder = ChatDecoder()
    assert run(decoder, [BODY]) == WHOLE
    assert decoder.done and decoder.ended and not decoder.failed


@pytest.mark.parametrize("at", range(len(BODY) + 1))
def test_every_split_point_decodes_the_same(at: int) -> None:
    assert run(ChatDecoder(), [BODY[:at], BODY[at:]]) == WHOLE


def test_every_pair_of_split_points_decodes_the_same() -> None:
    for a in range(0, len(BODY), 7):
        for b in range(a, len(BODY), 11):
            assert run(ChatDecoder(), [BODY[:a], BODY[a:b], BODY[b:]]) == WHOLE


def test_one_byte_per_read() -> None:
    assert run(ChatDecoder(), [BODY[i : i + 1] for i in range(len(BODY))]) == WHOLE


CUT = BODY[: BODY.index(b"data: [DONE]")]
UNFINISHED = BODY[: BODY.index(event(chunk({}, "tool_calls")))]
CAUSES = {
    EndCause.CLEAN: ("server_error", "The backend closed the stream before it finished."),
    EndCause.EOF: ("server_error", "The backend closed the stream before it finished."),
    EndCause.RESET: ("server_error", "The backend closed the stream before it finished."),
    EndCause.TIMEOUT: ("upstream_timeout", "The backend sent nothing for 7 s."),
    EndCause.INVALID: ("upstream_error", "The backend sent an invalid HTTP answer: why."),
    EndCause.UNDECODABLE: ("invalid_upstream_encoding", "The backend's answer broke off: why."),
}


@pytest.mark.parametrize("cause", list(EndCause))
def test_an_unfinished_stream_ends_in_the_error_of_its_cause(cause: EndCause) -> None:
    decoder = ChatDecoder(idle_timeout=7)
    out = [*fed(decoder, UNFINISHED), *decoder.end(cause, "why")]
    assert out == [*WHOLE[:6], UpstreamError(*CAUSES[cause])]
    assert decoder.ended and decoder.failed and decoder.broken
    assert decoder.end(cause) == []  # ended once


@pytest.mark.parametrize("cause", list(EndCause))
def test_a_finished_stream_without_done_ends_cleanly_whatever_the_cause(cause: EndCause) -> None:
    decoder = ChatDecoder()
    assert [*fed(decoder, CUT), *decoder.end(cause, "why")] == WHOLE
    assert decoder.ended and not decoder.failed


@pytest.mark.parametrize("cause", list(EndCause))
def test_after_done_any_end_adds_nothing(cause: EndCause) -> None:
    decoder = ChatDecoder()
    assert fed(decoder, BODY) == WHOLE and decoder.ended
    assert decoder.end(cause) == [] and not decoder.failed


def test_an_unterminated_last_event_counts_at_a_clean_end_only() -> None:
    last = b"data: " + orjson.dumps(chunk({"content": "end"}, "stop"))  # no blank line
    clean = ChatDecoder()
    assert [*clean.feed(last), *clean.end(EndCause.CLEAN)] == [TextDelta("end"), Finish("stop")]
    reset = ChatDecoder()
    assert [*reset.feed(last), *reset.end(EndCause.RESET)] == [
        UpstreamError(*CAUSES[EndCause.RESET])
    ]


def test_batches_are_the_first_few_events_then_up_to_max_batch() -> None:
    body = b"".join(event(chunk({"content": str(i)})) for i in range(600))
    decoder = ChatDecoder()
    sizes = [len(expand(decoder.feed(body)))]  # pieces, not runs: one per event
    while decoder.pending:
        sizes.append(len(expand(decoder.take())))
    assert sizes == [4, MAX_BATCH, MAX_BATCH, 600 - 4 - 2 * MAX_BATCH]
    assert decoder.take() == []


def test_an_error_payload_ends_the_stream_and_drops_what_waits() -> None:
    body = event(chunk({"content": "a"})) + event({"error": {"message": "boom"}})
    body += event(chunk({"content": "never"}))
    decoder = ChatDecoder()
    assert run(decoder, [body]) == [TextDelta("a"), UpstreamError("server_error", "boom")]
    assert decoder.failed and not decoder.broken and not decoder.pending


def test_broken_framing_is_an_error() -> None:
    decoder = ChatDecoder()
    decoder._sse.max_size = 10
    out = decoder.feed(b"data: " + b"x" * 20)
    assert len(out) == 1 and isinstance(out[0], UpstreamError)
    assert out[0].code == "invalid_upstream_chunk" and decoder.broken
    assert decoder.feed(BODY) == []


def test_shapes_are_learnt_from_the_second_chunk_of_a_kind() -> None:
    """A one-token answer and a call in one fragment learn nothing (the lesson costs more
    than it saves); the second text chunk and the second fragment teach their shapes."""
    from streamer.upstream.chat.chunk_shapes import NO_SHAPE
    from streamer.upstream.chat.decoder import ChatChunkDecoder

    def text(piece: str) -> bytes:
        return orjson.dumps({"id": "c", "choices": [{"index": 0, "delta": {"content": piece}}]})

    def fragment(piece: str) -> bytes:
        call = {"index": 0, "function": {"arguments": piece}}
        return orjson.dumps({"id": "c", "choices": [{"index": 0, "delta": {"tool_calls": [call]}}]})

    decoder = ChatChunkDecoder()
    assert decoder.decode([text("one")]) == [TextDelta("one")]
    assert decoder._text is NO_SHAPE
    assert decoder.decode([text("two"), text("three")]) == [TextDelta("two"), TextDelta("three")]
    assert decoder._text is not NO_SHAPE
    assert decoder.decode([fragment('{"a"')]) == [ToolCallDelta(0, None, None, '{"a"')]
    assert decoder._args is NO_SHAPE
    assert decoder.decode([fragment(":1}")]) == [ToolCallDelta(0, None, None, ":1}")]
    assert decoder._args is not NO_SHAPE


def test_a_short_read_is_decoded_whole_and_a_long_one_starts_small() -> None:
    """Up to WHOLE_READ events in a read leave in one batch (one write to the client); a
    longer read still gives its first FIRST_BATCH events at once (the first text)."""
    from streamer.upstream.chat.stream import FIRST_BATCH, WHOLE_READ

    def read(n: int) -> bytes:
        chunk = {"id": "c", "choices": [{"index": 0, "delta": {"content": "t"}}]}
        return b"".join(b"data: " + orjson.dumps(chunk) + b"\n\n" for _ in range(n))

    short = ChatDecoder(300)
    assert len(expand(short.feed(read(WHOLE_READ)))) == WHOLE_READ
    assert not short.pending
    long = ChatDecoder(300)
    assert len(expand(long.feed(read(WHOLE_READ + 1)))) == FIRST_BATCH
    assert long.pending
