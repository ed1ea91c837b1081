"""The Anthropic Messages lowering (issue 29), with plain values: a Responses request and its
items -> the `POST /v1/messages` body (streamer/upstream/anthropic/request.py, lowering.py)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from streamer.core.backend_tools import BACKEND_BLOB
from streamer.core.errors import RequestError
from streamer.core.lowering import LoweringOptions, normalize_input
from streamer.core.tools import ResponsesToolNames
from streamer.upstream.anthropic.blocks import ThinkingRun, thinking_blob, thinking_runs
from streamer.upstream.anthropic.lowering import NO_OUTPUT, OPENING, tool_id
from streamer.upstream.anthropic.request import (
    CACHE_MIN_CHARS,
    EPHEMERAL,
    compaction_request,
    lower_messages,
)

NAMESPACE = {
    "type": "namespace",
    "name": "mcp__docs",
    "description": "Docs.",
    "tools": [
        {
            "type": "function",
            "name": "search",
            "description": "Search the docs.",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        }
    ],
}
EXEC = {"type": "function", "name": "exec_command", "parameters": {"type": "object"}}
SIG = "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds"


def lowered(request: dict[str, Any], profile: str = "generic", **options: Any) -> dict[str, Any]:
    items = normalize_input(request.get("input"))
    names = ResponsesToolNames.convert(request.get("tools"), items)
    return lower_messages(request, items, names, LoweringOptions(profile=profile, **options))


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def call(call_id: str, name: str, arguments: str, namespace: str | None = None) -> dict[str, Any]:
    item = {"type": "function_call", "call_id": call_id, "name": name, "arguments": arguments}
    return {**item, "namespace": namespace} if namespace else item


def output(call_id: str, text: Any) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": text}


def test_text_system_and_the_required_max_tokens() -> None:
    body = lowered(
        {
            "model": "claude-x",
            "instructions": "Be brief.",
            "input": [
                {"type": "message", "role": "developer", "content": "Use metric units."},
                user("Hi"),
                user(" \n"),  # blank: the API refuses such a text block
                user("How tall is Everest?"),
            ],
        }
    )
    assert body["model"] == "claude-x"
    assert body["max_tokens"] == 8192  # generic's default
    assert body["system"] == [{"type": "text", "text": "Be brief.\n\nUse metric units."}]
    assert body["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Hi"},
                {"type": "text", "text": "How tall is Everest?"},
            ],
        }
    ]
    assert "thinking" not in body and "tools" not in body


def test_max_tokens_from_the_request_then_the_model_then_the_profile() -> None:
    request = {"model": "m", "input": "hi"}
    assert lowered({**request, "max_output_tokens": 77})["max_tokens"] == 77
    assert lowered(request, max_output_tokens=5000)["max_tokens"] == 5000
    assert lowered(request, "anthropic")["max_tokens"] == 32000
    assert lowered(request, "llamacpp")["max_tokens"] == 4096


def test_a_namespaced_call_and_its_output_are_a_tool_use_and_a_tool_result() -> None:
    body = lowered(
        {
            "model": "m",
            "tools": [NAMESPACE, EXEC],
            "input": [
                user("find it"),
                call("call:1/x", "search", '{"q": "ns"}', namespace="mcp__docs"),
                output("call:1/x", "found"),
                user("thanks"),
            ],
        }
    )
    flat = "mcp__docs__search"
    assert body["tools"] == [
        {
            "name": flat,
            "description": "Docs.\n\nSearch the docs.",  # the naming core's: namespace first
            "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
        {"name": "exec_command", "input_schema": {"type": "object"}},
    ]
    assert body["tool_choice"] == {"type": "auto"}
    use_id = tool_id("call:1/x")
    assert use_id == "call_1_x"
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "find it"}]},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": use_id, "name": flat, "input": {"q": "ns"}}],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": use_id, "content": "found"},
                {"type": "text", "text": "thanks"},
            ],
        },
    ]


def test_results_open_the_user_message_in_the_calls_order_and_gaps_are_said() -> None:
    body = lowered(
        {
            "model": "m",
            "tools": [EXEC],
            "input": [
                user("go"),
                {"type": "message", "role": "assistant", "content": "Running two."},
                call("a", "exec_command", '{"cmd": "ls"}'),
                call("b", "exec_command", "{}"),
                user("(meanwhile)"),
                output("b", "B"),
                output("stray", "S"),
            ],
        }
    )
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    assistant, answer = body["messages"][1]["content"], body["messages"][2]["content"]
    assert [b["type"] for b in assistant] == ["text", "tool_use", "tool_use"]
    assert answer[0] == {
        "type": "tool_result",
        "tool_use_id": "a",
        "content": NO_OUTPUT,
        "is_error": True,
    }
    assert answer[1] == {"type": "tool_result", "tool_use_id": "b", "content": "B"}
    assert answer[2] == {"type": "text", "text": "(meanwhile)"}
    assert answer[3] == {"type": "text", "text": "[Output of tool call stray]\nS"}


def test_a_history_ending_in_a_call_gets_its_missing_result() -> None:
    body = lowered(
        {"model": "m", "tools": [EXEC], "input": [user("go"), call("a", "exec_command", "")]}
    )
    assert body["messages"][1]["content"][0]["input"] == {}  # no arguments: an empty object
    assert body["messages"][-1] == {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "a", "content": NO_OUTPUT, "is_error": True}
        ],
    }


def test_arguments_that_are_not_an_object_are_dropped_with_a_note() -> None:
    body = lowered(
        {
            "model": "m",
            "tools": [EXEC],
            "input": [user("go"), call("a", "exec_command", '{"cmd": "l')],
        }
    )
    note, use = body["messages"][1]["content"]
    assert "cut off" in note["text"] and use["input"] == {}


def test_a_conversation_opening_with_the_assistant_gets_a_user_message_first() -> None:
    body = lowered(
        {"model": "m", "input": [{"role": "assistant", "content": "Hello!"}, user("hi")]}
    )
    assert body["messages"][0] == {"role": "user", "content": [{"type": "text", "text": OPENING}]}
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]


@pytest.mark.parametrize(
    ("choice", "parallel", "expected"),
    [
        ("auto", None, {"type": "auto"}),
        ("required", None, {"type": "any"}),
        ("none", False, {"type": "none"}),
        ("auto", False, {"type": "auto", "disable_parallel_tool_use": True}),
        (
            {"type": "function", "name": "exec_command"},
            False,
            {"type": "tool", "name": "exec_command", "disable_parallel_tool_use": True},
        ),
    ],
)
def test_tool_choice(choice: Any, parallel: bool | None, expected: dict[str, Any]) -> None:
    request = {"model": "m", "input": "hi", "tools": [NAMESPACE, EXEC], "tool_choice": choice}
    if parallel is not None:
        request["parallel_tool_calls"] = parallel
    assert lowered(request)["tool_choice"] == expected


def test_an_allowed_list_narrows_the_tools() -> None:
    choice = {
        "type": "allowed_tools",
        "mode": "required",
        "tools": [{"type": "function", "name": "exec_command"}],
    }
    body = lowered({"model": "m", "input": "hi", "tools": [NAMESPACE, EXEC], "tool_choice": choice})
    assert [t["name"] for t in body["tools"]] == ["exec_command"]
    assert body["tool_choice"] == {"type": "tool", "name": "exec_command"}


@pytest.mark.parametrize(
    ("effort", "max_tokens", "budget"),
    [("low", None, 4096), ("medium", None, 6144), ("high", 40000, 16384), ("xhigh", 2000, 1500)],
)
def test_effort_is_a_thinking_budget_that_leaves_room_for_the_answer(
    effort: str, max_tokens: int | None, budget: int
) -> None:
    request: dict[str, Any] = {"model": "m", "input": "hi", "reasoning": {"effort": effort}}
    if max_tokens:
        request["max_output_tokens"] = max_tokens
    body = lowered(request)
    assert body["thinking"] == {"type": "enabled", "budget_tokens": budget}


def test_no_thinking_when_it_cannot_fit_is_not_wanted_or_a_tool_is_forced() -> None:
    base: dict[str, Any] = {"model": "m", "input": "hi", "reasoning": {"effort": "high"}}
    assert "thinking" not in lowered({**base, "max_output_tokens": 1200})
    assert "thinking" not in lowered({**base, "reasoning": {"effort": "none"}})
    assert "thinking" not in lowered(base, "vllm")
    forced = {**base, "tools": [EXEC], "tool_choice": "required"}
    assert "thinking" not in lowered(forced)
    kept = lowered({**base, "temperature": 0.2, "top_p": 0.5})
    assert "thinking" in kept and "temperature" not in kept and "top_p" not in kept


def test_adaptive_models_take_an_effort_not_a_budget() -> None:
    request = {"model": "claude-opus-4-7", "input": "hi", "reasoning": {"effort": "xhigh"}}
    body = lowered(request, "anthropic")
    assert body["thinking"] == {"type": "adaptive"}
    assert body["output_config"] == {"effort": "high"}
    older = lowered({**request, "model": "claude-sonnet-4-5"}, "anthropic")
    assert older["thinking"]["type"] == "enabled"


def _signed(after: str | None, text: str, signature: str = SIG) -> ThinkingRun:
    return ThinkingRun(after, ({"type": "thinking", "thinking": text, "signature": signature},))


def test_sealed_thinking_goes_back_as_it_came_before_its_tool_use() -> None:
    redacted = {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"}
    first = _signed(None, "Let me look.")
    first = ThinkingRun(None, (*first.blocks, redacted))
    later = _signed("toolu_1", "Now the second.", "SIG2")
    blob = thinking_blob([first, later])
    assert thinking_runs(blob) == [first, later]
    reasoning = {"type": "reasoning", "summary": [], BACKEND_BLOB: blob}
    body = lowered(
        {
            "model": "m",
            "tools": [EXEC],
            "reasoning": {"effort": "low"},
            "input": [
                user("go"),
                reasoning,
                call("toolu_1", "exec_command", '{"cmd": "a"}'),
                call("toolu_2", "exec_command", '{"cmd": "b"}'),
                {**reasoning, "id": "rs_2"},  # the later blob holds every run: the last wins
                output("toolu_1", "A"),
                output("toolu_2", "B"),
            ],
        }
    )
    content = body["messages"][1]["content"]
    assert [b["type"] for b in content] == [
        "thinking",
        "redacted_thinking",
        "tool_use",
        "thinking",
        "tool_use",
    ]
    assert content[0] == {"type": "thinking", "thinking": "Let me look.", "signature": SIG}
    assert content[1] == redacted
    assert content[3]["signature"] == "SIG2"
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 4096}


def test_readable_reasoning_without_a_signature_only_where_the_profile_reads_it() -> None:
    reasoning = {
        "type": "reasoning",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": "hmm"}],
    }
    request = {
        "model": "m",
        "input": [user("a"), reasoning, {"role": "assistant", "content": "b"}, user("c")],
    }
    generic = lowered(request)["messages"][1]["content"]
    assert generic == [{"type": "text", "text": "b"}]
    llama = lowered(request, "llamacpp")["messages"][1]["content"]
    assert llama[0] == {"type": "thinking", "thinking": "hmm", "signature": ""}


def test_a_tool_loop_whose_call_had_no_thinking_turns_budgeted_thinking_off() -> None:
    request = {
        "model": "m",
        "tools": [EXEC],
        "reasoning": {"effort": "medium"},
        "input": [user("go"), call("a", "exec_command", "{}"), output("a", "done")],
    }
    assert "thinking" not in lowered(request)
    answered = {
        **request,
        "input": [*request["input"], {"role": "assistant", "content": "ok"}, user("more")],
    }
    assert "thinking" in lowered(answered)


def test_images_files_and_a_bad_data_url() -> None:
    content = [
        {"type": "input_text", "text": "look"},
        {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="},
        {"type": "input_image", "image_url": "https://example.com/cat.jpg"},
        {
            "type": "input_file",
            "file_data": "data:application/pdf;base64,JVBERi0=",
            "filename": "a.pdf",
        },
    ]
    request = {"model": "m", "input": [{"type": "message", "role": "user", "content": content}]}
    blocks = lowered(request, "anthropic")["messages"][0]["content"]
    assert blocks[1] == {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
    }
    assert blocks[2] == {
        "type": "image",
        "source": {"type": "url", "url": "https://example.com/cat.jpg"},
    }
    assert blocks[3]["type"] == "document"
    assert lowered(request)["messages"][0]["content"][3]["type"] == "text"  # generic: a note
    bad = [{"type": "input_image", "image_url": "data:image/png,notbase64"}]
    with pytest.raises(RequestError) as err:
        lowered({"model": "m", "input": [{"type": "message", "role": "user", "content": bad}]})
    assert err.value.param == "input[0].content[0].image_url"


def test_images_in_a_tool_output_stay_in_its_tool_result() -> None:
    image = {"type": "input_image", "image_url": "data:image/jpeg;base64,/9j/4AAQ"}
    request = {
        "model": "m",
        "tools": [EXEC],
        "input": [
            user("see"),
            call("a", "exec_command", "{}"),
            output("a", [{"type": "input_text", "text": "shot"}, image]),
        ],
    }
    result = lowered(request)["messages"][2]["content"][0]
    assert result["content"][0] == {"type": "text", "text": "shot"}
    assert result["content"][1]["source"]["media_type"] == "image/jpeg"
    bad = {"type": "input_image", "image_url": "data:image/bmp;base64,Qk0="}
    request["input"][-1] = output("a", [bad])
    with pytest.raises(RequestError) as err:
        lowered(request)
    assert err.value.param == "input[2].output[0].image_url"
    assert err.value.code == "unsupported_image_media_type"


def test_structured_output_where_the_profile_takes_it() -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "string"}},
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "name": "out", "schema": schema}
    request = {"model": "m", "input": "hi", "text": {"format": fmt}}
    assert lowered(request)["output_config"] == {
        "format": {"type": "json_schema", "schema": schema}
    }
    for profile, kind in (("llamacpp", "json_schema"), ("generic", "json_object")):
        asked = {**request, "text": {"format": {"type": kind, "name": "o", "schema": schema}}}
        with pytest.raises(RequestError) as err:
            lowered(asked, profile)
        assert err.value.param == "text.format.type" and err.value.status == 400


def test_sampling_stop_and_the_user_id() -> None:
    body = lowered(
        {
            "model": "m",
            "input": "hi",
            "temperature": 1.7,
            "top_p": 0.9,
            "stop": "END",
            "safety_identifier": "user-42",
        }
    )
    assert body["temperature"] == 1.0 and body["top_p"] == 0.9
    assert body["stop_sequences"] == ["END"] and body["metadata"] == {"user_id": "user-42"}
    with pytest.raises(RequestError) as err:
        lowered({"model": "m", "input": "hi", "stop": [1]})
    assert err.value.param == "stop"


def test_logprobs_are_a_400() -> None:
    with pytest.raises(RequestError) as err:
        lowered({"model": "m", "input": "hi", "top_logprobs": 2})
    assert err.value.code == "unsupported_parameter" and err.value.param == "top_logprobs"


def test_cache_breakpoints_with_a_cache_key_or_a_long_prefix_where_honoured() -> None:
    request = {
        "model": "m",
        "instructions": "Sys.",
        "tools": [EXEC],
        "input": [user("one"), {"role": "assistant", "content": "two"}, user("three")],
    }
    plain = lowered(request)
    assert "cache_control" not in str(plain)
    keyed = lowered({**request, "prompt_cache_key": "conv-1"})
    assert keyed["tools"][-1]["cache_control"] == EPHEMERAL
    assert keyed["system"][-1]["cache_control"] == EPHEMERAL
    marked = [b for m in keyed["messages"] for b in m["content"] if "cache_control" in b]
    assert [b["text"] for b in marked] == ["one", "three"]
    assert str(keyed).count("cache_control") == 4  # the API takes at most 4
    long = lowered({**request, "instructions": "x" * CACHE_MIN_CHARS})
    assert long["system"][-1]["cache_control"] == EPHEMERAL
    assert "cache_control" not in str(lowered({**request, "prompt_cache_key": "k"}, "llamacpp"))


def test_a_compaction_turn_keeps_the_tools_declared_but_calls_none() -> None:
    items = normalize_input(
        [
            user("go"),
            call("a", "exec_command", "{}"),
            output("a", "A"),
            {"type": "compaction_trigger"},
        ]
    )
    request = {"model": "m", "tools": [EXEC], "text": {"format": {"type": "json_object"}}}
    names = ResponsesToolNames.convert(request["tools"], items)
    body = compaction_request(request, items, names, LoweringOptions())
    assert body["tool_choice"] == {"type": "none"} and body["tools"]
    last = body["messages"][-1]
    assert last["role"] == "user" and "handover note" in last["content"][-1]["text"]
    assert last["content"][0]["type"] == "tool_result"  # the results still open it


def test_a_history_with_calls_but_no_tools_declares_what_it_calls_and_calls_none() -> None:
    body = lowered(
        {
            "model": "m",
            "input": [
                user("go"),
                call("a", "search", "{}", namespace="mcp__docs"),
                output("a", "A"),
                user("more"),
            ],
        }
    )
    assert body["tools"] == [{"name": "mcp__docs__search", "input_schema": {"type": "object"}}]
    assert body["tool_choice"] == {"type": "none"}
    assert "tools" not in lowered({"model": "m", "input": "hi"})


def test_a_messages_backends_error_words_are_scrubbed_where_they_enter() -> None:
    """The key the gateway sent, quoted back in an `error` event or a 2xx error body, never
    reaches the client (whole keys, as for the other kinds: streamer/core/scrub.py)."""
    from streamer.core.deltas import UpstreamError
    from streamer.upstream.anthropic.stream import MessagesDecoder, decode_message_body

    key = "sk-ant-secret-0123456789"
    error = {"type": "error", "error": {"type": "api_error", "message": f"bad key {key}"}}
    raw = orjson.dumps(error)
    (whole,) = decode_message_body(raw, (key,))
    decoder = MessagesDecoder(secrets=(key,))
    streamed = decoder.feed(b"event: error\ndata: " + raw + b"\n\n")
    while decoder.pending:
        streamed += decoder.take()
    for delta in (whole, *streamed):
        assert isinstance(delta, UpstreamError) and key not in delta.message
        assert "bad key [redacted]" in delta.message
