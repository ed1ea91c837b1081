"""The SSE decoder on long lines: linear work (counted copies), and its fast path checked
against the general line parser on the same bytes, however they are split."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamer.core.sse import SSEDecoder, SSEError, SSEMessage, message

MiB = 1 << 20


def named(items: list[bytes]) -> list[SSEMessage]:
    """The payloads with their names, as text (a NamedPayload equals its bytes alone)."""
    return list(map(message, items))


def fast(chunks: list[bytes]) -> list[SSEMessage]:
    """What the upstream sees: `payloads` (the regex fast path where it applies)."""
    decoder = SSEDecoder()
    out: list[bytes] = []
    for chunk in chunks:
        out += decoder.payloads(chunk)
    return named(out + decoder.close())


def general(chunks: list[bytes]) -> list[SSEMessage]:
    """The line parser alone, every chunk through it (the `sse` switch's reference)."""
    decoder = SSEDecoder(fast=False)
    out: list[bytes] = []
    for chunk in chunks:
        out += decoder.payloads(chunk)
    return named(out + decoder.close())


@pytest.mark.parametrize("before", [b"", b"data: {}\n\n", b"event: x\n", b"data: a\n", b": c\n"])
def test_a_long_line_costs_linear_work(before: bytes) -> None:
    """16 MiB of one line in 32 KiB reads: each pending byte copied at most twice (the base
    copied the whole pending line on every read: ~4 GiB for this line)."""
    decoder = SSEDecoder(max_size=16 * MiB)
    decoder.payloads(before + b"data: ")
    fed = 0
    block = b"x" * 32768
    with pytest.raises(SSEError, match="exceeded"):
        while fed < 32 * MiB:
            decoder.payloads(block)
            fed += len(block)
    assert fed <= 16 * MiB + len(block)
    assert decoder.copied <= 2 * fed, decoder.copied


def test_a_long_line_that_ends_is_copied_once() -> None:
    decoder = SSEDecoder()
    payload = b"y" * (4 * MiB)
    out = decoder.payloads(b"data: ")
    for i in range(0, len(payload), 65536):
        out += decoder.payloads(payload[i : i + 65536])
    out += decoder.payloads(b"\n\ndata: next\n\n")
    assert out == [payload, b"next"]
    assert decoder.copied <= 2 * len(payload)


payload_text = st.text(
    st.characters(exclude_categories=("Cs",), exclude_characters="\r\n"), max_size=300
)
frames = st.lists(
    st.one_of(
        payload_text.map(lambda t: b"data: " + t.encode() + b"\n\n"),  # the fast path's shape
        payload_text.map(lambda t: b"data:" + t.encode() + b"\n\n"),
        payload_text.map(lambda t: b"event: e\ndata: " + t.encode() + b"\n\n"),
        payload_text.map(lambda t: b": " + t.encode() + b"\n"),
        payload_text.map(lambda t: b"data: " + t.encode() + b"\r\n\r\n"),
        st.just(b"data: a\ndata: b\n\n"),
        st.just(b"\n"),
    ),
    max_size=12,
)


@settings(max_examples=400, deadline=None)
@given(st.booleans(), frames, st.data())
def test_fast_path_matches_the_line_parser(
    bom: bool, parts: list[bytes], data: st.DataObject
) -> None:
    stream = (b"\xef\xbb\xbf" if bom else b"") + b"".join(parts)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=16)))
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    expected = general([stream])
    assert fast([stream]) == expected
    assert fast(chunks) == expected
    assert general(chunks) == expected
