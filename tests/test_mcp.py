"""Remote MCP servers run by the gateway (`{"type": "mcp"}` tools), end to end.

A real MCP server (tests/mcp_server.py, the `mcp` SDK's own, in a subprocess on loopback),
the gateway in front of a scripted backend of each kind (Chat, Responses) that calls the
server's tools by the flat names the gateway declared and answers with what the tool said,
and the official `openai` SDK as the client: every streamed event is validated against the
SDK's typed models, and the non-streaming answer is the streamed one's terminal response.
"""

from __future__ import annotations

import contextlib
import select
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from harness import GatewayHarness
from openai import AsyncOpenAI
from scripted_backend import DONE, ScriptedBackend, finish, text_chunks, tool_call_chunks, usage
from scripted_responses_backend import ScriptedResponsesBackend
from sdk_models import validate_event, validate_response

SERVER = Path(__file__).with_name("mcp_server.py")
TOKEN = "s3cret-token-for-the-test"


@contextlib.contextmanager
def mcp_server(*args: str) -> Iterator[str]:
    """The test MCP server in its own process: its URL once it listens."""
    proc = subprocess.Popen([sys.executable, str(SERVER), *args], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 60)  # a deadline, not a sleep
        assert ready, "the MCP server did not start"
        line = proc.stdout.readline()
        assert line.startswith("MCP READY"), line
        path = "/sse" if "--sse" in args else "/mcp"
        yield f"http://127.0.0.1:{line.split()[-1]}{path}"
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    with mcp_server() as url:
        yield url


@pytest.fixture(params=["chat", "responses"])
def api(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def flat_name(body: dict[str, Any], tool: str) -> str:
    """The flat name the gateway declared for an MCP tool, as the backend got it."""
    for t in body.get("tools") or ():
        name = t.get("function", t).get("name", "")
        if name.endswith(tool):
            return str(name)
    raise AssertionError(f"no tool {tool!r} in {body.get('tools')}")


def tool_result(body: dict[str, Any]) -> str | None:
    """The last tool result the backend got (Chat `tool` message, Responses output item)."""
    if "messages" in body:
        last = body["messages"][-1]
        return last["content"] if last.get("role") == "tool" else None
    last = body["input"][-1]
    return last.get("output") if last.get("type") == "function_call_output" else None


def caller(tool: str, arguments: dict[str, Any]) -> Any:
    """A model that calls `tool` once, then answers with what it said."""

    def respond(body: dict[str, Any]) -> list[Any]:
        result = tool_result(body)
        if result is None:
            args = orjson.dumps(arguments).decode()
            calls = tool_call_chunks(0, "call_1", [flat_name(body, tool)], [args])
            return [*calls, finish("tool_calls"), usage(10, 5), DONE]
        return [*text_chunks(["Said: ", result]), finish("stop"), usage(20, 4), DONE]

    return respond


@pytest.fixture
async def gw(api: str) -> AsyncIterator[GatewayHarness]:
    backend = ScriptedResponsesBackend() if api == "responses" else ScriptedBackend()
    async with GatewayHarness(backend=backend, upstream_api=api, mcp_allow=("127.0.0.1",)) as h:
        yield h


def mcp_tool(url: str, **fields: Any) -> dict[str, Any]:
    return {
        "type": "mcp",
        "server_label": "dict",
        "server_url": url,
        "require_approval": "never",
        **fields,
    }


async def streamed(client: AsyncOpenAI, **request: Any) -> tuple[list[Any], dict[str, Any]]:
    """The typed events of a streamed response, and its terminal response."""
    events = []
    async with await client.responses.create(stream=True, **request) as stream:
        async for event in stream:
            events.append(validate_event(event.model_dump(mode="json", exclude_unset=True)))
    return events, events[-1].response.model_dump(mode="json")


async def test_a_call_runs_on_the_server_and_the_model_answers_with_it(
    gw: GatewayHarness, server_url: str
) -> None:
    gw.backend.responder = caller("lookup", {"term": "petrichor"})
    client = AsyncOpenAI(base_url=gw.url, api_key="k")
    request = {"model": "m", "input": "look it up", "tools": [mcp_tool(server_url)]}
    events, final = await streamed(client, **request)
    types = [e.type for e in events]
    for expected in (
        "response.mcp_list_tools.in_progress",
        "response.mcp_list_tools.completed",
        "response.mcp_call.in_progress",
        "response.mcp_call_arguments.delta",
        "response.mcp_call_arguments.done",
        "response.mcp_call.completed",
        "response.completed",
    ):
        assert expected in types, (expected, types)
    assert types.index("response.mcp_call.completed") < types.index("response.output_text.delta")
    output = final["output"]
    assert [i["type"] for i in output] == ["mcp_list_tools", "mcp_call", "message"]
    listed, call, message = output
    assert listed["server_label"] == "dict"
    assert {t["name"] for t in listed["tools"]} == {"lookup", "weather", "broken", "count"}
    lookup = next(t for t in listed["tools"] if t["name"] == "lookup")
    assert lookup["annotations"] == {"read_only": True}
    assert lookup["input_schema"]["properties"]["term"]["type"] == "string"
    assert call["name"] == "lookup" and call["server_label"] == "dict"
    assert orjson.loads(call["arguments"]) == {"term": "petrichor"}
    assert call["output"] == "petrichor: a word the test server knows"
    assert call["error"] is None and call["status"] == "completed"
    said = message["content"][0]["text"]
    assert said == "Said: petrichor: a word the test server knows"
    assert final["usage"]["input_tokens"] == 30 and final["usage"]["output_tokens"] == 9
    assert final["tools"][0]["headers"] is None
    assert len(gw.backend.requests) == 2
    assert tool_result(gw.backend.requests[1]) == call["output"]
    # the same turn, not streamed: the same items
    gw.backend.responder = caller("lookup", {"term": "petrichor"})
    body = (await client.responses.create(**request)).model_dump(mode="json")
    validate_response(body)
    assert [i["type"] for i in body["output"]] == ["mcp_list_tools", "mcp_call", "message"]
    assert body["output"][1]["output"] == call["output"]
    assert body["output"][2]["content"][0]["text"] == said
