"""The `/v1/responses` upstream's fast paths decode exactly what the plain path decodes.

The fast decoder cuts reads into raw events (framing.py) and slices per-token events
through learnt shapes (event_shapes.py). The plain reference is the decoder before them:
every event through `SSEDecoder.feed` and parsed whole, never a shape learnt. Both get
the same streams, split into the same reads: vLLM's, OpenAI's and the load backend's
layouts, spaced encoders, events with no `event:` line, CRLF, comments, several `data:`
lines, and per-token events mangled where a shape would slice them.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from streamer.core import speed
from streamer.core.deltas import TextDelta, ToolCallDelta
from streamer.upstream.chat.stream import EndCause
from streamer.upstream.responses.decoder import ResponsesDecoder, ResponsesEventDecoder
from streamer.upstream.responses.event_shapes import fit, learn
from streamer.upstream.responses.framing import EventFraming


def plain_decoder() -> ResponsesDecoder:
    """Every speed switch off: the line parser's framing, every event parsed whole."""
    with speed.using("all"):
        return ResponsesDecoder()


def run(decoder: ResponsesDecoder, reads: list[bytes]) -> tuple[list[Any], tuple[bool, ...]]:
    out: list[Any] = []
    for read in reads:
        out += decoder.feed(read)
        while decoder.pending:
            out += decoder.take()
    out += decoder.end(EndCause.CLEAN)
    return out, (decoder.ended, decoder.failed, decoder.broken)


def both(reads: list[bytes]) -> None:
    assert run(ResponsesDecoder(), reads) == run(plain_decoder(), reads)


# -- layouts ------------------------------------------------------------------------------


def text_event(delta: Any, seq: int, layout: str, kind: str = "response.output_text.delta") -> Any:
    at = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
    if layout == "openai":  # sequence_number first, a per-event obfuscation last
        return {
            "type": kind,
            "sequence_number": seq,
            **at,
            "delta": delta,
            "obfuscation": "x" * seq,
        }
    if layout == "vllm":  # the SDK models' field order
        return {"content_index": 0, "delta": delta, "item_id": "msg_1", "logprobs": []} | {
            "output_index": 0,
            "sequence_number": seq,
            "type": kind,
        }
    if layout == "bare":  # no sequence_number at all
        return {"type": kind, **at, "delta": delta}
    return {"type": kind, **at, "delta": delta, "logprobs": [], "sequence_number": seq}


def args_event(delta: Any, seq: int, at: int = 1) -> Any:
    kind = "response.function_call_arguments.delta"
    return {"type": kind, "item_id": f"fc_{at}", "output_index": at, "delta": delta} | {
        "sequence_number": seq
    }


def opening(seq: int = 0) -> list[Any]:
    response = {"id": "resp_1", "object": "response", "status": "in_progress", "output": []}
    message = {"id": "msg_1", "type": "message", "role": "assistant", "content": []}
    return [
        {"type": "response.created", "response": response, "sequence_number": seq},
        {"type": "response.in_progress", "response": response, "sequence_number": seq + 1},
        {"type": "response.output_item.added", "output_index": 0, "item": message},
        {
            "type": "response.content_part.added",
            "item_id": "msg_1",
            "output_index": 0,
            "content_index": 0,
            "part": {"type": "output_text", "text": ""},
        },
    ]


CALL = {"id": "fc_1", "type": "function_call", "call_id": "call_1", "name": "f", "arguments": ""}
CALL_ADDED = {"type": "response.output_item.added", "output_index": 1, "item": CALL}
CALL_DONE = {"type": "response.output_item.done", "output_index": 1, "item": CALL}
USAGE = {"input_tokens": 3, "output_tokens": 5}
COMPLETED = {"type": "response.completed", "response": {"status": "completed", "usage": USAGE}}


def encode(obj: Any, encoder: str) -> bytes:
    if encoder == "spaced":
        return json.dumps(obj).encode()
    if encoder == "unicode":
        return json.dumps(obj, ensure_ascii=False).encode()
    return orjson.dumps(obj)


def frame(payload: bytes, type_: str | None, style: str) -> bytes:
    """One SSE event: with or without its `event:` line, LF or CRLF, a comment, or split
    over two `data:` lines (JSON allows the line end there)."""
    event = b"event: " + type_.encode() + b"\n" if type_ is not None else b""
    if style == "crlf":
        return (event + b"data: " + payload + b"\n\n").replace(b"\n", b"\r\n")
    if style == "comment":
        return b": keep-alive\n" + event + b"data: " + payload + b"\n\n"
    if style == "two-lines" and payload.startswith(b"{"):
        return event + b"data: {\ndata: " + payload[1:] + b"\n\n"
    if style == "nospace":
        return event + b"data:" + payload + b"\n\n"
    return event + b"data: " + payload + b"\n\n"


def mangle(payload: bytes, how: int) -> bytes:
    """A per-token event broken where a shape slices it."""
    swaps = [
        (b'"delta":"', b'"delta":null,"x":"'),
        (b'"sequence_number":', b'"sequence_number":0'),  # a leading zero: not JSON
        (b'"sequence_number":', b'"sequence_number":-'),
        (b'"sequence_number":', b'"sequence_number":"'),
        (b'"delta":"', b'"delta":"\\'),
        (b'"delta":"', b'"delta":"a","delta":"'),
        (b'"delta":"', b'"delta":1,"y":"'),
        (b"}", b',"extra":true}'),
    ]
    old, new = swaps[how % len(swaps)]
    return payload.replace(old, new, 1)


deltas_text = st.text(alphabet=st.sampled_from('ab "\\\n\u00e9\u2028{}:,0'), max_size=8)
layouts = st.sampled_from(["bench", "bench", "vllm", "openai", "bare"])
encoders = st.sampled_from(["orjson", "orjson", "orjson", "spaced", "unicode"])
styles = st.sampled_from(["plain"] * 8 + ["crlf", "comment", "two-lines", "nospace", "noevent"])
kinds = st.sampled_from(
    ["response.output_text.delta"] * 4
    + ["response.reasoning_text.delta", "response.refusal.delta", "response.custom.x"]
)


@st.composite
def streams(draw: Any) -> bytes:
    """A turn: the opening, text deltas (mostly alike, some odd), a call's fragments, the end."""
    layout, encoder = draw(layouts), draw(encoders)
    events: list[Any] = opening()
    seq = 4
    for _ in range(draw(st.integers(0, 24))):
        seq += draw(st.sampled_from([1, 1, 1, 7, 100]))
        kind = draw(kinds) if draw(st.integers(0, 5)) == 0 else "response.output_text.delta"
        events.append(text_event(draw(deltas_text), seq, layout, kind))
    if draw(st.booleans()):
        events.append(CALL_ADDED)
        for _ in range(draw(st.integers(0, 10))):
            seq += 1
            events.append(args_event(draw(deltas_text), seq, draw(st.sampled_from([1, 1, 2]))))
        events.append(CALL_DONE)
    if draw(st.booleans()):
        events.append(COMPLETED)
    out = []
    for event in events:
        payload = encode(event, encoder)
        if "delta" in event and draw(st.integers(0, 7)) == 0:
            payload = mangle(payload, draw(st.integers(0, 100)))
        style = draw(styles)
        type_ = None if style == "noevent" else event["type"]
        out.append(frame(payload, type_, style))
    if draw(st.integers(0, 9)) == 0:
        out.insert(draw(st.integers(0, len(out))), draw(st.binary(max_size=12)))
    return b"".join(out)


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True) if b > a]


@settings(max_examples=400, deadline=None)
@given(streams(), st.lists(st.integers(0, 10**6), max_size=6))
def test_the_fast_decoder_decodes_what_the_plain_one_does(data: bytes, cuts: list[int]) -> None:
    both(split(data, cuts))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=30), max_size=8))
def test_any_bytes_decode_alike(reads: list[bytes]) -> None:
    both(reads)


TEXT = orjson.dumps(text_event("a", 5, "bench"))
pieces = st.sampled_from(
    [
        b"event: response.output_text.delta\n",
        b"event:x\n",
        b"data: " + TEXT + b"\n",
        b"data:" + TEXT + b"\n",
        b"data: " + TEXT[:40],
        TEXT[40:] + b"\n",
        b"data: {}\n",
        b'data: {"type": "error", "message": "boom"}\n',
        b"data: [DONE]\n",
        b"\n",
        b"\n\n",
        b"\r\n",
        b"\r",
        b": comment\n",
        b"id: 7\n",
        b"\xef\xbb\xbf",
        b"data",
    ]
)


@settings(max_examples=400, deadline=None)
@given(st.lists(pieces, max_size=30), st.lists(st.integers(0, 10**6), max_size=6))
def test_event_stream_fragments_decode_alike(parts: list[bytes], cuts: list[int]) -> None:
    """Lines of every kind, in any order, cut anywhere: the framing's raw events and the
    plain decoder's messages are the same events."""
    both(split(b"".join(parts), cuts))


# -- the shapes and the batches -----------------------------------------------------------


def raw_event(obj: Any, encoder: str = "orjson") -> bytes:
    return b"event: " + obj["type"].encode() + b"\ndata: " + encode(obj, encoder)


def test_shapes_are_learnt_for_the_bench_and_vllm_layouts() -> None:
    for layout in ("bench", "vllm", "bare"):
        for encoder in ("orjson", "spaced"):
            obj = text_event("Hi", 7, layout)
            event = raw_event(obj, encoder)
            offset = event.index(b"\ndata: ") + 7
            shape = learn(event, offset, obj, 0)
            assert shape is not None, (layout, encoder)
            assert fit(shape, raw_event(text_event('"x\\', 123, layout), encoder)) == '"x\\'
            assert fit(shape, raw_event(text_event("x", 8, layout, "response.refusal.delta"))) in (
                None,
                "x",  # a refusal's head differs: the decoder compares heads before fit
            )


def test_an_openai_event_is_decoded_whole() -> None:
    events = [text_event(t, i, "openai") for i, t in enumerate(("a", "b", "c"), 5)]
    decoder = ResponsesEventDecoder()
    assert decoder.decode([raw_event(e) for e in events]) == [TextDelta(t) for t in "abc"]
    assert decoder._lessons == 6  # each parsed whole (learnt from the second on): it never fits


def test_per_token_events_are_sliced_once_learnt() -> None:
    events: list[bytes] = [raw_event(e) for e in opening()]
    events += [raw_event(text_event(f"t{i}", 4 + i, "vllm")) for i in range(12)]
    events += [raw_event(CALL_ADDED)] + [raw_event(args_event(f"{i},", 20 + i)) for i in range(5)]
    decoder = ResponsesEventDecoder()
    out = decoder.decode(events)
    assert out[:12] == [TextDelta(f"t{i}") for i in range(12)]
    assert out[13:] == [ToolCallDelta(0, arguments=f"{i},") for i in range(5)]
    assert decoder._text.head and decoder._args.head
    assert decoder._lessons == 6  # one lesson each: the rest were sliced


def test_the_framing_hands_whole_reads_over_raw() -> None:
    data = b"event: a\ndata: {}\n\ndata: [1]\n\n: c\ndata: 2\n\nevent: b\ndata: {"
    framing = EventFraming()
    assert framing.payloads(data) == [b"event: a\ndata: {}", b"data: [1]", b": c\ndata: 2"]
    assert framing.payloads(b'"k":1}\n\n') == [b'event: b\ndata: {"k":1}']


def test_the_first_text_leaves_in_a_small_batch() -> None:
    """A whole stream in one read: the first batch with a delta is the first few events,
    not the next 256 (which made the first text wait for the whole read's decoding)."""
    events = opening() + [text_event(f"t{i}", 4 + i, "bench") for i in range(300)] + [COMPLETED]
    data = b"".join(frame(orjson.dumps(e), e["type"], "plain") for e in events)
    decoder = ResponsesDecoder()
    batch = decoder.feed(data)
    while not batch and decoder.pending:
        batch = decoder.take()
    assert batch == [TextDelta(f"t{i}") for i in range(4)]
