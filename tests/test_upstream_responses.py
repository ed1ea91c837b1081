"""`--upstream-api responses` (issue 18): a Responses backend behind the gateway.

Pure tests of the decoder (backend events -> deltas) and of the lowering (tools per backend
capability), then the official SDK (HTTP and the WebSocket mode) against the gateway in
front of scripted Responses backends that behave like vLLM, llama.cpp, Ollama and OpenAI.
"""

from __future__ import annotations

from typing import Any

import openai
import orjson
import pytest
import websockets
from harness import GatewayHarness
from openai import AsyncOpenAI
from scripted_backend import DONE, Status, error_chunk, finish, text_chunks, tool_call_chunks, usage
from scripted_responses_backend import ScriptedResponsesBackend
from sdk_models import validate_event

from streamer.cli import build_parser
from streamer.config import settings_from
from streamer.core.backend_tools import BackendTools
from streamer.core.deltas import (
    Finish,
    ForeignEvent,
    ReasoningBlob,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    UpstreamError,
    Usage,
    WholeItem,
)
from streamer.core.errors import RequestError
from streamer.core.lowering import LoweringOptions
from streamer.core.output import OutputItemStreamer
from streamer.core.response import new_response
from streamer.core.responses_lowering import lower_responses
from streamer.core.tools import ResponsesToolNames
from streamer.upstream.chat.stream import EndCause
from streamer.upstream.responses.decoder import ResponsesDecoder, decode_response_body
from streamer.upstream.responses.profiles import PROFILES

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
    {"type": "function", "name": "exec_command", "parameters": {"type": "object"}},
    {"type": "web_search"},
]


def sse(*events: dict[str, Any]) -> bytes:
    return b"".join(
        b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n" for e in events
    )


def decode(data: bytes) -> list[Any]:
    decoder = ResponsesDecoder()
    out = decoder.feed(data)
    while decoder.pending:
        out += decoder.take()
    return out + decoder.end(EndCause.CLEAN)


def completed(**response: Any) -> dict[str, Any]:
    return {"type": "response.completed", "response": {"status": "completed", **response}}


# -- the decoder (pure) -------------------------------------------------------------------


def test_text_reasoning_and_usage_become_the_chat_deltas() -> None:
    deltas = decode(
        sse(
            {"type": "response.created", "response": {"id": "resp_b"}},
            {"type": "response.reasoning_text.delta", "output_index": 0, "delta": "hmm"},
            {"type": "response.output_item.done", "output_index": 0,
             "item": {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "hmm"}]}},
            {"type": "response.output_text.delta", "output_index": 1, "delta": "Hi"},
            {"type": "response.brand_new_event", "whatever": 1},
            completed(usage={"input_tokens": 3, "output_tokens": 2,
                             "input_tokens_details": {"cached_tokens": 1}}),
        )
    )  # fmt: skip
    assert deltas == [
        ReasoningDelta("hmm"),
        TextDelta("Hi"),
        ForeignEvent({"type": "response.brand_new_event", "whatever": 1}),  # survives
        Usage(input_tokens=3, output_tokens=2, cached_tokens=1),
        Finish("stop"),
    ]


def test_calls_keep_the_backend_spelling_for_the_map() -> None:
    added = {"type": "response.output_item.added"}
    deltas = decode(
        sse(
            {**added, "output_index": 0, "item": {"type": "function_call", "call_id": "c1",
                                                  "name": "search", "namespace": "mcp__docs"}},
            {"type": "response.function_call_arguments.delta", "output_index": 0, "delta": '{"q"'},
            {"type": "response.output_item.done", "output_index": 0,
             "item": {"type": "function_call", "call_id": "c1", "name": "search",
                      "namespace": "mcp__docs", "arguments": '{"q":1}'}},
            {**added, "output_index": 1, "item": {"type": "custom_tool_call", "call_id": "c2",
                                                  "name": "mcp__docs.patch"}},
            {"type": "response.custom_tool_call_input.delta", "output_index": 1, "delta": "*** B"},
            {"type": "response.output_item.done", "output_index": 1,
             "item": {"type": "custom_tool_call", "call_id": "c2", "name": "mcp__docs.patch",
                      "input": "*** Begin"}},
            completed(),
        )
    )  # fmt: skip
    assert deltas == [
        ToolCallDelta(0, "c1", "mcp__docs.search"),
        ToolCallDelta(0, arguments='{"q"'),
        ToolCallDelta(0, arguments=":1}"),  # the rest the deltas did not carry
        ToolCallDelta(1, "c2", "mcp__docs.patch"),
        ToolCallDelta(1, arguments='{"input":"*** Begin"}'),
        Finish("tool_calls"),
    ]


def test_items_without_deltas_pass_whole_with_the_gateways_ids() -> None:
    search = {"type": "web_search_call", "id": "ws_backend", "status": "completed",
              "action": {"type": "search", "query": "q"}}  # fmt: skip
    odd = {"type": "brand_new_item", "id": "x_1", "payload": [1, 2]}
    deltas = decode(
        sse(
            {"type": "response.output_item.done", "output_index": 0, "item": search},
            {"type": "response.output_item.done", "output_index": 1, "item": odd},
            completed(),
        )
    )
    whole = [(d.item, d.key) for d in deltas if isinstance(d, WholeItem)]
    assert whole == [(search, 0), (odd, 1)]  # by the backend's item: the streamer names them
    streamer = OutputItemStreamer(ResponsesToolNames(), new_response({"model": "m"}))
    events = [orjson.loads(e.data) for e in streamer.feed(deltas) + streamer.finish()]
    items = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert [i["type"] for i in items] == ["web_search_call", "brand_new_item"]
    assert items[0]["id"].startswith("ws_") and items[1]["id"].startswith("x_")
    assert items[0]["action"] == search["action"] and items[1]["payload"] == [1, 2]
    assert items[0]["id"] != "ws_backend"


def test_encrypted_reasoning_is_kept_as_a_blob_delta() -> None:
    item = {"type": "reasoning", "summary": [], "encrypted_content": "gAAA-backend"}
    deltas = decode(
        sse({"type": "response.output_item.done", "output_index": 0, "item": item}, completed())
    )
    assert deltas[:1] == [ReasoningBlob("gAAA-backend")]


@pytest.mark.parametrize(
    ("events", "code"),
    [
        ([{"type": "error", "code": "rate_limit_exceeded", "message": "slow down"}], "rate_limit_exceeded"),
        ([{"type": "response.failed", "response": {"status": "failed", "error": {
            "code": "server_error", "message": "boom"}}}], "server_error"),
        ([{"type": "error", "code": None, "message": "This model's maximum context length is 8 tokens"}],
         "context_length_exceeded"),
    ],
)  # fmt: skip
def test_backend_errors_keep_the_chat_codes(events: list[dict[str, Any]], code: str) -> None:
    deltas = decode(sse(*events))
    assert isinstance(deltas[-1], UpstreamError) and deltas[-1].code == code


def test_incomplete_and_a_cut_stream() -> None:
    incomplete = {"type": "response.incomplete", "response": {
        "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}}}  # fmt: skip
    assert decode(sse(incomplete))[-1] == Finish("length")
    decoder = ResponsesDecoder()
    decoder.feed(sse({"type": "response.output_text.delta", "output_index": 0, "delta": "par"}))
    (cut,) = decoder.end(EndCause.EOF)
    assert isinstance(cut, UpstreamError) and cut.code == "server_error"


def test_a_whole_json_response_decodes_the_same() -> None:
    body = {"object": "response", "status": "completed", "output": [
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hi"}]},
        {"type": "function_call", "call_id": "c", "name": "exec_command", "arguments": "{}"}]}  # fmt: skip
    assert decode_response_body(orjson.dumps(body)) == [
        TextDelta("Hi"),
        ToolCallDelta(0, "c", "exec_command"),
        ToolCallDelta(0, arguments="{}"),
        Finish("tool_calls"),
    ]


# -- the lowering (pure) ------------------------------------------------------------------


def lowered(
    request: dict[str, Any], tools: BackendTools, items: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    names = ResponsesToolNames.convert(request.get("tools"), items or [])
    return lower_responses(request, items or [], names, LoweringOptions(), tools)


def test_flattening_backends_get_functions_only() -> None:
    sent = lowered({"model": "m", "tools": TOOLS}, PROFILES["vllm"])
    assert [(t["type"], t["name"]) for t in sent["tools"]] == [
        ("function", "mcp__docs__search"),
        ("function", "mcp__docs__patch"),
        ("function", "exec_command"),
    ]  # the hosted web_search is left out: vLLM does not run it
    assert sent["tools"][1]["parameters"]["properties"]["input"]["type"] == "string"


def test_openai_gets_namespaces_custom_and_hosted_tools_natively() -> None:
    sent = lowered(
        {"model": "m", "tools": TOOLS, "include": ["reasoning.encrypted_content"]},
        PROFILES["openai"],
    )
    space, function, hosted = sent["tools"]
    assert space["type"] == "namespace" and space["name"] == "mcp__docs"
    assert [(t["type"], t["name"]) for t in space["tools"]] == [
        ("function", "search"),
        ("custom", "patch"),
    ]
    assert function["name"] == "exec_command" and hosted == {"type": "web_search"}
    assert sent["include"] == ["reasoning.encrypted_content"]


def test_a_forced_hosted_tool_the_backend_does_not_run_is_a_400() -> None:
    with pytest.raises(RequestError) as raised:
        lowered(
            {"model": "m", "tools": TOOLS, "tool_choice": {"type": "web_search"}},
            PROFILES["llamacpp"],
        )
    assert raised.value.status == 400 and raised.value.param == "tool_choice.type"
    sent = lowered(
        {"model": "m", "tools": TOOLS, "tool_choice": {"type": "web_search"}}, PROFILES["openai"]
    )
    assert sent["tool_choice"] == {"type": "web_search"}


def test_tool_choice_and_history_are_rewritten_the_same_way() -> None:
    history = [
        {"type": "message", "id": "msg_gw", "role": "user", "content": "hi"},
        {"type": "function_call", "id": "fc_gw", "call_id": "c1", "namespace": "mcp__docs",
         "name": "search", "arguments": ""},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        {"type": "custom_tool_call", "call_id": "c2", "namespace": "mcp__docs", "name": "patch",
         "input": "*** Begin"},
        {"type": "custom_tool_call_output", "call_id": "c2", "output": "done"},
    ]  # fmt: skip
    choice = {"type": "function", "namespace": "mcp__docs", "name": "search"}
    request = {"model": "m", "tools": TOOLS, "tool_choice": choice, "previous_response_id": "resp_x",
               "store": True, "truncation": "auto", "temperature": 0.5, "brand_new": 1}  # fmt: skip
    sent = lowered(request, PROFILES["llamacpp"], history)
    assert sent["tool_choice"] == "required" and [t["name"] for t in sent["tools"]] == [
        "mcp__docs__search"
    ]
    assert sent["input"] == [
        {"type": "message", "role": "user", "content": "hi"},
        {"type": "function_call", "call_id": "c1", "name": "mcp__docs__search", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        {"type": "function_call", "call_id": "c2", "name": "mcp__docs__patch",
         "arguments": '{"input":"*** Begin"}'},
        {"type": "function_call_output", "call_id": "c2", "output": "done"},
    ]  # fmt: skip
    # the gateway's own state is not the backend's; unknown fields pass
    assert {"previous_response_id", "store", "truncation"}.isdisjoint(sent)
    assert sent["temperature"] == 0.5 and sent["brand_new"] == 1
    native = lowered(request, PROFILES["openai"], history)
    assert (
        native["input"][1]["namespace"] == "mcp__docs"
        and native["input"][3]["type"] == "custom_tool_call"
    )


# -- the command line ---------------------------------------------------------------------


def test_upstream_api_is_its_own_flag_and_abbreviations_are_refused() -> None:
    args = build_parser().parse_args(
        ["serve", "--upstream", "http://h/v1", "--upstream-api", "responses"]
    )
    settings = settings_from(args)
    assert settings.upstream_api == "responses" and settings.upstream_api_key is None
    with pytest.raises(SystemExit):  # once read as --upstream-api-key
        build_parser().parse_args(["serve", "--upstream-api-k", "secret"])
    with pytest.raises(SystemExit):
        build_parser().parse_args(["codex", "--upstream-ap", "responses"])


# -- the gateway in front of scripted Responses backends ----------------------------------


def _harness(personality: str, profile: str, **overrides: Any) -> GatewayHarness:
    backend = ScriptedResponsesBackend(personality=personality)
    return GatewayHarness(
        backend=backend, upstream_api="responses", backend_profile=profile, **overrides
    )


def _sdk(gw: GatewayHarness) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=gw.url, api_key="k", max_retries=0)


CALL_END = [finish("tool_calls"), usage(5, 2), DONE]


@pytest.mark.parametrize(
    ("personality", "profile", "spelling"),
    [
        ("vllm", "vllm", "mcp__docs__search"),  # flat names back
        ("llamacpp", "llamacpp", "mcp__docs__search"),
        ("ollama", "ollama", "mcp__docs.search"),  # dotted names back
        ("openai", "openai", "mcp__docs.search"),  # split: namespace + name
    ],
)
async def test_the_namespaced_call_comes_back_routable(
    personality: str, profile: str, spelling: str
) -> None:
    async with _harness(personality, profile) as gw, _sdk(gw) as client:
        gw.backend.script(
            [*tool_call_chunks(0, "call_1", [spelling], ['{"q":', '"x"}']), *CALL_END]
        )
        events = [
            e
            async for e in await client.responses.create(
                model="m", input="hi", tools=TOOLS, stream=True
            )
        ]
        for event in events:
            validate_event(event.to_dict())
        assert [e.sequence_number for e in events] == list(range(len(events)))
        (call,) = events[-1].response.output
        assert (call.type, call.namespace, call.name, call.arguments) == (
            "function_call", "mcp__docs", "search", '{"q":"x"}')  # fmt: skip
        assert (
            events[-1].response.id.startswith("resp_") and events[-1].response.id != "resp_backend"
        )
        sent = gw.backend.requests[-1]
        assert sent["stream"] is True and sent["store"] is False
        kept = gw.backend.kept_tools[-1]
        if profile in ("vllm", "llamacpp"):  # every client tool survives as a function
            assert {t["name"] for t in kept} == {
                "mcp__docs__search",
                "mcp__docs__patch",
                "exec_command",
            }
        else:
            assert kept[0]["type"] == "namespace"


async def test_a_backend_that_drops_namespaces_is_why_the_profile_flattens() -> None:
    """The control: namespace tools sent to a llama.cpp-like backend vanish from its view."""
    async with _harness("llamacpp", "openai") as gw, _sdk(gw) as client:
        gw.backend.script([*text_chunks(["no tools"]), *CALL_END])
        await client.responses.create(model="m", input="hi", tools=TOOLS)
        assert [t["name"] for t in gw.backend.kept_tools[-1]] == ["exec_command"]


async def test_vllm_rejecting_namespace_tools_is_the_backends_400() -> None:
    async with _harness("vllm", "openai") as gw, _sdk(gw) as client:
        with pytest.raises(openai.BadRequestError) as raised:
            await client.responses.create(model="m", input="hi", tools=TOOLS)
        assert "unsupported tool type" in raised.value.message


async def test_hosted_and_unknown_items_from_openai_pass_through() -> None:
    search = {"type": "web_search_call", "id": "ws_b", "status": "completed",
              "action": {"type": "search", "query": "namespaces"}}  # fmt: skip
    script = [
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {**search, "status": "in_progress"},
        },
        {"type": "response.web_search_call.completed", "output_index": 0, "item_id": "ws_b"},
        {"type": "response.output_item.done", "output_index": 0, "item": search},
        *text_chunks(["found"]),
        finish("stop"),
        DONE,
    ]
    async with _harness("openai", "openai") as gw, _sdk(gw) as client:
        gw.backend.script(script)
        response = await client.responses.create(model="m", input="hi", tools=TOOLS)
        kinds = [item.type for item in response.output]
        assert kinds == ["web_search_call", "message"] and response.output_text == "found"
        assert response.output[0].action.query == "namespaces"  # type: ignore[union-attr]
        assert {"type": "web_search"} in gw.backend.requests[-1]["tools"]


async def test_openai_custom_tool_natively() -> None:
    added = {
        "type": "custom_tool_call",
        "id": "ctc_b",
        "call_id": "c9",
        "name": "patch",
        "namespace": "mcp__docs",
    }
    script = [
        {"type": "response.output_item.added", "output_index": 0, "item": {**added, "input": ""}},
        {"type": "response.custom_tool_call_input.delta", "output_index": 0, "delta": "*** Begin"},
        {
            "type": "response.output_item.done",
            "output_index": 0,
            "item": {**added, "input": "*** Begin"},
        },
        finish("tool_calls"),
        DONE,
    ]
    async with _harness("openai", "openai") as gw, _sdk(gw) as client:
        gw.backend.script(script)
        (call,) = (await client.responses.create(model="m", input="hi", tools=TOOLS)).output
        assert (call.type, call.namespace, call.name, call.input) == (  # type: ignore[union-attr]
            "custom_tool_call", "mcp__docs", "patch", "*** Begin")  # fmt: skip


async def test_the_gateway_keeps_the_state_and_sends_the_whole_history() -> None:
    async with _harness("vllm", "vllm") as gw, _sdk(gw) as client:
        gw.backend.script(
            [*tool_call_chunks(0, "call_1", ["mcp__docs__search"], ['{"q":"x"}']), *CALL_END],
            [*text_chunks(["done"]), finish("stop"), DONE],
        )
        first = await client.responses.create(model="m", input="hi", tools=TOOLS)
        output = {"type": "function_call_output", "call_id": "call_1", "output": "result"}
        second = await client.responses.create(
            model="m",
            input=[output],
            tools=TOOLS,
            previous_response_id=first.id,  # type: ignore[list-item]
        )
        assert second.output_text == "done"
        sent = gw.backend.requests[-1]
        assert "previous_response_id" not in sent and sent["store"] is False
        assert [i["type"] for i in sent["input"]] == [
            "message",
            "function_call",
            "function_call_output",
        ]
        assert sent["input"][1]["name"] == "mcp__docs__search" and "id" not in sent["input"][1]
        stored = await client.responses.retrieve(second.id)
        assert stored.output_text == "done"


async def test_the_websocket_mode_over_a_responses_backend() -> None:
    async with _harness("ollama", "ollama") as gw:
        gw.backend.script([*tool_call_chunks(0, "call_1", ["mcp__docs.search"], ["{}"]), *CALL_END])
        async with websockets.connect(gw.ws_url) as ws:
            create = {"type": "response.create", "model": "m", "input": "hi", "tools": TOOLS}
            await ws.send(orjson.dumps(create).decode())
            events = []
            while not events or events[-1]["type"] != "response.completed":
                events.append(orjson.loads(await ws.recv()))
        (call,) = events[-1]["response"]["output"]
        assert (call["namespace"], call["name"]) == ("mcp__docs", "search")


async def test_errors_of_the_backend_map_like_a_chat_backends() -> None:
    async with _harness("vllm", "vllm") as gw, _sdk(gw) as client:
        gw.backend.script([Status(429, {"error": {"message": "slow down", "type": "rate_limit"}})])
        with pytest.raises(openai.RateLimitError) as raised:
            await client.responses.create(model="m", input="hi")
        assert raised.value.body["code"] == "rate_limit_exceeded"  # type: ignore[index]
        gw.backend.script([*text_chunks(["par"]), error_chunk("the GPU fell over")])
        events = [
            e async for e in await client.responses.create(model="m", input="hi", stream=True)
        ]
        assert events[-1].type == "response.failed"
        assert events[-1].response.error.message == "the GPU fell over"  # type: ignore[union-attr]
        assert events[-1].response.error.code == "server_error"  # type: ignore[union-attr]


async def test_openai_reasoning_blob_is_sealed_inside_the_gateways_and_given_back() -> None:
    reasoning = {
        "type": "reasoning",
        "id": "rs_b",
        "summary": [],
        "encrypted_content": "gAAA-openai-blob",
    }
    script = [
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {**reasoning, "encrypted_content": None},
        },
        {"type": "response.output_item.done", "output_index": 0, "item": reasoning},
        *text_chunks(["ok"]),
        finish("stop"),
        DONE,
    ]
    async with _harness("openai", "openai") as gw, _sdk(gw) as client:
        gw.backend.script(script, [*text_chunks(["again"]), finish("stop"), DONE])
        include = ["reasoning.encrypted_content"]
        first = await client.responses.create(model="m", input="hi", include=include, store=False)  # type: ignore[list-item]
        item = first.output[0]
        assert item.type == "reasoning"
        assert item.encrypted_content and "gAAA-openai-blob" not in item.encrypted_content  # type: ignore[union-attr]
        assert gw.backend.requests[-1]["include"] == include
        history = [
            {"role": "user", "content": "hi"},
            item.to_dict(),
            {"role": "user", "content": "more"},
        ]
        await client.responses.create(model="m", input=history, include=include, store=False)  # type: ignore[arg-type]
        sent = gw.backend.requests[-1]["input"]
        assert sent[1] == {
            "type": "reasoning",
            "summary": [],
            "encrypted_content": "gAAA-openai-blob",
        }


async def test_responses_mode_needs_an_upstream() -> None:
    with pytest.raises(ValueError, match="needs --upstream"):
        from dataclasses import replace

        from streamer.app import check_settings
        from streamer.config import Settings

        check_settings(replace(Settings(), upstream_api="responses"))


async def test_a_recording_of_a_responses_backend_replays_the_same(tmp_path: Any) -> None:
    import io

    from streamer.tap.replay import run_replay

    tap = tmp_path / "tap"
    async with _harness("ollama", "ollama", tap_dir=str(tap)) as gw, _sdk(gw) as client:
        gw.backend.script(
            [
                *text_chunks(["a"]),
                *tool_call_chunks(0, "c1", ["mcp__docs.search"], ["{}"]),
                *CALL_END,
            ]
        )
        await client.responses.create(model="m", input="hi", tools=TOOLS, stream=False)
    (path,) = tap.iterdir()
    args = build_parser().parse_args(["replay", str(path), "--compare", "--color", "never"])
    out = io.StringIO()
    assert await run_replay(args, out) == 0, out.getvalue()
    assert '"namespace":"mcp__docs"' in path.read_text()


async def test_compaction_is_the_gateways_over_a_responses_backend() -> None:
    from streamer.core.compaction import HANDOVER_PROMPT, SUMMARY_HEADING

    history = [
        {"type": "message", "role": "user", "content": "Fix the parser"},
        {"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
    ]
    async with _harness("vllm", "vllm") as gw, _sdk(gw) as client:
        gw.backend.script(
            [*text_chunks(["Goal: ship ", "the parser."]), finish("stop"), usage(50, 9), DONE],
            [*text_chunks(["next"]), finish("stop"), DONE],
        )
        compacted = await client.responses.compact(model="m", input=history)  # type: ignore[arg-type]
        *_, item = compacted.output
        assert item.type == "compaction"
        sent = gw.backend.requests[-1]
        assert "tools" not in sent and sent["store"] is False
        assert sent["input"][-1] == {"type": "message", "role": "user", "content": HANDOVER_PROMPT}
        replay = [i.model_dump(exclude_none=True, warnings=False) for i in compacted.output]
        replay.append({"type": "message", "role": "user", "content": "Now add tests."})
        answer = await client.responses.create(model="m", input=replay)  # type: ignore[arg-type]
        assert answer.output_text == "next"
        texts = [str(i.get("content")) for i in gw.backend.requests[-1]["input"]]
        assert any(SUMMARY_HEADING in t and "Goal: ship the parser." in t for t in texts)


async def test_background_mode_over_a_responses_backend() -> None:
    async with _harness("openai", "openai") as gw, _sdk(gw) as client:
        gw.backend.script([*tool_call_chunks(0, "c1", ["mcp__docs.search"], ["{}"]), *CALL_END])
        stream = await client.responses.create(
            model="m", input="hi", tools=TOOLS, background=True, stream=True
        )
        events = [event async for event in stream]
        assert events[0].type == "response.queued" and events[-1].type == "response.completed"
        stored = await client.responses.retrieve(events[-1].response.id)
        (call,) = stored.output
        assert (stored.status, call.namespace, call.name) == ("completed", "mcp__docs", "search")  # type: ignore[union-attr]
        assert (
            gw.backend.requests[-1]["store"] is False
            and "background" not in gw.backend.requests[-1]
        )


def test_hosted_tools_left_out_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    from streamer.upstream.responses.kind import RESPONSES

    request = {"model": "m", "tools": TOOLS}
    options = LoweringOptions(tools=PROFILES["llamacpp"])
    with caplog.at_level("INFO", logger="streamer.upstream.responses"):
        sent = RESPONSES.lower(request, [], ResponsesToolNames.convert(TOOLS), options)
    assert "web_search" not in {t["type"] for t in sent["tools"]}
    assert "hosted tools left out" in caplog.text and "web_search" in caplog.text
    caplog.clear()
    with caplog.at_level("INFO", logger="streamer.upstream.responses"):
        RESPONSES.lower(
            request,
            [],
            ResponsesToolNames.convert(TOOLS),
            LoweringOptions(tools=PROFILES["openai"]),
        )
    assert "left out" not in caplog.text


def test_event_types_the_gateway_does_not_make_pass_through() -> None:
    vendor = {"type": "response.vendor.progress", "sequence_number": 7, "stage": "planning"}
    deltas = decode(
        sse(
            {"type": "response.reasoning.delta", "delta": "hm"},  # Open Responses' name
            vendor,
            {"type": "response.output_text.delta", "delta": "ok"},
            completed(),
        )
    )
    assert deltas[:3] == [
        ReasoningDelta("hm"),
        ForeignEvent({"type": "response.vendor.progress", "stage": "planning"}),
        TextDelta("ok"),
    ]


@pytest.mark.emits_invalid  # a vendor's event type: neither the spec nor the SDK knows it
async def test_a_vendor_event_reaches_the_client_in_order_with_our_sequence_number() -> None:
    script = [
        *text_chunks(["Hel"]),
        {"type": "response.vendor.progress", "stage": "planning", "sequence_number": 99},
        *text_chunks(["lo"]),
        finish("stop"),
        DONE,
    ]
    async with _harness("flat", "generic") as gw, _sdk(gw) as client:
        gw.backend.script(script)
        stream = await client.responses.create(model="m", input="hi", stream=True)
        events = [event async for event in stream]
    kinds = [e.type for e in events]
    at = kinds.index("response.vendor.progress")
    assert kinds.index("response.output_text.delta") < at < len(kinds) - 1
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[at].model_extra == {"stage": "planning"}  # type: ignore[union-attr]
    assert events[-1].response.output_text == "Hello"  # type: ignore[union-attr]
