"""Chat Completions payloads -> deltas: every shape the backends send, and the odd ones."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from streamer.core.deltas import (
    Finish,
    ReasoningDelta,
    RefusalDelta,
    TextDelta,
    ToolCallDelta,
    UpstreamError,
    Usage,
)
from streamer.upstream.chat.decoder import ChatChunkDecoder, decode_completion
from streamer.upstream.chat.http_errors import http_error
from streamer.upstream.chat.stream import decode_body


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **top: Any) -> bytes:
    body: dict[str, Any] = {
        "id": "c",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}],
    }
    body.update(top)
    return orjson.dumps(body)


def feed(*payloads: str | bytes) -> list[Any]:
    decoder = ChatChunkDecoder()
    return [d for p in payloads for d in decoder.feed(p)]


def test_text_and_role_only_chunks() -> None:
    assert feed(chunk({"role": "assistant", "content": ""}), chunk({"content": "Hi"})) == [
        TextDelta("Hi")
    ]


def test_str_and_bytes_payloads_decode_alike() -> None:
    payload = chunk({"content": "é"})
    assert feed(payload) == feed(payload.decode()) == [TextDelta("é")]


def test_done_sets_done_and_stops_decoding() -> None:
    decoder = ChatChunkDecoder()
    assert decoder.feed("[DONE]") == []
    assert decoder.done
    assert decoder.feed(chunk({"content": "late"})) == []


def test_reasoning_from_either_field() -> None:
    assert feed(chunk({"reasoning_content": "a"}), chunk({"reasoning": "b"})) == [
        ReasoningDelta("a"),
        ReasoningDelta("b"),
    ]
    # a backend that sends both names for the same piece yields it once
    assert feed(chunk({"reasoning_content": "x", "reasoning": "x"})) == [ReasoningDelta("x")]


def test_refusal() -> None:
    assert feed(chunk({"refusal": "no"})) == [RefusalDelta("no")]


def test_order_within_one_chunk() -> None:
    payload = chunk(
        {
            "tool_calls": [{"index": 0, "id": "c1", "function": {"name": "f", "arguments": "{}"}}],
            "refusal": "r",
            "content": "t",
            "reasoning_content": "think",
        },
        finish="tool_calls",
        usage={"prompt_tokens": 3, "completion_tokens": 4},
    )
    assert feed(payload) == [
        ReasoningDelta("think"),
        TextDelta("t"),
        RefusalDelta("r"),
        ToolCallDelta(0, "c1", "f", "{}"),
        Finish("tool_calls"),
        Usage(input_tokens=3, output_tokens=4),
    ]


def test_tool_call_fragments() -> None:
    deltas = feed(
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 1,
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "mcp__do"},
                    }
                ]
            }
        ),
        chunk(
            {"tool_calls": [{"index": 1, "function": {"name": "cs__search", "arguments": None}}]}
        ),
        chunk({"tool_calls": [{"index": 1, "id": "", "function": {"arguments": '{"q":'}}]}),
        chunk({"tool_calls": [{"index": 1, "function": {"arguments": '"x"}'}}]}),
    )
    assert deltas == [
        ToolCallDelta(1, "call_1", "mcp__do", ""),
        ToolCallDelta(1, None, "cs__search", ""),
        ToolCallDelta(1, None, None, '{"q":'),
        ToolCallDelta(1, None, None, '"x"}'),
    ]


def test_tool_call_without_index_uses_its_position() -> None:
    payload = chunk(
        {
            "tool_calls": [
                {"id": "a", "function": {"name": "f", "arguments": "{}"}},
                {"id": "b", "function": {"name": "g", "arguments": "{}"}},
            ]
        }
    )
    assert [(d.index, d.id) for d in feed(payload)] == [(0, "a"), (1, "b")]


def test_object_arguments_are_dumped_to_json() -> None:
    payload = chunk(
        {"tool_calls": [{"id": "a", "function": {"name": "f", "arguments": {"q": "é", "n": 1}}}]}
    )
    (delta,) = feed(payload)
    assert isinstance(delta, ToolCallDelta)
    assert orjson.loads(delta.arguments) == {"q": "é", "n": 1}


def test_finish_sets_finished() -> None:
    decoder = ChatChunkDecoder()
    assert decoder.feed(chunk(finish="length")) == [Finish("length")]
    assert decoder.finished and not decoder.done


def test_usage_only_chunk_with_details() -> None:
    payload = orjson.dumps(
        {
            "choices": [],
            "usage": {
                "prompt_tokens": 100,
                "completion_tokens": 20,
                "prompt_tokens_details": {"cached_tokens": 64, "cache_write_tokens": 30},
                "completion_tokens_details": {"reasoning_tokens": 12},
            },
        }
    )
    assert feed(payload) == [
        Usage(100, 20, cached_tokens=64, cache_write_tokens=30, reasoning_tokens=12)
    ]


def test_usage_with_nulls_and_other_cache_write_names() -> None:
    assert feed(
        orjson.dumps(
            {
                "usage": {
                    "prompt_tokens": None,
                    "completion_tokens": 2,
                    "prompt_tokens_details": None,
                }
            }
        )
    ) == [Usage(0, 2)]
    assert feed(
        orjson.dumps({"usage": {"prompt_tokens": 5, "cache_creation_input_tokens": 7}})
    ) == [Usage(5, 0, cache_write_tokens=7)]


def test_error_payloads() -> None:
    assert feed(
        orjson.dumps({"error": {"message": "out of memory", "type": "server_error", "code": "oom"}})
    ) == [UpstreamError("oom", "out of memory", "server_error")]
    assert feed(
        orjson.dumps({"error": {"message": "bad", "type": "BadRequestError", "code": 400}})
    ) == [UpstreamError("BadRequestError", "bad")]
    assert feed(orjson.dumps({"error": "model not loaded"})) == [
        UpstreamError("server_error", "model not loaded")
    ]
    assert feed(orjson.dumps({"object": "error", "message": "vllm says no", "code": 500})) == [
        UpstreamError("server_error", "vllm says no")
    ]


def test_event_named_error_is_an_error() -> None:
    (delta,) = ChatChunkDecoder().feed(orjson.dumps({"message": "boom"}), event="error")
    assert delta == UpstreamError("server_error", "boom")


def test_malformed_json_is_an_upstream_error() -> None:
    (delta,) = feed('{"choices": [')
    assert isinstance(delta, UpstreamError)
    assert delta.code == "invalid_upstream_chunk"
    assert "malformed JSON" in delta.message


def test_unknown_shapes_are_ignored() -> None:
    odd: list[str | bytes] = [
        "42",
        "null",
        '"text"',
        "[]",
        "{}",
        orjson.dumps({"choices": None}),
        orjson.dumps({"choices": [None, 3]}),
        orjson.dumps({"choices": [{"index": 0, "delta": "text"}]}),
        orjson.dumps({"choices": [{"index": 0, "delta": {"content": 5, "tool_calls": "x"}}]}),
        orjson.dumps({"choices": [{"index": 0, "delta": {"tool_calls": [None, 1]}}]}),
        orjson.dumps({"choices": [{"index": 1, "delta": {"content": "second choice"}}]}),
        orjson.dumps({"usage": None, "timings": {"predicted_ms": 3}}),
    ]
    assert feed(*odd) == []


def test_content_as_parts() -> None:
    assert feed(
        chunk({"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]})
    ) == [TextDelta("ab")]


@settings(max_examples=300, deadline=None)
@given(
    st.recursive(
        st.none()
        | st.booleans()
        | st.integers(-(2**63), 2**63 - 1)
        | st.floats(allow_nan=False)
        | st.text(max_size=5),
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.dictionaries(
                st.sampled_from(
                    [
                        "choices",
                        "delta",
                        "content",
                        "tool_calls",
                        "function",
                        "arguments",
                        "name",
                        "index",
                        "usage",
                        "error",
                        "finish_reason",
                        "message",
                        "reasoning",
                        "refusal",
                        "id",
                        "x",
                    ]
                ),
                inner,
                max_size=4,
            )
        ),
        max_leaves=20,
    )
)
def test_any_json_never_raises(value: Any) -> None:
    decoder = ChatChunkDecoder()
    for delta in decoder.feed(orjson.dumps(value)):
        assert isinstance(
            delta,
            TextDelta
            | ReasoningDelta
            | RefusalDelta
            | ToolCallDelta
            | Finish
            | Usage
            | UpstreamError,
        )
    decode_completion(value)


def test_whole_completion() -> None:
    body = {
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "reasoning_content": "hmm",
                    "content": "Calling.",
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "f", "arguments": '{"a":1}'},
                        },
                        {
                            "id": "c2",
                            "type": "function",
                            "function": {"name": "g", "arguments": {"b": 2}},
                        },
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": 8},
    }
    assert decode_completion(body) == [
        ReasoningDelta("hmm"),
        TextDelta("Calling."),
        ToolCallDelta(0, "c1", "f", '{"a":1}'),
        ToolCallDelta(1, "c2", "g", '{"b":2}'),
        Finish("tool_calls"),
        Usage(9, 8),
    ]
    assert decode_completion({"error": {"message": "nope", "code": "x"}}) == [
        UpstreamError("x", "nope")
    ]
    (bad,) = decode_completion([1, 2])
    assert isinstance(bad, UpstreamError)


def test_body_that_is_an_event_stream_labelled_json() -> None:
    raw = (
        b"data: "
        + chunk({"content": "hi"})
        + b"\n\ndata: "
        + chunk(finish="stop")
        + b"\n\ndata: [DONE]\n\n"
    )
    assert decode_body(raw) == [TextDelta("hi"), Finish("stop")]
    (bad,) = decode_body(b"<html>oops</html>")
    assert isinstance(bad, UpstreamError) and bad.code == "invalid_upstream_chunk"
    # a truncated stream is not a complete answer
    (cut,) = decode_body(b"data: " + chunk({"content": "hi"}))[-1:]
    assert isinstance(cut, UpstreamError)


def test_http_error_shapes() -> None:
    ollama = http_error(404, b'{"error": "model \\"x\\" not found"}', {})
    assert (ollama.status, ollama.message, ollama.type) == (
        404,
        'model "x" not found',
        "invalid_request_error",
    )
    fastapi = http_error(422, b'{"detail": "Unprocessable"}', {})
    assert fastapi.message == "Unprocessable"
    text = http_error(502, b"<h1>Bad Gateway</h1>", {})
    assert text.type == "server_error" and "Bad Gateway" in text.message and text.code is None
    empty = http_error(500, b"", {})
    assert empty.message == "The backend answered HTTP 500."
    busy = http_error(503, b"{}", {"Retry-After": "2", "Content-Type": "application/json"})
    assert busy.headers == {"retry-after": "2"}
    assert http_error(400, b"{}", {"Retry-After": "2"}).headers == {}
    redirect = http_error(307, b"", {"Location": "http://elsewhere/"})
    assert (redirect.status, redirect.code) == (502, "upstream_error")
