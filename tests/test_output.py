"""OutputItemStreamer with plain values: deltas in, events out, no event loop."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from sdk_models import validate_event, validate_response

from streamer.core.deltas import (
    Finish,
    ReasoningDelta,
    RefusalDelta,
    TextDelta,
    ToolCallDelta,
    UpstreamError,
    Usage,
)
from streamer.core.output import OutputItemStreamer
from streamer.core.response import new_response
from streamer.core.tools import ResponsesToolNames

TOOLS: list[dict[str, Any]] = [
    {
        "type": "namespace",
        "name": "mcp__docs",
        "description": "Docs.",
        "tools": [
            {"type": "function", "name": "search", "parameters": {"type": "object"}},
            {"type": "custom", "name": "patch", "description": "Apply a patch."},
        ],
    },
    {
        "type": "namespace",
        "name": "crm",
        "description": "CRM.",
        "tools": [{"type": "function", "name": "lookup", "parameters": {"type": "object"}}],
    },
    {"type": "function", "name": "exec_command", "parameters": {"type": "object"}},
    {"type": "tool_search", "execution": "client", "parameters": {"type": "object"}},
]


def run(
    *batches: list[Any], tools: list[dict[str, Any]] = TOOLS, end: str = "finish"
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Feed batches through a fresh streamer; return decoded events and the final response."""
    names = ResponsesToolNames.convert(tools)
    streamer = OutputItemStreamer(names, new_response({"model": "m", "tools": tools}))
    encoded = streamer.start()
    for batch in batches:
        encoded += streamer.feed(batch)
    encoded += streamer.finish() if end == "finish" else []
    events = []
    for event in encoded:
        validate_event(event.data)  # every event is a valid SDK event
        decoded = orjson.loads(event.data)
        assert decoded["type"] == event.type and decoded["sequence_number"] == event.seq
        events.append(decoded)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    validate_response(streamer.response)
    return events, streamer.response


def types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"].removeprefix("response.") for e in events]


def test_text_answer_follows_ordering_a() -> None:
    events, response = run([TextDelta("Hel"), TextDelta("lo")], [Finish("stop"), Usage(5, 2)])
    assert types(events) == [
        "created", "in_progress", "output_item.added", "content_part.added",
        "output_text.delta", "output_text.delta", "output_text.done", "content_part.done",
        "output_item.done", "completed",
    ]  # fmt: skip
    assert events[6]["text"] == "Hello"
    assert events[8]["item"]["content"][0]["text"] == "Hello"
    assert response["status"] == "completed"
    assert response["output"][0]["id"].startswith("msg_")
    assert response["usage"] == {
        "input_tokens": 5,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": 2,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 7,
    }
    assert isinstance(response["created_at"], int) and isinstance(response["completed_at"], int)
    assert (
        events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    )


def test_reasoning_then_text() -> None:
    events, response = run([ReasoningDelta("think"), ReasoningDelta("ing"), TextDelta("ok")])
    assert types(events)[2:9] == [
        "output_item.added", "content_part.added", "reasoning_text.delta",
        "reasoning_text.delta", "reasoning_text.done", "content_part.done", "output_item.done",
    ]  # fmt: skip
    assert events[6]["text"] == "thinking"
    reasoning, message = response["output"]
    assert reasoning["type"] == "reasoning" and reasoning["id"].startswith("rs_")
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "thinking"}]
    assert message["type"] == "message" and message["content"][0]["text"] == "ok"
    assert [e["output_index"] for e in events if e["type"] == "response.output_item.added"] == [
        0,
        1,
    ]


def test_namespaced_call_restores_name_and_namespace_everywhere() -> None:
    events, response = run(
        [ToolCallDelta(0, "call_1", "mcp__docs__search", '{"q":')],
        [ToolCallDelta(0, None, None, '"x"}')],
        [Finish("tool_calls")],
    )
    assert types(events) == [
        "created", "in_progress", "output_item.added", "function_call_arguments.delta",
        "function_call_arguments.delta", "function_call_arguments.done", "output_item.done",
        "completed",
    ]  # fmt: skip
    added, done_args, done = events[2]["item"], events[5], events[6]["item"]
    for item in (added, done, response["output"][0]):
        assert item["name"] == "search" and item["namespace"] == "mcp__docs"
        assert item["call_id"] == "call_1" and item["id"].startswith("fc_")
    assert added["arguments"] == "" and added["status"] == "in_progress"
    assert done_args["arguments"] == '{"q":"x"}'
    assert (done_args["name"], done_args["namespace"]) == ("search", "mcp__docs")
    assert done["status"] == "completed" and done["arguments"] == '{"q":"x"}'


def test_interleaved_parallel_calls_come_out_whole_and_in_order() -> None:
    events, response = run(
        [
            ToolCallDelta(0, "call_a", "mcp__docs__search", ""),
            ToolCallDelta(1, "call_b", "crm__lookup", ""),
        ],
        [ToolCallDelta(0, None, None, '{"q"'), ToolCallDelta(1, None, None, '{"id"')],
        [ToolCallDelta(1, None, None, ":1}"), ToolCallDelta(0, None, None, ':"x"}')],
        [Finish("tool_calls")],
    )
    open_item = None
    for e in events:  # never two items open at once
        if e["type"] == "response.output_item.added":
            assert open_item is None
            open_item = e["item"]["id"]
        elif e["type"] == "response.output_item.done":
            assert e["item"]["id"] == open_item
            open_item = None
        elif e["type"].startswith("response.function_call_arguments"):
            assert e["item_id"] == open_item
    first, second = response["output"]
    assert (first["namespace"], first["name"], first["arguments"]) == (
        "mcp__docs",
        "search",
        '{"q":"x"}',
    )
    assert (second["namespace"], second["name"], second["arguments"]) == (
        "crm",
        "lookup",
        '{"id":1}',
    )
    assert first["call_id"] == "call_a" and second["call_id"] == "call_b"
    assert [e["output_index"] for e in events if e["type"] == "response.output_item.done"] == [0, 1]


def test_call_is_added_only_once_its_name_is_complete() -> None:
    events, response = run(
        [ToolCallDelta(0, "call_1", "mcp__do", "")],
        [ToolCallDelta(0, None, "cs__sea", "")],
        [ToolCallDelta(0, None, "rch", "")],
        [ToolCallDelta(0, None, None, "{}")],
    )
    added = [e for e in events if e["type"] == "response.output_item.added"]
    assert len(added) == 1
    assert (added[0]["item"]["name"], added[0]["item"]["namespace"]) == ("search", "mcp__docs")
    assert response["output"][0]["arguments"] == "{}"


def test_repeated_full_name_on_every_fragment_is_not_doubled() -> None:
    _, response = run(
        [ToolCallDelta(0, "c", "exec_command", "")],
        [ToolCallDelta(0, "c", "exec_command", "{}")],
    )
    assert response["output"][0]["name"] == "exec_command"
    assert "namespace" not in response["output"][0]


def test_custom_tool_in_namespace_becomes_custom_tool_call() -> None:
    events, response = run(
        [ToolCallDelta(0, "call_p", "mcp__docs__patch", '{"input": "*** Begin')],
        [ToolCallDelta(0, None, None, ' Patch"}')],
    )
    assert types(events)[2:6] == [
        "output_item.added", "custom_tool_call_input.delta", "custom_tool_call_input.done",
        "output_item.done",
    ]  # fmt: skip
    item = response["output"][0]
    assert item["type"] == "custom_tool_call" and item["id"].startswith("ctc_")
    assert (item["namespace"], item["name"], item["input"]) == (
        "mcp__docs",
        "patch",
        "*** Begin Patch",
    )
    assert events[4]["input"] == "*** Begin Patch"


def test_tool_search_call_carries_object_arguments() -> None:
    _, response = run([ToolCallDelta(0, "call_s", "tool_search", '{"query":"cal","limit":3}')])
    item = response["output"][0]
    assert item["type"] == "tool_search_call" and item["execution"] == "client"
    assert item["arguments"] == {"query": "cal", "limit": 3} and item["call_id"] == "call_s"


def test_unknown_flat_name_passes_through_untouched() -> None:
    _, response = run([ToolCallDelta(0, "c", "not_declared__x", "{}")])
    assert response["output"][0]["name"] == "not_declared__x"
    assert "namespace" not in response["output"][0]


def test_text_then_call_closes_the_message_first() -> None:
    events, response = run(
        [TextDelta("Let me look.")], [ToolCallDelta(0, "c", "crm__lookup", "{}")]
    )
    assert [i["type"] for i in response["output"]] == ["message", "function_call"]
    assert types(events).index("output_item.done") < types(events).index(
        "function_call_arguments.delta"
    )


def test_text_arriving_after_a_call_is_kept_after_it() -> None:
    _, response = run([ToolCallDelta(0, "c", "crm__lookup", "{}")], [TextDelta("done")])
    assert [i["type"] for i in response["output"]] == ["function_call", "message"]
    assert response["output"][1]["content"][0]["text"] == "done"


def test_missing_and_duplicate_call_ids_are_replaced() -> None:
    _, response = run(
        [ToolCallDelta(0, None, "crm__lookup", "{}"), ToolCallDelta(1, None, "exec_command", "{}")],
        [
            ToolCallDelta(2, "dup", "exec_command", "{}"),
            ToolCallDelta(3, "dup", "exec_command", "{}"),
        ],
    )
    ids = [item["call_id"] for item in response["output"]]
    assert len(set(ids)) == 4 and all(ids)


def test_refusal() -> None:
    events, response = run([RefusalDelta("I can"), RefusalDelta("not.")])
    assert "refusal.delta" in types(events) and "refusal.done" in types(events)
    assert response["output"][0]["content"] == [{"type": "refusal", "refusal": "I cannot."}]
    assert response["status"] == "completed"


def test_length_ends_incomplete_with_items_incomplete() -> None:
    events, response = run([TextDelta("trunc")], [Finish("length")])
    assert events[-1]["type"] == "response.incomplete"
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert response["output"][0]["status"] == "incomplete"
    assert response["usage"] is not None


def test_backend_error_mid_stream_fails_the_response() -> None:
    events, response = run(
        [TextDelta("partial")], [UpstreamError("server_error", "backend died")], end="none"
    )
    assert events[-1]["type"] == "response.failed"
    assert response["error"] == {
        "code": "server_error",
        "message": "backend died",
        "type": "server_error",
    }
    assert response["output"][0]["status"] == "incomplete"
    assert [e["type"] for e in events].count("response.output_item.done") == 1


def test_nothing_after_the_terminal_event() -> None:
    names = ResponsesToolNames.convert([])
    streamer = OutputItemStreamer(names, new_response({"model": "m"}))
    streamer.start()
    streamer.finish()
    assert streamer.done
    assert streamer.feed([TextDelta("late")]) == [] and streamer.finish() == []
    assert streamer.fail("x", "y") == []


@pytest.mark.parametrize("n", [1, 7])
def test_item_ids_are_unique_and_stable(n: int) -> None:
    batches = [[ToolCallDelta(i, f"c{i}", "exec_command", "{}")] for i in range(n)]
    events, response = run(*batches)
    added = {
        e["item"]["id"]: e["item"]["call_id"] for e in events if e["type"].endswith("item.added")
    }
    done = {
        e["item"]["id"]: e["item"]["call_id"] for e in events if e["type"].endswith("item.done")
    }
    assert added == done == {i["id"]: i["call_id"] for i in response["output"]}
    assert len(added) == n


def test_text_buffer_keeps_every_piece_in_order_across_joins() -> None:
    from streamer.core.output_items import TextBuffer

    pieces = [f"{i}é " for i in range(TextBuffer.JOIN * 3 + 5)]
    buffer = TextBuffer()
    for piece in pieces:
        buffer.write(piece)
        assert buffer.getvalue().endswith(piece)
    assert buffer.getvalue() == "".join(pieces)


def test_long_text_stays_compact_while_it_streams_and_is_whole_at_the_end() -> None:
    pieces = [f"w{i} " for i in range(1000)]
    s = OutputItemStreamer(ResponsesToolNames.convert([]), new_response({"model": "m"}))
    s.start()
    deltas: list[Any] = []
    for start in range(0, len(pieces), 100):
        deltas += s.feed([TextDelta(p) for p in pieces[start : start + 100]])
        hot = s._hot
        assert hot is not None and len(hot.text.pieces) < hot.text.JOIN
    texts = [orjson.loads(e.data)["delta"] for e in deltas if e.type.endswith("text.delta")]
    assert texts == pieces
    done = [orjson.loads(e.data) for e in s.finish() if e.type == "response.output_text.done"]
    assert done[0]["text"] == "".join(pieces)
