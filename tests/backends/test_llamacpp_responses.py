"""The gateway in `--upstream-api responses` before the real llama.cpp `/v1/responses`.

llama.cpp's own Responses endpoint skips every non-function tool (MCP namespaces vanish),
numbers no item (`output_index` absent: items are told apart by id) and keeps nothing
(`store` is ignored). The gateway flattens the namespaces (`--backend-profile llamacpp`),
restores them on the way back, and keeps the state itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
import websockets
from openai import AsyncOpenAI
from sdk_models import validate_event
from test_llamacpp import (
    GREEDY,
    MIXED,
    ONE_NAMESPACE,
    called,
    calls,
    declared,
    streamed,
    streamed_any,
)

pytestmark = pytest.mark.backends
RESPONSES: dict[str, Any] = {"upstream_api": "responses", "backend_profile": "llamacpp"}


async def test_text_through_responses(llama_server: str, recorded: Any) -> None:
    async with (
        recorded(llama_server, **RESPONSES) as gw,
        AsyncOpenAI(base_url=gw.url, api_key="k", max_retries=0, timeout=120) as client,
    ):
        response = await streamed_any(client, input="Say something.", max_output_tokens=16)
    (message,) = [item for item in response.output if item.type == "message"]
    assert response.output_text == message.content[0].text != ""
    assert response.usage is not None and response.usage.input_tokens > 0


async def test_namespaced_calls_come_back_with_their_namespace(
    llama_server: str, recorded: Any
) -> None:
    async with (
        recorded(llama_server, **RESPONSES) as gw,
        AsyncOpenAI(base_url=gw.url, api_key="k", max_retries=0, timeout=120) as client,
    ):
        response = await streamed_any(
            client, input="Do it.", tools=MIXED, tool_choice="required", **GREEDY
        )
    assert called(response) <= declared(MIXED)
    assert any(namespace for namespace, _ in called(response))


async def test_the_gateway_keeps_the_state(llama_server: str, recorded: Any) -> None:
    async with (
        recorded(llama_server, **RESPONSES) as gw,
        AsyncOpenAI(base_url=gw.url, api_key="k", max_retries=0, timeout=120) as client,
    ):
        first = await streamed(
            client, input="Search.", tools=ONE_NAMESPACE, tool_choice="required", store=True
        )
        outputs = [
            {"type": "function_call_output", "call_id": c.call_id, "output": "nothing found"}
            for c in calls(first, ONE_NAMESPACE)
        ]
        second = await streamed_any(
            client, input=outputs, previous_response_id=first.id, tools=ONE_NAMESPACE,
            max_output_tokens=16,
        )  # fmt: skip
    assert second.status in ("completed", "incomplete")
    assert second.previous_response_id == first.id


async def test_websocket_through_responses(
    llama_server: str, recorded: Any, tmp_path: Path
) -> None:
    async with recorded(llama_server, **RESPONSES) as gw:
        frame = {"type": "response.create", "model": "tiny", "input": "Hi.", "tools": ONE_NAMESPACE,
                 "tool_choice": "required", **GREEDY}  # fmt: skip
        async with websockets.connect(gw.ws_url, open_timeout=10) as ws:
            await ws.send(orjson.dumps(frame).decode())
            events: list[dict[str, Any]] = []
            while not events or events[-1]["type"] not in (
                "response.completed",
                "response.incomplete",
            ):
                events.append(orjson.loads(await ws.recv()))
                validate_event(events[-1])
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert {(i.get("namespace"), i["name"]) for i in done if i["type"] == "function_call"} == {
        ("mcp__docs", "search")
    }
