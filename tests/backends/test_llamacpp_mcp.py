"""Remote MCP tools run by the gateway in front of the real llama.cpp server (tiny model).

The model's words are random but its tool calls are shaped by the server's grammar: with
`tool_choice: "required"` it calls the one allowed MCP tool, the gateway runs it on the real
MCP server (tests/mcp_server.py) and asks the model again, inside one Response, until the
MCP call budget (`max_tool_calls`) is spent; on the Chat and on the Responses API, streamed
(every event checked by the SDK's types) and not.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from harness import GatewayHarness
from openai import AsyncOpenAI
from sdk_models import validate_event, validate_response
from test_mcp import mcp_server

pytestmark = pytest.mark.backends

KNOWN = ": a word the test server knows"


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    with mcp_server() as url:
        yield url


def request(url: str) -> dict[str, Any]:
    tool = {
        "type": "mcp",
        "server_label": "dict",
        "server_url": url,
        "require_approval": "never",
        "allowed_tools": ["spell"],
    }
    return {
        "model": "tiny",
        "input": "Look a word up.",
        "tools": [tool],
        "tool_choice": "required",
        "max_tool_calls": 2,
        "temperature": 0,
        "max_output_tokens": 96,
    }


def check(body: dict[str, Any]) -> None:
    validate_response(body)
    output = body["output"]
    assert output[0]["type"] == "mcp_list_tools"
    assert [t["name"] for t in output[0]["tools"]] == ["spell"]
    calls = [i for i in output if i["type"] == "mcp_call"]
    assert calls, output
    ran = [c for c in calls if c["status"] == "completed"]
    assert ran, calls
    for call in ran:  # the grammar's JSON arguments, run on the server
        term = orjson.loads(call["arguments"])["q"]
        assert call["output"] == f"{term}{KNOWN}"
    assert len(calls) <= 3  # two run (the budget), at most one more refused


@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_the_mcp_loop_on_llamacpp(llama_server: str, server_url: str, api: str) -> None:
    settings: dict[str, Any] = {"upstream": llama_server, "mcp_allow": ("127.0.0.1",)}
    if api == "responses":
        settings.update(upstream_api="responses", backend_profile="llamacpp")
    async with GatewayHarness(**settings) as gw:
        client = AsyncOpenAI(base_url=gw.url, api_key="k", max_retries=0, timeout=120)
        body = (await client.responses.create(**request(server_url))).model_dump(mode="json")
        check(body)
        final = None
        async for event in await client.responses.create(stream=True, **request(server_url)):
            validate_event(event.model_dump(mode="json"))
            if event.type in ("response.completed", "response.incomplete"):
                final = event.response.model_dump(mode="json")
        assert final is not None
        check(final)
