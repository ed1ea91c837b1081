"""The OpenAI Agents SDK (`openai-agents`) against the gateway on a scripted backend.

Each test runs a real `Runner` over the Responses API (HTTP, or the SDK's WebSocket session)
against the gateway on loopback, and asserts both what the Chat backend received (the
lowered messages and tools) and what the SDK returned (final output, items, last agent).
Tracing is off: its exporter would call api.openai.com.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from harness import GatewayHarness
from openai import AsyncOpenAI
from pydantic import BaseModel
from scripted_backend import DIE, DONE, HANG, Status, finish, text_chunks, tool_call_chunks, usage
from test_tap_record import tap

agents = pytest.importorskip("agents", reason="openai-agents is not installed (the test extra)")

from agents import (  # noqa: E402
    Agent,
    ApplyPatchOperation,
    ApplyPatchResult,
    ApplyPatchTool,
    ItemHelpers,
    LocalShellCommandRequest,
    LocalShellTool,
    ModelSettings,
    OpenAIConversationsSession,
    OpenAIProvider,
    RunConfig,
    Runner,
    ShellCallOutcome,
    ShellCommandOutput,
    ShellCommandRequest,
    ShellResult,
    ShellTool,
    SQLiteSession,
    ToolSearchTool,
    apply_diff,
    function_tool,
    handoff,
    responses_websocket_session,
    set_tracing_disabled,
    tool_namespace,
)
from agents.exceptions import ModelBehaviorError  # noqa: E402
from agents.memory import OpenAIResponsesCompactionSession  # noqa: E402
from agents.models.openai_responses import ResponsesWebSocketError  # noqa: E402

set_tracing_disabled(True)

Script = list[Any]


def _text(*parts: str) -> Script:
    return [*text_chunks(list(parts)), finish("stop"), usage(7, 3), DONE]


def _call(call_id: str, name: str, *args: str) -> Script:
    return [
        *tool_call_chunks(0, call_id, [name], list(args)),
        finish("tool_calls"),
        usage(7, 3),
        DONE,
    ]


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


@function_tool
def lookup_customer(customer_id: int) -> str:
    """A customer's record."""
    return f"customer {customer_id}: Ada"


@pytest.fixture
async def sdk(gw: GatewayHarness) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(base_url=gw.url, api_key="test-key", max_retries=0) as client:
        yield client


@pytest.fixture
def run_config(sdk: AsyncOpenAI) -> RunConfig:
    """Every agent's model from the one provider, over the Responses API at the gateway."""
    provider = OpenAIProvider(openai_client=sdk, use_responses=True)
    return RunConfig(model_provider=provider, tracing_disabled=True)


def _roles(body: dict[str, Any]) -> list[str]:
    return [m["role"] for m in body["messages"]]


def _tool_names(body: dict[str, Any]) -> list[str]:
    return [t["function"]["name"] for t in body.get("tools", [])]


def _item_types(result: Any) -> list[str]:
    return [item.type for item in result.new_items]


async def test_tool_loop(gw: GatewayHarness, run_config: RunConfig) -> None:
    """A function tool over two model turns: the call runs, its output goes back, text ends."""
    gw.backend.script(
        _call("call_w", "get_weather", '{"city":', '"Paris"}'),
        _text("It is ", "sunny."),
    )
    agent = Agent(name="weather", instructions="Be brief.", tools=[get_weather])
    result = await Runner.run(agent, "Weather in Paris?", run_config=run_config)

    assert result.final_output == "It is sunny."
    assert _item_types(result) == ["tool_call_item", "tool_call_output_item", "message_output_item"]
    assert result.new_items[1].output == "sunny in Paris"
    first, second = gw.backend.requests
    assert _roles(first) == ["system", "user"]
    assert first["messages"][0]["content"] == "Be brief."
    assert _tool_names(first) == ["get_weather"]
    assert first["tools"][0]["function"]["parameters"]["required"] == ["city"]
    assert _roles(second) == ["system", "user", "assistant", "tool"]
    call = second["messages"][2]["tool_calls"][0]
    assert (call["id"], call["function"]["name"]) == ("call_w", "get_weather")
    assert second["messages"][3] == {
        "role": "tool",
        "tool_call_id": "call_w",
        "content": "sunny in Paris",
    }
    assert sum(r.usage.input_tokens for r in result.raw_responses) == 14


async def test_streamed_run(gw: GatewayHarness, run_config: RunConfig) -> None:
    """`Runner.run_streamed`: raw deltas, run items in order, the same final output."""
    gw.backend.script(
        _call("call_w", "get_weather", '{"ci', 'ty":"Oslo"}'),
        _text("Cold ", "and ", "clear."),
    )
    agent = Agent(name="weather", instructions="Be brief.", tools=[get_weather])
    result = Runner.run_streamed(agent, "Weather in Oslo?", run_config=run_config)
    deltas: list[str] = []
    raw_types: list[str] = []
    run_items: list[str] = []
    async for event in result.stream_events():
        if event.type == "raw_response_event":
            raw_types.append(event.data.type)
            if event.data.type == "response.output_text.delta":
                deltas.append(event.data.delta)
        elif event.type == "run_item_stream_event":
            run_items.append(event.name)

    assert deltas == ["Cold ", "and ", "clear."]
    assert run_items == ["tool_called", "tool_output", "message_output_created"]
    assert raw_types.count("response.completed") == 2
    assert "response.function_call_arguments.delta" in raw_types
    assert result.final_output == "Cold and clear."
    assert gw.backend.requests[1]["messages"][3]["content"] == "sunny in Oslo"


async def test_handoff(gw: GatewayHarness, run_config: RunConfig) -> None:
    """A handoff is a tool call the SDK turns into a switch of agent, instructions and tools."""
    billing = Agent(
        name="billing",
        instructions="You handle billing.",
        handoff_description="Billing questions.",
        tools=[lookup_customer],
    )
    triage = Agent(name="triage", instructions="Route the user.", handoffs=[handoff(billing)])
    gw.backend.script(
        _call("call_h", "transfer_to_billing", "{}"),
        _call("call_c", "lookup_customer", '{"customer_id": 42}'),
        _text("Ada owes nothing."),
    )
    result = await Runner.run(triage, "Do I owe money? I am 42.", run_config=run_config)

    assert result.last_agent is billing
    assert result.final_output == "Ada owes nothing."
    assert _item_types(result) == [
        "handoff_call_item",
        "handoff_output_item",
        "tool_call_item",
        "tool_call_output_item",
        "message_output_item",
    ]
    first, second, third = gw.backend.requests
    assert _tool_names(first) == ["transfer_to_billing"]
    assert first["messages"][0]["content"] == "Route the user."
    assert _tool_names(second) == ["lookup_customer"]
    assert second["messages"][0]["content"] == "You handle billing."
    # the handoff's call and its output are history for the new agent
    assert _roles(second) == ["system", "user", "assistant", "tool"]
    assert second["messages"][2]["tool_calls"][0]["function"]["name"] == "transfer_to_billing"
    assert "billing" in second["messages"][3]["content"]
    assert third["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "call_c",
        "content": "customer 42: Ada",
    }


class Forecast(BaseModel):
    city: str
    high_c: int
    rain: bool


async def test_structured_output(gw: GatewayHarness, run_config: RunConfig) -> None:
    """`output_type`: a strict JSON schema reaches the backend; the answer parses into it."""
    gw.backend.script(_text('{"city":"Rome",', '"high_c":31,"rain":false}'))
    agent = Agent(name="forecaster", instructions="Forecast.", output_type=Forecast)
    result = await Runner.run(agent, "Rome tomorrow?", run_config=run_config)

    assert result.final_output == Forecast(city="Rome", high_c=31, rain=False)
    fmt = gw.backend.requests[0]["response_format"]
    assert fmt["type"] == "json_schema"
    assert fmt["json_schema"]["name"] == "final_output"
    assert fmt["json_schema"]["strict"] is True
    schema = fmt["json_schema"]["schema"]
    assert sorted(schema["required"]) == ["city", "high_c", "rain"]
    assert schema["additionalProperties"] is False


async def test_previous_response_id(gw: GatewayHarness, run_config: RunConfig) -> None:
    """A second run continues from the first by id: the backend sees the whole history."""
    gw.backend.script(_text("Hi Ada."), _call("call_w", "get_weather", '{"city":"Rome"}'))
    gw.backend.script(_text("Rome is sunny, Ada."))
    agent = Agent(name="a", instructions="Be kind.", tools=[get_weather])
    first = await Runner.run(agent, "I am Ada.", run_config=run_config)
    assert first.final_output == "Hi Ada."
    assert first.last_response_id is not None and first.last_response_id.startswith("resp_")

    second = await Runner.run(
        agent,
        "Weather in Rome?",
        previous_response_id=first.last_response_id,
        auto_previous_response_id=True,
        run_config=run_config,
    )
    assert second.final_output == "Rome is sunny, Ada."
    _, call_turn, output_turn = gw.backend.requests
    assert _roles(call_turn) == ["system", "user", "assistant", "user"]
    assert [m["content"] for m in call_turn["messages"][1:]] == [
        "I am Ada.",
        "Hi Ada.",
        "Weather in Rome?",
    ]
    # within the run the SDK chains by id too: only the tool output is new input
    assert _roles(output_turn) == ["system", "user", "assistant", "user", "assistant", "tool"]
    assert output_turn["messages"][-1]["content"] == "sunny in Rome"


async def test_sqlite_session(gw: GatewayHarness, run_config: RunConfig) -> None:
    """`SQLiteSession` replays the stored items as input: the backend sees the earlier turn."""
    session = SQLiteSession("chat-1")  # in memory
    gw.backend.script(_text("Noted: blue."), _text("You like blue."))
    agent = Agent(name="a", instructions="Remember.")
    await Runner.run(agent, "My colour is blue.", session=session, run_config=run_config)
    result = await Runner.run(agent, "What is my colour?", session=session, run_config=run_config)

    assert result.final_output == "You like blue."
    second = gw.backend.requests[1]
    assert _roles(second) == ["system", "user", "assistant", "user"]
    assert second["messages"][2]["content"] == "Noted: blue."
    items = await session.get_items()
    assert [i.get("role") for i in items] == ["user", "assistant", "user", "assistant"]
    session.close()


async def test_openai_conversations_session(
    gw: GatewayHarness, sdk: AsyncOpenAI, run_config: RunConfig
) -> None:
    """`OpenAIConversationsSession` keeps the history in the gateway's Conversations API."""
    session = OpenAIConversationsSession(openai_client=sdk)
    gw.backend.script(_text("Noted: green."), _text("You like green."))
    agent = Agent(name="a", instructions="Remember.")
    await Runner.run(agent, "My colour is green.", session=session, run_config=run_config)
    result = await Runner.run(agent, "What is my colour?", session=session, run_config=run_config)

    assert result.final_output == "You like green."
    second = gw.backend.requests[1]
    assert _roles(second) == ["system", "user", "assistant", "user"]
    assert second["messages"][2]["content"] == "Noted: green."
    items = await session.get_items()
    assert [i.get("role") for i in items] == ["user", "assistant", "user", "assistant"]
    await session.clear_session()


async def test_compaction_session(
    gw: GatewayHarness, sdk: AsyncOpenAI, run_config: RunConfig
) -> None:
    """`OpenAIResponsesCompactionSession`: the history is compacted through the gateway's
    `/v1/responses/compact`, and the next run goes on from the compaction item."""
    gw.backend.script(
        _text("Noted: blue."),
        _text("Summary: the user likes blue."),  # the compaction's summary
        _text("You like blue."),
    )
    session = OpenAIResponsesCompactionSession(
        "chat-2",
        SQLiteSession("chat-2"),
        client=sdk,
        compaction_mode="input",
        should_trigger_compaction=lambda context: len(gw.backend.requests) == 1,
    )
    agent = Agent(name="a", instructions="Remember.")
    await Runner.run(agent, "My colour is blue.", session=session, run_config=run_config)
    items = await session.get_items()
    assert [i.get("type") for i in items] == ["message", "compaction"]
    assert items[1]["encrypted_content"]
    result = await Runner.run(agent, "What is my colour?", session=session, run_config=run_config)

    assert result.final_output == "You like blue."
    _, compact, after = gw.backend.requests
    assert compact["messages"][1] == {"role": "assistant", "content": "Noted: blue."}
    assert "tools" not in compact
    assert "Summary: the user likes blue." in after["messages"][2]["content"]
    assert after["messages"][-1] == {"role": "user", "content": "What is my colour?"}


async def test_tool_namespace(gw: GatewayHarness, run_config: RunConfig) -> None:
    """`tool_namespace()` sends a namespace; the backend's flat call routes back into it."""
    crm = tool_namespace(name="crm", description="The CRM.", tools=[lookup_customer])
    agent = Agent(name="a", instructions="Help.", tools=[*crm, get_weather])
    gw.backend.script(
        _call("call_c", "crm__lookup_customer", '{"customer_id": 7}'),
        _text("Customer 7 is Ada."),
    )
    result = await Runner.run(agent, "Who is customer 7?", run_config=run_config)

    assert result.final_output == "Customer 7 is Ada."
    call = result.new_items[0].raw_item
    assert (call.name, call.namespace, call.call_id) == ("lookup_customer", "crm", "call_c")
    assert result.new_items[1].output == "customer 7: Ada"
    first, second = gw.backend.requests
    assert sorted(_tool_names(first)) == ["crm__lookup_customer", "get_weather"]
    # replayed history names the flat tool again
    assert second["messages"][2]["tool_calls"][0]["function"]["name"] == "crm__lookup_customer"
    assert second["messages"][3]["content"] == "customer 7: Ada"


async def test_local_shell(gw: GatewayHarness, run_config: RunConfig) -> None:
    """`LocalShellTool`: the backend's call comes back as a local_shell_call the SDK runs."""
    commands: list[list[str]] = []

    def run_shell(request: LocalShellCommandRequest) -> str:
        commands.append(list(request.data.action.command))
        return "notes.txt"

    agent = Agent(name="a", instructions="Use the shell.", tools=[LocalShellTool(run_shell)])
    gw.backend.script(
        _call("call_s", "local_shell", '{"type":"exec","command":["ls","-1"]}'),
        _text("There is notes.txt."),
    )
    result = await Runner.run(agent, "What files are here?", run_config=run_config)

    assert result.final_output == "There is notes.txt."
    assert commands == [["ls", "-1"]]
    assert _item_types(result)[:2] == ["tool_call_item", "tool_call_output_item"]
    first, second = gw.backend.requests
    assert _tool_names(first) == ["local_shell"]
    assert _roles(second) == ["system", "user", "assistant", "tool"]
    assert second["messages"][2]["tool_calls"][0]["function"]["name"] == "local_shell"
    assert second["messages"][3]["content"] == "notes.txt"


async def test_shell_tool(gw: GatewayHarness, run_config: RunConfig) -> None:
    """`ShellTool`: a function `shell` to the backend; its call comes back as a shell_call the
    SDK runs (it failed with "Tool shell not found" when the tool was dropped), and the
    call and its output replay as a tool call and a tool message."""
    requests: list[tuple[list[str], int | None]] = []

    def run_shell(request: ShellCommandRequest) -> ShellResult:
        action = request.data.action
        requests.append((list(action.commands), action.timeout_ms))
        return ShellResult(
            output=[
                ShellCommandOutput(stdout="notes.txt\n", outcome=ShellCallOutcome("exit", 0)),
                ShellCommandOutput(stderr="nope\n", outcome=ShellCallOutcome("exit", 2)),
            ]
        )

    agent = Agent(name="a", instructions="Use the shell.", tools=[ShellTool(executor=run_shell)])
    gw.backend.script(
        _call("call_sh", "shell", '{"commands": ["ls", "cat x"],', ' "timeout_ms": 900}'),
        _text("There is notes.txt."),
    )
    result = await Runner.run(agent, "What files are here?", run_config=run_config)

    assert result.final_output == "There is notes.txt."
    assert requests == [(["ls", "cat x"], 900)]
    assert _item_types(result)[:2] == ["tool_call_item", "tool_call_output_item"]
    raw = result.new_items[0].raw_item
    assert (raw if isinstance(raw, dict) else raw.to_dict())["type"] == "shell_call"
    first, second = gw.backend.requests
    assert _tool_names(first) == ["shell"]
    assert first["tools"][0]["function"]["parameters"]["required"] == ["commands"]
    assert _roles(second) == ["system", "user", "assistant", "tool"]
    (replayed,) = second["messages"][2]["tool_calls"]
    assert replayed["id"] == "call_sh" and replayed["function"]["name"] == "shell"
    assert orjson.loads(replayed["function"]["arguments"]) == {
        "commands": ["ls", "cat x"],
        "timeout_ms": 900,
    }
    assert second["messages"][3] == {
        "role": "tool",
        "tool_call_id": "call_sh",
        "content": "notes.txt\n[exit code 0]\n[stderr]\nnope\n[exit code 2]",
    }


class _Files:
    """An `ApplyPatchEditor` over a dict of files, applying V4A diffs as the SDK does."""

    def __init__(self, **files: str) -> None:
        self.files = dict(files)

    def create_file(self, op: ApplyPatchOperation) -> ApplyPatchResult:
        self.files[op.path] = apply_diff("", op.diff or "", mode="create")
        return ApplyPatchResult(output=f"Created {op.path}")

    def update_file(self, op: ApplyPatchOperation) -> ApplyPatchResult:
        self.files[op.path] = apply_diff(self.files[op.path], op.diff or "")
        return ApplyPatchResult(output=f"Updated {op.path}")

    def delete_file(self, op: ApplyPatchOperation) -> ApplyPatchResult:
        del self.files[op.path]
        return ApplyPatchResult(output=f"Deleted {op.path}")


async def test_apply_patch_tool(gw: GatewayHarness, run_config: RunConfig) -> None:
    """`ApplyPatchTool`: a function `apply_patch` whose arguments are the operation; the call
    comes back as an apply_patch_call the SDK's editor applies (V4A diffs), over two turns."""
    editor = _Files(**{"todo.txt": "buy milk\ncall Ada\n"})
    agent = Agent(name="a", instructions="Edit files.", tools=[ApplyPatchTool(editor=editor)])
    create = {"type": "create_file", "path": "hello.txt", "diff": "+hello\n+world\n"}
    update = {"type": "update_file", "path": "todo.txt", "diff": "@@\n-buy milk\n+buy bread\n"}
    gw.backend.script(
        _call("call_c", "apply_patch", orjson.dumps(create).decode()),
        _call("call_u", "apply_patch", orjson.dumps(update).decode()),
        _text("Done."),
    )
    result = await Runner.run(agent, "Make the edits.", run_config=run_config)

    assert result.final_output == "Done."
    assert editor.files == {"hello.txt": "hello\nworld", "todo.txt": "buy bread\ncall Ada\n"}
    calls = [i.raw_item for i in result.new_items if i.type == "tool_call_item"]
    types = [(c if isinstance(c, dict) else c.to_dict())["type"] for c in calls]
    assert types == ["apply_patch_call", "apply_patch_call"]
    first, _, third = gw.backend.requests
    assert _tool_names(first) == ["apply_patch"]
    assert _roles(third) == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert [orjson.loads(m["tool_calls"][0]["function"]["arguments"]) for m in
            third["messages"] if m["role"] == "assistant"] == [create, update]  # fmt: skip
    assert [m["content"] for m in third["messages"] if m["role"] == "tool"] == [
        "Created hello.txt",
        "Updated todo.txt",
    ]


@function_tool(defer_loading=True)
def open_orders(customer_id: int) -> str:
    """A customer's open orders."""
    return f"customer {customer_id}: 2 open orders"


async def test_deferred_tool_with_tool_search(gw: GatewayHarness, run_config: RunConfig) -> None:
    """A `defer_loading` function beside `ToolSearchTool()`: the backend cannot search, so the
    gateway offers the function at once, and calls it back as OpenAI does after a search
    (`namespace` equal to its name), the only form the SDK routes to a deferred tool."""
    agent = Agent(name="a", tools=[open_orders, ToolSearchTool()])
    gw.backend.script(
        _call("call_o", "open_orders", '{"customer_id": 3}'),
        _text("Two open orders."),
    )
    result = await Runner.run(agent, "Orders of customer 3?", run_config=run_config)

    assert result.final_output == "Two open orders."
    call = result.new_items[0].raw_item
    assert (call.name, call.namespace) == ("open_orders", "open_orders")
    assert result.new_items[1].output == "customer 3: 2 open orders"
    first, second = gw.backend.requests
    assert _tool_names(first) == ["open_orders"]  # the hosted tool_search is not sent
    assert second["messages"][1]["tool_calls"][0]["function"]["name"] == "open_orders"
    assert second["messages"][2]["content"] == "customer 3: 2 open orders"


async def _transport_counts(gw: GatewayHarness) -> dict[str, float]:
    """Events the gateway sent, by transport, from its own /metrics."""
    async with aiohttp.ClientSession() as http, http.get(gw.url[: -len("/v1")] + "/metrics") as r:
        text = await r.text()
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("streamer_events_sent_total{"):
            transport = line.split('transport="', 1)[1].split('"', 1)[0]
            counts[transport] = float(line.rsplit(" ", 1)[1])
    return counts


async def test_websocket_session(gw: GatewayHarness) -> None:
    """`responses_websocket_session`: every turn of a tool loop over one WebSocket."""
    gw.backend.script(
        _call("call_w", "get_weather", '{"city":"Lima"}'),
        _text("Lima: ", "sunny."),
        _text("Still sunny."),
    )
    agent = Agent(name="weather", instructions="Be brief.", tools=[get_weather], model="m")
    async with responses_websocket_session(api_key="test-key", base_url=gw.url) as ws:
        first = await ws.run(agent, "Weather in Lima?")
        streamed = ws.run_streamed(agent, "And now?", previous_response_id=first.last_response_id)
        deltas = [
            e.data.delta
            async for e in streamed.stream_events()
            if e.type == "raw_response_event" and e.data.type == "response.output_text.delta"
        ]

    assert first.final_output == "Lima: sunny."
    assert streamed.final_output == "Still sunny."
    assert deltas == ["Still sunny."]
    assert ItemHelpers.text_message_outputs(first.new_items) == "Lima: sunny."
    _, output_turn, follow_up = gw.backend.requests
    assert output_turn["messages"][-1]["content"] == "sunny in Lima"
    assert _roles(follow_up)[-3:] == ["tool", "assistant", "user"]
    counts = await _transport_counts(gw)
    assert counts.get("websocket", 0) > 0
    assert counts.get("sse", 0) == 0 and counts.get("json", 0) == 0


async def test_websocket_store_false(gw: GatewayHarness) -> None:
    """`store: false` over the WebSocket: turns chain by id through the connection's memory."""
    gw.backend.script(
        _call("call_w", "get_weather", '{"city":"Quito"}'),
        _text("Quito: sunny."),
        _text("Still Quito."),
    )
    settings = ModelSettings(store=False)
    agent = Agent(name="w", tools=[get_weather], model="m", model_settings=settings)
    async with responses_websocket_session(api_key="test-key", base_url=gw.url) as ws:
        first = await ws.run(agent, "Weather in Quito?", auto_previous_response_id=True)
        second = await ws.run(agent, "And now?", previous_response_id=first.last_response_id)

    assert (first.final_output, second.final_output) == ("Quito: sunny.", "Still Quito.")
    assert [_roles(r) for r in gw.backend.requests] == [
        ["user"],
        ["user", "assistant", "tool"],
        ["user", "assistant", "tool", "assistant", "user"],
    ]
    assert gw.backend.requests[2]["messages"][3]["content"] == "Quito: sunny."
    assert await gw.gateway.store.get(first.last_response_id) is None  # nothing stored


async def test_websocket_error_then_next_turn(gw: GatewayHarness) -> None:
    """A backend 400 over the WebSocket is the SDK's error; the same socket serves the next run."""
    refusal = {"error": {"message": "context too long", "type": "invalid_request_error"}}
    gw.backend.script([Status(400, refusal)], _text("Fine now."))
    agent = Agent(name="a", model="m")
    async with responses_websocket_session(api_key="test-key", base_url=gw.url) as ws:
        with pytest.raises(ResponsesWebSocketError) as failed:
            await ws.run(agent, "Too long.")
        result = await ws.run(agent, "Short.")

    assert "context too long" in str(failed.value)
    assert '"status": 400' in str(failed.value)
    assert result.final_output == "Fine now."
    assert len(gw.backend.requests) == 2


async def test_cancel_streamed_run(gw: GatewayHarness, run_config: RunConfig) -> None:
    """`RunResultStreaming.cancel()` mid-answer: the gateway stops the backend request."""
    gw.backend.script([*text_chunks(["Hel"]), HANG])
    result = Runner.run_streamed(Agent(name="a"), "Say hello.", run_config=run_config)
    async for event in result.stream_events():
        if event.type == "raw_response_event" and event.data.type == "response.output_text.delta":
            result.cancel()

    await gw.backend.records[-1].wait_disconnect()
    assert result.is_complete
    assert result.final_output is None


async def test_cancel_over_websocket(gw: GatewayHarness) -> None:
    """Cancelled over the WebSocket session: the backend request stops, the next run works."""
    gw.backend.script([*text_chunks(["Hel"]), HANG], _text("Next."))
    agent = Agent(name="a", model="m")
    async with responses_websocket_session(api_key="test-key", base_url=gw.url) as ws:
        streamed = ws.run_streamed(agent, "Say hello.")
        async for event in streamed.stream_events():
            if (
                event.type == "raw_response_event"
                and event.data.type == "response.output_text.delta"
            ):
                streamed.cancel()
        await gw.backend.records[-1].wait_disconnect()
        after = await ws.run(agent, "Again.")

    assert after.final_output == "Next."
    assert _roles(gw.backend.requests[-1]) == ["user"]


async def _stream_then_cancel(result: Any) -> None:
    async for event in result.stream_events():
        if event.type == "raw_response_event" and event.data.type == "response.output_text.delta":
            result.cancel()


async def test_own_recordings_of_client_sessions_are_clean(tmp_path: Path) -> None:
    """`--tap-dir` recordings of what these clients do pass `streamer tap`: a tool loop, a
    backend refusal (HTTP and WebSocket), a cut stream, and runs the client cancelled."""
    refusal = Status(400, {"error": {"message": "no such model", "type": "invalid_request_error"}})
    async with GatewayHarness(tap_dir=str(tmp_path)) as gw:
        gw.backend.script(
            _call("call_w", "get_weather", '{"city":"Oslo"}'),
            _text("Sunny."),
            [refusal],
            [*text_chunks(["Hal"]), DIE],
            [*text_chunks(["Hel"]), HANG],
            [refusal],
            [*text_chunks(["Hel"]), HANG],
        )
        async with AsyncOpenAI(base_url=gw.url, api_key="k", max_retries=0) as client:
            provider = OpenAIProvider(openai_client=client, use_responses=True)
            config = RunConfig(model_provider=provider, tracing_disabled=True)
            agent = Agent(name="a", tools=[get_weather])
            await Runner.run(agent, "Weather?", run_config=config)
            with pytest.raises(openai.BadRequestError):
                await Runner.run(agent, "Refused.", run_config=config)
            with pytest.raises(ModelBehaviorError):
                cut = Runner.run_streamed(agent, "Cut.", run_config=config)
                async for _ in cut.stream_events():
                    pass
            await _stream_then_cancel(Runner.run_streamed(agent, "Left.", run_config=config))
            await gw.backend.records[-1].wait_disconnect()
        async with responses_websocket_session(api_key="k", base_url=gw.url) as ws:
            with pytest.raises(ResponsesWebSocketError):
                await ws.run(Agent(name="w", model="m"), "Refused.")
            await _stream_then_cancel(ws.run_streamed(Agent(name="w", model="m"), "Left."))
            await gw.backend.records[-1].wait_disconnect()

    paths = sorted(tmp_path.iterdir())
    kinds = [[orjson.loads(line)["kind"] for line in p.read_text().splitlines()] for p in paths]
    assert len(paths) == 7
    assert sum(k[-1] == "error" for k in kinds) == 2  # the two refusals
    assert sum(k[-1] == "abandoned" for k in kinds) == 2  # the two runs cancelled mid-answer
    for path in paths:
        code, out = await tap(path)
        assert code == 0, out
