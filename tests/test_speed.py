"""The speed switches (core/speed.py): every trick of the per-event pipeline against its plain
equivalent, all at once and stage by stage (differential).

A Chat Completions body, chunked as a backend sends it and cut into random reads, goes through
what the gateway runs per event (`ChunkedDecoder`, `ChatDecoder`, `OutputItemStreamer`,
`sse.encode_many`): with every switch on, every switch off (`--reference all`) and each stage
alone off, the bytes the client gets are the same, byte for byte.
"""

from __future__ import annotations

import itertools
from typing import Any
from unittest import mock

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from streamer.app import check_settings
from streamer.config import Settings
from streamer.core import speed, sse
from streamer.core.output import OutputItemStreamer
from streamer.core.output_items import OutputLimits
from streamer.core.response import new_response
from streamer.core.tools import ResponsesToolNames
from streamer.upstream.chat.stream import ChatDecoder, EndCause
from streamer.upstream.http1.wire import ChunkedDecoder

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "name": "search", "parameters": {"type": "object"}}
]
SETTINGS = ["", "all", *speed.STAGES]  # all on, all off, each stage alone off


def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return orjson.dumps({"id": "c1", "object": "chat.completion.chunk", "choices": [choice]})


CALL = {"index": 0, "id": "call_1", "function": {"name": "search", "arguments": ""}}
pieces = st.text(st.characters(codec="utf-8"), max_size=5)
payloads = st.one_of(
    pieces.map(lambda t: chunk({"content": t})),
    pieces.map(lambda t: chunk({"tool_calls": [{"index": 0, "function": {"arguments": t}}]})),
    st.just(chunk({"tool_calls": [CALL]})),
    st.just(chunk({"reasoning_content": "hm"})),
    st.just(b"{not json"),
)
events = st.one_of(
    payloads.map(lambda p: b"data: " + p + b"\n\n"),  # the fast framing's one shape
    payloads.map(lambda p: b"data:" + p + b"\r\n\r\n"),  # the line parser's
    payloads.map(lambda p: b"event: ping\ndata: " + p + b"\n\n"),  # named: read one by one
    st.just(b": keep-alive\n\n"),
    st.just(b"event: error\ndata: " + chunk({"content": "x"}) + b"\n\n"),  # a name that counts
)


def body_of(parts: list[bytes], size: int) -> bytes:
    """The SSE body as a chunked HTTP body, `size` bytes a chunk."""
    raw = b"".join(parts) + b"data: " + chunk({}, "stop") + b"\n\ndata: [DONE]\n\n"
    out = [
        b"%x\r\n%s\r\n" % (len(raw[i : i + size]), raw[i : i + size])
        for i in range(0, len(raw), size)
    ]
    return b"".join(out) + b"0\r\n\r\n"


def client_bytes(body: bytes, cuts: list[int], reference: str) -> bytes:
    """What the client is sent for `body` read in pieces cut at `cuts`, with `reference`'s
    stages on their plain equivalent."""
    counter = itertools.count()
    with speed.using(reference), mock.patch("streamer.core.output.time.time", return_value=1.0):
        response = new_response({"model": "m", "tools": TOOLS}, response_id="resp_1", created_at=1)
        streamer = OutputItemStreamer(
            ResponsesToolNames.convert(TOOLS),
            response,
            make_id=lambda prefix: f"{prefix}_{next(counter)}",
            limits=OutputLimits(max_chars=10_000, max_items=8),
        )
        chunked, decoder = ChunkedDecoder(), ChatDecoder()
        out = [sse.encode_many(streamer.start())]
        start = 0
        for cut in [*sorted(cuts), len(body)]:
            deltas = decoder.feed(chunked.feed(body[start:cut]))
            start = cut
            while True:
                out.append(sse.encode_many(streamer.feed(deltas)))
                if not decoder.pending:
                    break
                deltas = decoder.take()
        out.append(sse.encode_many(streamer.feed(decoder.end(EndCause.CLEAN)) + streamer.finish()))
    return b"".join(out)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(events, max_size=40),
    st.integers(1, 300),
    st.lists(st.integers(0, 6000), max_size=5),
)
@example([b"data: " + chunk({"content": f"t{i}"}) + b"\n\n" for i in range(30)], 4096, [])
@example(
    [b"data: " + chunk({"content": f"t{i}"}) + b"\n\n" for i in range(8)]
    + [b"event: error\ndata: " + chunk({"content": "x"}) + b"\n\n"]
    + [b"data: " + chunk({"content": "y"}) + b"\n\n"] * 4,
    65536,
    [],
)
def test_every_switch_off_makes_the_bytes_every_switch_on_makes(
    parts: list[bytes], size: int, cuts: list[int]
) -> None:
    body = body_of(parts, size)
    cuts = [min(c, len(body)) for c in cuts]
    fast = client_bytes(body, cuts, "")
    for reference in SETTINGS[1:]:
        assert client_bytes(body, cuts, reference) == fast, reference


def test_a_named_error_event_is_an_error_on_every_path() -> None:
    """`event: error` changes what a payload means: not a run's piece, even once runs form."""
    parts = [b"data: " + chunk({"content": f"t{i}"}) + b"\n\n" for i in range(8)]
    parts += [b"\r\n"]  # the line parser from here on, so the named event is read as named
    parts += [b"event: error\ndata: " + chunk({"content": "x"}) + b"\n\n"]
    body = body_of(parts, 65536)
    sent = client_bytes(body, [], "")
    assert b"response.failed" in sent and b'"delta":"x"' not in sent
    assert all(client_bytes(body, [], r) == sent for r in SETTINGS[1:])


def test_reference_names_the_stages() -> None:
    assert speed.parse_reference("") == ()
    assert speed.parse_reference(" runs, sse ") == ("runs", "sse")
    assert speed.parse_reference("all") == tuple(speed.STAGES)
    with pytest.raises(ValueError, match="unknown stage 'fastest'"):
        speed.parse_reference("runs,fastest")
    with speed.using("output,encode"):
        assert speed.reference() == ("output", "encode")
        assert not speed.fast("output") and speed.fast("runs")
    assert speed.reference() == ()


def test_an_unknown_stage_stops_the_gateway_before_it_serves() -> None:
    with pytest.raises(ValueError, match="--reference: unknown stage"):
        check_settings(Settings(reference="bulk"))
