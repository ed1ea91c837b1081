"""Remote MCP tools through more clients, transports and servers than tests/test_mcp.py.

The Agents SDK's `HostedMCPTool` (with and without approval, via `on_approval_request`),
the gateway's WebSocket mode and background mode, the HTTP+SSE transport, and the npm
reference server (`@modelcontextprotocol/server-everything`, scripts/install-mcp-everything.sh)
over streamable HTTP; all through a Chat backend that calls the tools by their flat names.
"""

from __future__ import annotations

import asyncio
import os
import select
import socket
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import orjson
import pytest
import websockets
from harness import GatewayHarness
from openai import AsyncOpenAI
from scripted_backend import ScriptedBackend
from test_client_aisdk import _missing as aisdk_missing
from test_client_aisdk import _run as run_aisdk
from test_mcp import caller, mcp_server, mcp_tool, output_of, tool_result

agents = pytest.importorskip("agents", reason="openai-agents is not installed (the test extra)")

from agents import (  # noqa: E402
    Agent,
    HostedMCPTool,
    MCPToolApprovalFunctionResult,
    MCPToolApprovalRequest,
    OpenAIProvider,
    RunConfig,
    Runner,
    set_tracing_disabled,
)

set_tracing_disabled(True)
EVERYTHING = (
    Path(__file__).resolve().parent.parent
    / ".tools/mcpnpm/node_modules/@modelcontextprotocol/server-everything/dist/index.js"
)


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    with mcp_server() as url:
        yield url


@pytest.fixture
async def gw() -> AsyncIterator[GatewayHarness]:
    async with GatewayHarness(backend=ScriptedBackend(), mcp_allow=("127.0.0.1",)) as harness:
        yield harness


def run_config(gw: GatewayHarness) -> RunConfig:
    sdk = AsyncOpenAI(base_url=gw.url, api_key="k", max_retries=0)
    return RunConfig(model_provider=OpenAIProvider(openai_client=sdk, use_responses=True))


@pytest.mark.parametrize("approval", ["never", "approved", "declined"])
async def test_the_agents_sdk_hosted_mcp_tool(
    gw: GatewayHarness, server_url: str, approval: str
) -> None:
    gw.backend.responder = caller("lookup", {"term": "agent"})
    asked: list[str] = []

    def decide(request: MCPToolApprovalRequest) -> MCPToolApprovalFunctionResult:
        asked.append(request.data.name)
        if approval == "approved":
            return {"approve": True}
        return {"approve": False, "reason": "not today"}

    config = mcp_tool(server_url, require_approval="never" if approval == "never" else "always")
    tool = HostedMCPTool(
        tool_config=config,  # type: ignore[arg-type]
        on_approval_request=None if approval == "never" else decide,
    )
    agent = Agent(name="mcp", instructions="Use the dictionary.", tools=[tool])
    result = await Runner.run(agent, "Look it up", run_config=run_config(gw))
    types = [item.type for item in result.new_items]
    if approval == "declined":
        assert asked == ["lookup"]
        assert "declined" in result.final_output and "not today" in result.final_output
        return
    assert result.final_output == "Said: agent: a word the test server knows"
    assert asked == ([] if approval == "never" else ["lookup"])
    assert "tool_call_item" in types  # the SDK's item for an mcp_call
    calls = [i.raw_item for i in result.new_items if getattr(i.raw_item, "type", "") == "mcp_call"]
    assert calls and calls[-1].output == "agent: a word the test server knows"


async def test_the_websocket_mode(gw: GatewayHarness, server_url: str) -> None:
    gw.backend.responder = caller("lookup", {"term": "socket"})
    request = {"model": "m", "input": "go", "tools": [mcp_tool(server_url)]}
    types = []
    async with websockets.connect(gw.ws_url) as ws:
        await ws.send(orjson.dumps({"type": "response.create", **request}).decode())
        while True:
            event = orjson.loads(await asyncio.wait_for(ws.recv(), 60))
            types.append(event["type"])
            if event["type"] in ("response.completed", "response.failed", "error"):
                break
    assert types[-1] == "response.completed", types
    assert "response.mcp_call.completed" in types and "response.mcp_list_tools.completed" in types
    output = event["response"]["output"]
    assert [i["type"] for i in output] == ["mcp_list_tools", "mcp_call", "message"]


async def test_the_background_mode(gw: GatewayHarness, server_url: str) -> None:
    gw.backend.responder = caller("weather", {"city": "Bergen"})
    client = AsyncOpenAI(base_url=gw.url, api_key="k")
    started = await client.responses.create(
        model="m", input="go", tools=[mcp_tool(server_url)], background=True
    )
    events = []
    async with await client.responses.retrieve(started.id, stream=True) as stream:
        async for event in stream:
            events.append(event)
    final = events[-1].response
    assert final.status == "completed"
    assert [i.type for i in final.output] == ["mcp_list_tools", "mcp_call", "message"]
    assert "Bergen" in (final.output[1].output or "")


async def test_the_http_sse_transport(gw: GatewayHarness) -> None:
    with mcp_server("--sse") as url:
        gw.backend.responder = caller("lookup", {"term": "sse"})
        client = AsyncOpenAI(base_url=gw.url, api_key="k")
        response = await client.responses.create(model="m", input="go", tools=[mcp_tool(url)])
    output = output_of(response)
    assert output[1]["output"] == "sse: a word the test server knows"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def everything() -> Iterator[str]:
    """The npm reference server over streamable HTTP: its URL once it listens."""
    if not EVERYTHING.exists():
        pytest.skip("server-everything is not installed (scripts/install-mcp-everything.sh)")
    port = _free_port()
    env = {**os.environ, "PORT": str(port)}
    proc = subprocess.Popen(
        ["node", str(EVERYTHING), "streamableHttp"], env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stderr is not None
        while True:  # its log line says it listens; a deadline, not a sleep
            ready, _, _ = select.select([proc.stderr], [], [], 60)
            assert ready, "server-everything did not start"
            line = proc.stderr.readline()
            assert line, "server-everything exited"
            if "listening on port" in line:
                break
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(30)


async def test_the_npm_reference_server(gw: GatewayHarness, everything: str) -> None:
    gw.backend.responder = caller("echo", {"message": "from npm"})
    client = AsyncOpenAI(base_url=gw.url, api_key="k")
    tool = mcp_tool(everything, server_label="everything", allowed_tools=["echo", "get-sum"])
    response = await client.responses.create(model="m", input="go", tools=[tool])
    listed, call, message = output_of(response)
    assert {t["name"] for t in listed["tools"]} == {"echo", "get-sum"}
    assert call["server_label"] == "everything" and call["output"] == "Echo: from npm"
    assert tool_result(gw.backend.requests[-1]) == "Echo: from npm"
    assert message["content"][0]["text"] == "Said: Echo: from npm"


async def test_the_ai_sdks_remote_mcp_tool(
    gw: GatewayHarness, server_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = aisdk_missing()
    if missing is not None:
        pytest.skip(missing)
    gw.backend.responder = caller("lookup", {"term": "vercel"})
    monkeypatch.setenv("AISDK_MCP_URL", server_url)
    result = await run_aisdk(gw, "mcp")
    assert result["text"] == "Said: vercel: a word the test server knows"
    results = [c for c in result["content"] if c["type"] == "tool-result"]
    assert results and results[0]["output"]["output"] == "vercel: a word the test server knows"


async def test_max_turn_seconds_bounds_an_mcp_call(server_url: str) -> None:
    async with GatewayHarness(
        backend=ScriptedBackend(), mcp_allow=("127.0.0.1",), mcp_timeout=60.0, max_turn_seconds=1.0
    ) as gw:
        gw.backend.responder = caller("stuck", {})
        client = AsyncOpenAI(base_url=gw.url, api_key="k")
        response = await client.responses.create(
            model="m", input="go", tools=[mcp_tool(server_url)]
        )
    assert response.status == "failed"
    assert response.error is not None
    assert "longer than the gateway allows (1 s)" in response.error.message


async def test_the_sdk_s_strict_stream_accumulator(gw: GatewayHarness, server_url: str) -> None:
    """`responses.stream()` raises on any event out of place; its final response is whole."""
    gw.backend.responder = caller("lookup", {"term": "strict"})
    client = AsyncOpenAI(base_url=gw.url, api_key="k")
    async with client.responses.stream(
        model="m",
        input="go",
        tools=[mcp_tool(server_url)],  # type: ignore[list-item]
    ) as stream:
        async for _event in stream:
            pass
        final = await stream.get_final_response()
    assert [i.type for i in final.output] == ["mcp_list_tools", "mcp_call", "message"]
    assert final.output_text == "Said: strict: a word the test server knows"


async def test_two_servers_are_two_namespaces(gw: GatewayHarness, server_url: str) -> None:
    gw.backend.responder = caller("lookup", {"term": "two"})
    client = AsyncOpenAI(base_url=gw.url, api_key="k")
    own = {"type": "function", "name": "lookup", "parameters": {"type": "object"}}
    tools = [
        mcp_tool(server_url, server_label="a", allowed_tools=["lookup"]),
        mcp_tool(server_url, server_label="b", allowed_tools=["lookup"]),
        own,  # the client's own tool of the same name keeps its name
    ]
    response = await client.responses.create(model="m", input="go", tools=tools)  # type: ignore[arg-type]
    output = output_of(response)
    assert [(i["type"], i.get("server_label")) for i in output[:2]] == [
        ("mcp_list_tools", "a"),
        ("mcp_list_tools", "b"),
    ]
    names = [t["function"]["name"] for t in gw.backend.requests[0]["tools"]]
    assert len(names) == len(set(names)) == 3 and "lookup" in names
