"""The learnt-shape fast path decodes exactly what the full decoder decodes."""

from __future__ import annotations

import json
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from streamer.core.deltas import TextDelta, ToolCallDelta
from streamer.upstream.chat.chunk_shapes import learn_arguments, learn_text
from streamer.upstream.chat.decoder import ChatChunkDecoder


def chunk(delta: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
        **extra,
    }


def text_chunk(text: str, **extra: Any) -> dict[str, Any]:
    return chunk({"content": text}, **extra)


def args_chunk(fragment: str, index: int = 0) -> dict[str, Any]:
    return chunk({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]})


def slow(payloads: list[bytes]) -> list[Any]:
    """The reference: every payload through `feed`, one by one."""
    decoder = ChatChunkDecoder()
    return [d for p in payloads for d in decoder.feed(p)]


def test_text_shape_is_learnt_and_used() -> None:
    payloads = [orjson.dumps(text_chunk(t)) for t in ("Hel", "lo", ' "q" \\', "")]
    decoder = ChatChunkDecoder()
    assert decoder.decode(payloads) == [TextDelta("Hel"), TextDelta("lo"), TextDelta(' "q" \\')]
    assert decoder._text.head
    assert decoder._lessons == 3  # learnt once; the later chunks were sliced


def test_argument_shape_keeps_the_call_index() -> None:
    payloads = [orjson.dumps(args_chunk(f, index=2)) for f in ('{"a":', ' "x"}')]
    decoder = ChatChunkDecoder()
    assert decoder.decode(payloads) == [
        ToolCallDelta(2, None, None, '{"a":'),
        ToolCallDelta(2, None, None, ' "x"}'),
    ]
    assert decoder._args.head and decoder._args.call == 2


def test_a_spaced_encoder_and_a_deeper_content_key() -> None:
    # Python's json.dumps puts spaces after colons; logprobs carry a "content" key too.
    obj = text_chunk("hi")
    obj["choices"][0] = {"logprobs": {"content": []}, **obj["choices"][0]}
    payload = json.dumps(obj).encode()
    shape = learn_text(payload, obj)
    assert shape is not None
    assert shape.head.endswith(b'"delta": {"content": ')


def test_no_shape_when_the_key_is_not_where_the_text_is() -> None:
    obj = args_chunk("x")
    payload = orjson.dumps(obj)
    assert learn_text(payload, {"choices": [{"delta": {"content": "x"}}]}) is None
    assert learn_arguments(payload, obj, 0) is not None


def test_a_chunk_that_fits_the_shape_but_holds_no_string_goes_the_full_way() -> None:
    good = orjson.dumps(text_chunk("a"))
    head, tail = good.split(b'"a"')
    odd = [head + b'"b","x":1' + tail, head + b"null" + tail, head + b'"c"' + tail]
    assert ChatChunkDecoder().decode([good, *odd]) == slow([good, *odd])


def test_done_stops_the_fast_path_too() -> None:
    payloads = [orjson.dumps(text_chunk("a")), b"[DONE]", orjson.dumps(text_chunk("b"))]
    assert ChatChunkDecoder().decode(payloads) == [TextDelta("a")]


texts = st.text(max_size=12)
extras = st.sampled_from([{}, {"usage": None}, {"system_fingerprint": "fp"}, {"created": 2}])
payloads = st.one_of(
    st.builds(lambda t, e: orjson.dumps(text_chunk(t, **e)), texts, extras),
    st.builds(lambda t: json.dumps(text_chunk(t)).encode(), texts),
    st.builds(lambda t: json.dumps(text_chunk(t), ensure_ascii=False).encode(), texts),
    st.builds(lambda f, i: orjson.dumps(args_chunk(f, i)), texts, st.integers(0, 2)),
    st.builds(lambda t: orjson.dumps(chunk({"content": t}, usage={"prompt_tokens": 1})), texts),
    st.just(
        orjson.dumps(chunk({}) | {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    ),
    st.just(b'{"error": {"message": "boom"}}'),
    st.just(b"[DONE]"),
    st.binary(max_size=40),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(payloads, max_size=30))
def test_decode_equals_the_full_decoder(batch: list[bytes]) -> None:
    assert ChatChunkDecoder().decode(batch) == slow_until_error(batch)


def slow_until_error(payloads: list[bytes]) -> list[Any]:
    out = slow(payloads)
    for position, delta in enumerate(out):
        if type(delta).__name__ == "UpstreamError":
            return out[: position + 1]
    return out


def general(payloads: list[bytes]) -> list[Any]:
    """The plain path: a decoder that never learns a shape, so every payload is parsed whole."""
    decoder = ChatChunkDecoder()
    decoder._lessons = 0
    out: list[Any] = []
    for payload in payloads:
        out += decoder.feed(payload)
        if out and type(out[-1]).__name__ == "UpstreamError":
            break
    return out


# Chunks that look per-token but are not always: extra fields in the delta or the chunk,
# a second choice, a call with an id or a name, a finish reason, a non-zero choice index.
deltas = st.one_of(
    st.builds(lambda t: {"content": t}, texts),
    st.builds(lambda t: {"role": "assistant", "content": t}, texts),
    st.builds(
        lambda t, r: {"content": t, "reasoning_content": r}, texts, st.sampled_from(["", "r"])
    ),
    st.builds(
        lambda f, i: {"tool_calls": [{"index": i, "function": {"arguments": f}}]},
        texts,
        st.integers(0, 2),
    ),
    st.builds(
        lambda f: {"tool_calls": [{"index": 0, "id": "c", "function": {"arguments": f}}]}, texts
    ),
    st.builds(
        lambda f: {"tool_calls": [{"function": {"arguments": f}}, {"function": {"arguments": f}}]},
        texts,
    ),
)


def _choices(
    delta: dict[str, Any], reason: str | None, index: Any, other: int, text: str
) -> list[Any]:
    """One choice, or two: another one (index 1, its own text) after ours (other 1) or
    before it (other 2)."""
    ours = {"index": index, "delta": delta, "finish_reason": reason}
    theirs = {"index": 1, "delta": {"content": text}, "finish_reason": None}
    return [[ours], [ours, theirs], [theirs, ours]][other]


choices = st.builds(
    _choices,
    deltas,
    st.sampled_from([None, None, None, "stop"]),
    st.sampled_from([0, 0, 0, None, 1]),
    st.sampled_from([0, 0, 1, 2]),
    st.sampled_from(["a", "b"]),
)
chunks = st.builds(
    lambda c, e: orjson.dumps({"id": "x", "object": "chat.completion.chunk", "choices": c, **e}),
    choices,
    extras,
)


@settings(max_examples=400, deadline=None)
@given(st.lists(chunks, max_size=24), st.randoms(use_true_random=False))
def test_learnt_shapes_decode_what_the_plain_path_decodes(batch: list[bytes], rnd: Any) -> None:
    """The stream repeats its chunks (as a backend does), in any order: whatever shapes the
    decoder learns, `decode` gives exactly what the plain path gives."""
    stream = batch + [rnd.choice(batch) for _ in range(len(batch))] if batch else []
    assert ChatChunkDecoder().decode(stream) == general(stream)
