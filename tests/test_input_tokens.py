"""`POST /v1/responses/input_tokens` with the official SDK (`responses.input_tokens.count`):
counted by the backend's tokenizer as its profile says (vLLM: the chat itself; llama.cpp:
its template, then the text; SGLang: the lowered text), else estimated and marked so."""

from __future__ import annotations

from typing import Any

import aiohttp
import openai
import pytest
from harness import GatewayHarness
from openai import AsyncOpenAI
from scripted_backend import ScriptedBackend

from streamer.upstream.chat.tokenize import estimate, lowered_text

TOOLS: list[dict[str, Any]] = [
    {
        "type": "namespace",
        "name": "mcp__docs",
        "description": "Docs.",
        "tools": [{"type": "function", "name": "search", "parameters": {"type": "object"}}],
    }
]


def _chat(gw: GatewayHarness) -> list[Any]:
    return gw.backend.requests  # chat completions only: counting generates nothing


async def _raw(gw: GatewayHarness, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{gw.url}/responses/input_tokens", json=body) as resp,
    ):
        return resp.status, await resp.json()


async def test_estimated_without_a_tokenizer(gw: GatewayHarness, client: AsyncOpenAI) -> None:
    counted = await client.responses.input_tokens.count(model="m", input="hello there world")
    status, body = await _raw(gw, {"model": "m", "input": "hello there world"})
    assert status == 200 and body["object"] == "response.input_tokens"
    assert body["estimated"] is True and body["input_tokens"] == counted.input_tokens
    messages = [{"role": "user", "content": "hello there world"}]
    assert counted.input_tokens == estimate({"messages": messages}) > 0
    assert _chat(gw) == []


@pytest.mark.parametrize("profile", ["vllm", "llamacpp", "sglang"])
async def test_counted_by_the_backend_tokenizer(profile: str) -> None:
    async with GatewayHarness(backend_profile=profile) as gw:
        async with AsyncOpenAI(base_url=gw.url, api_key="k", max_retries=0) as client:
            counted = await client.responses.input_tokens.count(
                model="m",
                instructions="Be brief.",
                input="count these four words",
                tools=TOOLS,  # type: ignore[arg-type]
            )
            _, body = await _raw(gw, {"model": "m", "input": "count these four words"})
        paths = [r.path for r in gw.backend.records]
        asked = next(r.body for r in gw.backend.records if r.path == "/tokenize")
    assert "estimated" not in body
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "count these four words"},
    ]
    rendered = ScriptedBackend.render(messages)
    if profile == "vllm":  # the chat itself, template applied by the backend
        assert paths == ["/tokenize", "/tokenize"]
        assert asked["messages"] == messages and asked["add_generation_prompt"] is True
        assert asked["tools"][0]["function"]["name"] == "mcp__docs__search"  # as a turn sends
        assert counted.input_tokens == len(rendered.split())
    elif profile == "llamacpp":  # the backend's template, then its tokenizer
        assert paths == ["/apply-template", "/tokenize"] * 2
        assert asked == {
            "content": rendered,
            "add_special": True,
            "parse_special": True,
            "model": "m",
        }
        assert counted.input_tokens == len(rendered.split())
    else:  # text only: the lowered messages
        assert paths == ["/tokenize", "/tokenize"]
        assert asked["prompt"].startswith(lowered_text({"messages": messages}) + "\n")
        assert '"name":"mcp__docs__search"' in asked["prompt"]  # the tools, as a turn sends them
        assert counted.input_tokens == len(asked["prompt"].split())


async def test_a_failing_tokenizer_is_an_estimate() -> None:
    async with GatewayHarness(backend_profile="vllm") as gw:
        gw.backend.tokenizer_status = 404
        status, body = await _raw(gw, {"model": "m", "input": "hello"})
    assert status == 200 and body["estimated"] is True and body["input_tokens"] > 0


async def test_the_history_of_previous_response_id_is_counted() -> None:
    async with GatewayHarness(backend_profile="vllm") as gw:
        async with AsyncOpenAI(base_url=gw.url, api_key="k", max_retries=0) as client:
            first = await client.responses.create(model="m", input="one two")
            alone = await client.responses.input_tokens.count(model="m", input="three")
            chained = await client.responses.input_tokens.count(
                model="m", input="three", previous_response_id=first.id
            )
        asked = [r.body for r in gw.backend.records if r.path == "/tokenize"][-1]
    assert [m["role"] for m in asked["messages"]] == ["user", "assistant", "user"]
    assert chained.input_tokens > alone.input_tokens


async def test_the_model_is_optional(gw: GatewayHarness) -> None:
    status, body = await _raw(gw, {"input": "hi"})
    assert status == 200 and body["input_tokens"] > 0


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m", "input": 7}, "input"),
        ({"model": "m", "input": "hi", "tools": [{"type": "function"}]}, "tools[0].name"),
        (
            {"model": "m", "input": "hi", "previous_response_id": "resp_nope"},
            "previous_response_id",
        ),
        ({"model": "m", "input": "hi", "presence_penalty": 5}, "presence_penalty"),
    ],
)
async def test_bad_requests_are_400s_with_param(
    gw: GatewayHarness, client: AsyncOpenAI, body: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await client.responses.input_tokens.count(extra_body=body)
    error = caught.value.body
    assert isinstance(error, dict) and error["param"] == param, error
