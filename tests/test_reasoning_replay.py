"""Reasoning replayed in the field the backend reads (issue 15): a thinking backend in a
tool loop (DeepSeek, Kimi, GLM) answers 400 unless every earlier tool-call turn's
reasoning comes back; vLLM and OpenRouter read it from `reasoning`, DeepSeek from
`reasoning_content`. Driven with the official SDK, the client replaying the items
(`store: false`) and the gateway's store replaying them (`previous_response_id`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from harness import GatewayHarness
from openai import AsyncOpenAI, BadRequestError
from openai.types.responses import Response
from scripted_backend import (
    DONE,
    ScriptedBackend,
    Status,
    finish,
    reasoning_chunks,
    text_chunks,
    tool_call_chunks,
    usage,
)

TOOLS: list[Any] = [
    {"type": "function", "name": "exec_command", "parameters": {"type": "object"}},
    {
        "type": "namespace",
        "name": "mcp__fs",
        "description": "Files.",
        "tools": [{"type": "function", "name": "read", "parameters": {"type": "object"}}],
    },
]
CALLS = [("exec_command", '{"cmd":"ls"}'), ("mcp__fs__read", '{"path":"a"}')]


def _missing(index: int, field: str) -> Status:
    """DeepSeek's answer to a thinking-mode tool loop without the reasoning (its wording)."""
    message = (
        f"Missing `{field}` field in the assistant message at message index {index}. For more "
        "information, please refer to https://api-docs.deepseek.com/guides/thinking_mode#tool-calls"
    )
    error = {"message": message, "type": "invalid_request_error", "param": None}
    return Status(400, {"error": {**error, "code": "invalid_request_error"}})


def thinking_backend(field: str) -> Callable[[Any], list[Any]]:
    """Thinks in `field`, calls a tool twice, then answers; 400 for a tool-call message
    in the history whose reasoning did not come back in `field`."""

    def respond(body: Any) -> list[Any]:
        messages = body["messages"]
        for index, message in enumerate(messages):
            tool_turn = message["role"] == "assistant" and message.get("tool_calls")
            if tool_turn and not message.get(field):
                return [_missing(index, field)]
        turn = sum(1 for m in messages if m["role"] == "tool")
        thought = reasoning_chunks([f"think {turn}", " more"], field=field)
        if turn < len(CALLS):
            name, arguments = CALLS[turn]
            call = tool_call_chunks(0, f"call_{turn}", [name], [arguments])
            return [*thought, *call, finish("tool_calls"), usage(9, 4), DONE]
        return [*thought, *text_chunks(["done"]), finish("stop"), usage(9, 2), DONE]

    return respond


def _calls(response: Response) -> list[str]:
    return [item.call_id for item in response.output if item.type == "function_call"]


async def loop_client_replays(sdk: AsyncOpenAI) -> Response:
    items: list[Any] = [{"role": "user", "content": "list, then read"}]
    for _ in range(len(CALLS) + 1):
        response = await sdk.responses.create(model="m", input=items, tools=TOOLS, store=False)
        items += [item.model_dump(exclude_none=True) for item in response.output]
        if not _calls(response):
            return response
        items += [
            {"type": "function_call_output", "call_id": c, "output": "ok"} for c in _calls(response)
        ]
    raise AssertionError("the loop did not end")


async def loop_store_replays(sdk: AsyncOpenAI) -> Response:
    response = await sdk.responses.create(model="m", input="list, then read", tools=TOOLS)
    for _ in range(len(CALLS)):
        if not _calls(response):
            break
        outputs: list[Any] = [
            {"type": "function_call_output", "call_id": c, "output": "ok"} for c in _calls(response)
        ]
        response = await sdk.responses.create(
            model="m", input=outputs, tools=TOOLS, previous_response_id=response.id
        )
    return response


LOOPS = {"store false": loop_client_replays, "previous_response_id": loop_store_replays}
PROFILES = {  # profile -> the field its backend thinks in and reads back
    "deepseek": "reasoning_content",
    "kimi": "reasoning_content",
    "glm": "reasoning_content",
    "vllm": "reasoning",
    "openrouter": "reasoning",
}


@pytest.mark.parametrize("loop", list(LOOPS))
@pytest.mark.parametrize("profile", list(PROFILES))
async def test_every_tool_call_turns_reasoning_reaches_the_backend(profile: str, loop: str) -> None:
    field = PROFILES[profile]
    backend = ScriptedBackend(responder=thinking_backend(field))
    async with (
        GatewayHarness(backend=backend, backend_profile=profile) as gw,
        AsyncOpenAI(base_url=gw.url, api_key="k", max_retries=0) as sdk,
    ):
        final = await LOOPS[loop](sdk)
        last = gw.backend.requests[-1]
    assert final.status == "completed" and final.output_text == "done"
    replayed = [m.get(field) for m in last["messages"] if m["role"] == "assistant"]
    assert replayed == ["think 0 more", "think 1 more"]
    other = "reasoning" if field == "reasoning_content" else "reasoning_content"
    assert not any(other in m for m in last["messages"])


async def test_the_flag_overrides_the_profile_and_off_replays_nothing() -> None:
    backend = ScriptedBackend(responder=thinking_backend("reasoning"))
    async with (
        GatewayHarness(
            backend=backend, backend_profile="deepseek", reasoning_replay="reasoning"
        ) as gw,
        AsyncOpenAI(base_url=gw.url, api_key="k", max_retries=0) as sdk,
    ):
        assert (await loop_store_replays(sdk)).status == "completed"
    backend = ScriptedBackend(responder=thinking_backend("reasoning_content"))
    async with (
        GatewayHarness(backend=backend, reasoning_replay="off") as gw,
        AsyncOpenAI(base_url=gw.url, api_key="k", max_retries=0) as sdk,
    ):
        with pytest.raises(BadRequestError) as caught:
            await loop_store_replays(sdk)
        (_, second) = gw.backend.requests
    assert "reasoning_content" not in str(second["messages"])
    assert "Missing `reasoning_content` field" in str(caught.value)
    assert caught.value.status_code == 400


def test_the_deprecated_replay_reasoning_off_still_means_off() -> None:
    from streamer.config import Settings
    from streamer.turns.options import backend_profile

    assert backend_profile(Settings(replay_reasoning=False)).reasoning_replay == "off"
    assert backend_profile(Settings(backend_profile="vllm")).reasoning_replay == "reasoning"
