"""The gateway in front of a real llama.cpp `llama-server` (tiny random model), official SDK.

The model's words are random; the server's grammar forces the shape of its tool calls. So the
tests check shapes: a call resolves to a declared (namespace, name) with JSON arguments, text
turns stream text, a cut turn is `incomplete`, and every stream passes the SDK's own checks.
"""

from __future__ import annotations

import io
import itertools
import json
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
import websockets
from harness import GatewayHarness
from openai import AsyncOpenAI
from sdk_models import validate_event

from streamer.cli import build_parser
from streamer.tap.command import run_tap

pytestmark = pytest.mark.backends


def fn(name: str) -> dict[str, Any]:
    """A function tool with one short string argument (bounded: random strings run long)."""
    props = {"q": {"type": "string", "maxLength": 6}}
    schema = {"type": "object", "properties": props, "required": ["q"]}
    return {"type": "function", "name": name, "description": f"{name}.", "parameters": schema}


def namespace(name: str, *tools: str) -> dict[str, Any]:
    return {"type": "namespace", "name": name, "description": name, "tools": [fn(t) for t in tools]}


ONE_NAMESPACE = [namespace("mcp__docs", "search")]
MIXED = [namespace("mcp__docs", "search", "fetch"), namespace("crm", "lookup"), fn("exec_command")]


def declared(tools: list[dict[str, Any]]) -> set[tuple[str | None, str]]:
    out: set[tuple[str | None, str]] = set()
    for t in tools:
        if t["type"] == "namespace":
            out |= {(t["name"], inner["name"]) for inner in t["tools"]}
        else:
            out.add((None, t["name"]))
    return out


async def streamed(client: AsyncOpenAI, **fields: Any) -> Any:
    """One streamed turn through `responses.stream()` (which raises on protocol errors)."""
    fields.setdefault("model", "tiny")
    async with client.responses.stream(**fields) as stream:
        async for event in stream:
            validate_event(event.model_dump(mode="json"))
        return await stream.get_final_response()


async def streamed_any(client: AsyncOpenAI, **fields: Any) -> Any:
    """One streamed turn that may end `incomplete` (which `responses.stream()` refuses)."""
    fields.setdefault("model", "tiny")
    final = None
    async for event in await client.responses.create(stream=True, **fields):
        validate_event(event.model_dump(mode="json"))
        if event.type in ("response.completed", "response.incomplete"):
            final = event.response
    assert final is not None
    return final


def calls(response: Any, tools: list[dict[str, Any]]) -> list[Any]:
    """The response's function calls, each checked against the declared tools."""
    found = [item for item in response.output if item.type == "function_call"]
    assert found, response.model_dump_json()
    for call in found:
        key = (getattr(call, "namespace", None), call.name)
        assert key in declared(tools), (key, declared(tools))
        assert isinstance(json.loads(call.arguments), dict)
    return found


def called(response: Any) -> set[tuple[str | None, str]]:
    """The (namespace, name) of every call; each one that completed has JSON arguments."""
    found = [item for item in response.output if item.type == "function_call"]
    assert found, response.model_dump_json()
    for call in found:
        if call.status == "completed":
            assert isinstance(json.loads(call.arguments), dict)
    return {(getattr(c, "namespace", None), c.name) for c in found}


# Greedy sampling: fast (a second or two a turn) and the tiny model then repeats its call
# until the token limit, so the last call may be cut (`incomplete`).
GREEDY: dict[str, Any] = {"temperature": 0, "max_output_tokens": 96}


async def test_text(real_client: AsyncOpenAI) -> None:
    response = await streamed_any(real_client, input="Say something.", max_output_tokens=24)
    (message,) = [item for item in response.output if item.type == "message"]
    assert response.output_text == message.content[0].text
    assert response.usage is not None and response.usage.output_tokens > 0


async def test_cut_at_max_output_tokens(real_client: AsyncOpenAI) -> None:
    response = await streamed_any(real_client, input="Write a long story.", max_output_tokens=16)
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage is not None and response.usage.output_tokens == 16


async def test_namespaced_call(real_client: AsyncOpenAI) -> None:
    response = await streamed(
        real_client, input="Search the docs.", tools=ONE_NAMESPACE, tool_choice="required"
    )
    assert {(getattr(c, "namespace", None), c.name) for c in calls(response, ONE_NAMESPACE)} == {
        ("mcp__docs", "search")
    }


@pytest.mark.parametrize("style", ["codex", "double-underscore", "llamacpp", "dotted"])
async def test_two_namespaces_and_a_top_level_tool(
    style: str, llama_server: str, recorded: Any
) -> None:
    async with (
        recorded(llama_server, tool_name_style=style) as gw,
        AsyncOpenAI(base_url=gw.url, api_key="k", max_retries=0, timeout=120) as client,
    ):
        response = await streamed_any(
            client, input="Do it.", tools=MIXED, tool_choice="required", **GREEDY
        )
    assert called(response) <= declared(MIXED)


async def test_websocket(real_gw: GatewayHarness) -> None:
    frame = {"type": "response.create", "model": "tiny", "input": "Hi.", "max_output_tokens": 16}
    async with websockets.connect(real_gw.ws_url, open_timeout=10) as ws:
        await ws.send(orjson.dumps(frame).decode())
        types: list[str] = []
        while not types or types[-1] not in ("response.completed", "response.incomplete"):
            event = orjson.loads(await ws.recv())
            validate_event(event)
            types.append(event["type"])
    assert types[0] == "response.created" and "response.output_text.delta" in types


async def test_previous_response_id_replay(real_client: AsyncOpenAI) -> None:
    first = await streamed(
        real_client, input="Search.", tools=ONE_NAMESPACE, tool_choice="required", store=True
    )
    outputs = [
        {"type": "function_call_output", "call_id": c.call_id, "output": "nothing found"}
        for c in calls(first, ONE_NAMESPACE)
    ]
    second = await streamed_any(
        real_client,
        input=outputs,
        previous_response_id=first.id,
        tools=ONE_NAMESPACE,
        max_output_tokens=16,
    )  # llama.cpp answers 500 to replayed arguments that are not valid JSON
    assert second.status in ("completed", "incomplete")
    assert second.previous_response_id == first.id


async def test_tap_recording_is_clean(llama_server: str, tmp_path: Path) -> None:
    """Every gateway here records (`recorded`, `real_gw`) and checks each stream with the
    tap when it closes; this is that check spelled out, on a mixed tool turn."""
    tap_dir = tmp_path / "tap"
    async with (
        GatewayHarness(upstream=llama_server, tap_dir=str(tap_dir)) as gw,
        AsyncOpenAI(base_url=gw.url, api_key="k", max_retries=0, timeout=120) as client,
    ):
        response = await streamed_any(
            client, input="Go.", tools=MIXED, tool_choice="required", **GREEDY
        )
    assert called(response) <= declared(MIXED)
    (path,) = tap_dir.iterdir()
    args = build_parser().parse_args(["tap", str(path), "--color", "never"])
    out = io.StringIO()
    assert await run_tap(args, out) == 0, out.getvalue()


# -- scenarios of issue 15: tool_choice, allowed_tools, parallel calls, reasoning, overflow


async def test_forced_named_tool_choice(real_client: AsyncOpenAI) -> None:
    """llama.cpp ignores a named tool_choice object; the gateway sends "required" over the
    one chosen tool, so every call is that tool."""
    choice: Any = {"type": "function", "name": "fetch", "namespace": "mcp__docs"}
    response = await streamed_any(
        real_client, input="Fetch.", tools=MIXED, tool_choice=choice, **GREEDY
    )
    assert called(response) == {("mcp__docs", "fetch")}


async def test_allowed_tools_required_with_one_tool(real_client: AsyncOpenAI) -> None:
    only = [{"type": "function", "name": "lookup", "namespace": "crm"}]
    choice: Any = {"type": "allowed_tools", "mode": "required", "tools": only}
    response = await streamed_any(
        real_client, input="Look up.", tools=MIXED, tool_choice=choice, **GREEDY
    )
    assert called(response) == {("crm", "lookup")}


def call_spans(events: list[dict[str, Any]]) -> list[tuple[int, int, int, int]]:
    """Per function call, in output order: the positions of its `output_item.added`, first
    arguments delta, `function_call_arguments.done` and `output_item.done` in the stream."""
    spans: dict[int, list[int]] = {}
    for at, event in enumerate(events):
        item = event.get("item") or {}
        index = event.get("output_index")
        if event["type"] == "response.output_item.added" and item.get("type") == "function_call":
            spans[index] = [at, -1, -1, -1]
        elif index in spans and event["type"] == "response.function_call_arguments.delta":
            spans[index][1] = at if spans[index][1] < 0 else spans[index][1]
        elif index in spans and event["type"] == "response.function_call_arguments.done":
            spans[index][2] = at
        elif index in spans and event["type"] == "response.output_item.done":
            spans[index][3] = at
    return [tuple(spans[i]) for i in sorted(spans)]  # type: ignore[misc]


async def test_parallel_calls_stream_whole_and_in_order(real_client: AsyncOpenAI) -> None:
    """Greedy sampling makes the tiny model repeat calls until the token limit: several calls
    in one response, sent one after another. Each must stream whole (added, arguments,
    arguments done, item done) before the next begins; only the cut last one is incomplete."""
    events: list[dict[str, Any]] = []
    stream = await real_client.responses.create(
        model="tiny",
        input="Do it.",
        tools=MIXED,
        tool_choice="required",
        parallel_tool_calls=True,
        temperature=0,
        max_output_tokens=160,
        stream=True,
    )
    async for event in stream:
        data = event.model_dump(mode="json")
        validate_event(data)
        events.append(data)
    final = events[-1]["response"]
    done = [i for i in final["output"] if i["type"] == "function_call"]
    whole = [c for c in done if c["status"] == "completed"]
    assert len(whole) >= 2, [(c["name"], c["arguments"], c["status"]) for c in done]
    for call in whole:
        assert isinstance(json.loads(call["arguments"]), dict)
    spans = call_spans(events)
    assert len(spans) == len(done)
    for added, first_delta, args_done, item_done in spans:
        assert added < first_delta < args_done < item_done, spans
    for (_, _, _, item_done), (next_added, _, _, _) in itertools.pairwise(spans):
        assert item_done < next_added, spans  # the first call is finished before the next
    if final["status"] == "incomplete":  # cut at max_output_tokens: only the last call
        assert [c["status"] for c in done[:-1]] == ["completed"] * (len(done) - 1)


async def test_reasoning_streams_from_reasoning_content(
    llama_thinking_server: str, recorded: Any
) -> None:
    async with (
        recorded(llama_thinking_server) as gw,
        AsyncOpenAI(base_url=gw.url, api_key="k", max_retries=0, timeout=120) as client,
    ):
        types: list[str] = []
        final = None
        stream = await client.responses.create(
            model="tiny", input="Think first.", max_output_tokens=48, stream=True
        )
        async for event in stream:
            validate_event(event.model_dump(mode="json"))
            types.append(event.type)
            if event.type in ("response.completed", "response.incomplete"):
                final = event.response
    assert final is not None
    assert "response.reasoning_text.delta" in types
    kinds = [item.type for item in final.output]
    assert kinds[0] == "reasoning", kinds
    reasoning = final.output[0]
    assert reasoning.content and reasoning.content[0].text
    assert set(kinds) <= {"reasoning", "message"} and kinds.count("reasoning") == 1


@pytest.mark.parametrize("stream", [False, True])
async def test_context_overflow_is_context_length_exceeded(
    real_client: AsyncOpenAI, stream: bool
) -> None:
    """A prompt beyond the slot's 4096 tokens: llama.cpp's `exceed_context_size_error`
    reaches the SDK as `context_length_exceeded`, what Codex keys on."""
    with pytest.raises(openai.BadRequestError) as raised:
        await real_client.responses.create(
            model="tiny", input="word " * 9000, max_output_tokens=16, stream=stream
        )
    assert raised.value.code == "context_length_exceeded", raised.value.body
    assert "context" in raised.value.message


PNG_1PX = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQ"
    "DwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


async def test_tool_output_image_to_a_model_without_vision(real_client: AsyncOpenAI) -> None:
    """The image of a `view_image` output reaches llama.cpp as a user image part; this model
    has no vision projector, so llama.cpp refuses it, and the SDK sees a 400 with llama.cpp's
    own message (a deterministic rejection: not a 500 that clients retry)."""
    items: Any = [
        {"role": "user", "content": "Look at red.png"},
        {"type": "function_call", "call_id": "c1", "name": "view_image", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": [
            {"type": "input_image", "image_url": PNG_1PX}
        ]},
    ]  # fmt: skip
    with pytest.raises(openai.BadRequestError) as raised:
        await real_client.responses.create(
            model="tiny", input=items, tools=[fn("view_image")], max_output_tokens=16
        )
    assert "image" in raised.value.message.lower(), raised.value.body
