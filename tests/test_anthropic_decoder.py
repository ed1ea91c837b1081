"""The Anthropic Messages stream decoder (issue 29), with plain values: the documented events
(platform.claude.com "Streaming messages") -> the one delta vocabulary; a whole Message; the
thinking round trip through the streamer's seal and back into the next request; errors."""

from __future__ import annotations

import itertools
import json
import random
from typing import Any

import orjson
import pytest

from streamer.core.compaction import BACKEND_FIELD, REASONING_FIELD, restore
from streamer.core.deltas import (
    Delta,
    Finish,
    ReasoningBlob,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    UpstreamError,
    Usage,
    expand,
)
from streamer.core.lowering import LoweringOptions, normalize_input
from streamer.core.output import OutputItemStreamer
from streamer.core.response import new_response
from streamer.core.sealing import Sealer
from streamer.core.tools import ResponsesToolNames
from streamer.upstream.anthropic.blocks import thinking_runs
from streamer.upstream.anthropic.decoder import MessagesEventDecoder
from streamer.upstream.anthropic.errors import http_error
from streamer.upstream.anthropic.event_shapes import NO_SHAPE
from streamer.upstream.anthropic.request import lower_messages
from streamer.upstream.anthropic.stream import MessagesDecoder, decode_message_body
from streamer.upstream.chat.stream import EndCause

SIG = "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds"
REDACTED = "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpP"


def frame(event: dict[str, Any]) -> bytes:
    return b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


def start(usage: dict[str, int] | None = None) -> dict[str, Any]:
    message = {"id": "msg_1", "type": "message", "role": "assistant", "content": [],
               "model": "claude-x", "stop_reason": None, "stop_sequence": None,
               "usage": usage or {"input_tokens": 25, "output_tokens": 1}}  # fmt: skip
    return {"type": "message_start", "message": message}


def block(index: int, content: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": content}


def delta(index: int, content: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": content}


def stop(index: int) -> dict[str, Any]:
    return {"type": "content_block_stop", "index": index}


def end(reason: str, usage: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    body = {"stop_reason": reason, "stop_sequence": None}
    return [
        {"type": "message_delta", "delta": body, "usage": usage or {"output_tokens": 15}},
        {"type": "message_stop"},
    ]


TEXT = [
    start(),
    block(0, {"type": "text", "text": ""}),
    {"type": "ping"},
    delta(0, {"type": "text_delta", "text": "Hello"}),
    delta(0, {"type": "text_delta", "text": "!"}),
    stop(0),
    *end("end_turn"),
]
THINKING_TOOL = [
    start(
        {
            "input_tokens": 10,
            "cache_creation_input_tokens": 300,
            "cache_read_input_tokens": 1200,
            "output_tokens": 1,
        }
    ),
    block(0, {"type": "thinking", "thinking": "", "signature": ""}),
    delta(0, {"type": "thinking_delta", "thinking": "I should "}),
    delta(0, {"type": "thinking_delta", "thinking": "list files."}),
    delta(0, {"type": "signature_delta", "signature": SIG}),
    stop(0),
    block(1, {"type": "redacted_thinking", "data": REDACTED}),
    stop(1),
    block(2, {"type": "text", "text": ""}),
    delta(2, {"type": "text_delta", "text": "Listing."}),
    stop(2),
    block(3, {"type": "tool_use", "id": "toolu_01A", "name": "mcp__docs__search", "input": {}}),
    delta(3, {"type": "input_json_delta", "partial_json": ""}),
    delta(3, {"type": "input_json_delta", "partial_json": '{"q": '}),
    delta(3, {"type": "input_json_delta", "partial_json": '"ls"}'}),
    stop(3),
    *end("tool_use", {"output_tokens": 89, "output_tokens_details": {"thinking_tokens": 40}}),
]


def decode(events: list[dict[str, Any]], cuts: int = 0) -> tuple[list[Delta], MessagesDecoder]:
    """The deltas of the stream, fed in one read or cut every `cuts` bytes."""
    raw = b"".join(frame(e) for e in events)
    decoder = MessagesDecoder()
    reads = [raw] if not cuts else [raw[i : i + cuts] for i in range(0, len(raw), cuts)]
    out: list[Delta] = []
    for read in reads:
        out += decoder.feed(read)
        while decoder.pending:
            out += decoder.take()
    out += decoder.end(EndCause.CLEAN)
    return expand(out), decoder


def test_a_text_answer() -> None:
    deltas, decoder = decode(TEXT)
    assert deltas == [
        TextDelta("Hello"),
        TextDelta("!"),
        Usage(input_tokens=25, output_tokens=15),
        Finish("stop"),
    ]
    assert decoder.ended and not decoder.failed


def test_thinking_signature_redacted_text_and_a_call() -> None:
    deltas, _ = decode(THINKING_TOOL)
    kinds = [type(d).__name__ for d in deltas]
    assert kinds == [
        "ReasoningDelta", "ReasoningDelta", "ReasoningBlob", "ReasoningBlob", "TextDelta",
        "ToolCallDelta", "ToolCallDelta", "ToolCallDelta", "Usage", "Finish",
    ]  # fmt: skip
    assert deltas[0] == ReasoningDelta("I should ")
    blob = deltas[3]
    assert isinstance(blob, ReasoningBlob)
    (run,) = thinking_runs(blob.encrypted_content) or []
    assert run.after is None
    assert run.blocks == (
        {"type": "thinking", "thinking": "I should list files.", "signature": SIG},
        {"type": "redacted_thinking", "data": REDACTED},
    )
    assert deltas[5] == ToolCallDelta(0, "toolu_01A", "mcp__docs__search")
    assert "".join(d.arguments for d in deltas if isinstance(d, ToolCallDelta)) == '{"q": "ls"}'
    assert deltas[-2] == Usage(
        input_tokens=1510, output_tokens=89, cached_tokens=1200, cache_write_tokens=300,
        reasoning_tokens=40,
    )  # fmt: skip
    assert deltas[-1] == Finish("tool_calls")


@pytest.mark.parametrize("cuts", [1, 7, 64])
def test_any_cut_of_the_bytes_decodes_the_same(cuts: int) -> None:
    assert decode(THINKING_TOOL, cuts)[0] == decode(THINKING_TOOL)[0]


@pytest.mark.parametrize(
    ("reason", "finish"),
    [
        ("end_turn", "stop"), ("stop_sequence", "stop"), ("pause_turn", "stop"),
        ("max_tokens", "length"), ("model_context_window_exceeded", "length"),
        ("refusal", "content_filter"),
    ],
)  # fmt: skip
def test_stop_reasons(reason: str, finish: str) -> None:
    assert decode([start(), *end(reason)])[0][-1] == Finish(finish)


def test_a_call_whose_input_came_whole_or_not_at_all() -> None:
    events = [
        start(),
        block(0, {"type": "tool_use", "id": "t1", "name": "a", "input": {"x": 1}}),
        stop(0),
        block(1, {"type": "tool_use", "id": "t2", "name": "b", "input": {}}),
        stop(1),
        *end("tool_use"),
    ]
    calls = [d for d in decode(events)[0] if isinstance(d, ToolCallDelta)]
    assert calls == [
        ToolCallDelta(0, "t1", "a"),
        ToolCallDelta(0, arguments='{"x":1}'),
        ToolCallDelta(1, "t2", "b"),
        ToolCallDelta(1, arguments="{}"),
    ]


def test_an_error_event_mid_stream_fails_the_turn() -> None:
    events = [
        start(),
        block(0, {"type": "text", "text": ""}),
        delta(0, {"type": "text_delta", "text": "Par"}),
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
        delta(0, {"type": "text_delta", "text": "never"}),
    ]
    deltas, decoder = decode(events)
    assert deltas == [TextDelta("Par"), UpstreamError("overloaded_error", "Overloaded")]
    assert decoder.failed
    too_long = {"type": "error", "error": {"type": "invalid_request_error",
                                            "message": "prompt is too long: 210000 tokens > 200000 maximum"}}  # fmt: skip
    assert decode([start(), too_long])[0][-1].code == "context_length_exceeded"  # type: ignore[union-attr]


def test_a_stream_cut_before_its_stop_reason_is_an_error() -> None:
    deltas, decoder = decode(TEXT[:4])
    assert isinstance(deltas[-1], UpstreamError) and decoder.failed


def test_malformed_json_is_an_error() -> None:
    decoder = MessagesDecoder()
    out = decoder.feed(b"event: message_start\ndata: {nope\n\n")
    assert isinstance(out[-1], UpstreamError) and decoder.failed


def test_a_whole_message_decodes_as_its_stream_would() -> None:
    body = {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
        "content": [
            {"type": "thinking", "thinking": "I should list files.", "signature": SIG},
            {"type": "redacted_thinking", "data": REDACTED},
            {"type": "text", "text": "Listing."},
            {"type": "tool_use", "id": "toolu_01A", "name": "mcp__docs__search", "input": {"q": "ls"}},
        ],
        "stop_reason": "tool_use", "stop_sequence": None,
        "usage": {"input_tokens": 10, "cache_creation_input_tokens": 300,
                  "cache_read_input_tokens": 1200, "output_tokens": 89,
                  "output_tokens_details": {"thinking_tokens": 40}},
    }  # fmt: skip
    whole = decode_message_body(orjson.dumps(body))
    streamed = decode(THINKING_TOOL)[0]

    def calls(ds: list[Delta]) -> str:
        return "".join(d.arguments for d in ds if isinstance(d, ToolCallDelta))

    assert orjson.loads(calls(whole)) == orjson.loads(calls(streamed))
    assert [d for d in whole if not isinstance(d, ToolCallDelta | ReasoningDelta)] == [
        d for d in streamed if not isinstance(d, ToolCallDelta | ReasoningDelta)
    ]
    error = {"type": "error", "error": {"type": "api_error", "message": "boom"}}
    assert decode_message_body(orjson.dumps(error)) == [UpstreamError("api_error", "boom")]


# -- the thinking round trip --------------------------------------------------------------


TOOLS = [
    {
        "type": "namespace",
        "name": "mcp__docs",
        "tools": [{"type": "function", "name": "search", "parameters": {"type": "object"}}],
    }
]


def _answer(sealer: Sealer, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The output items the client gets for a streamed answer, reasoning sealed (as
    `include: ["reasoning.encrypted_content"]` asks)."""

    def seal(text: str, backend: str | None) -> str:
        extra = {BACKEND_FIELD: backend} if backend else None
        return sealer.seal("reasoning", REASONING_FIELD, text, extra)

    names = ResponsesToolNames.convert(TOOLS)
    streamer = OutputItemStreamer(names, new_response({"model": "m"}), seal_reasoning=seal)
    streamer.start()
    streamer.feed(decode(events)[0])
    streamer.finish()
    return list(streamer.response["output"])


def test_the_signed_thinking_comes_back_before_its_tool_use_from_the_clients_items() -> None:
    sealer = Sealer(bytes(32))
    output = _answer(sealer, THINKING_TOOL)
    assert [i["type"] for i in output] == ["reasoning", "message", "function_call"]
    reasoning, _, call = output
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "I should list files."}]
    assert reasoning["encrypted_content"].startswith("stm1_") and SIG not in str(output)
    assert (call["name"], call["namespace"], call["call_id"]) == (
        "search",
        "mcp__docs",
        "toolu_01A",
    )
    # a store: false client (Codex) sends back what it kept, without the readable text
    kept = [{k: v for k, v in reasoning.items() if k != "content"}, *output[1:]]
    result = {"type": "function_call_output", "call_id": "toolu_01A", "output": "a.txt"}
    items = normalize_input([{"role": "user", "content": "list"}, *kept, result])
    view = restore(items, sealer)
    names = ResponsesToolNames.convert(TOOLS, view)
    request = {"model": "m", "tools": TOOLS, "reasoning": {"effort": "low"}, "input": items}
    body = lower_messages(request, view, names, LoweringOptions(profile="anthropic"))
    assistant = body["messages"][1]["content"]
    assert assistant[:2] == [
        {"type": "thinking", "thinking": "I should list files.", "signature": SIG},
        {"type": "redacted_thinking", "data": REDACTED},
    ]
    assert assistant[2] == {"type": "text", "text": "Listing."}
    assert assistant[3] == {"type": "tool_use", "id": "toolu_01A", "name": "mcp__docs__search",
                            "input": {"q": "ls"}}  # fmt: skip
    assert body["messages"][2]["content"][0]["tool_use_id"] == "toolu_01A"
    assert body["thinking"]["type"] == "enabled"


def test_interleaved_thinking_keeps_its_place_after_the_call_it_followed() -> None:
    sealer = Sealer(bytes(32))
    events = [
        start(),
        block(0, {"type": "thinking", "thinking": "first", "signature": "S1"}),
        stop(0),
        block(1, {"type": "tool_use", "id": "toolu_1", "name": "mcp__docs__search", "input": {}}),
        delta(1, {"type": "input_json_delta", "partial_json": "{}"}),
        stop(1),
        block(2, {"type": "thinking", "thinking": "second", "signature": "S2"}),
        stop(2),
        block(3, {"type": "tool_use", "id": "toolu_2", "name": "mcp__docs__search", "input": {}}),
        delta(3, {"type": "input_json_delta", "partial_json": "{}"}),
        stop(3),
        *end("tool_use"),
    ]
    output = _answer(sealer, events)
    results = [
        {"type": "function_call_output", "call_id": c, "output": "x"}
        for c in ("toolu_1", "toolu_2")
    ]
    items = normalize_input([{"role": "user", "content": "go"}, *output, *results])
    view = restore(items, sealer)
    names = ResponsesToolNames.convert(TOOLS, view)
    body = lower_messages({"model": "m", "tools": TOOLS}, view, names, LoweringOptions())
    assistant = body["messages"][1]["content"]
    assert [(b["type"], b.get("signature") or b.get("id")) for b in assistant] == [
        ("thinking", "S1"), ("tool_use", "toolu_1"), ("thinking", "S2"), ("tool_use", "toolu_2"),
    ]  # fmt: skip


# -- errors -------------------------------------------------------------------------------


def _error(kind: str, message: str) -> bytes:
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": message},
                         "request_id": "req_1"})  # fmt: skip


def test_overloaded_is_a_503_with_retry_advice() -> None:
    error = http_error(529, _error("overloaded_error", "Overloaded"), {})
    assert (error.status, error.type, error.code) == (503, "server_error", "server_is_overloaded")
    assert error.headers == {"retry-after": "1"} and "retry" in error.message
    kept = http_error(529, _error("overloaded_error", "Overloaded"), {"Retry-After": "7"})
    assert kept.headers == {"retry-after": "7"}


def test_rate_limits_keep_their_headers() -> None:
    headers = {
        "retry-after": "30",
        "anthropic-ratelimit-requests-remaining": "0",
        "x-ratelimit-a": "1",
    }
    error = http_error(429, _error("rate_limit_error", "Slow down"), headers)
    assert (error.status, error.code, error.message) == (429, "rate_limit_exceeded", "Slow down")
    assert error.headers == {"retry-after": "30", "x-ratelimit-a": "1"}


@pytest.mark.parametrize(
    ("message", "code"),
    [
        ("prompt is too long: 208310 tokens > 200000 maximum", "context_length_exceeded"),
        ("messages.1: tool_use ids were found without tool_result blocks", None),
    ],
)
def test_invalid_requests_are_400s(message: str, code: str | None) -> None:
    error = http_error(400, _error("invalid_request_error", message), {})
    assert (error.status, error.type, error.code, error.message) == (
        400, "invalid_request_error", code, message,
    )  # fmt: skip


def test_every_cut_of_a_whole_answer_matches() -> None:
    """A small exhaustive check: every two-cut split of the text stream decodes alike."""
    raw = b"".join(frame(e) for e in TEXT)
    expected = decode(TEXT)[0]
    for a, b in itertools.combinations(range(1, len(raw), 11), 2):
        decoder = MessagesDecoder()
        out: list[Delta] = []
        for read in (raw[:a], raw[a:b], raw[b:]):
            out += decoder.feed(read)
            while decoder.pending:
                out += decoder.take()
        out += decoder.end(EndCause.CLEAN)
        assert expand(out) == expected, (a, b)


def test_llamacpps_stream_every_block_stopped_at_the_end_and_unsigned_thinking() -> None:
    """As llama-server streams it (seen against the real one): the usage's input split into
    `input_tokens` and `cache_read_input_tokens`, tool_use starts without `input`, thinking
    with an empty signature, and every block's stop after the last block's deltas."""
    events = [
        start({"cache_read_input_tokens": 167, "input_tokens": 1, "output_tokens": 0}),
        block(0, {"type": "thinking", "thinking": ""}),
        delta(0, {"type": "thinking_delta", "thinking": "hmm"}),
        block(1, {"type": "text", "text": ""}),
        delta(1, {"type": "text_delta", "text": "ok"}),
        block(2, {"type": "tool_use", "id": "xDufc1kvFtfTZVhh", "name": "mcp__docs__search"}),
        delta(2, {"type": "input_json_delta", "partial_json": '{"q":"/'}),
        delta(2, {"type": "input_json_delta", "partial_json": '-quote" }'}),
        stop(0),
        stop(1),
        stop(2),
        *end("tool_use", {"output_tokens": 60}),
    ]
    deltas, _ = decode(events)
    assert not any(isinstance(d, ReasoningBlob) for d in deltas)  # nothing signed to keep
    assert deltas[:3] == [
        ReasoningDelta("hmm"),
        TextDelta("ok"),
        ToolCallDelta(0, "xDufc1kvFtfTZVhh", "mcp__docs__search"),
    ]
    assert (
        "".join(d.arguments for d in deltas if isinstance(d, ToolCallDelta)) == '{"q":"/-quote" }'
    )
    assert deltas[-2:] == [
        Usage(input_tokens=168, output_tokens=60, cached_tokens=167),
        Finish("tool_calls"),
    ]


def test_a_run_is_placed_by_the_block_it_started_after_whenever_it_stops() -> None:
    events = [
        start(),
        block(0, {"type": "tool_use", "id": "t1", "name": "a", "input": {}}),
        block(1, {"type": "thinking", "thinking": "late", "signature": "S"}),
        stop(0),
        stop(1),
        *end("tool_use"),
    ]
    (blob,) = [d for d in decode(events)[0] if isinstance(d, ReasoningBlob)]
    (run,) = thinking_runs(blob.encrypted_content) or []
    assert run.after == "t1"


# -- the per-token path against the plain one ---------------------------------------------


class PlainDecoder(MessagesDecoder):
    """The decoder that never learns a shape: every event parsed whole (the reference)."""

    __slots__ = ()

    def _payloads(self) -> MessagesEventDecoder:
        return MessagesEventDecoder(lessons=0)


_PIECES = ["a", "tok ", "\\", '"', "é", "日本", "\n", "\u2028", "{}", '","x":"', "}}", " "]


def _encoded(event: dict[str, Any], rng: random.Random) -> bytes:
    """An event as some encoder wrote it: compact, or spaced, or keys in another order."""
    style = rng.random()
    if style < 0.7:
        data = orjson.dumps(event)
    elif style < 0.85:
        data = json.dumps(event, ensure_ascii=rng.random() < 0.5).encode()
    else:
        data = orjson.dumps(dict(reversed(list(event.items()))))
    return b"event: " + event["type"].encode() + b"\ndata: " + data + b"\n\n"


def _random_stream(rng: random.Random) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [start()]
    for index in range(rng.randint(1, 6)):
        kind = rng.choice(["text", "thinking", "tool_use"])
        if kind == "text":
            events.append(block(index, {"type": "text", "text": ""}))
        elif kind == "thinking":
            events.append(block(index, {"type": "thinking", "thinking": "", "signature": ""}))
        else:
            events.append(
                block(index, {"type": "tool_use", "id": f"t{index}", "name": "f", "input": {}})
            )
        field, dtype = {"text": ("text", "text_delta"), "thinking": ("thinking", "thinking_delta"),
                        "tool_use": ("partial_json", "input_json_delta")}[kind]  # fmt: skip
        for _ in range(rng.randint(0, 12)):
            piece = "".join(rng.choice(_PIECES) for _ in range(rng.randint(0, 3)))
            at = index if rng.random() < 0.95 else rng.randint(0, index + 1)  # a stray index
            events.append(delta(at, {"type": dtype, field: piece}))
        if kind == "thinking":
            events.append(delta(index, {"type": "signature_delta", "signature": "S"}))
        events.append(stop(index))
        if rng.random() < 0.2:  # a late delta of the stopped block
            events.append(delta(index, {"type": dtype, field: "late"}))
    return events + end(rng.choice(["end_turn", "tool_use", "max_tokens"]))


def _feed(decoder: MessagesDecoder, raw: bytes, cuts: list[int]) -> list[Delta]:
    out: list[Delta] = []
    for a, b in itertools.pairwise([0, *cuts, len(raw)]):
        out += decoder.feed(raw[a:b])
        while decoder.pending:
            out += decoder.take()
    return expand(out + decoder.end(EndCause.CLEAN))


def test_the_learnt_shapes_decode_as_the_plain_path_does() -> None:
    rng = random.Random(29)
    learnt = 0
    for _ in range(400):
        raw = b"".join(_encoded(e, rng) for e in _random_stream(rng))
        cuts = sorted(rng.sample(range(1, len(raw)), min(len(raw) - 1, rng.randint(0, 6))))
        fast, plain = MessagesDecoder(), PlainDecoder()
        assert _feed(fast, raw, cuts) == _feed(plain, raw, cuts), raw
        learnt += fast._chat._shape is not NO_SHAPE or fast._chat._lessons < 8  # type: ignore[attr-defined]
    assert learnt > 100  # the fast path was taken, not only the plain one


# -- what a backend may make the decoder keep ---------------------------------------------


def test_more_thinking_blocks_than_kept_fail_the_turn() -> None:
    from streamer.upstream.anthropic.decoder import MAX_THINKING_BLOCKS, THINKING_LIMIT

    events = [start()]
    for i in range(MAX_THINKING_BLOCKS + 1):
        events += [block(i, {"type": "redacted_thinking", "data": f"d{i}"}), stop(i)]
    deltas, decoder = decode(events)
    assert decoder.failed and isinstance(deltas[-1], UpstreamError)
    assert deltas[-1].code == THINKING_LIMIT and "thinking blocks" in deltas[-1].message
    assert sum(isinstance(d, ReasoningBlob) for d in deltas) == MAX_THINKING_BLOCKS


def test_kept_thinking_past_what_a_seal_holds_fails_the_turn() -> None:
    from streamer.core.sealing import MAX_PLAIN_BYTES
    from streamer.upstream.anthropic.decoder import MAX_THINKING_CHARS, THINKING_LIMIT

    assert MAX_THINKING_CHARS < MAX_PLAIN_BYTES  # what is kept still seals with its text
    big = "x" * (MAX_THINKING_CHARS // 2 + 1)
    events = [start()]
    for i in range(2):
        events += [block(i, {"type": "redacted_thinking", "data": big}), stop(i)]
    deltas, _ = decode(events)
    assert deltas[-1].code == THINKING_LIMIT  # type: ignore[union-attr]
    endless = [start(), block(0, {"type": "thinking", "thinking": "", "signature": ""})]
    endless += [delta(0, {"type": "signature_delta", "signature": big}) for _ in range(3)]
    deltas, _ = decode(endless)
    assert deltas[-1].code == THINKING_LIMIT and "signature" in deltas[-1].message  # type: ignore[union-attr]


def test_a_whole_input_nested_past_what_a_client_may_send_back_fails_the_turn() -> None:
    from streamer.core.json_bounds import MAX_ITEM_DEPTH

    deep: Any = {}
    for _ in range(MAX_ITEM_DEPTH + 1):
        deep = {"a": deep}
    events = [
        start(),
        block(0, {"type": "tool_use", "id": "t", "name": "f", "input": deep}),
        stop(0),
    ]
    deltas, decoder = decode(events)
    assert decoder.failed and "levels deep" in deltas[-1].message  # type: ignore[union-attr]
