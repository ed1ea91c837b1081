"""Request fields besides input and tools (issue 17, fidelity): what reaches the backend, per
backend profile, and what the Response echoes; the values the API refuses, as 400s.

One parametrised matrix over a recording scripted backend, through the gateway with the
official SDK: each row is a profile, the fields a client sent, the Chat fields the backend
must (and must not) have received, and the Response fields that say what was applied.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import openai
import pytest
from harness import GatewayHarness
from openai import AsyncOpenAI
from scripted_backend import DONE, finish, text_chunks, tool_call_chunks, usage

from streamer.core.errors import RequestError
from streamer.core.request_fields import check_fields

TEXT = [*text_chunks(["ok"]), finish("stop"), usage(3, 1), DONE]
LOGPROBS = "message.output_text.logprobs"
_ABSENT = object()


@asynccontextmanager
async def gateway(**settings: Any) -> AsyncIterator[tuple[GatewayHarness, AsyncOpenAI]]:
    harness = GatewayHarness(**settings)
    async with harness as gw, AsyncOpenAI(base_url=gw.url, api_key="k", max_retries=0) as sdk:
        yield gw, sdk


# (id, settings, request fields, backend must have, backend must not have, Response echo)
MATRIX: list[Any] = [
    ("logprobs by top_logprobs", {}, {"top_logprobs": 3},
     {"logprobs": True, "top_logprobs": 3}, (), {"top_logprobs": 3}),
    ("logprobs by include", {}, {"include": [LOGPROBS]},
     {"logprobs": True}, ("top_logprobs",), {}),
    ("no logprobs unasked", {}, {"include": ["reasoning.encrypted_content"]},
     {}, ("logprobs", "top_logprobs"), {}),
    ("user, generic drops it", {}, {"user": "u1"}, {}, ("user",), {"user": "u1"}),
    ("user to vllm", {"backend_profile": "vllm"}, {"user": "u1"}, {"user": "u1"}, (), {}),
    ("safety_identifier as user", {"backend_profile": "vllm"}, {"safety_identifier": "s1"},
     {"user": "s1"}, ("safety_identifier",), {"safety_identifier": "s1"}),
    ("user before safety_identifier", {"backend_profile": "vllm"},
     {"user": "u1", "safety_identifier": "s1"}, {"user": "u1"}, (), {}),
    ("prompt_cache_key to openai", {"backend_profile": "openai"},
     {"prompt_cache_key": "thread-1"}, {"prompt_cache_key": "thread-1"}, ("cache_salt",),
     {"prompt_cache_key": "thread-1"}),
    ("prompt_cache_key, vllm by default", {"backend_profile": "vllm"},
     {"prompt_cache_key": "thread-1"}, {}, ("prompt_cache_key", "cache_salt"), {}),
    ("prompt_cache_key as vllm cache_salt",
     {"backend_profile": "vllm", "backend_accepts": "logprobs,cache_salt"},
     {"prompt_cache_key": "thread-1"}, {"cache_salt": "thread-1"}, ("prompt_cache_key",), {}),
    ("metadata to openai", {"backend_profile": "openai"}, {"metadata": {"k": "v"}},
     {"metadata": {"k": "v"}}, (), {"metadata": {"k": "v"}}),
    ("metadata, generic keeps it", {}, {"metadata": {"k": "v"}},
     {}, ("metadata",), {"metadata": {"k": "v"}}),
    ("verbosity to openai", {"backend_profile": "openai"}, {"text": {"verbosity": "low"}},
     {"verbosity": "low"}, (), {"text.verbosity": "low"}),
    ("verbosity, generic: the echo says medium", {}, {"text": {"verbosity": "low"}},
     {}, ("verbosity",), {"text.verbosity": "medium"}),
    ("service_tier to openai", {"backend_profile": "openai"}, {"service_tier": "flex"},
     {"service_tier": "flex"}, (), {"service_tier": "default"}),
    ("a tier newer than the spec's", {}, {"service_tier": "ultrafast"},
     {}, ("service_tier",), {"service_tier": "default"}),
    ("priority is not echoed as applied", {}, {"service_tier": "priority"},
     {}, ("service_tier",), {"service_tier": "default"}),
    ("max_tool_calls is the gateway's", {}, {"max_tool_calls": 2},
     {}, ("max_tool_calls",), {"max_tool_calls": 2}),
    ("truncation is the gateway's", {}, {"truncation": "auto"},
     {}, ("truncation",), {"truncation": "auto"}),
    ("frequency_penalty", {}, {"frequency_penalty": 0.5}, {"frequency_penalty": 0.5}, (), {}),
    ("presence_penalty", {}, {"presence_penalty": -0.5}, {"presence_penalty": -0.5}, (), {}),
]  # fmt: skip


def _rows() -> list[Any]:
    return [pytest.param(*row[1:], id=row[0]) for row in MATRIX]


def _echoed(response: Any, path: str) -> Any:
    value = response.model_dump()
    for key in path.split("."):
        value = value.get(key, _ABSENT) if isinstance(value, dict) else _ABSENT
    return value


@pytest.mark.parametrize(
    ("settings", "fields", "sent", "not_sent", "echo"),
    _rows(),
)
async def test_what_reaches_the_backend(
    settings: dict[str, Any],
    fields: dict[str, Any],
    sent: dict[str, Any],
    not_sent: tuple[str, ...],
    echo: dict[str, Any],
) -> None:
    async with gateway(**settings) as (gw, sdk):
        gw.backend.script(TEXT)
        response = await sdk.responses.create(model="m", input="hi", extra_body=fields)
    body = gw.backend.requests[-1]
    assert {k: body.get(k, _ABSENT) for k in sent} == sent
    assert [k for k in not_sent if k in body] == []
    assert {k: _echoed(response, k) for k in echo} == echo
    assert response.status == "completed"


async def test_the_echo_says_the_tier_the_backend_served() -> None:
    """OpenAI's chunks carry `service_tier`: the tier that served the request, not the asked."""
    served = [{**c, "service_tier": "flex"} for c in TEXT[:-1]]
    async with gateway(backend_profile="openai") as (gw, sdk):
        gw.backend.script([*served, DONE], [*served, DONE])
        one = await sdk.responses.create(model="m", input="hi", service_tier="auto")
        stream = await sdk.responses.create(model="m", input="hi", service_tier="auto", stream=True)
        events = [e async for e in stream]
    assert gw.backend.requests[0]["service_tier"] == "auto"
    assert one.service_tier == "flex"
    assert events[0].response.service_tier == "default"  # type: ignore[union-attr]
    assert events[-1].response.service_tier == "flex"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"top_logprobs": 21}, "top_logprobs"),
        ({"top_logprobs": -1}, "top_logprobs"),
        ({"include": ["message.output_text.logprobs", "nope"]}, "include[1]"),
        ({"include": [[]]}, "include[0]"),  # found by tests/test_fuzz.py
        ({"max_tool_calls": 0}, "max_tool_calls"),
        ({"moderation": {"model": "omni-moderation-latest"}}, "moderation"),
        ({"context_management": [{"type": "compaction"}]}, "context_management"),
        ({"text": {"verbosity": "loud"}}, "text.verbosity"),
    ],
)
async def test_values_the_api_refuses_are_400s_with_their_param(
    fields: dict[str, Any], param: str
) -> None:
    async with gateway() as (gw, sdk):
        with pytest.raises(openai.BadRequestError) as caught:
            await sdk.responses.create(model="m", input="hi", extra_body=fields)
    assert caught.value.status_code == 400
    assert caught.value.body["param"] == param  # type: ignore[index]
    assert gw.backend.requests == []


@pytest.mark.parametrize(
    ("fields", "param"),
    [({"top_logprobs": 2}, "top_logprobs"), ({"include": [LOGPROBS]}, "include")],
)
async def test_logprobs_a_backend_cannot_give_are_a_400_not_an_empty_list(
    fields: dict[str, Any], param: str
) -> None:
    async with gateway(backend_accepts="") as (gw, sdk):
        with pytest.raises(openai.BadRequestError) as caught:
            await sdk.responses.create(model="m", input="hi", extra_body=fields)
    assert caught.value.body["param"] == param  # type: ignore[index]
    assert "not supported" in caught.value.body["message"]  # type: ignore[index]
    assert gw.backend.requests == []


def test_every_include_value_of_the_api_is_accepted() -> None:
    values = [
        "reasoning.encrypted_content",  # Codex sends it on every turn
        LOGPROBS,
        "message.input_image.image_url",
        "file_search_call.results",
        "web_search_call.action.sources",
        "computer_call_output.output.image_url",
        "code_interpreter_call.outputs",
    ]
    check_fields({"include": values})
    with pytest.raises(RequestError):
        check_fields({"include": ["reasoning.plaintext"]})


def test_backend_accepts_names_only_known_parameters() -> None:
    from streamer.upstream.chat.profiles import resolve

    assert resolve("vllm", accepts="logprobs, cache_salt").accepts == {"logprobs", "cache_salt"}
    with pytest.raises(ValueError, match="unknown parameter"):
        resolve("generic", accepts="logprobs,seed")


# -- max_tool_calls -----------------------------------------------------------------------

TOOLS: list[dict[str, Any]] = [
    {
        "type": "namespace",
        "name": "mcp__web",
        "description": "Web tools.",
        "tools": [{"type": "function", "name": "search", "parameters": {"type": "object"}}],
    },
    {"type": "function", "name": "exec_command", "parameters": {"type": "object"}},
]


def _three_calls() -> list[Any]:
    calls = [
        tool_call_chunks(0, "call_a", ["mcp__web__search"], ['{"q":', '"a"}']),
        tool_call_chunks(1, "call_b", ["exec_command"], ['{"cmd":"ls"}']),
        tool_call_chunks(2, "call_c", ["mcp__web__search"], ['{"q":"c"}']),
    ]
    return [*(c for call in calls for c in call), finish("tool_calls"), usage(5, 9), DONE]


@pytest.mark.parametrize(("limit", "parallel"), [(2, True), (1, True), (3, False)])
async def test_max_tool_calls_leaves_out_the_calls_beyond_it(limit: int, parallel: bool) -> None:
    """OpenAI ignores calls past `max_tool_calls`: the response completes with the first ones
    (and `parallel_tool_calls: false` still means one)."""
    kept = min(limit, 1 if not parallel else limit)
    async with gateway() as (gw, sdk):
        gw.backend.script(_three_calls(), _three_calls())
        one = await sdk.responses.create(
            model="m", input="go", tools=TOOLS, max_tool_calls=limit, parallel_tool_calls=parallel
        )
        stream = await sdk.responses.create(
            model="m",
            input="go",
            tools=TOOLS,
            max_tool_calls=limit,
            parallel_tool_calls=parallel,
            stream=True,
        )
        events = [e async for e in stream]
    expected = [("call_a", "search", '{"q":"a"}'), ("call_b", "exec_command", '{"cmd":"ls"}')]
    for response in (one, events[-1].response):  # type: ignore[union-attr]
        assert response.status == "completed"
        assert response.max_tool_calls == limit
        calls = [(i.call_id, i.name, i.arguments) for i in response.output]  # type: ignore[union-attr]
        assert calls == [*expected, ("call_c", "search", '{"q":"c"}')][:kept]
    added = [e for e in events if e.type == "response.output_item.added"]
    assert len(added) == kept
