"""`local_shell` tools (older Codex, the Agents SDK): lowered as a function whose arguments are
the action, back as a `local_shell_call` item; its call and output items replay as a tool call
and a tool message. Through the official SDK, against a scripted backend."""

from __future__ import annotations

from typing import Any

import openai
import orjson
import pytest
from harness import GatewayHarness
from openai import AsyncOpenAI
from scripted_backend import DONE, finish, text_chunks, tool_call_chunks, usage
from sdk_models import validate_event, validate_response

from streamer.core.tools import ResponsesToolNames
from streamer.tap.grammar import GrammarChecker

SHELL = [{"type": "local_shell"}]
ARGS = '{"command": ["ls", "-la"], "working_directory": "/tmp", "env": {"A": "1"}}'


def shell_call(name: str = "local_shell", args: str = ARGS, call_id: str = "call_ls") -> list[Any]:
    chunks = tool_call_chunks(0, call_id, [name], [args[:10], args[10:]])
    return [*chunks, finish("tool_calls"), usage(5, 2), DONE]


async def test_local_shell_is_a_function_and_comes_back_as_a_local_shell_call(
    gw: GatewayHarness, client: AsyncOpenAI
) -> None:
    gw.backend.script(shell_call())
    events = [e async for e in await client.responses.create(
        model="m", input="list files", tools=SHELL, stream=True  # type: ignore[list-item]
    )]  # fmt: skip
    checker = GrammarChecker(ResponsesToolNames.convert(SHELL))
    raw = [e.to_dict() for e in events]
    assert [v for e in raw for v in checker.feed(e)] + checker.finish() == []
    for event in raw:
        validate_event(event)
    (tool,) = gw.backend.requests[-1]["tools"]
    function = tool["function"]
    assert function["name"] == "local_shell"
    assert function["parameters"]["properties"]["command"]["type"] == "array"
    assert function["parameters"]["required"] == ["command"]

    added = next(e for e in raw if e["type"] == "response.output_item.added")["item"]
    assert added["type"] == "local_shell_call" and added["call_id"] == "call_ls"
    assert not any(e["type"].startswith("response.function_call_arguments") for e in raw)
    (item,) = raw[-1]["response"]["output"]
    assert item["type"] == "local_shell_call" and item["status"] == "completed"
    assert item["call_id"] == "call_ls" and item["id"].startswith("lsh_")
    assert item["action"] == {
        "type": "exec",
        "command": ["ls", "-la"],
        "env": {"A": "1"},
        "working_directory": "/tmp",
    }
    validate_response(raw[-1]["response"])


async def test_a_command_string_runs_through_bash(gw: GatewayHarness, client: AsyncOpenAI) -> None:
    gw.backend.script(shell_call(args='{"command": "ls | wc -l", "timeout_ms": 500}'))
    response = await client.responses.create(model="m", input="count", tools=SHELL)  # type: ignore[list-item]
    action = response.output[0].to_dict()["action"]
    assert action == {
        "type": "exec",
        "command": ["bash", "-lc", "ls | wc -l"],
        "env": {},
        "timeout_ms": 500,
    }


@pytest.mark.parametrize("output_key", ["id", "call_id"])  # OpenAI's shape; the Agents SDK's
async def test_local_shell_history_replays_as_a_tool_call(
    output_key: str, gw: GatewayHarness, client: AsyncOpenAI
) -> None:
    gw.backend.script(shell_call())
    first = await client.responses.create(model="m", input="list files", tools=SHELL)  # type: ignore[list-item]
    call = first.output[0].to_dict()
    output = {"type": "local_shell_call_output", output_key: call["call_id"], "output": "a\nb"}
    gw.backend.script([*text_chunks(["two files"]), finish("stop"), DONE])
    chained = await client.responses.create(
        model="m",
        input=[output],
        tools=SHELL,
        previous_response_id=first.id,  # type: ignore[list-item]
    )
    assert chained.output_text == "two files"
    gw.backend.script([*text_chunks(["again"]), finish("stop"), DONE])
    await client.responses.create(
        model="m", input=[{"role": "user", "content": "list files"}, call, output], tools=SHELL
    )  # type: ignore[list-item]
    for body in gw.backend.requests[-2:]:  # from the store, and sent in full
        _, assistant, tool = body["messages"]
        (replayed,) = assistant["tool_calls"]
        assert replayed["id"] == "call_ls" and replayed["function"]["name"] == "local_shell"
        assert orjson.loads(replayed["function"]["arguments"]) == orjson.loads(ARGS)
        assert tool == {"role": "tool", "tool_call_id": "call_ls", "content": "a\nb"}


async def test_a_bad_local_shell_item_is_a_400(gw: GatewayHarness, client: AsyncOpenAI) -> None:
    bad = {"type": "local_shell_call", "call_id": "c", "status": "completed",
           "action": {"type": "exec", "command": "ls", "env": {}}}  # fmt: skip
    with pytest.raises(openai.BadRequestError) as raised:
        await client.responses.create(model="m", input=[bad], tools=SHELL)  # type: ignore[list-item]
    assert raised.value.body["param"] == "input[0].action.command"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as raised:
        await client.responses.create(
            model="m",
            input=[{"type": "local_shell_call_output", "output": "x"}],  # type: ignore[list-item]
        )
    assert raised.value.body["param"] == "input[0].id"  # type: ignore[index]
    assert gw.backend.requests == []


async def test_a_function_named_local_shell_keeps_its_name(
    gw: GatewayHarness, client: AsyncOpenAI
) -> None:
    tools = [{"type": "function", "name": "local_shell", "parameters": {"type": "object"}}, *SHELL]
    gw.backend.script([*text_chunks(["ok"]), finish("stop"), DONE])
    await client.responses.create(model="m", input="hi", tools=tools)  # type: ignore[arg-type]
    names = [t["function"]["name"] for t in gw.backend.requests[-1]["tools"]]
    assert names[0] == "local_shell" and names[1].startswith("local_shell_")
    gw.backend.script(shell_call(name=names[1]))
    response = await client.responses.create(model="m", input="hi", tools=tools)  # type: ignore[arg-type]
    assert response.output[0].type == "local_shell_call"
