"""The SSE codec: decoding under any chunking, the framing rules, and the encoder."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamer.core.events import Event
from streamer.core.sse import SSEDecoder, SSEError, SSEMessage, encode, encode_many, message


def decode_all(chunks: list[bytes], *, close: bool = False) -> list[SSEMessage]:
    decoder = SSEDecoder()
    out: list[SSEMessage] = []
    for chunk in chunks:
        out.extend(decoder.feed(chunk))
    if close:
        out.extend(map(message, decoder.close()))
    return out


def bytewise(stream: bytes) -> list[bytes]:
    return [stream[i : i + 1] for i in range(len(stream))]


def test_data_lines_and_event_names() -> None:
    stream = b'data: {"a":1}\n\nevent: ping\ndata: x\n\ndata: y\n\n'
    assert decode_all([stream]) == [
        SSEMessage(None, '{"a":1}'),
        SSEMessage("ping", "x"),
        SSEMessage(None, "y"),  # the event name does not leak into the next event
    ]


def test_multiline_data_is_joined_with_newlines() -> None:
    assert decode_all([b"data: one\ndata:two\ndata:  three\n\n"]) == [
        SSEMessage(None, "one\ntwo\n three")
    ]


def test_comments_id_retry_and_unknown_fields_are_ignored() -> None:
    stream = b": keep-alive\nid: 7\nretry: 1000\nfoo: bar\ndata: kept\n\n:\n\n"
    assert decode_all([stream]) == [SSEMessage(None, "kept")]


def test_event_without_data_is_not_dispatched() -> None:
    assert decode_all([b"event: ping\n\n\n\nid: 3\n\n"]) == []


def test_empty_data_line_is_an_event_with_empty_data() -> None:
    assert decode_all([b"data:\n\ndata\n\n"]) == [SSEMessage(None, ""), SSEMessage(None, "")]


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"])
def test_every_line_ending(eol: bytes) -> None:
    stream = eol.join([b"event: e", b"data: a", b"data: b", b"", b"data: c", b"", b""])
    expected = [SSEMessage("e", "a\nb"), SSEMessage(None, "c")]
    assert decode_all([stream]) == expected
    assert decode_all(bytewise(stream)) == expected


def test_crlf_split_between_chunks_is_one_line_end() -> None:
    assert decode_all([b"data: a\r", b"\n\r", b"\ndata: b\r", b"\r"]) == [
        SSEMessage(None, "a"),
        SSEMessage(None, "b"),
    ]


def test_mixed_line_endings() -> None:
    assert decode_all([b"data: a\r\n\rdata: b\n\r\ndata: c\r\r"]) == [
        SSEMessage(None, "a"),
        SSEMessage(None, "b"),
        SSEMessage(None, "c"),
    ]


def test_utf8_split_inside_a_sequence() -> None:
    text = "héllo — 世界 🚀"
    stream = b"data: " + text.encode() + b"\n\n"
    assert decode_all(bytewise(stream)) == [SSEMessage(None, text)]


def test_leading_bom_is_stripped_even_when_split() -> None:
    stream = b"\xef\xbb\xbfdata: x\n\n"
    assert decode_all([stream]) == [SSEMessage(None, "x")]
    assert decode_all(bytewise(stream)) == [SSEMessage(None, "x")]


def test_invalid_utf8_is_replaced_not_raised() -> None:
    assert decode_all([b"data: a\xffb\n\n"]) == [SSEMessage(None, "a\ufffdb")]


def test_unterminated_event_waits_for_its_blank_line() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\n") == []
    assert decoder.feed(b"data: b") == []
    assert decoder.feed(b"\n\n") == [SSEMessage(None, "a\nb")]


def test_close_dispatches_an_unterminated_last_event() -> None:
    assert decode_all([b"data: a\n\ndata: last"], close=True) == [
        SSEMessage(None, "a"),
        SSEMessage(None, "last"),
    ]
    assert decode_all([b"data: a\n\n: trailing comment"], close=True) == [SSEMessage(None, "a")]


def test_oversized_line_and_event_raise() -> None:
    decoder = SSEDecoder(max_size=64)
    with pytest.raises(SSEError):
        decoder.feed(b"data: " + b"x" * 100)
    decoder = SSEDecoder(max_size=64)
    with pytest.raises(SSEError):
        decoder.feed(b"data: " + b"y" * 40 + b"\n" + b"data: " + b"y" * 40 + b"\n")


def test_encode_and_encode_many() -> None:
    a = Event("response.created", b'{"type":"response.created","sequence_number":0}')
    b = Event("response.output_text.delta", b'{"type":"response.output_text.delta","delta":"hi"}')
    assert (
        encode(a)
        == b'event: response.created\ndata: {"type":"response.created","sequence_number":0}\n\n'
    )
    assert encode_many([a, b]) == encode(a) + encode(b)
    assert encode_many([]) == b""
    assert decode_all([encode_many([a, b])]) == [
        SSEMessage(a.type, a.data.decode()),
        SSEMessage(b.type, b.data.decode()),
    ]


# ---------------------------------------------------------------- property: chunking never matters

line_text = st.text(
    st.characters(exclude_categories=("Cs",), exclude_characters="\r\n"), max_size=30
)
messages = st.lists(
    st.tuples(
        st.none()
        | st.text(st.characters(min_codepoint=33, max_codepoint=0x2FFF), min_size=1, max_size=12),
        st.lists(line_text, min_size=1, max_size=4),
    ),
    max_size=8,
)


@st.composite
def streams(draw: st.DrawFn) -> tuple[bytes, list[SSEMessage]]:
    eol = draw(st.sampled_from([b"\n", b"\r\n", b"\r"]))
    lines: list[bytes] = []
    expected: list[SSEMessage] = []
    for event, data_lines in draw(messages):
        if draw(st.booleans()):
            lines.append(b": comment " + draw(line_text).encode())
        if draw(st.booleans()):
            lines.append(b"id: 42")
        if event is not None:
            lines.append(b"event: " + event.encode())
        for value in data_lines:
            # "data:value" is only unambiguous when the value does not start with a space
            spaced = draw(st.booleans()) or value.startswith(" ")
            lines.append((b"data: " if spaced else b"data:") + value.encode())
        lines.append(b"")
        expected.append(SSEMessage(event, "\n".join(data_lines)))
    stream = b"".join(line + eol for line in lines)
    return stream, expected


@settings(max_examples=300, deadline=None)
@given(streams(), st.data())
def test_any_split_gives_the_same_messages(
    case: tuple[bytes, list[SSEMessage]], data: st.DataObject
) -> None:
    stream, expected = case
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=12)))
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    assert decode_all([stream]) == expected
    assert decode_all(chunks) == expected


@settings(max_examples=100, deadline=None)
@given(st.lists(st.dictionaries(st.text(max_size=8), st.text(max_size=20), max_size=4), max_size=6))
def test_encoded_events_decode_back(payloads: list[dict[str, str]]) -> None:
    events = [Event(f"response.test.{i}", orjson.dumps(p)) for i, p in enumerate(payloads)]
    decoded = decode_all(bytewise(encode_many(events)))
    assert [(m.event, orjson.loads(m.data)) for m in decoded] == [
        (e.type, orjson.loads(e.data)) for e in events
    ]
