"""A backend that refuses a forced tool_choice (issue 15): Kimi with thinking on answers
400 to "required" or a named choice, GLM takes only "auto"; their profiles send "auto"
over the narrowed tool list, so the turn still runs."""

from __future__ import annotations

from typing import Any

import pytest
from harness import GatewayHarness
from openai import AsyncOpenAI
from scripted_backend import DONE, ScriptedBackend, Status, finish, tool_call_chunks, usage

TOOLS: list[Any] = [
    {"type": "function", "name": "exec_command", "parameters": {"type": "object"}},
    {
        "type": "namespace",
        "name": "mcp__web",
        "description": "Web.",
        "tools": [{"type": "function", "name": "search", "parameters": {"type": "object"}}],
    },
]
FORCED = {"type": "function", "name": "search", "namespace": "mcp__web"}


def kimi_thinking(body: Any) -> list[Any]:
    choice = body.get("tool_choice")
    if choice == "required" or isinstance(choice, dict):
        message = f"tool_choice '{choice}' is incompatible with thinking enabled"
        return [Status(400, {"error": {"message": message, "type": "invalid_request_error"}})]
    name = body["tools"][0]["function"]["name"]
    call = tool_call_chunks(0, "call_1", [name], ['{"q":"x"}'])
    return [*call, finish("tool_calls"), usage(5, 3), DONE]


@pytest.mark.parametrize("profile", ["kimi", "glm"])
@pytest.mark.parametrize("choice", [FORCED, "required"], ids=["named", "required"])
async def test_a_forced_choice_is_auto_over_the_narrowed_list(profile: str, choice: Any) -> None:
    backend = ScriptedBackend(responder=kimi_thinking)
    async with (
        GatewayHarness(backend=backend, backend_profile=profile) as gw,
        AsyncOpenAI(base_url=gw.url, api_key="k", max_retries=0) as sdk,
    ):
        response = await sdk.responses.create(
            model="m", input="search", tools=TOOLS, tool_choice=choice
        )
        (sent,) = gw.backend.requests
    assert response.status == "completed"
    assert sent["tool_choice"] == "auto"
    names = [t["function"]["name"] for t in sent["tools"]]
    assert names == (
        ["mcp__web__search"] if choice is FORCED else ["exec_command", "mcp__web__search"]
    )


async def test_the_flag_lays_over_the_profile() -> None:
    backend = ScriptedBackend(responder=kimi_thinking)
    async with (
        GatewayHarness(backend=backend, tool_choice_required=False) as gw,
        AsyncOpenAI(base_url=gw.url, api_key="k", max_retries=0) as sdk,
    ):
        await sdk.responses.create(model="m", input="x", tools=TOOLS, tool_choice="required")
        (sent,) = gw.backend.requests
    assert sent["tool_choice"] == "auto"
