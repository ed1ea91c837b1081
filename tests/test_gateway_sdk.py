"""The official OpenAI SDK against the gateway on loopback, in front of a scripted backend.

Each scenario is one backend script, run three ways: `responses.create()` non-streaming,
`responses.create(stream=True)`, and `responses.stream()` (whose accumulator raises on
protocol errors). Every streamed event is validated against the SDK's typed models, and
the non-streaming body must equal the streamed terminal response.

Every test runs twice: in front of a Chat backend and in front of a Responses backend
(`--upstream-api responses`) playing the same scripts (tests/scripted_responses_backend.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import openai
import pytest
from harness import GatewayHarness
from openai import AsyncOpenAI
from scripted_backend import (
    DIE,
    DONE,
    ScriptedBackend,
    Status,
    finish,
    reasoning_chunks,
    refusing_url,
    text_chunks,
    tool_call_chunks,
    usage,
)
from scripted_responses_backend import ScriptedResponsesBackend
from sdk_models import validate_event


@pytest.fixture(params=["chat", "responses"])
def api(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def gw(api: str) -> AsyncIterator[GatewayHarness]:
    """The gateway in front of a scripted backend of the `api` kind."""
    backend = ScriptedResponsesBackend() if api == "responses" else ScriptedBackend()
    async with GatewayHarness(backend=backend, upstream_api=api) as harness:
        yield harness


def sent_tools(sent: dict[str, Any]) -> list[tuple[str, str]]:
    """(type, name) of each tool the backend got, whichever API it speaks."""
    return [(t["type"], t.get("function", t).get("name")) for t in sent.get("tools") or ()]


def last_input_text(sent: dict[str, Any]) -> Any:
    """The content of the last message the backend got, whichever API it speaks."""
    if "messages" in sent:
        return sent["messages"][-1]["content"]
    return sent["input"][-1]["content"]


TOOLS: list[dict[str, Any]] = [
    {
        "type": "namespace",
        "name": "mcp__docs",
        "description": "Tools in the mcp__docs namespace.",
        "tools": [
            {
                "type": "function",
                "name": "search",
                "description": "Search the docs.",
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
            },
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
]


def _interleaved() -> list[Any]:
    a = tool_call_chunks(0, "call_a", ["mcp__docs__search"], ['{"q":', '"x"}'])
    b = tool_call_chunks(1, "call_b", ["crm__lookup"], ['{"id"', ":7}"])
    return [x for pair in zip(a, b, strict=True) for x in pair]


def _expect_text(r: dict[str, Any]) -> None:
    assert r["status"] == "completed"
    assert [i["type"] for i in r["output"]] == ["message"]
    assert r["output"][0]["content"][0]["text"] == "Hello"
    assert r["usage"]["input_tokens"] == 5 and r["usage"]["output_tokens"] == 2


def _expect_reasoning(r: dict[str, Any]) -> None:
    assert [i["type"] for i in r["output"]] == ["reasoning", "message"]
    assert r["output"][0]["content"] == [{"type": "reasoning_text", "text": "thinking"}]
    assert r["output"][1]["content"][0]["text"] == "ok"


def _expect_call(r: dict[str, Any]) -> None:
    (call,) = r["output"]
    assert (call["type"], call["namespace"], call["name"]) == (
        "function_call",
        "mcp__docs",
        "search",
    )
    assert call["arguments"] == '{"q":"x"}' and call["call_id"] == "call_1"


def _expect_parallel(r: dict[str, Any]) -> None:
    first, second = r["output"]
    assert (first["namespace"], first["name"], first["arguments"]) == (
        "mcp__docs",
        "search",
        '{"q":"x"}',
    )
    assert (second["namespace"], second["name"], second["arguments"]) == (
        "crm",
        "lookup",
        '{"id":7}',
    )


def _expect_custom(r: dict[str, Any]) -> None:
    (call,) = r["output"]
    assert call["type"] == "custom_tool_call"
    assert (call["namespace"], call["name"], call["input"]) == (
        "mcp__docs",
        "patch",
        "*** Begin Patch",
    )


def _expect_split(r: dict[str, Any]) -> None:
    (call,) = r["output"]
    assert (call["namespace"], call["name"]) == ("mcp__docs", "search")


def _expect_length(r: dict[str, Any]) -> None:
    assert r["status"] == "incomplete"
    assert r["incomplete_details"] == {"reason": "max_output_tokens"}
    assert r["output"][0]["status"] == "incomplete"


def _expect_failed(r: dict[str, Any]) -> None:
    assert r["status"] == "failed"
    assert r["error"]["code"] == "server_error" and r["error"]["message"]


END = [finish("stop"), usage(5, 2), DONE]
SCENARIOS: dict[str, tuple[list[Any], Callable[[dict[str, Any]], None], str]] = {
    "text": ([*text_chunks(["Hel", "lo"]), *END], _expect_text, "response.completed"),
    "reasoning_then_text": (
        [*reasoning_chunks(["think", "ing"]), *text_chunks(["ok"]), *END],
        _expect_reasoning,
        "response.completed",
    ),
    "namespaced_call": (
        [*tool_call_chunks(0, "call_1", ["mcp__docs__search"], ['{"q":', '"x"}']),
         finish("tool_calls"), usage(5, 2), DONE],
        _expect_call,
        "response.completed",
    ),
    "parallel_interleaved": (
        [*_interleaved(), finish("tool_calls"), DONE], _expect_parallel, "response.completed"
    ),
    "custom_in_namespace": (
        [*tool_call_chunks(0, "call_p", ["mcp__docs__patch"], ['{"input": "*** Begin', ' Patch"}']),
         finish("tool_calls"), DONE],
        _expect_custom,
        "response.completed",
    ),
    "name_split_across_chunks": (
        [*tool_call_chunks(0, "call_1", ["mcp__do", "cs__sea", "rch"], ["{}"]), finish("tool_calls"), DONE],
        _expect_split,
        "response.completed",
    ),
    "length": ([*text_chunks(["trun"]), finish("length"), usage(5, 9), DONE], _expect_length,
               "response.incomplete"),
    "backend_dies_mid_stream": ([*text_chunks(["par", "tial"]), DIE], _expect_failed, "response.failed"),
}  # fmt: skip


def _normalised(response: dict[str, Any]) -> dict[str, Any]:
    """The response with ids and timestamps replaced by positions, for comparison."""
    out = dict(response, id="resp", created_at=0, completed_at=None)
    out["output"] = [{**item, "id": f"item{i}"} for i, item in enumerate(response["output"])]
    return out


async def _create(client: AsyncOpenAI, **extra: Any) -> Any:
    return await client.responses.create(
        model="test-model", input="hi", tools=TOOLS, store=False, **extra
    )


@pytest.mark.parametrize("scenario", list(SCENARIOS))
async def test_scenario_three_ways(scenario: str, gw: GatewayHarness, client: AsyncOpenAI) -> None:
    script, expect, terminal = SCENARIOS[scenario]

    gw.backend.script(script)
    body = (await _create(client)).to_dict()
    expect(body)

    gw.backend.script(script)
    events = [event async for event in await _create(client, stream=True)]
    for event in events:
        validate_event(event.to_dict())
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type == terminal
    streamed = events[-1].response.to_dict()
    expect(streamed)
    assert _normalised(streamed) == _normalised(body)

    gw.backend.script(script)
    async with client.responses.stream(
        model="test-model", input="hi", tools=TOOLS, store=False
    ) as stream:
        seen = [event async for event in stream]  # the accumulator raises on bad grammar
        if terminal == "response.completed":
            final = (await stream.get_final_response()).to_dict()
        else:  # the helper only hands out completed responses
            final = seen[-1].response.to_dict()
    assert [e.type for e in seen] == [e.type for e in events]
    expect(final)

    # The backend only ever saw flat function tools, always streamed.
    sent = gw.backend.requests[-1]
    assert sent["stream"] is True
    assert {name for _, name in sent_tools(sent)} == {
        "mcp__docs__search", "mcp__docs__patch", "crm__lookup", "exec_command"
    }  # fmt: skip
    assert all(kind == "function" for kind, _ in sent_tools(sent))
    if "input" in sent:  # a Responses backend: stateless, the gateway keeps the state
        assert sent["store"] is False


async def test_backend_400_keeps_status_and_message(
    gw: GatewayHarness, client: AsyncOpenAI
) -> None:
    error = {"error": {"message": "bad max_tokens", "type": "invalid_request_error", "code": None}}
    gw.backend.script([Status(400, error)])
    with pytest.raises(openai.BadRequestError) as raised:
        await _create(client, stream=True)
    assert raised.value.status_code == 400
    assert "bad max_tokens" in raised.value.message


async def test_backend_refusing_connections_is_502(api: str) -> None:
    async with (
        GatewayHarness(upstream=refusing_url(), upstream_api=api) as gw,
        AsyncOpenAI(base_url=gw.url, api_key="k", max_retries=0) as client,
    ):
        for stream in (False, True):
            with pytest.raises(openai.APIStatusError) as raised:
                await _create(client, stream=stream)
            assert raised.value.status_code == 502
            assert raised.value.body["code"] == "upstream_unreachable"  # type: ignore[index]


async def test_two_turn_loop_replays_call_under_same_flat_name(
    gw: GatewayHarness, client: AsyncOpenAI
) -> None:
    gw.backend.script(
        [
            *tool_call_chunks(0, "call_1", ["mcp__docs__search"], ['{"q":"x"}']),
            finish("tool_calls"),
            DONE,
        ],
        [*text_chunks(["found it"]), *END],
    )
    first = await _create(client)
    call = first.output[0]
    assert (call.type, call.namespace, call.name) == ("function_call", "mcp__docs", "search")

    second = await client.responses.create(
        model="test-model",
        tools=TOOLS,
        store=False,
        input=[
            {"role": "user", "content": "hi"},
            call.to_dict(),
            {
                "type": "function_call_output",
                "call_id": call.call_id,
                "output": [{"type": "input_text", "text": "result A"},
                           {"type": "input_text", "text": "result B"}],
            },
        ],
    )  # fmt: skip
    assert second.output_text == "found it"
    if "input" in gw.backend.requests[-1]:
        *_, replayed, output = gw.backend.requests[-1]["input"]
        assert replayed == {"type": "function_call", "call_id": "call_1",
                            "name": "mcp__docs__search", "arguments": '{"q":"x"}',
                            "status": "completed"}  # fmt: skip
        assert output["type"] == "function_call_output" and output["call_id"] == "call_1"
        return
    messages = gw.backend.requests[-1]["messages"]
    assistant, tool = messages[-2], messages[-1]
    assert assistant["role"] == "assistant"
    assert assistant["tool_calls"] == [
        {"id": "call_1", "type": "function",
         "function": {"name": "mcp__docs__search", "arguments": '{"q":"x"}'}}
    ]  # fmt: skip
    assert tool["role"] == "tool" and tool["tool_call_id"] == "call_1"
    assert "result A" in tool["content"] and "result B" in tool["content"]


async def test_request_errors_have_openai_shape_and_param(client: AsyncOpenAI) -> None:
    bad_tools = [
        {"type": "namespace", "name": "ns", "description": "", "tools": [{"type": "function"}]}
    ]
    with pytest.raises(openai.BadRequestError) as raised:
        await client.responses.create(model="m", input="hi", tools=bad_tools)  # type: ignore[arg-type]
    assert raised.value.body["param"] == "tools[0].tools[0].name"  # type: ignore[index]
    assert raised.value.body["type"] == "invalid_request_error"  # type: ignore[index]


async def test_unknown_fields_and_items_pass_without_error(
    gw: GatewayHarness, client: AsyncOpenAI
) -> None:
    gw.backend.script([*text_chunks(["ok"]), *END])
    response = await client.responses.create(
        model="m",
        input=[
            {"type": "brand_new_item", "data": 1},  # (a compaction is opened: test_compaction)
            {"role": "user", "content": "hi", "phase": "final_answer"},
        ],
        extra_body={"client_metadata": {"a": "b"}, "prompt_cache_key": "k", "brand_new_field": 1},
    )
    assert response.output_text == "ok"
    assert last_input_text(gw.backend.requests[-1]) == "hi"


async def test_models_are_forwarded(client: AsyncOpenAI) -> None:
    models = await client.models.list()
    assert [m.id async for m in models]


async def test_client_disconnect_cancels_backend_request(gw: GatewayHarness) -> None:
    import aiohttp

    gw.backend.script([*text_chunks(["a"]), ("sleep", 30)])
    async with aiohttp.ClientSession() as session:
        response = await session.post(
            gw.url + "/responses", json={"model": "m", "input": "hi", "stream": True}
        )
        await response.content.readuntil(b"output_text.delta")
        response.close()
    waited = await gw.backend.records[-1].wait_disconnect(timeout=5)
    assert waited < 5
