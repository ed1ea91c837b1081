"""Response-side quirks of the Chat backends people run (issue 15), each against a scripted
backend that behaves that way: context overflow and deterministic 500s, parallel calls sent
one after another, calls cut by `length`, reasoning fields, calls without index or id."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import orjson
import pytest
from builders import client_session, parse_sse, sse_events
from harness import GatewayHarness
from openai import AsyncOpenAI
from scripted_backend import DONE, HANG, Gate, Sleep, Status, chunk, finish, text_chunks, usage

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
    "ollama embed": Status(400, {"error": "the input length exceeds the context length"}),
    # MoonshotAI/kimi-cli#2011
    "kimi": Status(
        400,
        {
            "error": {
                "message": "Invalid request: Your request exceeded model token limit: 262144 "
                "(requested: 269030)",
                "type": "invalid_request_error",
            }
        },
    ),
    # zeroclaw-labs/zeroclaw#4124
    "glm": Status(400, {"error": {"code": "1261", "message": "Prompt exceeds max length"}}),
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


# -- tool calls -------------------------------------------------------------------------


def _call(index: int | None, id: str | None, name: str | None, args: str) -> dict[str, Any]:
    call: dict[str, Any] = {"function": {"arguments": args}}
    if index is not None:
        call["index"] = index
    if id is not None:
        call.update(id=id, type="function")
    if name is not None:
        call["function"]["name"] = name
    return chunk({"tool_calls": [call]})


def _types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


async def test_sequential_call_is_done_when_the_next_starts(gw: GatewayHarness) -> None:
    """llama.cpp/vLLM send calls one after another: call 0 is finished (its `done` events out)
    while call 1 is still streaming, and the backend waits for the client to see that."""
    seen = asyncio.Event()
    gw.backend.script(
        [
            _call(0, "call_a", "get", '{"k":'),
            _call(0, None, None, ' "a"}'),
            _call(1, "call_b", "put", '{"k":'),
            Gate(seen),
            _call(1, None, None, ' "b"}'),
            finish("tool_calls"),
            usage(3, 4),
            DONE,
        ]
    )
    events: list[dict[str, Any]] = []
    async with (
        asyncio.timeout(60),  # a guard, not a measure: without the fix the gate never opens
        client_session() as session,
        session.post(gw.url + "/responses", json={**BODY, "stream": True}) as resp,
    ):
        buffer = b""
        async for data in resp.content.iter_any():
            buffer += data
            *frames, buffer = buffer.split(b"\n\n")
            for frame in frames:
                events += parse_sse(frame + b"\n\n")
            if not seen.is_set() and any(
                e["type"] == "response.output_item.done" and e["item"]["call_id"] == "call_a"
                for e in events
            ):
                # call 0 is whole before call 1's last fragment was even sent
                assert "response.function_call_arguments.done" in _types(events)
                seen.set()
    assert seen.is_set()
    calls = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert [(c["call_id"], c["arguments"], c["status"]) for c in calls] == [
        ("call_a", '{"k": "a"}', "completed"),
        ("call_b", '{"k": "b"}', "completed"),
    ]
    # call 1 streamed live: its second fragment came as its own delta
    deltas = [e for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert [d["delta"] for d in deltas] == ['{"k":', ' "a"}', '{"k":', ' "b"}']


async def test_interleaved_calls_still_whole_and_in_order(gw: GatewayHarness) -> None:
    a = [_call(0, "call_a", "get", ""), _call(0, None, None, '{"k": 1}')]
    b = [_call(1, "call_b", "put", ""), _call(1, None, None, '{"k": 2}')]
    gw.backend.script([a[0], b[0], a[1], b[1], finish("tool_calls"), DONE])
    events = await sse_events(gw.url, BODY)
    calls = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert [(c["call_id"], c["arguments"]) for c in calls] == [
        ("call_a", '{"k": 1}'),
        ("call_b", '{"k": 2}'),
    ]


async def test_length_cut_only_the_cut_call_is_incomplete(gw: GatewayHarness) -> None:
    gw.backend.script(
        [
            _call(0, "call_a", "get", '{"k": 1}'),
            _call(1, "call_b", "put", '{"k": "tr'),
            finish("length"),
            DONE,
        ]
    )
    events = await sse_events(gw.url, BODY)
    assert events[-1]["type"] == "response.incomplete"
    output = events[-1]["response"]["output"]
    assert [(o["call_id"], o["status"]) for o in output] == [
        ("call_a", "completed"),
        ("call_b", "incomplete"),
    ]


async def test_length_cut_custom_call_gives_the_input_so_far(gw: GatewayHarness) -> None:
    gw.backend.script(
        [
            _call(0, "call_p", "patch", '{"input": "*** Begin Patch\\n+line \\"q'),
            finish("length"),
            DONE,
        ]
    )
    events = await sse_events(gw.url, BODY)
    (item,) = events[-1]["response"]["output"]
    assert item["type"] == "custom_tool_call"
    assert item["status"] == "incomplete"
    assert item["input"] == '*** Begin Patch\n+line "q'


async def test_replayed_cut_arguments_are_never_sent_as_invalid_json(
    gw: GatewayHarness,
) -> None:
    history = [
        {"type": "message", "role": "user", "content": "hi"},
        {"type": "function_call", "call_id": "c1", "name": "get", "arguments": '{"k": "tr'},
        {"type": "function_call_output", "call_id": "c1", "output": "error"},
    ]
    gw.backend.script([*text_chunks(["ok"]), finish(), DONE])
    await sse_events(gw.url, {**BODY, "input": history})
    sent = gw.backend.requests[-1]["messages"]
    assistant = next(m for m in sent if m["role"] == "assistant")
    for call in assistant["tool_calls"]:
        orjson.loads(call["function"]["arguments"])  # valid JSON, every one
    assert "cut off" in assistant["content"]


async def test_every_call_at_index_0_ids_on_first_chunks_only(gw: GatewayHarness) -> None:
    """Ollama: every call at index 0 (or none), each call's `id` on its first chunk only."""
    gw.backend.script(
        [
            _call(0, "call_a", "get", '{"k":'),
            _call(0, None, None, " 1}"),
            _call(0, "call_b", "put", '{"k":'),
            _call(0, None, None, " 2}"),
            _call(None, None, "get", '{"k": 3}'),
            finish("tool_calls"),
            DONE,
        ]
    )
    events = await sse_events(gw.url, BODY)
    calls = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert [(c["name"], c["arguments"]) for c in calls] == [
        ("get", '{"k": 1}'),
        ("put", '{"k": 2}'),
        ("get", '{"k": 3}'),
    ]
    assert [c["call_id"] for c in calls][:2] == ["call_a", "call_b"]
    assert len({c["call_id"] for c in calls}) == 3


# -- reasoning and usage ----------------------------------------------------------------


@pytest.mark.parametrize(
    "delta",
    [
        {"reasoning_details": [{"type": "reasoning.text", "text": "think"}]},  # OpenRouter
        {"reasoning_details": [{"type": "reasoning.summary", "summary": "think"}]},
        {"reasoning_content": "think"},  # Kimi, DeepSeek
        {"reasoning": "think"},  # vLLM, Ollama
    ],
)
async def test_reasoning_fields(gw: GatewayHarness, delta: dict[str, Any]) -> None:
    gw.backend.script([chunk(delta), *text_chunks(["ok"]), finish(), DONE])
    events = await sse_events(gw.url, {"model": "m", "input": "hi"})
    reasoning = [e["delta"] for e in events if e["type"] == "response.reasoning_text.delta"]
    assert reasoning == ["think"]


async def test_no_usage_chunk_gives_an_estimate(gw: GatewayHarness) -> None:
    gw.backend.script([*text_chunks(["x" * 40]), finish(), DONE])
    events = await sse_events(gw.url, {"model": "m", "input": "hello " * 20})
    usage_ = events[-1]["response"]["usage"]
    assert usage_["output_tokens"] == 10  # 40 characters, 4 a token
    assert usage_["input_tokens"] >= 120 // 4
    assert usage_["total_tokens"] == usage_["input_tokens"] + usage_["output_tokens"]


# -- timeouts by phase ------------------------------------------------------------------


async def test_first_byte_timeout_covers_a_long_prompt_read() -> None:
    """The head comes at once, then nothing while the backend reads the prompt: longer than
    the idle timeout, within the first-byte timeout, so the answer still comes."""
    async with GatewayHarness(idle_timeout=0.1, first_byte_timeout=60.0) as gw:
        gw.backend.script([Sleep(0.5), *text_chunks(["ok"]), finish(), DONE])
        events = await sse_events(gw.url, {"model": "m", "input": "hi"})
    assert events[-1]["type"] == "response.completed"


async def test_idle_timeout_applies_once_bytes_came() -> None:
    """llama.cpp after SIGTERM: it streamed, then went silent; the idle timeout ends it."""
    async with GatewayHarness(idle_timeout=0.2, first_byte_timeout=60.0) as gw:
        gw.backend.script([*text_chunks(["partial"]), HANG])
        events = await sse_events(gw.url, {"model": "m", "input": "hi"})
    assert events[-1]["type"] == "response.failed"
    error = events[-1]["response"]["error"]
    assert "0.2 s" in error["message"]
