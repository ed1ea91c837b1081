"""`shell` and `apply_patch` tools (OpenAI's client-executed tools; the Agents SDK's ShellTool
and ApplyPatchTool, the AI SDK's openai.tools.shell / applyPatch): each lowered as a function
whose arguments are the call's action / operation, back as a `shell_call` / `apply_patch_call`
item; their call and output items replay as a tool call and a tool message; forcing either
is a forced function, forcing a hosted tool a 400. Through the official SDK, against a
scripted backend."""

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

SHELL: list[Any] = [{"type": "shell", "environment": {"type": "local"}}]
PATCH: list[Any] = [{"type": "apply_patch"}]
SHELL_ARGS = '{"commands": ["ls -la", "wc -l notes.txt"], "timeout_ms": 5000}'
DIFF = "@@\n-old line\n+new line\n"
PATCH_ARGS = orjson.dumps({"type": "update_file", "path": "notes.txt", "diff": DIFF}).decode()


def call(name: str, args: str, call_id: str = "call_1") -> list[Any]:
    chunks = tool_call_chunks(0, call_id, [name], [args[:10], args[10:]])
    return [*chunks, finish("tool_calls"), usage(5, 2), DONE]


def text(*parts: str) -> list[Any]:
    return [*text_chunks(list(parts)), finish("stop"), DONE]


async def stream(client: AsyncOpenAI, tools: list[Any], **kw: Any) -> list[dict[str, Any]]:
    events = [e async for e in await client.responses.create(
        model="m", input="go", tools=tools, stream=True, **kw
    )]  # fmt: skip
    raw = [e.to_dict() for e in events]
    checker = GrammarChecker(ResponsesToolNames.convert(tools))
    assert [v for e in raw for v in checker.feed(e)] + checker.finish() == []
    for event in raw:
        validate_event(event)
    validate_response(raw[-1]["response"])
    return raw


async def test_shell_is_a_function_and_comes_back_as_a_shell_call(
    gw: GatewayHarness, client: AsyncOpenAI
) -> None:
    gw.backend.script(call("shell", SHELL_ARGS))
    raw = await stream(client, SHELL)

    (tool,) = gw.backend.requests[-1]["tools"]
    function = tool["function"]
    assert function["name"] == "shell" and "shell commands" in function["description"]
    assert function["parameters"]["properties"]["commands"]["items"] == {"type": "string"}
    assert function["parameters"]["required"] == ["commands"]
    assert not any(e["type"].startswith("response.function_call") for e in raw)
    action = {"commands": ["ls -la", "wc -l notes.txt"], "timeout_ms": 5000}
    added = next(e for e in raw if e["type"] == "response.output_item.added")["item"]
    assert added == {
        "id": added["id"],
        "type": "shell_call",
        "status": "in_progress",
        "call_id": "call_1",
        "action": action,
    }
    (item,) = raw[-1]["response"]["output"]
    assert item == {**added, "status": "completed"} and item["id"].startswith("shc_")
    assert raw[-1]["response"]["tools"] == SHELL  # echoed as sent


async def test_apply_patch_is_a_function_and_comes_back_as_an_apply_patch_call(
    gw: GatewayHarness, client: AsyncOpenAI
) -> None:
    gw.backend.script(call("apply_patch", PATCH_ARGS, "call_p"))
    raw = await stream(client, PATCH)

    (tool,) = gw.backend.requests[-1]["tools"]
    params = tool["function"]["parameters"]
    assert tool["function"]["name"] == "apply_patch" and "V4A" in tool["function"]["description"]
    assert params["properties"]["type"]["enum"] == ["create_file", "update_file", "delete_file"]
    assert params["required"] == ["type", "path"]
    (item,) = raw[-1]["response"]["output"]
    assert item["type"] == "apply_patch_call" and item["status"] == "completed"
    assert item["call_id"] == "call_p" and item["id"].startswith("apc_")
    assert item["operation"] == {"type": "update_file", "path": "notes.txt", "diff": DIFF}


@pytest.mark.parametrize(
    ("args", "operation"),
    [
        ('{"type": "delete_file", "path": "a.txt", "diff": "x"}', {"type": "delete_file", "path": "a.txt"}),
        ('{"type": "create_file", "path": "b.txt"}', {"type": "create_file", "path": "b.txt", "diff": ""}),
        # an unknown type never deletes or overwrites on a guess
        ('{"type": "rename", "path": "c", "diff": "d"}', {"type": "update_file", "path": "c", "diff": "d"}),
        # OpenAI's item shape, wrapped
        ('{"operation": {"type": "delete_file", "path": "e"}}', {"type": "delete_file", "path": "e"}),
    ],
)  # fmt: skip
async def test_patch_operations_are_well_formed(
    args: str, operation: dict[str, Any], gw: GatewayHarness, client: AsyncOpenAI
) -> None:
    gw.backend.script(call("apply_patch", args))
    response = await client.responses.create(model="m", input="edit", tools=PATCH)
    assert response.output[0].to_dict()["operation"] == operation
    validate_response(response.to_dict())


async def test_a_command_string_is_one_command(gw: GatewayHarness, client: AsyncOpenAI) -> None:
    gw.backend.script(call("shell", '{"commands": "ls | wc -l", "max_output_length": 100}'))
    response = await client.responses.create(model="m", input="count", tools=SHELL)
    action = response.output[0].to_dict()["action"]
    assert action == {"commands": ["ls | wc -l"], "max_output_length": 100}


async def test_a_cut_apply_patch_call_stays_in_progress(
    gw: GatewayHarness, client: AsyncOpenAI
) -> None:
    """Cut by the length limit: apply_patch_call has no `incomplete` status; never completed."""
    chunks = tool_call_chunks(0, "call_c", ["apply_patch"], ['{"type": "create_file", "pa'])
    gw.backend.script([*chunks, finish("length"), DONE])
    response = await client.responses.create(model="m", input="edit", tools=PATCH)
    assert response.status == "incomplete"
    (item,) = response.output
    assert item.type == "apply_patch_call" and item.status == "in_progress"
    validate_response(response.to_dict())


SHELL_OUTPUT = {
    "type": "shell_call_output",
    "call_id": "call_1",
    "output": [
        {"stdout": "a\nb\n", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}},
        {"stdout": "", "stderr": "no such file\n", "outcome": {"type": "exit", "exit_code": 1}},
    ],
    "max_output_length": 100,
}
SHELL_TEXT = "a\nb\n[exit code 0]\n[stderr]\nno such file\n[exit code 1]"


@pytest.mark.parametrize(
    ("tools", "args", "output", "message"),
    [
        (SHELL, SHELL_ARGS, SHELL_OUTPUT, SHELL_TEXT),
        (
            PATCH,
            PATCH_ARGS,
            {"type": "apply_patch_call_output", "call_id": "call_1", "status": "completed"},
            "The patch was applied.",
        ),
        (
            PATCH,
            PATCH_ARGS,
            {
                "type": "apply_patch_call_output",
                "call_id": "call_1",
                "status": "failed",
                "output": "notes.txt: hunk 1 did not match",
            },
            "The patch failed: notes.txt: hunk 1 did not match",
        ),
    ],
)
async def test_history_replays_as_a_tool_call_and_a_tool_message(
    tools: list[Any],
    args: str,
    output: dict[str, Any],
    message: str,
    gw: GatewayHarness,
    client: AsyncOpenAI,
) -> None:
    name = tools[0]["type"]
    gw.backend.script(call(name, args))
    first = await client.responses.create(model="m", input="go", tools=tools)
    item = first.output[0].to_dict()
    gw.backend.script(text("done"))
    chained = await client.responses.create(
        model="m", input=[output], tools=tools, previous_response_id=first.id
    )
    assert chained.output_text == "done"
    gw.backend.script(text("again"))
    await client.responses.create(
        model="m", input=[{"role": "user", "content": "go"}, item, output], tools=tools
    )
    for body in gw.backend.requests[-2:]:  # from the store, and sent in full
        _, assistant, tool = body["messages"]
        (replayed,) = assistant["tool_calls"]
        assert replayed["id"] == "call_1" and replayed["function"]["name"] == name
        assert orjson.loads(replayed["function"]["arguments"]) == orjson.loads(args)
        assert tool == {"role": "tool", "tool_call_id": "call_1", "content": message}


@pytest.mark.parametrize(
    ("item", "param"),
    [
        ({"type": "shell_call", "call_id": "c", "action": {"commands": "ls"}}, "input[0].action.commands"),
        ({"type": "shell_call", "call_id": "c"}, "input[0].action"),
        ({"type": "shell_call", "call_id": "c", "action": {"commands": [], "timeout_ms": "1"}},
         "input[0].action.timeout_ms"),
        ({"type": "shell_call_output", "output": []}, "input[0].call_id"),
        ({"type": "shell_call_output", "call_id": "c", "output": [1]}, "input[0].output[0]"),
        ({"type": "shell_call_output", "call_id": "c", "output": [{"stdout": 1}]},
         "input[0].output[0].stdout"),
        ({"type": "apply_patch_call", "call_id": "c", "status": "completed",
          "operation": {"type": "move_file", "path": "a"}}, "input[0].operation.type"),
        ({"type": "apply_patch_call", "call_id": "c", "status": "completed",
          "operation": {"type": "delete_file"}}, "input[0].operation.path"),
        ({"type": "apply_patch_call_output", "status": "completed"}, "input[0].call_id"),
    ],
)  # fmt: skip
async def test_a_bad_history_item_is_a_400(
    item: dict[str, Any], param: str, gw: GatewayHarness, client: AsyncOpenAI
) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        await client.responses.create(model="m", input=[item], tools=SHELL + PATCH)
    assert raised.value.body["param"] == param  # type: ignore[index]
    assert gw.backend.requests == []


async def test_forcing_shell_or_apply_patch_forces_its_function(
    gw: GatewayHarness, client: AsyncOpenAI
) -> None:
    tools = [*SHELL, *PATCH, {"type": "function", "name": "f", "parameters": {"type": "object"}}]
    for kind in ("shell", "apply_patch"):
        gw.backend.script(call(kind, SHELL_ARGS if kind == "shell" else PATCH_ARGS))
        response = await client.responses.create(
            model="m", input="go", tools=tools, tool_choice={"type": kind}
        )
        body = gw.backend.requests[-1]
        assert body["tool_choice"] == "required"
        assert [t["function"]["name"] for t in body["tools"]] == [kind]  # narrowed to it
        assert response.output[0].type == f"{kind}_call"
        assert response.to_dict()["tool_choice"] == {"type": kind}


@pytest.mark.parametrize(
    "choice",
    [
        {"type": "web_search_preview"},
        {"type": "file_search"},
        {"type": "code_interpreter"},
        {"type": "image_generation"},
        {"type": "computer_use_preview"},
        {"type": "mcp", "server_label": "docs"},
        {"type": "shell"},  # the only shell runs in OpenAI's container
    ],
)
async def test_forcing_a_hosted_tool_is_a_400(
    choice: dict[str, Any], gw: GatewayHarness, client: AsyncOpenAI
) -> None:
    tools = [
        {"type": "web_search"},
        {"type": "file_search", "vector_store_ids": ["vs_1"]},
        {"type": "code_interpreter", "container": {"type": "auto"}},
        {"type": "image_generation"},
        {"type": "shell", "environment": {"type": "container_auto"}},
        {"type": "function", "name": "f", "parameters": {"type": "object"}},
    ]  # (an `mcp` tool is run by the gateway: tests/test_mcp.py)
    with pytest.raises(openai.BadRequestError) as raised:
        await client.responses.create(model="m", input="go", tools=tools, tool_choice=choice)  # type: ignore[arg-type]
    body = raised.value.body
    assert body["param"] == "tool_choice.type"  # type: ignore[index]
    assert "does not run" in body["message"] or "no shell tool" in body["message"]  # type: ignore[index]
    assert gw.backend.requests == []
    # not forced, an optional hosted tool (--optional-hosted-tool) is echoed and not sent;
    # one the gateway cannot run and that is not optional is a 400 naming it (docs/mcp.md)
    with pytest.raises(openai.BadRequestError) as unrunnable:
        await client.responses.create(model="m", input="go", tools=tools)  # type: ignore[arg-type]
    assert unrunnable.value.body["param"] == "tools[1]"  # type: ignore[index]
    tools = [t for t in tools if t["type"] in ("web_search", "shell", "function")]
    gw.backend.script(text("ok"))
    response = await client.responses.create(model="m", input="go", tools=tools)  # type: ignore[arg-type]
    assert [t["function"]["name"] for t in gw.backend.requests[-1]["tools"]] == ["f"]
    assert [t["type"] for t in response.to_dict()["tools"]] == [t["type"] for t in tools]
