"""The gateway in front of a real llama.cpp `llama-server` (tiny random model), official SDK.

The model's words are random; the server's grammar forces the shape of its tool calls. So the
tests check shapes: a call resolves to a declared (namespace, name) with JSON arguments, text
turns stream text, a cut turn is `incomplete`, and every stream passes the SDK's own checks.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

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
async def test_two_namespaces_and_a_top_level_tool(style: str, llama_server: str) -> None:
    async with (
        GatewayHarness(upstream=llama_server, tool_name_style=style) as gw,
        AsyncOpenAI(base_url=gw.url, api_key="k", max_retries=0, timeout=120) as client,
    ):
        response = await streamed(client, input="Do it.", tools=MIXED, tool_choice="required")
    calls(response, MIXED)


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
    tap_dir = tmp_path / "tap"
    async with (
        GatewayHarness(upstream=llama_server, tap_dir=str(tap_dir)) as gw,
        AsyncOpenAI(base_url=gw.url, api_key="k", max_retries=0, timeout=120) as client,
    ):
        await streamed(client, input="Go.", tools=MIXED, tool_choice="required")
    (path,) = tap_dir.iterdir()
    args = build_parser().parse_args(["tap", str(path), "--color", "never"])
    out = io.StringIO()
    assert await run_tap(args, out) == 0, out.getvalue()
