"""Response-side quirks of the Chat backends people run (issue 15), each against a scripted
backend that behaves that way: context overflow and deterministic 500s, parallel calls sent
one after another, calls cut by `length`, reasoning fields, calls without index or id."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from builders import sse_events
from harness import GatewayHarness
from openai import AsyncOpenAI
from scripted_backend import DONE, Status, text_chunks

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "name": "get", "parameters": {"type": "object"}},
    {"type": "function", "name": "put", "parameters": {"type": "object"}},
    {"type": "custom", "name": "patch", "description": "Apply a patch."},
]
BODY: dict[str, Any] = {"model": "m", "input": "hi", "tools": TOOLS}


@pytest.fixture
async def gw() -> Any:
    async with GatewayHarness() as harness:
        yield harness


@pytest.fixture
async def client(gw: GatewayHarness) -> Any:
    async with AsyncOpenAI(base_url=gw.url, api_key="k", max_retries=0) as c:
        yield c


# -- errors ---------------------------------------------------------------------------

OVERFLOWS = {
    "llama.cpp": Status(
        400,
        {
            "error": {
                "code": 400,
                "message": "the request exceeds the available context size, try increasing it",
                "type": "exceed_context_size_error",
                "n_prompt_tokens": 5000,
                "n_ctx": 4096,
            }
        },
    ),
    "vllm": Status(
        400,
        {
            "object": "error",
            "message": "This model's maximum context length is 4096 tokens. However, you "
            "requested 5000 tokens in the messages.",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        },
    ),
    "ollama": Status(500, {"error": "prompt too long; exceeded max context length by 9 tokens"}),
    "sglang": Status(
        400,
        {
            "object": "error",
            "message": "The input (5000 tokens) is longer than the model's context length "
            "(4096 tokens).",
            "type": "BadRequestError",
            "code": 400,
        },
    ),
}


@pytest.mark.parametrize("backend", sorted(OVERFLOWS))
async def test_context_overflow_on_http_error(
    gw: GatewayHarness, client: AsyncOpenAI, backend: str
) -> None:
    gw.backend.script([OVERFLOWS[backend]])
    with pytest.raises(openai.BadRequestError) as raised:
        await client.responses.create(model="m", input="hi", stream=True)
    assert raised.value.status_code == 400
    assert raised.value.code == "context_length_exceeded"


@pytest.mark.parametrize("backend", sorted(OVERFLOWS))
async def test_context_overflow_inside_response_failed(gw: GatewayHarness, backend: str) -> None:
    payload = OVERFLOWS[backend].body  # the same body, in the stream
    gw.backend.script([*text_chunks(["a"]), payload, DONE])
    events = await sse_events(gw.url, {"model": "m", "input": "hi"})
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"]["code"] == "context_length_exceeded"


@pytest.mark.parametrize(
    "message",
    [
        "Failed to parse tool call arguments as JSON: [json.exception.parse_error.101]",
        "image input is not supported - hint: if this is unexpected, you may need to provide "
        "the mmproj",
    ],
)
async def test_deterministic_500_is_400_with_backend_message(
    gw: GatewayHarness, client: AsyncOpenAI, message: str
) -> None:
    gw.backend.script(
        [Status(500, {"error": {"code": 500, "message": message, "type": "server_error"}})]
    )
    with pytest.raises(openai.BadRequestError) as raised:
        await client.responses.create(model="m", input="hi", stream=True)
    assert raised.value.status_code == 400
    assert message in raised.value.message


async def test_other_500_stays_5xx(gw: GatewayHarness, client: AsyncOpenAI) -> None:
    gw.backend.script([Status(500, {"error": {"message": "CUDA out of memory"}})])
    with pytest.raises(openai.InternalServerError):
        await client.responses.create(model="m", input="hi", stream=True)
