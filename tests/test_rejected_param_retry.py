"""A backend that answers 400 to an optional parameter it does not take (issue 15): the
request is sent once more without it before any byte reaches the client, and the
gateway leaves it out from then on; what the client asked for (tools) is never dropped."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
from harness import GatewayHarness
from openai import AsyncOpenAI, BadRequestError
from scripted_backend import DONE, ScriptedBackend, Status, finish, text_chunks, usage

TEXT = [*text_chunks(["ok"]), finish("stop"), usage(3, 1), DONE]
TOOLS: list[Any] = [{"type": "function", "name": "exec_command", "parameters": {"type": "object"}}]


def _sglang(param: str) -> Status:
    message = (
        f"[{{'type': 'extra_forbidden', 'loc': ('body', '{param}'), 'msg': 'Extra inputs "
        "are not permitted', 'input': None}]"
    )
    body = {"object": "error", "message": message, "type": "BadRequestError", "code": 400}
    return Status(400, body)


def _openai(param: str) -> Status:
    error = {"message": f"Unrecognized request argument supplied: {param}", "param": None}
    return Status(400, {"error": {**error, "type": "invalid_request_error", "code": None}})


def _deepseek(param: str) -> Status:
    message = f"deepseek-reasoner does not support the parameter `{param}`"
    error = {"message": message, "type": "invalid_request_error", "param": None}
    return Status(400, {"error": {**error, "code": "invalid_request_error"}})


SHAPES: dict[str, Callable[[str], Status]] = {
    "sglang": _sglang,
    "openai": _openai,
    "deepseek": _deepseek,
}


def rejecting(param: str, shape: Callable[[str], Status]) -> Callable[[Any], list[Any]]:
    return lambda body: [shape(param)] if param in body else TEXT


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("param", ["stream_options", "parallel_tool_calls", "reasoning_effort"])
async def test_retried_once_without_it_then_remembered(
    shape: str, param: str, caplog: pytest.LogCaptureFixture
) -> None:
    backend = ScriptedBackend(responder=rejecting(param, SHAPES[shape]))
    request: dict[str, Any] = {
        "model": "m",
        "input": "x",
        "tools": TOOLS,
        "parallel_tool_calls": False,
        "reasoning": {"effort": "high"},
    }
    caplog.set_level(logging.WARNING, "streamer.upstream")
    async with (
        GatewayHarness(backend=backend) as gw,
        AsyncOpenAI(base_url=gw.url, api_key="k", max_retries=0) as sdk,
    ):
        stream = await sdk.responses.create(**request, stream=True)  # the retry is here
        events = [event async for event in stream]
        second = await sdk.responses.create(**request)
        sent = gw.backend.requests
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert not any(e.type == "error" for e in events)
    assert second.status == "completed" and second.output_text == "ok"
    assert [param in body for body in sent] == [True, False, False]  # once, then remembered
    assert all(body["tools"] and body["messages"] for body in sent)
    warned = [r.getMessage() for r in caplog.records if param in r.getMessage()]
    assert len(warned) == 1 and "left out of every request" in warned[0]


async def test_max_completion_tokens_is_renamed_to_max_tokens() -> None:
    backend = ScriptedBackend(responder=rejecting("max_completion_tokens", _sglang))
    async with (
        GatewayHarness(backend=backend, backend_profile="openai") as gw,
        AsyncOpenAI(base_url=gw.url, api_key="k", max_retries=0) as sdk,
    ):
        response = await sdk.responses.create(model="m", input="x", max_output_tokens=40)
        (rejected, sent) = gw.backend.requests
    assert response.status == "completed"
    assert rejected["max_completion_tokens"] == 40
    assert "max_completion_tokens" not in sent and sent["max_tokens"] == 40


async def test_a_rejected_tools_parameter_passes_through() -> None:
    """Dropping tools would silently lose what the client asked for."""
    backend = ScriptedBackend(responder=rejecting("tools", _sglang))
    async with (
        GatewayHarness(backend=backend) as gw,
        AsyncOpenAI(base_url=gw.url, api_key="k", max_retries=0) as sdk,
    ):
        with pytest.raises(BadRequestError) as caught:
            await sdk.responses.create(model="m", input="x", tools=TOOLS)
        assert len(gw.backend.requests) == 1
        assert gw.gateway.upstreams.default.rejected == frozenset()  # type: ignore[attr-defined]
    assert caught.value.status_code == 400
    assert "Extra inputs are not permitted" in str(caught.value)


async def test_a_second_400_after_the_retry_passes_through() -> None:
    """One retry, never a loop: a backend that rejects the next parameter too answers."""

    def respond(body: Any) -> list[Any]:
        for param in ("user", "stream_options"):
            if param in body:
                return [_openai(param)]
        return TEXT

    backend = ScriptedBackend(responder=respond)
    async with (
        GatewayHarness(backend=backend, drop_params="") as gw,
        AsyncOpenAI(base_url=gw.url, api_key="k", max_retries=0) as sdk,
    ):
        with pytest.raises(BadRequestError) as caught:
            await sdk.responses.create(model="m", input="x", user="alice")
        assert len(gw.backend.requests) == 2
        answered = await sdk.responses.create(model="m", input="x", user="alice")
        assert [("user" in b, "stream_options" in b) for b in gw.backend.requests] == [
            (True, True),
            (False, True),
            (False, False),  # the second 400 was remembered too
        ]
    assert "stream_options" in str(caught.value)
    assert answered.status == "completed"
