"""Lowering: Responses request -> Chat Completions request (pure, plain values)."""

from __future__ import annotations

import itertools
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamer.core.call_kinds import CALL_TYPES
from streamer.core.errors import RequestError
from streamer.core.lowering import LoweringOptions, lower, normalize_input, public_output_to_input
from streamer.core.tools import ResponsesToolNames

# The client asks the backend to stream (upstream/chat/client.py, tested there); lowering
# leaves it out, so the client's own `stream`/`stream_options` never reach the backend.
STREAM: dict[str, object] = {}
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
SEARCH = {"type": "object", "properties": {"q": {"type": "string"}}}
DOCS_NS = {
    "type": "namespace",
    "name": "mcp__docs",
    "description": "Tools in the mcp__docs namespace.",
    "tools": [
        {"type": "function", "name": "search", "description": "Search docs", "parameters": SEARCH},
        {"type": "custom", "name": "patch", "description": "Apply a patch"},
    ],
}
WEATHER_FN = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather",
    "parameters": WEATHER,
    "strict": True,
}


def run(request: dict[str, Any], options: LoweringOptions | None = None) -> dict[str, Any]:
    """The pipeline's order: normalise input, convert tools over the items, lower."""
    items = normalize_input(request.get("input"))
    names = ResponsesToolNames.convert(request.get("tools"), items)
    return lower(request, items, names, options or LoweringOptions())


def messages(input_: Any, **request: Any) -> list[dict[str, Any]]:
    return run({"model": "m", "input": input_, **request})["messages"]


def user(*parts: dict[str, Any] | str) -> dict[str, Any]:
    content = [{"type": "input_text", "text": p} if isinstance(p, str) else p for p in parts]
    return {"type": "message", "role": "user", "content": content}


def assistant(text: str, **extra: Any) -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": []}]
    return {"type": "message", "role": "assistant", "content": content, **extra}


_TEXT = {"type": "input_text", "text": "a"}


def fc(call_id: str, name: str, arguments: str = "{}", **extra: Any) -> dict[str, Any]:
    return {
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    } | extra


def fco(call_id: str, output: Any) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": output}


def tc(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


# -- normalize_input ----------------------------------------------------------------------


def test_string_input_is_one_user_message() -> None:
    assert normalize_input("hi") == [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
    ]
    assert messages("hi") == [{"role": "user", "content": "hi"}]


def test_absent_input_is_empty() -> None:
    assert normalize_input(None) == []


def test_bare_message_gains_type_and_keeps_fields() -> None:
    bare = {"role": "assistant", "content": "ok", "phase": "final_answer", "x-extra": 1}
    assert normalize_input([bare]) == [{**bare, "type": "message"}]


def test_unknown_items_pass_through_untouched() -> None:
    odd = {"type": "compaction", "encrypted_content": "zz", "anything": [1, {"a": None}]}
    ref = {"id": "msg_1"}  # `type` is optional on item_reference
    out = normalize_input([odd, ref])
    assert out[0] is odd and out[1] is ref
    assert normalize_input(out) == out  # idempotent


@pytest.mark.parametrize(
    ("value", "param"),
    [
        (42, "input"),
        ({"role": "user", "content": "x"}, "input"),
        (["hi"], "input[0]"),
        ([{"content": "x"}], "input[0].type"),
        ([{"type": 3}], "input[0].type"),
        ([{"type": "message", "content": "x"}], "input[0].role"),
        ([{"type": "message", "role": "robot", "content": "x"}], "input[0].role"),
        ([{"type": "message", "role": "user"}], "input[0].content"),
        ([{"role": "user", "content": 5}], "input[0].content"),
        ([{"role": "user", "content": None}], "input[0].content"),
        ([user("a"), {"role": "user", "content": ["x"]}], "input[1].content[0]"),
        (
            [user("a"), user("b"), fc("c", "f"), {"role": "user", "content": [_TEXT, {}]}],
            "input[3].content[1].type",
        ),
        ([{"role": "user", "content": [{"type": "input_audio"}]}], "input[0].content[0].type"),
        (
            [{"role": "user", "content": [{"type": "input_text", "text": 1}]}],
            "input[0].content[0].text",
        ),
        ([{"role": "user", "content": [{"type": "input_text"}]}], "input[0].content[0].text"),
        ([{"role": "assistant", "content": [{"type": "refusal"}]}], "input[0].content[0].refusal"),
        ([{"role": "user", "content": [{"type": "input_image"}]}], "input[0].content[0].image_url"),
        (
            [{"role": "user", "content": [{"type": "input_image", "image_url": {"url": "u"}}]}],
            "input[0].content[0].image_url",
        ),
        ([{"role": "user", "content": [{"type": "input_file"}]}], "input[0].content[0].file_id"),
        (
            [{"role": "user", "content": [{"type": "input_file", "file_id": "f", "filename": 3}]}],
            "input[0].content[0].filename",
        ),
        ([{"type": "function_call", "name": "f", "arguments": "{}"}], "input[0].call_id"),
        ([{"type": "function_call", "call_id": "", "name": "f"}], "input[0].call_id"),
        ([{"type": "function_call", "call_id": "c"}], "input[0].name"),
        ([fc("c", "f", arguments={"a": 1})], "input[0].arguments"),  # type: ignore[arg-type]
        ([fc("c", "f", namespace=7)], "input[0].namespace"),
        ([{"type": "custom_tool_call", "call_id": "c", "name": "p", "input": 1}], "input[0].input"),
        ([{"type": "function_call_output", "output": "x"}], "input[0].call_id"),
        ([{"type": "function_call_output", "call_id": "c"}], "input[0].output"),
        ([fco("c", 12)], "input[0].output"),
        ([fco("c", [{"type": "input_text", "text": "a"}, "b"])], "input[0].output[1]"),
        ([fco("c", [{"type": "refusal", "refusal": "no"}])], "input[0].output[0].type"),
        ([{"type": "custom_tool_call_output", "call_id": 5, "output": ""}], "input[0].call_id"),
        ([{"type": "tool_search_call", "arguments": [1]}], "input[0].arguments"),
        ([{"type": "tool_search_output", "tools": {"a": 1}}], "input[0].tools"),
    ],
)
def test_validation_errors_point_at_the_field(value: Any, param: str) -> None:
    with pytest.raises(RequestError) as caught:
        normalize_input(value)
    assert caught.value.status == 400
    assert caught.value.type == "invalid_request_error"
    assert caught.value.param == param
    assert param in caught.value.message


def test_error_path_counts_items() -> None:
    items = [user("a"), user("b"), fc("c", "f"), {"type": "function_call", "name": "f"}]
    with pytest.raises(RequestError) as caught:
        normalize_input(items)
    assert caught.value.param == "input[3].call_id"


def test_tolerated_shapes_are_accepted() -> None:
    items = [
        {"type": "message", "role": "user", "content": "x", "status": "completed", "zzz": 1},
        {"type": "function_call", "call_id": "c", "name": "f"},  # no arguments: lowers as {}
        {"type": "tool_search_call", "call_id": None, "execution": "server", "arguments": None},
        {"type": "tool_search_output", "call_id": None, "tools": None},
        {"type": "reasoning", "summary": "not even a list"},
        {"type": "additional_tools", "role": "developer", "tools": []},
        {"type": "brand_new_item", "payload": object()},
    ]
    assert normalize_input(items) == items


# -- messages -----------------------------------------------------------------------------


def test_instructions_become_the_first_system_message() -> None:
    input_ = [
        {"role": "developer", "content": "dev"},
        {"role": "system", "content": "sys"},
        user("u"),
    ]
    out = messages(input_, instructions="be brief")
    assert out == [  # merged, the default (backend profiles)
        {"role": "system", "content": "be brief\n\ndev\n\nsys"},
        {"role": "user", "content": "u"},
    ]
    request = {"model": "m", "input": input_, "instructions": "be brief"}
    out = run(request, LoweringOptions(system_messages="keep"))["messages"]
    assert out == [
        {"role": "system", "content": "be brief"},
        {"role": "system", "content": "dev"},
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "u"},
    ]


def test_empty_or_null_instructions_add_nothing() -> None:
    assert messages("x", instructions="") == [{"role": "user", "content": "x"}]
    assert messages("x", instructions=None) == [{"role": "user", "content": "x"}]
    with pytest.raises(RequestError) as caught:
        messages("x", instructions=["a"])
    assert caught.value.param == "instructions"


def test_text_only_parts_are_joined_into_a_string() -> None:
    input_ = [
        user("<env>", "do it"),
        {
            "role": "developer",
            "content": [
                {"type": "input_text", "text": "a"},
                {"type": "input_text", "text": "b"},
            ],
        },
    ]
    out = run({"model": "m", "input": input_}, LoweringOptions(system_messages="keep"))["messages"]
    assert out == [
        {"role": "user", "content": "<env>\ndo it"},
        {"role": "system", "content": "a\nb"},
    ]


def test_user_images_and_files_keep_a_part_list() -> None:
    parts = [
        {"type": "input_text", "text": "look"},
        {"type": "input_image", "image_url": "https://x/cat.png", "detail": "low"},
        {"type": "input_image", "image_url": "data:image/png;base64,AAA", "detail": "original"},
        {"type": "input_image", "image_url": "https://x/dog.png"},
        {"type": "input_image", "file_id": "file-img"},
        {"type": "input_file", "file_id": "file-pdf", "filename": "a.pdf"},
        {"type": "input_file", "file_data": "data:application/pdf;base64,JVB", "filename": "b.pdf"},
        {"type": "input_file", "file_url": "https://x/c.pdf"},
    ]
    files = LoweringOptions(file_parts=True)  # generic's and openai's; llamacpp notes them
    assert run({"model": "m", "input": [{"role": "user", "content": parts}]}, files)[
        "messages"
    ] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": "https://x/cat.png", "detail": "low"}},
                {
                    "type": "image_url",
                    "image_url": {"url": "data:image/png;base64,AAA", "detail": "high"},
                },
                {"type": "image_url", "image_url": {"url": "https://x/dog.png"}},
                {"type": "text", "text": "[image omitted: file file-img]"},
                {"type": "file", "file": {"file_id": "file-pdf", "filename": "a.pdf"}},
                {
                    "type": "file",
                    "file": {"file_data": "data:application/pdf;base64,JVB", "filename": "b.pdf"},
                },
                {"type": "text", "text": "[file omitted: https://x/c.pdf]"},
            ],
        }
    ]


def test_file_id_only_image_alone_becomes_a_string_note() -> None:
    out = messages([user("see", {"type": "input_image", "file_id": "file-1", "detail": "auto"})])
    assert out == [{"role": "user", "content": "see\n[image omitted: file file-1]"}]


def test_assistant_text_and_refusal_without_phase() -> None:
    refusal = {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "refusal", "refusal": "I can't."}],
    }
    out = messages(
        [user("q"), assistant("a1", phase="final_answer", id="msg_1"), user("r"), refusal]
    )
    assert out == [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "r"},
        {"role": "assistant", "content": "I can't."},
    ]


def test_assistant_string_and_multi_part_content() -> None:
    two = {
        "role": "assistant",
        "content": [{"type": "output_text", "text": "a"}, {"type": "output_text", "text": "b"}],
    }
    assert messages([{"role": "assistant", "content": "s"}, user("u"), two]) == [
        {"role": "assistant", "content": "s"},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": "a\nb"},
    ]


def test_consecutive_calls_become_one_assistant_message() -> None:
    items = [
        user("go"),
        assistant("Let me check."),
        fc("call_1", "search", '{"q":"x"}', namespace="mcp__docs", id="fc_1", status="completed"),
        fc("call_2", "get_weather", '{"city":"Paris"}'),
        {
            "type": "custom_tool_call",
            "call_id": "call_3",
            "name": "patch",
            "namespace": "mcp__docs",
            "input": '*** Begin Patch\n"q"',
        },
        fco("call_1", "found"),
        fco("call_2", "sunny"),
        {"type": "custom_tool_call_output", "call_id": "call_3", "output": "applied"},
    ]
    out = messages(items, tools=[WEATHER_FN, DOCS_NS])
    assert out == [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                tc("call_1", "mcp__docs__search", '{"q":"x"}'),
                tc("call_2", "get_weather", '{"city":"Paris"}'),
                tc("call_3", "mcp__docs__patch", '{"input":"*** Begin Patch\\n\\"q\\""}'),
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "found"},
        {"role": "tool", "tool_call_id": "call_2", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_3", "content": "applied"},
    ]


def test_calls_without_text_have_null_content_and_empty_arguments_become_braces() -> None:
    out = messages(
        [
            user("go"),
            fc("c1", "get_weather", ""),
            {"type": "function_call", "call_id": "c2", "name": "get_weather"},
            fco("c1", "x"),
            fco("c2", "y"),
        ],
        tools=[WEATHER_FN],
    )
    assert out[1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [tc("c1", "get_weather", "{}"), tc("c2", "get_weather", "{}")],
    }


def test_tool_output_separates_two_call_turns() -> None:
    items = [
        user("go"),
        fc("c1", "get_weather"),
        fco("c1", "x"),
        fc("c2", "get_weather"),
        fco("c2", "y"),
        assistant("done"),
    ]
    out = messages(items, tools=[WEATHER_FN])
    assert [m["role"] for m in out] == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]
    assert out[3]["tool_calls"] == [tc("c2", "get_weather", "{}")]
    assert out[5] == {"role": "assistant", "content": "done"}


def test_output_part_array_is_joined_text_with_notes() -> None:
    output = [
        {"type": "input_text", "text": "line 1"},
        {"type": "input_text", "text": "line 2"},
        {"type": "input_image", "file_id": "file-9"},
        {"type": "input_file", "filename": "r.csv", "file_data": "QQ=="},
    ]
    # (a request carrying these is refused before lowering: core/media_parts.py; history
    # replayed from the store may still hold them)
    request = {"model": "m", "input": [fc("c", "get_weather"), fco("c", output)]}
    out = run({**request, "tools": [WEATHER_FN]}, LoweringOptions(file_parts=False))["messages"]
    assert out[1] == {
        "role": "tool",
        "tool_call_id": "c",
        "content": "line 1\nline 2\n[image omitted: file file-9]\n"
        "[file omitted: r.csv; the backend takes no files]",
    }  # images with a URL: tests/test_tool_output_media.py
    assert messages([fc("c", "get_weather"), fco("c", [])], tools=[WEATHER_FN])[1]["content"] == ""


def test_tool_search_call_and_output_make_found_tools_callable() -> None:
    search_tool = {
        "type": "tool_search",
        "execution": "client",
        "description": "Find tools",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
    }
    found = {
        "type": "namespace",
        "name": "mcp__cal",
        "description": "Calendar",
        "tools": [
            {
                "type": "function",
                "name": "_create_event",
                "description": "Create",
                "defer_loading": True,
                "parameters": {"type": "object"},
            },
            {"type": "custom", "name": "raw"},
        ],
    }
    items = [
        user("book it"),
        {
            "type": "tool_search_call",
            "call_id": "call_s",
            "execution": "client",
            "arguments": {"query": "calendar", "limit": 2},
            "status": "completed",
        },
        {
            "type": "tool_search_output",
            "call_id": "call_s",
            "execution": "client",
            "status": "completed",
            "tools": [found, {"type": "web_search"}],
        },
    ]
    chat = run({"model": "m", "input": items, "tools": [search_tool]})
    assert chat["messages"][1:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [tc("call_s", "tool_search", '{"query":"calendar","limit":2}')],
        },
        {
            "role": "tool",
            "tool_call_id": "call_s",
            "content": "Loaded tools, now callable:\n- mcp__cal_create_event: Create\n- mcp__cal__raw",
        },
    ]
    offered = [t["function"]["name"] for t in chat["tools"]]
    assert offered[0] == "tool_search"
    assert sorted(offered[1:]) == ["mcp__cal__raw", "mcp__cal_create_event"]


def test_search_listing_and_replayed_calls_use_the_offered_alias() -> None:
    ns = "mcp__" + "very_long_server_name_" * 3
    found = {
        "type": "namespace",
        "name": ns,
        "description": "d",
        "tools": [{"type": "function", "name": "lookup_everything_twice"}],
    }
    items = [
        {"type": "tool_search_call", "call_id": "s", "arguments": {"query": "q"}},
        {"type": "tool_search_output", "call_id": "s", "tools": [found]},
        fc("c", "lookup_everything_twice", namespace=ns),
        fco("c", "ok"),
    ]
    chat = run({"model": "m", "input": items})
    (offered,) = [t["function"]["name"] for t in chat["tools"]]
    assert len(offered) <= 64 and offered != f"{ns}__lookup_everything_twice"
    assert chat["messages"][1]["content"] == f"Loaded tools, now callable:\n- {offered}"
    assert chat["messages"][2]["tool_calls"] == [tc("c", offered, "{}")]


def test_server_search_without_call_ids_is_paired_by_order() -> None:
    items = [
        {
            "type": "tool_search_call",
            "call_id": None,
            "execution": "server",
            "arguments": {"paths": ["crm"]},
        },
        {"type": "tool_search_output", "call_id": None, "execution": "server", "tools": []},
        {"type": "tool_search_output", "call_id": None, "tools": []},  # nothing left to answer
    ]
    out = messages(items)
    assert out[0]["tool_calls"][0]["id"] == "tool_search_0"
    assert out[1:] == [
        {"role": "tool", "tool_call_id": "tool_search_0", "content": "No tools were loaded."}
    ]


def test_unencodable_arguments_are_a_400() -> None:
    items = [user("q"), {"type": "tool_search_call", "call_id": "c", "arguments": {"n": 10**30}}]
    with pytest.raises(RequestError) as caught:
        messages(items)
    assert caught.value.param == "input[1].arguments"


def test_reasoning_replays_on_the_next_assistant_message() -> None:
    items = [
        user("q"),
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [{"type": "summary_text", "text": "s"}],
            "content": [{"type": "reasoning_text", "text": "think"}],
            "encrypted_content": "E",
        },
        fc("c1", "get_weather"),
        fco("c1", "x"),
        {
            "type": "reasoning",
            "summary": [
                {"type": "summary_text", "text": "s1"},
                {"type": "summary_text", "text": "s2"},
            ],
        },
        {"type": "reasoning", "summary": [], "encrypted_content": "only-encrypted"},
        assistant("answer"),
    ]
    out = messages(items, tools=[WEATHER_FN])
    assert out[1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [tc("c1", "get_weather", "{}")],
        "reasoning_content": "think",
    }
    assert out[3] == {"role": "assistant", "content": "answer", "reasoning_content": "s1\n\ns2"}
    off = run(
        {"model": "m", "input": items, "tools": [WEATHER_FN]},
        LoweringOptions(replay_reasoning=False),
    )["messages"]
    assert all("reasoning_content" not in m for m in off)


def test_reasoning_without_a_following_assistant_is_dropped() -> None:
    think = {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "t"}]}
    assert messages([user("a"), think, user("b"), assistant("c")]) == [
        {"role": "user", "content": "a"},
        {"role": "user", "content": "b"},
        {"role": "assistant", "content": "c"},
    ]


def test_unlowerable_items_are_dropped_not_rejected() -> None:
    items = [
        user("a"),
        {"type": "compaction", "encrypted_content": "C"},
        {"type": "additional_tools", "role": "developer", "tools": []},
        assistant("b"),
    ]
    assert messages(items) == [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
    ]


@pytest.mark.parametrize("reference", [{"type": "item_reference", "id": "msg_0"}, {"id": "msg_0"}])
def test_an_unresolved_item_reference_is_a_400_naming_it(reference: dict[str, Any]) -> None:
    # the gateway puts referenced items in (streamer/core/item_references.py) before lowering
    with pytest.raises(RequestError) as raised:
        messages([user("a"), reference])
    assert (raised.value.status, raised.value.param) == (400, "input[1].id")


# -- tools and tool_choice ----------------------------------------------------------------


def test_tools_are_flat_functions_omitting_none_fields() -> None:
    tools = [WEATHER_FN, {"type": "function", "name": "ping"}, DOCS_NS, {"type": "web_search"}]
    names = ResponsesToolNames.convert(tools, [])
    chat = lower({"model": "m", "input": "x", "tools": tools}, [], names)
    assert chat["tools"][0] == {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather",
            "parameters": WEATHER,
            "strict": True,
        },
    }
    assert chat["tools"][2] == {
        "type": "function",
        "function": {
            "name": "mcp__docs__search",
            "description": "Search docs",
            "parameters": SEARCH,
        },
    }
    custom = chat["tools"][3]["function"]
    assert custom["name"] == "mcp__docs__patch"
    assert custom["parameters"]["properties"]["input"]["type"] == "string"
    assert len(chat["tools"]) == 4  # the hosted web_search never reaches the backend
    for flat, sent in zip(names.tools, chat["tools"], strict=True):
        fields = {
            "name": flat.name,
            "description": flat.description,
            "parameters": flat.parameters,
            "strict": flat.strict,
        }
        assert sent == {
            "type": "function",
            "function": {k: v for k, v in fields.items() if v is not None},
        }
    assert chat["tool_choice"] == "auto"


def test_no_callable_tools_omits_tool_fields() -> None:
    chat = run(
        {
            "model": "m",
            "input": "x",
            "tools": [{"type": "web_search"}],
            "tool_choice": "auto",
            "parallel_tool_calls": False,
        }
    )
    assert not {"tools", "tool_choice", "parallel_tool_calls"} & chat.keys()
    assert not {"tools", "tool_choice"} & run({"model": "m", "input": "x"}).keys()


@pytest.mark.parametrize("mode", ["none", "auto", "required"])
def test_string_tool_choice_and_parallel_pass_through(mode: str) -> None:
    chat = run(
        {
            "model": "m",
            "input": "x",
            "tools": [WEATHER_FN],
            "tool_choice": mode,
            "parallel_tool_calls": False,
        }
    )
    assert chat["tool_choice"] == mode
    assert chat["parallel_tool_calls"] is False


def test_forced_namespaced_function_keeps_all_tools_as_a_named_object() -> None:
    choice = {"type": "function", "name": "search", "namespace": "mcp__docs"}
    request = {"model": "m", "input": "x", "tools": [WEATHER_FN, DOCS_NS], "tool_choice": choice}
    chat = run(request, LoweringOptions(tool_choice_object=True))
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "mcp__docs__search"}}
    assert len(chat["tools"]) == 3


def test_allowed_tools_filter_the_list() -> None:
    choice = {
        "type": "allowed_tools",
        "mode": "required",
        "tools": [
            {"type": "function", "name": "get_weather"},
            {"type": "function", "name": "search"},
        ],
    }
    chat = run({"model": "m", "input": "x", "tools": [WEATHER_FN, DOCS_NS], "tool_choice": choice})
    assert chat["tool_choice"] == "required"
    assert [t["function"]["name"] for t in chat["tools"]] == ["get_weather", "mcp__docs__search"]
    one_auto = {**choice, "mode": "auto", "tools": [{"type": "function", "name": "search"}]}
    chat = run(
        {"model": "m", "input": "x", "tools": [WEATHER_FN, DOCS_NS], "tool_choice": one_auto}
    )
    assert chat["tool_choice"] == "auto"
    assert [t["function"]["name"] for t in chat["tools"]] == ["mcp__docs__search"]


def test_bad_tool_choice_is_a_400() -> None:
    with pytest.raises(RequestError) as caught:
        run(
            {
                "model": "m",
                "input": "x",
                "tools": [WEATHER_FN],
                "tool_choice": {"type": "function", "name": "nope"},
            }
        )
    assert caught.value.status == 400


# -- sampling and dropped fields ----------------------------------------------------------


def test_sampling_fields_and_stream_are_mapped() -> None:
    request = {
        "model": "client-model",
        "input": "x",
        "max_output_tokens": 64,
        "temperature": 0.2,
        "top_p": 0.9,
        "reasoning": {"effort": "high", "summary": "auto"},
        "text": {"format": {"type": "json_object"}, "verbosity": "low"},
        "stream": False,
        "stream_options": {"include_obfuscation": False},
    }
    assert run(request) == {
        "model": "client-model",
        "messages": [{"role": "user", "content": "x"}],
        "max_tokens": 64,
        "temperature": 0.2,
        "top_p": 0.9,
        "response_format": {"type": "json_object"},
        "reasoning_effort": "high",
        **STREAM,
    }
    other = run(request, LoweringOptions(model="backend", max_tokens_field="max_completion_tokens"))
    assert other["model"] == "backend"
    assert other["max_completion_tokens"] == 64 and "max_tokens" not in other


def test_json_schema_format() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = {
        "type": "json_schema",
        "name": "thing",
        "schema": schema,
        "strict": True,
        "description": None,
    }
    chat = run({"model": "m", "input": "x", "text": {"format": fmt}})
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "thing", "schema": schema, "strict": True},
    }
    assert "response_format" not in run(
        {"model": "m", "input": "x", "text": {"format": {"type": "text"}}}
    )
    with pytest.raises(RequestError) as caught:
        run({"model": "m", "input": "x", "text": {"format": {"type": "json_schema", "name": "n"}}})
    assert caught.value.param == "text.format.schema"


def test_fields_the_generic_backend_does_not_take_are_not_sent() -> None:
    """Identifiers and hints the default profile takes none of (no `user`, no verbosity,
    tier, metadata or cache hint: tests/test_request_fields.py has what each profile sends);
    `max_tool_calls` and `truncation` are the gateway's own to apply."""
    request = {
        "model": "m",
        "input": "x",
        "user": "u",
        "safety_identifier": "s",
        "metadata": {"k": "v"},
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "pk",
        "background": False,
        "previous_response_id": "resp_1",
        "service_tier": "flex",
        "truncation": "auto",
        "client_metadata": {"a": 1},
        "max_tool_calls": 3,
        "top_logprobs": 0,
        "text": {"verbosity": "low"},
        "reasoning": {"summary": "auto"},
        "temperature": None,
    }
    assert run(request) == {"model": "m", "messages": [{"role": "user", "content": "x"}], **STREAM}


# -- end to end and continuation ----------------------------------------------------------


def test_codex_shaped_request_end_to_end() -> None:
    exec_tool = {
        "type": "function",
        "name": "exec_command",
        "description": "Run",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
        "strict": False,
    }
    tool_search = {
        "type": "tool_search",
        "execution": "client",
        "description": "Search tools",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}, "limit": {"type": "number"}},
        },
    }
    probe = {
        "type": "namespace",
        "name": "mcp__probe",
        "description": "Tools in the mcp__probe namespace.",
        "tools": [
            {
                "type": "function",
                "name": "echo_marker",
                "description": "Echo",
                "parameters": {"type": "object", "properties": {}},
            }
        ],
    }
    lite = {
        "type": "namespace",
        "name": "functions",
        "description": "",
        "tools": [{"type": "custom", "name": "exec", "description": "Exec JS"}],
    }
    calendar = {
        "type": "namespace",
        "name": "mcp__codex_apps__calendar",
        "description": "Plan",
        "tools": [
            {
                "type": "function",
                "name": "_create_event",
                "strict": False,
                "defer_loading": True,
                "description": "Create an event",
                "parameters": {"type": "object", "properties": {}},
            }
        ],
    }
    request = {
        "model": "gpt-5.5",
        "instructions": None,
        "tools": [exec_tool, tool_search, probe, {"type": "web_search"}],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "019a",
        "client_metadata": {"x": "y"},
        "reasoning": {"effort": "medium", "summary": "auto"},
        "input": [
            {
                "type": "message",
                "id": "m0",
                "role": "developer",
                "content": [{"type": "input_text", "text": "You are Codex."}],
            },
            {"type": "additional_tools", "id": "at0", "role": "developer", "tools": [lite]},
            {
                "type": "message",
                "id": "m1",
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "<environment_context/>"},
                    {"type": "input_text", "text": "Call the echo_marker tool"},
                ],
            },
            {"type": "reasoning", "id": "rs0", "summary": [], "encrypted_content": "gAAA"},
            {
                "type": "function_call",
                "id": "fc0",
                "call_id": "call_a",
                "name": "echo_marker",
                "namespace": "mcp__probe",
                "arguments": '{"marker":"M"}',
                "status": "completed",
            },
            {
                "type": "function_call_output",
                "id": "o0",
                "call_id": "call_a",
                "output": [
                    {"type": "input_text", "text": "M"},
                    {"type": "input_text", "text": "(echoed)"},
                ],
            },
            {
                "type": "tool_search_call",
                "id": "ts0",
                "call_id": "call_b",
                "execution": "client",
                "status": "completed",
                "arguments": {"query": "calendar", "limit": 1},
            },
            {
                "type": "tool_search_output",
                "id": "to0",
                "call_id": "call_b",
                "execution": "client",
                "status": "completed",
                "tools": [calendar],
            },
            {
                "type": "custom_tool_call",
                "id": "ctc0",
                "call_id": "call_c",
                "name": "exec",
                "namespace": "functions",
                "input": "1+1",
            },
            {"type": "custom_tool_call_output", "call_id": "call_c", "output": "2"},
            {
                "type": "message",
                "id": "m2",
                "role": "assistant",
                "phase": "final_answer",
                "content": [{"type": "output_text", "text": "Done.", "annotations": []}],
            },
        ],
    }
    chat = run(request)
    tools = chat.pop("tools")
    assert chat == {
        "model": "gpt-5.5",
        "messages": [
            {"role": "system", "content": "You are Codex."},
            {"role": "user", "content": "<environment_context/>\nCall the echo_marker tool"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [tc("call_a", "mcp__probe__echo_marker", '{"marker":"M"}')],
            },
            {"role": "tool", "tool_call_id": "call_a", "content": "M\n(echoed)"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [tc("call_b", "tool_search", '{"query":"calendar","limit":1}')],
            },
            {
                "role": "tool",
                "tool_call_id": "call_b",
                "content": "Loaded tools, now callable:\n"
                "- mcp__codex_apps__calendar_create_event: Create an event",
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [tc("call_c", "exec", '{"input":"1+1"}')],
            },
            {"role": "tool", "tool_call_id": "call_c", "content": "2"},
            {"role": "assistant", "content": "Done."},
        ],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "reasoning_effort": "medium",
        **STREAM,
    }
    assert tools[:3] == [
        {
            "type": "function",
            "function": {
                "name": "exec_command",
                "description": "Run",
                "parameters": exec_tool["parameters"],
                "strict": False,
            },
        },
        {
            "type": "function",
            "function": {
                "name": "tool_search",
                "description": "Search tools",
                "parameters": tool_search["parameters"],
            },
        },
        {
            "type": "function",
            "function": {
                "name": "mcp__probe__echo_marker",
                "description": "Echo",
                "parameters": {"type": "object", "properties": {}},
            },
        },
    ]
    # tools from additional_tools and tool_search_output are callable too
    assert sorted(t["function"]["name"] for t in tools[3:]) == [
        "exec",
        "mcp__codex_apps__calendar_create_event",
    ]


def test_public_output_replays_under_the_offered_flat_name() -> None:
    output = [
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "need docs"}],
        },
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_1",
            "name": "search",
            "namespace": "mcp__docs",
            "arguments": '{"q":"a"}',
            "status": "completed",
        },
    ]
    history = public_output_to_input(output)
    assert history == output and history[0] is not output[0]
    items = [user("q"), *history, fco("call_1", [{"type": "input_text", "text": "r"}])]
    chat = run({"model": "m", "input": items, "tools": [DOCS_NS]})
    offered = {t["function"]["name"] for t in chat["tools"]}
    call = chat["messages"][1]["tool_calls"][0]
    assert call["function"]["name"] in offered
    assert chat["messages"][1:] == [
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "need docs",
            "tool_calls": [tc("call_1", "mcp__docs__search", '{"q":"a"}')],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "r"},
    ]


def test_raw_items_are_normalised_once_then_lowered() -> None:
    names = ResponsesToolNames.convert(None, [])
    items = normalize_input([{"role": "user", "content": "hi"}])
    chat = lower({"model": "m"}, items, names)
    assert chat["messages"] == [{"role": "user", "content": "hi"}]
    with pytest.raises(RequestError) as caught:
        normalize_input([{"role": "user"}])
    assert caught.value.param == "input[0].content"


# -- property: random item lists lower or fail with a RequestError, nothing else -----------

_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8))
_json = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
_part_types = st.sampled_from(
    ["input_text", "output_text", "text", "refusal", "input_image", "input_file", "bogus"]
)
_part = st.one_of(
    _json,
    st.fixed_dictionaries(
        {"type": _part_types},
        optional={
            "text": st.one_of(st.text(max_size=8), _scalars),
            "refusal": st.text(max_size=8),
            "image_url": st.one_of(st.just("data:x"), st.just("https://x"), _scalars),
            "file_id": st.one_of(st.text(max_size=5), _scalars),
            "file_data": st.text(max_size=5),
            "filename": st.text(max_size=5),
            "detail": st.sampled_from(["low", "high", "auto", "original", "weird"]),
        },
    ),
)
_item_types = st.sampled_from(
    [
        "message",
        "function_call",
        "custom_tool_call",
        "tool_search_call",
        "function_call_output",
        "custom_tool_call_output",
        "tool_search_output",
        "reasoning",
        "item_reference",
        "compaction",
        "additional_tools",
        "weird",
        None,
    ]
)
_item = st.one_of(
    _json,
    st.fixed_dictionaries(
        {"type": _item_types},
        optional={
            "role": st.sampled_from(["user", "assistant", "system", "developer", "x"]),
            "content": st.one_of(st.text(max_size=8), st.lists(_part, max_size=3), _json),
            "call_id": st.one_of(st.sampled_from(["c1", "c2", ""]), _scalars),
            "name": st.one_of(st.sampled_from(["search", "get_weather", "x"]), _scalars),
            "namespace": st.one_of(st.sampled_from(["mcp__docs", "functions", ""]), _scalars),
            "arguments": st.one_of(st.text(max_size=8), _json),
            "input": st.one_of(st.text(max_size=8), _scalars),
            "output": st.one_of(st.text(max_size=8), st.lists(_part, max_size=3), _json),
            "tools": st.one_of(st.just([WEATHER_FN]), st.just([DOCS_NS]), _json),
            "summary": st.one_of(
                st.lists(
                    st.fixed_dictionaries(
                        {"type": st.just("summary_text"), "text": st.text(max_size=5)}
                    ),
                    max_size=2,
                ),
                _json,
            ),
            "content_reasoning": _json,
        },
    ),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=st.one_of(st.lists(_item, max_size=8), _json))
def test_lowering_random_items_raises_only_request_errors(items: Any) -> None:
    request = {"model": "m", "input": items, "tools": [WEATHER_FN, DOCS_NS]}
    try:
        chat = run(request)
    except RequestError as exc:
        assert exc.status == 400 and exc.param
        return
    orjson.dumps(chat)
    for message in chat["messages"]:
        assert message["role"] in ("system", "user", "assistant", "tool")
        for call in message.get("tool_calls", []):
            assert isinstance(call["function"]["arguments"], str) and call["id"]


_request_fields = st.fixed_dictionaries(
    {},
    optional={
        "instructions": st.one_of(st.text(max_size=8), _json),
        "text": st.one_of(
            _json,
            st.fixed_dictionaries(
                {
                    "format": st.one_of(
                        _json,
                        st.fixed_dictionaries(
                            {"type": st.sampled_from(["text", "json_object", "json_schema", "x"])},
                            optional={"name": _json, "schema": _json, "strict": _json},
                        ),
                    )
                }
            ),
        ),
        "reasoning": st.one_of(_json, st.fixed_dictionaries({"effort": _json})),
        "max_output_tokens": _json,
        "temperature": _json,
        "parallel_tool_calls": _json,
        "tool_choice": st.sampled_from(["auto", "none", "required"]),
        "metadata": _json,
    },
)


@settings(max_examples=200, deadline=None)
@given(fields=_request_fields, items=st.lists(_item, max_size=4))
def test_random_request_fields_raise_only_request_errors(
    fields: dict[str, Any], items: list[Any]
) -> None:
    try:
        chat = run({"model": "m", "input": items, "tools": [WEATHER_FN], **fields})
    except RequestError as exc:
        assert exc.status == 400 and exc.param
        return
    assert "stream" not in chat and "stream_options" not in chat  # the client sets them
    assert "metadata" not in chat


_ids = st.sampled_from(["c1", "c2", "c3"])
_ns = st.sampled_from([None, "mcp__docs", "functions", "other"])
_text_part = st.builds(
    lambda kind, text: {"type": kind, "text": text},
    st.sampled_from(["input_text", "output_text"]),
    st.text(max_size=6),
)
_media_part = st.one_of(
    st.builds(
        lambda url: {"type": "input_image", "image_url": url},
        st.sampled_from(["https://x/a.png", "data:image/png;base64,AA"]),
    ),
    st.just({"type": "input_image", "file_id": "file-1"}),
    st.just({"type": "input_file", "file_id": "file-2", "filename": "f.pdf"}),
)
_valid_parts = st.lists(st.one_of(_text_part, _text_part, _media_part), max_size=3)
_valid_item = st.one_of(
    st.builds(
        lambda role, content: {"type": "message", "role": role, "content": content},
        st.sampled_from(["user", "assistant", "system", "developer"]),
        st.one_of(st.text(max_size=6), _valid_parts),
    ),
    st.builds(
        lambda i, n, ns, a: (
            {"type": "function_call", "call_id": i, "name": n, "arguments": a}
            | ({"namespace": ns} if ns else {})
        ),
        _ids,
        st.sampled_from(["search", "get_weather", "gone"]),
        _ns,
        st.sampled_from(["{}", '{"q":"a"}', "", "not json"]),
    ),
    st.builds(
        lambda i, ns, x: (
            {"type": "custom_tool_call", "call_id": i, "name": "patch", "input": x}
            | ({"namespace": ns} if ns else {})
        ),
        _ids,
        _ns,
        st.text(max_size=6),
    ),
    st.builds(
        lambda kind, i, out: {"type": kind, "call_id": i, "output": out},
        st.sampled_from(["function_call_output", "custom_tool_call_output"]),
        _ids,
        st.one_of(st.text(max_size=6), _valid_parts),
    ),
    st.builds(
        lambda i, q: {"type": "tool_search_call", "call_id": i, "arguments": {"query": q}},
        st.one_of(st.none(), _ids),
        st.text(max_size=4),
    ),
    st.builds(
        lambda i, tools: {"type": "tool_search_output", "call_id": i, "tools": tools},
        st.one_of(st.none(), _ids),
        st.sampled_from([[], [DOCS_NS], [WEATHER_FN, {"type": "web_search"}]]),
    ),
    st.builds(
        lambda s, c: {"type": "reasoning", "summary": s, "content": c, "encrypted_content": "E"},
        st.lists(st.builds(lambda t: {"type": "summary_text", "text": t}, st.text(max_size=4))),
        st.lists(st.builds(lambda t: {"type": "reasoning_text", "text": t}, st.text(max_size=4))),
    ),
    st.sampled_from([{"type": "compaction", "encrypted_content": "C"}]),
)


@settings(max_examples=300, deadline=None)
@given(items=st.lists(_valid_item, max_size=10))
def test_valid_histories_always_lower_and_keep_every_call_and_result(
    items: list[dict[str, Any]],
) -> None:
    chat = run({"model": "m", "input": items, "tools": [WEATHER_FN, DOCS_NS]})
    out = chat["messages"]
    calls = [c for m in out for c in m.get("tool_calls", [])]
    assert len(calls) == sum(i["type"] in CALL_TYPES for i in items)
    answered = [
        i
        for i in items
        if i["type"] in ("function_call_output", "custom_tool_call_output")
        or (i["type"] == "tool_search_output" and i["call_id"])
    ]
    results = [m["tool_call_id"] for m in out if m["role"] == "tool"]
    assert [r for r in results if not r.startswith("tool_search_")] == [
        i["call_id"] for i in answered
    ]
    for message in out:
        if message["role"] == "assistant":
            assert isinstance(message["content"], str) or message.get("tool_calls")
        else:
            assert isinstance(message["content"], str | list)
    for a, b in itertools.pairwise(out):
        assert not (a["role"] == b["role"] == "assistant")  # assistant-side items merge
    orjson.dumps(chat)


# -- backend profiles (issue 15) ------------------------------------------------------------


def test_a_forced_tool_is_required_over_the_narrowed_list_by_default() -> None:
    """llama.cpp reads a named tool_choice object as "auto": narrowed "required" works everywhere."""
    for choice in (
        {"type": "function", "name": "search", "namespace": "mcp__docs"},
        {
            "type": "allowed_tools",
            "mode": "required",
            "tools": [{"type": "function", "name": "search"}],
        },
    ):
        request = {
            "model": "m",
            "input": "x",
            "tools": [WEATHER_FN, DOCS_NS],
            "tool_choice": choice,
        }
        chat = run(request)
        assert chat["tool_choice"] == "required"
        assert [t["function"]["name"] for t in chat["tools"]] == ["mcp__docs__search"]


def test_system_messages_policies() -> None:
    input_ = [
        {"role": "developer", "content": "dev"},
        user("u"),
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
        {"role": "developer", "content": "later"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
    ]
    request = {"model": "m", "input": input_, "instructions": "be brief", "tools": [WEATHER_FN]}
    merged = run(request)["messages"]
    assert merged[0] == {"role": "system", "content": "be brief\n\ndev\n\nlater"}
    assert [m["role"] for m in merged] == ["system", "user", "assistant", "tool"]
    as_user = run(request, LoweringOptions(system_messages="user"))["messages"]
    assert as_user[0] == {"role": "system", "content": "be brief\n\ndev"}
    assert [m["role"] for m in as_user] == ["system", "user", "assistant", "user", "tool"]
    assert as_user[3]["content"].startswith("[Instructions from the developer")
    assert as_user[3]["content"].endswith("\nlater")
    kept = run(request, LoweringOptions(system_messages="keep"))["messages"]
    assert [m["role"] for m in kept] == ["system", "system", "user", "assistant", "system", "tool"]


@pytest.mark.parametrize(
    ("effort", "accepted", "sent"),
    [
        ("medium", ("low", "medium", "high"), "medium"),
        ("xhigh", ("low", "medium", "high"), "high"),
        ("max", ("low", "medium", "high"), "high"),
        ("minimal", ("low", "medium", "high"), "low"),
        ("none", ("low", "medium", "high"), None),  # no reasoning, not the least of it
        ("none", ("minimal", "low"), None),
        ("none", ("none", "low", "medium", "high"), "none"),
        ("minimal", ("none", "low", "medium", "high"), "none"),
        ("high", (), None),
        ("xhigh", None, "xhigh"),
    ],
)
def test_reasoning_effort_maps_to_the_nearest_accepted(
    effort: str, accepted: tuple[str, ...] | None, sent: str | None
) -> None:
    request = {"model": "m", "input": "x", "reasoning": {"effort": effort}}
    chat = run(request, LoweringOptions(efforts=accepted))
    assert chat.get("reasoning_effort") == sent


def test_parameters_are_dropped_or_renamed_per_profile() -> None:
    request = {
        "model": "m",
        "input": "x",
        "user": "u",
        "max_output_tokens": 7,
        "parallel_tool_calls": False,
        "tools": [WEATHER_FN],
    }
    chat = run(request)
    assert "user" not in chat and chat["max_tokens"] == 7 and chat["parallel_tool_calls"] is False
    options = LoweringOptions(
        max_tokens_field="max_completion_tokens", drop=frozenset({"parallel_tool_calls"})
    )
    chat = run(request, options)
    assert chat["user"] == "u" and chat["max_completion_tokens"] == 7 and "max_tokens" not in chat
    assert "parallel_tool_calls" not in chat
