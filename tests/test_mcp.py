"""Remote MCP servers run by the gateway (`{"type": "mcp"}` tools), end to end.

A real MCP server (tests/mcp_server.py, the `mcp` SDK's own, in a subprocess on loopback),
the gateway in front of a scripted backend of each kind (Chat, Responses) that calls the
server's tools by the flat names the gateway declared and answers with what the tool said,
and the official `openai` SDK as the client: every streamed event is validated against the
SDK's typed models, and the non-streaming answer is the streamed one's terminal response.
"""

from __future__ import annotations

import contextlib
import io
import select
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
from harness import GatewayHarness
from openai import AsyncOpenAI
from scripted_backend import (
    DONE,
    ScriptedBackend,
    finish,
    refusing_url,
    text_chunks,
    tool_call_chunks,
    usage,
)
from scripted_responses_backend import ScriptedResponsesBackend
from sdk_models import validate_event, validate_response

from streamer.cli import build_parser
from streamer.core.mcp_servers import servers
from streamer.mcp.client import McpClients, McpSettings, McpUnavailable
from streamer.mcp.guard import HostRule
from streamer.tap.command import run_tap

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
    assert {t["name"] for t in listed["tools"]} == {
        "lookup",
        "spell",
        "weather",
        "broken",
        "stuck",
        "count",
    }
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


@contextlib.asynccontextmanager
async def chat_gateway(**settings: Any) -> AsyncIterator[GatewayHarness]:
    settings.setdefault("mcp_allow", ("127.0.0.1",))
    async with GatewayHarness(backend=ScriptedBackend(), **settings) as harness:
        yield harness


def output_of(response: Any) -> list[dict[str, Any]]:
    body = response.model_dump(mode="json")
    validate_response(body)
    return list(body["output"])


@pytest.mark.parametrize(
    ("tool", "arguments", "said"),
    [
        ("weather", {"city": "Oslo"}, '"celsius": 21'),
        ("broken", {}, "Error: the tool failed: Error executing tool broken: broken on purpose"),
    ],
)
async def test_structured_content_and_a_tool_error_reach_the_model(
    server_url: str, tool: str, arguments: dict[str, Any], said: str
) -> None:
    async with chat_gateway() as gw:
        gw.backend.responder = caller(tool, arguments)
        client = AsyncOpenAI(base_url=gw.url, api_key="k")
        response = await client.responses.create(
            model="m", input="go", tools=[mcp_tool(server_url)]
        )
    _listed, call, message = output_of(response)
    assert call["name"] == tool
    if tool == "broken":  # the turn goes on: the model is told
        assert call["status"] == "failed" and call["output"] is None
        assert call["error"]["type"] == "mcp_tool_execution_error"
        assert "broken on purpose" in call["error"]["content"][0]["text"]
    else:
        assert call["status"] == "completed" and orjson.loads(call["output"])["city"] == "Oslo"
    assert said in message["content"][0]["text"]


async def test_the_authorization_header_goes_to_its_server_only_and_is_never_echoed() -> None:
    with mcp_server("--token", TOKEN) as url:
        async with chat_gateway() as gw:
            gw.backend.responder = caller("lookup", {"term": "x"})
            client = AsyncOpenAI(base_url=gw.url, api_key="k")
            headers = {"Authorization": f"Bearer {TOKEN}"}
            tool = mcp_tool(url, headers=headers)
            response = await client.responses.create(model="m", input="go", tools=[tool])
            assert [i["type"] for i in output_of(response)][:2] == ["mcp_list_tools", "mcp_call"]
            stored = await client.responses.retrieve(response.id)
            items = await client.responses.input_items.list(response.id)
            seen = [
                orjson.dumps(response.model_dump(mode="json")),
                orjson.dumps(stored.model_dump(mode="json")),
                orjson.dumps(items.model_dump(mode="json")),
                *(orjson.dumps(r) for r in gw.backend.requests),
            ]
            assert not any(TOKEN.encode() in s for s in seen)
            assert stored.tools[0].model_dump()["headers"] is None
            assert stored.tools[0].model_dump()["server_url"].endswith("/<redacted>")
            # without the header the server refuses: a 424 naming the server, no backend call
            calls = len(gw.backend.requests)
            with pytest.raises(openai.APIStatusError) as refused:
                await client.responses.create(model="m", input="go", tools=[mcp_tool(url)])
            assert refused.value.status_code == 424
            assert "'dict'" in refused.value.message  # the SDK keeps no HTTP status
            assert len(gw.backend.requests) == calls


async def test_an_unreachable_or_unallowed_server_is_a_424_and_mcp_off_a_400(
    server_url: str,
) -> None:
    async with chat_gateway(mcp_allow=()) as gw:  # the default: no loopback address
        client = AsyncOpenAI(base_url=gw.url, api_key="k")
        with pytest.raises(openai.APIStatusError) as blocked:
            await client.responses.create(model="m", input="go", tools=[mcp_tool(server_url)])
        assert blocked.value.status_code == 424 and "--mcp-allow" in blocked.value.message
        assert blocked.value.body["param"] == "tools[0]"  # type: ignore[index]
        assert gw.backend.requests == []
    async with chat_gateway() as gw:
        client = AsyncOpenAI(base_url=gw.url, api_key="k")
        with pytest.raises(openai.APIStatusError) as unreachable:
            tool = mcp_tool(refusing_url().replace("/v1", "/mcp"))
            await client.responses.create(model="m", input="go", tools=[tool])
        assert unreachable.value.status_code == 424
    async with chat_gateway(mcp="off") as gw:
        client = AsyncOpenAI(base_url=gw.url, api_key="k")
        with pytest.raises(openai.BadRequestError) as off:
            await client.responses.create(model="m", input="go", tools=[mcp_tool(server_url)])
        assert off.value.body["param"] == "tools[0].type"  # type: ignore[index]


async def test_max_tool_calls_bounds_the_loop(server_url: str) -> None:
    def always(body: dict[str, Any]) -> list[Any]:
        calls = tool_call_chunks(0, "call_1", [flat_name(body, "lookup")], ['{"term": "a"}'])
        return [*calls, finish("tool_calls"), DONE]

    async with chat_gateway() as gw:
        gw.backend.responder = always
        client = AsyncOpenAI(base_url=gw.url, api_key="k")
        response = await client.responses.create(
            model="m", input="go", tools=[mcp_tool(server_url)], max_tool_calls=2
        )
        output = output_of(response)
        assert [i["type"] for i in output] == ["mcp_list_tools", *["mcp_call"] * 3]
        assert [i["status"] for i in output[1:]] == ["completed", "completed", "failed"]
        assert output[3]["error"]["type"] == "http_error"
        assert "max_tool_calls" in output[3]["error"]["message"]
        assert len(gw.backend.requests) == 3
        assert gw.backend.requests[-1]["tool_choice"] == "none"  # the budget is spent


async def test_a_call_past_mcp_timeout_fails_and_the_turn_goes_on(server_url: str) -> None:
    async with chat_gateway(mcp_timeout=1.0) as gw:
        gw.backend.responder = caller("stuck", {})
        client = AsyncOpenAI(base_url=gw.url, api_key="k")
        response = await client.responses.create(
            model="m", input="go", tools=[mcp_tool(server_url)]
        )
    _listed, call, message = output_of(response)
    assert call["status"] == "failed" and call["error"]["code"] == 504
    assert "--mcp-timeout" in call["error"]["message"]
    assert "--mcp-timeout" in message["content"][0]["text"]


@pytest.mark.parametrize("approve", [True, False])
async def test_a_call_that_needs_approval_waits_for_the_client(
    server_url: str, approve: bool
) -> None:
    async with chat_gateway() as gw:
        gw.backend.responder = caller("lookup", {"term": "kept"})
        client = AsyncOpenAI(base_url=gw.url, api_key="k")
        tools = [mcp_tool(server_url, require_approval="always")]
        first = await client.responses.create(model="m", input="go", tools=tools)
        _listed, request = output_of(first)
        assert request["type"] == "mcp_approval_request" and request["name"] == "lookup"
        assert len(gw.backend.requests) == 1
        answer = {"type": "mcp_approval_response", "approval_request_id": request["id"]}
        _events, final = await streamed(
            client,
            model="m",
            previous_response_id=first.id,
            input=[{**answer, "approve": approve}],
            tools=tools,
        )
    types = [i["type"] for i in final["output"]]
    assert "mcp_list_tools" not in types  # listed once per chain
    if approve:
        assert types == ["mcp_call", "message"]
        call = final["output"][0]
        assert call["approval_request_id"] == request["id"]
        assert call["output"] == "kept: a word the test server knows"
    else:
        assert types == ["message"]
        assert "declined" in final["output"][0]["content"][0]["text"]
    assert len(gw.backend.requests) == 2


async def test_tool_lists_are_cached_per_url_and_headers_with_a_bound() -> None:
    settings = McpSettings(HostRule.parse(["127.0.0.1"]), cache_entries=1)
    clients = McpClients(settings)
    with mcp_server() as url:
        (plain,) = servers([mcp_tool(url)])
        (keyed,) = servers([mcp_tool(url, headers={"X-Key": "k"})])
        first = await clients.list_tools(plain)
        assert clients.cached_bytes > 0
    # the server is gone: what is cached is still listed, what is not cannot be
    assert await clients.list_tools(plain) == first
    with pytest.raises(McpUnavailable):
        await clients.list_tools(keyed)  # other headers: another entry
    with mcp_server() as url:
        (other,) = servers([mcp_tool(url)])
        await clients.list_tools(other)  # the bound (1 entry): the first one goes
    with pytest.raises(McpUnavailable):
        await clients.list_tools(plain)


async def test_items_replayed_without_previous_response_id_and_a_per_tool_filter(
    server_url: str,
) -> None:
    async with chat_gateway() as gw:
        gw.backend.responder = caller("weather", {"city": "Lima"})
        client = AsyncOpenAI(base_url=gw.url, api_key="k")
        tools = [mcp_tool(server_url, require_approval={"never": {"tool_names": ["lookup"]}})]
        first = await client.responses.create(model="m", input="go", tools=tools, store=False)
        items = output_of(first)
        assert [i["type"] for i in items] == ["mcp_list_tools", "mcp_approval_request"]
        answer = {
            "type": "mcp_approval_response",
            "approval_request_id": items[1]["id"],
            "approve": True,
        }
        replay = [{"role": "user", "content": "go"}, *items, answer]
        second = await client.responses.create(
            model="m",
            input=replay,
            tools=tools,
            store=False,  # type: ignore[arg-type]
        )
    types = [i["type"] for i in output_of(second)]
    assert types == ["mcp_call", "message"]  # listed in the items: not listed again
    assert "Lima" in output_of(second)[0]["output"]


async def test_the_bounds_on_a_list_and_on_a_call_s_output(server_url: str) -> None:
    for bound in ({"mcp_max_tools": 2}, {"mcp_max_list_bytes": 100}):
        async with chat_gateway(**bound) as gw:
            client = AsyncOpenAI(base_url=gw.url, api_key="k")
            with pytest.raises(openai.APIStatusError) as refused:
                await client.responses.create(model="m", input="go", tools=[mcp_tool(server_url)])
            assert refused.value.status_code == 424 and "--mcp-max-" in refused.value.message
    async with chat_gateway(mcp_max_output_bytes=10) as gw:
        gw.backend.responder = caller("lookup", {"term": "long enough"})
        client = AsyncOpenAI(base_url=gw.url, api_key="k")
        response = await client.responses.create(
            model="m", input="go", tools=[mcp_tool(server_url)]
        )
    _listed, call, message = output_of(response)
    assert call["status"] == "failed" and call["error"]["code"] == 413
    assert "--mcp-max-output-bytes" in message["content"][0]["text"]


async def test_a_name_that_resolves_to_loopback_is_refused_by_default(server_url: str) -> None:
    url = server_url.replace("127.0.0.1", "localhost")
    async with chat_gateway(mcp_allow=()) as gw:
        client = AsyncOpenAI(base_url=gw.url, api_key="k")
        with pytest.raises(openai.APIStatusError) as refused:
            await client.responses.create(model="m", input="go", tools=[mcp_tool(url)])
        assert refused.value.status_code == 424 and "private, loopback" in refused.value.message
    async with chat_gateway(mcp_allow=("mcp.example.com",)) as gw:  # not listed: refused
        client = AsyncOpenAI(base_url=gw.url, api_key="k")
        with pytest.raises(openai.APIStatusError) as unlisted:
            await client.responses.create(model="m", input="go", tools=[mcp_tool(url)])
        assert "--mcp-allow" in unlisted.value.message


async def test_tool_choice_forces_an_mcp_tool(gw: GatewayHarness, server_url: str) -> None:
    gw.backend.responder = caller("spell", {"q": "ab"})
    client = AsyncOpenAI(base_url=gw.url, api_key="k")
    choice = {"type": "mcp", "server_label": "dict", "name": "spell"}
    response = await client.responses.create(
        model="m",
        input="go",
        tools=[mcp_tool(server_url)],
        tool_choice=choice,  # type: ignore[arg-type]
    )
    assert output_of(response)[1]["output"] == "ab: a word the test server knows"
    first, second = gw.backend.requests
    assert first["tool_choice"] == "required"  # over the one chosen tool
    assert [t.get("function", t)["name"] for t in first["tools"]] == [flat_name(first, "spell")]
    assert second["tool_choice"] == "auto"  # forced for the first answer only
    with pytest.raises(openai.BadRequestError) as unknown:
        await client.responses.create(
            model="m",
            input="go",
            tools=[mcp_tool(server_url)],
            tool_choice={**choice, "name": "nope"},  # type: ignore[arg-type]
        )
    assert unknown.value.body["param"] == "tool_choice.name"  # type: ignore[index]


async def test_a_recorded_mcp_turn_passes_the_tap_check(server_url: str, tmp_path: Path) -> None:
    async with chat_gateway(tap_dir=str(tmp_path)) as gw:
        gw.backend.responder = caller("lookup", {"term": "taped"})
        client = AsyncOpenAI(base_url=gw.url, api_key="k")
        tool = mcp_tool(server_url, headers={"Authorization": f"Bearer {TOKEN}"})
        await streamed(client, model="m", input="go", tools=[tool])
    (path,) = tmp_path.iterdir()
    assert TOKEN.encode() not in path.read_bytes()
    out = io.StringIO()
    args = build_parser().parse_args(["tap", str(path), "--color", "never"])
    assert await run_tap(args, out) == 0, out.getvalue()
    assert "mcp_call" in out.getvalue()
