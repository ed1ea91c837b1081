"""Request-side quirks of Chat backends (issue 15), each against a scripted backend that
behaves that way, through the gateway with the official SDK; every assertion is on what the
backend received (or what the client got back from a backend that misbehaves)."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import brotli
import orjson
import pytest
from harness import GatewayHarness
from openai import AsyncOpenAI
from scripted_backend import (
    DONE,
    ScriptedBackend,
    Status,
    finish,
    text_chunks,
    tool_call_chunks,
    usage,
)

try:
    from compression import zstd  # type: ignore[import-not-found]
except ImportError:
    from backports import zstd  # type: ignore[import-not-found,no-redef]

TOOLS: list[dict[str, Any]] = [
    {
        "type": "namespace",
        "name": "mcp__web",
        "description": "Web tools.",
        "tools": [
            {"type": "function", "name": "search", "parameters": {"type": "object"}},
            {"type": "function", "name": "fetch", "parameters": {"type": "object"}},
        ],
    },
    {
        "type": "namespace",
        "name": "crm",
        "description": "CRM.",
        "tools": [{"type": "function", "name": "lookup", "parameters": {"type": "object"}}],
    },
    {"type": "function", "name": "exec_command", "parameters": {"type": "object"}},
]
TEXT = [*text_chunks(["ok"]), finish("stop"), usage(3, 1), DONE]


@asynccontextmanager
async def gateway(
    backend: ScriptedBackend | None = None, **settings: Any
) -> AsyncIterator[tuple[GatewayHarness, AsyncOpenAI]]:
    harness = GatewayHarness(backend=backend, **settings)
    async with harness as gw, AsyncOpenAI(base_url=gw.url, api_key="k", max_retries=0) as sdk:
        yield gw, sdk


# -- 1. a forced named tool_choice ---------------------------------------------------------


CHOICES: dict[str, tuple[Any, list[str]]] = {
    "function": (
        {"type": "function", "name": "search", "namespace": "mcp__web"},
        ["mcp__web__search"],
    ),
    "allowed_tools required, one": (
        {
            "type": "allowed_tools",
            "mode": "required",
            "tools": [{"type": "function", "name": "exec_command"}],
        },
        ["exec_command"],
    ),
    "namespace with one member": ({"type": "namespace", "name": "crm"}, ["crm__lookup"]),
}


@pytest.mark.parametrize("case", list(CHOICES))
async def test_a_forced_tool_is_required_over_the_narrowed_list(case: str) -> None:
    """llama.cpp reads only strings: a named object silently became "auto" (issue 15, 1)."""
    choice, narrowed = CHOICES[case]
    async with gateway() as (gw, sdk):
        gw.backend.script(TEXT)
        await sdk.responses.create(model="m", input="go", tools=TOOLS, tool_choice=choice)
        (sent,) = gw.backend.requests
    assert sent["tool_choice"] == "required"
    assert [t["function"]["name"] for t in sent["tools"]] == narrowed


async def test_a_profile_that_takes_named_objects_gets_one() -> None:
    choice, _ = CHOICES["function"]
    async with gateway(backend_profile="vllm") as (gw, sdk):
        gw.backend.script(TEXT)
        await sdk.responses.create(model="m", input="go", tools=TOOLS, tool_choice=choice)
        (sent,) = gw.backend.requests
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "mcp__web__search"}}
    assert len(sent["tools"]) == 4


# -- 2. parallel_tool_calls: false ---------------------------------------------------------


def _two_calls(same_index: bool) -> list[Any]:
    first = tool_call_chunks(0, "call_a", ["mcp__web__search"], ['{"q":', '"x"}'])
    second = tool_call_chunks(0 if same_index else 1, "call_b", ["crm__lookup"], ['{"id":7}'])
    return [*first, *second, finish("tool_calls"), usage(5, 9), DONE]


@pytest.mark.parametrize("same_index", [False, True], ids=["indexed", "all at index 0"])
async def test_parallel_tool_calls_false_keeps_the_first_call(same_index: bool) -> None:
    """llama.cpp's grammar ignores the flag and sends 2-4 calls (issue 15, 5)."""
    async with gateway() as (gw, sdk):
        gw.backend.script(_two_calls(same_index), _two_calls(same_index))
        one = await sdk.responses.create(
            model="m", input="go", tools=TOOLS, parallel_tool_calls=False
        )
        stream = await sdk.responses.create(
            model="m", input="go", tools=TOOLS, parallel_tool_calls=False, stream=True
        )
        events = [e async for e in stream]
    for response in (one, events[-1].response):
        assert response.status == "completed"
        calls = [(i.call_id, i.name, i.arguments) for i in response.output]  # type: ignore[union-attr]
        assert calls == [("call_a", "search", '{"q":"x"}')]
    assert not any(e.type == "response.output_item.added" and e.output_index > 0 for e in events)


async def test_parallel_tool_calls_true_keeps_every_call() -> None:
    async with gateway() as (gw, sdk):
        gw.backend.script(_two_calls(False))
        response = await sdk.responses.create(model="m", input="go", tools=TOOLS)
    assert [i.call_id for i in response.output] == ["call_a", "call_b"]  # type: ignore[union-attr]


# -- 3. system messages --------------------------------------------------------------------


def _leading_system_only(body: Any) -> list[Any]:
    """A chat template that raises on a system message that is not first (Qwen, Mistral)."""
    roles = [m["role"] for m in body["messages"]]
    if "system" in roles[1:]:
        return [Status(400, {"error": {"message": "System message must be at the beginning."}})]
    return TEXT


CODEX_INPUT: list[dict[str, Any]] = [
    {"role": "developer", "content": "<permissions>sandboxed</permissions>"},
    {"role": "user", "content": "fix it"},
    {"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "c1", "output": "done"},
    {"role": "developer", "content": "<environment>changed</environment>"},
    {"role": "user", "content": "and now?"},
]


async def test_system_messages_merge_into_one_leading_message() -> None:
    backend = ScriptedBackend(responder=_leading_system_only)
    async with gateway(backend) as (gw, sdk):
        response = await sdk.responses.create(
            model="m",
            instructions="You are Codex.",
            input=CODEX_INPUT,
            tools=TOOLS,  # type: ignore[arg-type]
        )
        (sent,) = gw.backend.requests
    assert response.status == "completed"
    assert [m["role"] for m in sent["messages"]] == ["system", "user", "assistant", "tool", "user"]
    assert sent["messages"][0]["content"] == (
        "You are Codex.\n\n<permissions>sandboxed</permissions>\n\n<environment>changed</environment>"
    )


async def test_system_messages_user_marks_later_ones_as_instructions() -> None:
    backend = ScriptedBackend(responder=_leading_system_only)
    async with gateway(backend, system_messages="user") as (gw, sdk):
        await sdk.responses.create(
            model="m",
            instructions="You are Codex.",
            input=CODEX_INPUT,
            tools=TOOLS,  # type: ignore[arg-type]
        )
        (sent,) = gw.backend.requests
    roles = [m["role"] for m in sent["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "user", "user"]
    assert sent["messages"][0]["content"].endswith("<permissions>sandboxed</permissions>")
    assert sent["messages"][4]["content"].startswith("[Instructions from the developer")
    assert sent["messages"][4]["content"].endswith("<environment>changed</environment>")


async def test_system_messages_keep_leaves_them_in_place() -> None:
    async with gateway(system_messages="keep") as (gw, sdk):
        gw.backend.script(TEXT)
        await sdk.responses.create(model="m", input=CODEX_INPUT, tools=TOOLS)  # type: ignore[arg-type]
        (sent,) = gw.backend.requests
    assert [m["role"] for m in sent["messages"]].count("system") == 2


# -- 4. reasoning.effort -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("profile", "effort", "sent"),
    [
        ("generic", "xhigh", "high"),
        ("generic", "minimal", "low"),
        ("generic", "medium", "medium"),
        ("ollama", "minimal", "none"),
        ("openai", "xhigh", "xhigh"),
        ("deepseek", "max", "max"),  # api-docs.deepseek.com guides/thinking_mode
        ("deepseek", "none", None),  # "none" is never mapped up to some reasoning
        ("generic", "none", None),
        ("vllm", "none", None),
        ("sglang", "none", None),
        ("kimi", "high", None),
    ],
)
async def test_reasoning_effort_is_the_nearest_the_backend_takes(
    profile: str, effort: str, sent: str | None
) -> None:
    async with gateway(backend_profile=profile) as (gw, sdk):
        gw.backend.script(TEXT)
        await sdk.responses.create(model="m", input="x", reasoning={"effort": effort})  # type: ignore[typeddict-item]
        (body,) = gw.backend.requests
    assert body.get("reasoning_effort") == sent


async def test_the_effort_flag_overrides_the_profile() -> None:
    async with gateway(reasoning_efforts="low,high") as (gw, sdk):
        gw.backend.script(TEXT)
        await sdk.responses.create(model="m", input="x", reasoning={"effort": "medium"})
        (body,) = gw.backend.requests
    assert body["reasoning_effort"] == "low"


# -- 5. parameters a backend rejects -------------------------------------------------------


def _rejecting(*params: str) -> Callable[[Any], list[Any]]:
    def respond(body: Any) -> list[Any]:
        for param in params:
            if param in body:
                message = f"Unrecognized request argument supplied: {param}"
                return [
                    Status(400, {"error": {"message": message, "type": "invalid_request_error"}})
                ]
        return TEXT

    return respond


REQUEST: dict[str, Any] = {
    "model": "m",
    "input": "x",
    "user": "alice",
    "max_output_tokens": 50,
    "parallel_tool_calls": False,
    "tools": TOOLS,
}


async def test_generic_sends_no_user_and_max_tokens() -> None:
    backend = ScriptedBackend(responder=_rejecting("user", "max_completion_tokens"))
    async with gateway(backend) as (gw, sdk):
        response = await sdk.responses.create(**REQUEST)
        (body,) = gw.backend.requests
    assert response.status == "completed"
    assert "user" not in body and body["max_tokens"] == 50
    assert body["stream_options"] == {"include_usage": True}


async def test_openai_profile_sends_max_completion_tokens_and_user() -> None:
    backend = ScriptedBackend(responder=_rejecting("max_tokens"))
    async with gateway(backend, backend_profile="openai") as (gw, sdk):
        response = await sdk.responses.create(**REQUEST)
        (body,) = gw.backend.requests
    assert response.status == "completed"
    assert body["max_completion_tokens"] == 50 and body["user"] == "alice"


async def test_dropped_parameters_never_reach_the_backend() -> None:
    dropped = ("stream_options", "parallel_tool_calls", "user")
    backend = ScriptedBackend(responder=_rejecting(*dropped))
    async with gateway(backend, drop_params=",".join(dropped)) as (gw, sdk):
        gw.backend.script(_two_calls(False))
        response = await sdk.responses.create(**REQUEST)
        (body,) = gw.backend.requests
    assert not set(dropped) & set(body)
    assert [i.call_id for i in response.output] == ["call_a"]  # type: ignore[union-attr]


# -- 6. compressed request bodies ----------------------------------------------------------


CODINGS: dict[str, Callable[[bytes], bytes]] = {
    "zstd": zstd.compress,
    "gzip": gzip.compress,
    "deflate": zlib.compress,
    "br": brotli.compress,
}


@pytest.mark.parametrize("coding", list(CODINGS))
async def test_compressed_request_bodies_are_read(coding: str) -> None:
    """Codex sends `Content-Encoding: zstd`."""
    body = orjson.dumps({"model": "m", "input": "compressed hello", "stream": False})
    headers = {"Content-Type": "application/json", "Content-Encoding": coding}
    async with GatewayHarness() as gw, aiohttp.ClientSession() as session:
        gw.backend.script(TEXT)
        async with session.post(
            gw.url + "/responses", data=CODINGS[coding](body), headers=headers
        ) as resp:
            assert resp.status == 200, await resp.text()
            answer = await resp.json()
        (sent,) = gw.backend.requests
    assert answer["status"] == "completed"
    assert sent["messages"] == [{"role": "user", "content": "compressed hello"}]


@pytest.mark.parametrize("coding", ["lzma", "gzip, br"])
async def test_an_unknown_coding_is_a_clear_415(coding: str) -> None:
    """aiohttp passes a coding it does not decode through as is: it was a bad-JSON 400."""
    body = orjson.dumps({"model": "m", "input": "x", "stream": False})
    headers = {"Content-Type": "application/json", "Content-Encoding": coding}
    async with GatewayHarness() as gw, aiohttp.ClientSession() as session:
        async with session.post(gw.url + "/responses", data=body, headers=headers) as resp:
            assert resp.status == 415
            error = (await resp.json())["error"]
        assert gw.backend.requests == []
    assert error["code"] == "unsupported_content_encoding"
    assert coding in error["message"] and "zstd" in error["message"]


# -- the table -----------------------------------------------------------------------------


def test_every_profile_is_a_row_and_flags_lay_over_it() -> None:
    from streamer.upstream.chat.profiles import PROFILES, resolve

    assert set(PROFILES) == {
        *("vllm", "sglang", "llamacpp", "ollama", "lmstudio", "deepseek", "kimi", "glm"),
        *("openrouter", "openai", "generic", "anthropic", "litellm"),
    }
    generic = resolve("generic")
    assert (generic.tool_choice_object, generic.system_messages, generic.drop) == (
        False,
        "merge",
        frozenset({"user"}),
    )
    over = resolve("openai", system_messages="merge", drop="", efforts="any")  # fields by name
    assert (over.system_messages, over.drop, over.efforts) == ("merge", frozenset(), None)
    for bad in ({"name": "nope"}, {"name": "generic", "system_messages": "first"}):
        with pytest.raises(ValueError):
            resolve(**bad)  # type: ignore[arg-type]
