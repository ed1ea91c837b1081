"""`item_reference` input items, as the Vercel AI SDK sends them with `store: true`: earlier
assistant text, reasoning and calls replaced by `{"type": "item_reference", "id": …}`. The
gateway resolves them through the store (items of stored responses, input and output), with
the memory store and a real Redis; an unknown id is a 400 naming the reference."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
import redis.asyncio as aioredis
from harness import GatewayHarness
from openai import AsyncOpenAI
from redis_server import redis_marks
from redis_server import redis_server as redis_server  # the module-scoped fixture
from scripted_backend import (
    DONE,
    finish,
    reasoning_chunks,
    text_chunks,
    tool_call_chunks,
    usage,
)

from streamer.core.errors import RequestError
from streamer.core.item_references import referenced_ids, resolve
from streamer.store import MemoryStore, StoredResponse

END = [finish("stop"), usage(3, 2), DONE]
WEATHER = [{"type": "function", "name": "weather", "parameters": {"type": "object"}}]


@pytest.fixture(params=["memory", pytest.param("redis", marks=redis_marks)])
async def gw(request: pytest.FixtureRequest) -> AsyncIterator[GatewayHarness]:
    spec = "memory"
    if request.param == "redis":
        spec = request.getfixturevalue("redis_server").url
        async with aioredis.Redis.from_url(spec) as r:
            await r.flushdb()
    async with GatewayHarness(store=spec, api_keys=("key-a", "key-b")) as harness:
        yield harness


@pytest.fixture
async def client(gw: GatewayHarness) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(base_url=gw.url, api_key="key-a", max_retries=0) as c:
        yield c


def ref(item_id: str) -> dict[str, Any]:
    return {"type": "item_reference", "id": item_id}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


async def test_a_multi_turn_chat_keeps_the_assistant_turn(
    gw: GatewayHarness, client: AsyncOpenAI
) -> None:
    gw.backend.script([*reasoning_chunks(["ponder"]), *text_chunks(["Paris."]), *END])
    first = await client.responses.create(model="m", input=[user("Capital of France?")])
    reasoning, message = first.output
    gw.backend.script([*text_chunks(["Lyon."]), *END])
    second = await client.responses.create(
        model="m",
        instructions="Be brief.",
        input=[user("Capital of France?"), ref(reasoning.id), ref(message.id),  # type: ignore[list-item,arg-type]
               user("And the second city?")],
    )  # fmt: skip
    assert second.output_text == "Lyon."
    assert gw.backend.requests[-1]["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "Paris.", "reasoning_content": "ponder"},
        {"role": "user", "content": "And the second city?"},
    ]
    # the stored input lists the items themselves, not the references
    listed = await client.responses.input_items.list(second.id, order="asc")
    assert [item.type for item in listed.data] == ["message", "reasoning", "message", "message"]

    # a reference to an input item of a stored response resolves too
    gw.backend.script([*text_chunks(["ok"]), *END])
    await client.responses.create(model="m", input=[ref(listed.data[3].id)])  # type: ignore[list-item]
    assert gw.backend.requests[-1]["messages"][-1] == {
        "role": "user",
        "content": "And the second city?",
    }


async def test_a_step_with_text_and_a_tool_call_keeps_its_text(
    gw: GatewayHarness, client: AsyncOpenAI
) -> None:
    call = tool_call_chunks(0, "call_w", ["weather"], ['{"city":"Paris"}'])
    gw.backend.script([*text_chunks(["Let me check."]), *call, finish("tool_calls"), DONE])
    step = await client.responses.create(model="m", input=[user("Weather?")], tools=WEATHER)  # type: ignore[arg-type]
    message, function_call = step.output
    gw.backend.script([*text_chunks(["Sunny."]), *END])
    output = {"type": "function_call_output", "call_id": "call_w", "output": "sunny"}
    await client.responses.create(
        model="m",
        tools=WEATHER,  # type: ignore[arg-type]
        input=[user("Weather?"), ref(message.id), ref(function_call.id), output],  # type: ignore[list-item,arg-type]
    )
    _, assistant, tool = gw.backend.requests[-1]["messages"]
    assert assistant["content"] == "Let me check."
    assert assistant["tool_calls"][0]["function"] == {
        "name": "weather",
        "arguments": '{"city":"Paris"}',
    }
    assert tool == {"role": "tool", "tool_call_id": "call_w", "content": "sunny"}


async def test_an_unknown_reference_is_a_400_naming_it(
    gw: GatewayHarness, client: AsyncOpenAI
) -> None:
    gw.backend.script([*text_chunks(["hi"]), *END])
    first = await client.responses.create(model="m", input="hi")
    for bad, param in (
        ([user("a"), ref(first.output[0].id), ref("msg_nope")], "input[2].id"),
        ([{"id": "msg_nope"}], "input[0].id"),  # `type` is optional on a reference
        ([ref("")], "input[0].id"),
    ):
        with pytest.raises(openai.BadRequestError) as raised:
            await client.responses.create(model="m", input=bad)  # type: ignore[arg-type]
        assert raised.value.body["param"] == param, bad  # type: ignore[index]
    async with AsyncOpenAI(base_url=gw.url, api_key="key-b", max_retries=0) as other:
        with pytest.raises(openai.BadRequestError) as raised:  # another client's item
            await other.responses.create(model="m", input=[ref(first.output[0].id)])  # type: ignore[list-item]
        assert raised.value.body["code"] == "item_not_found"  # type: ignore[index]
    assert len(gw.backend.requests) == 1


async def test_references_resolve_against_a_continued_unstored_history(
    gw: GatewayHarness, client: AsyncOpenAI
) -> None:
    """Over the WebSocket, a `store: false` response is remembered by the connection only."""
    gw.backend.script([*text_chunks(["first"]), *END], [*text_chunks(["second"]), *END])
    async with client.responses.connect() as conn:
        await conn.response.create(model="m", input="one", store=False)
        first = await anext(e async for e in conn if e.type == "response.completed")
        message_id = first.response.output[0].id  # type: ignore[union-attr]
        await conn.response.create(
            model="m", input=[ref(message_id), user("two")], store=False,  # type: ignore[list-item]
            previous_response_id=first.response.id,  # type: ignore[union-attr]
        )  # fmt: skip
        done = await anext(e async for e in conn if e.type in ("response.completed", "error"))
    assert done.type == "response.completed", done
    messages = gw.backend.requests[-1]["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[1]["content"] == "first\nfirst"  # the history's, then the reference's


def test_resolution_is_pure() -> None:
    item = {"type": "message", "id": "msg_1", "role": "assistant", "content": "x"}
    value = [ref("msg_1"), {"id": "msg_1"}, user("y")]
    assert referenced_ids(value) == {"msg_1": 0}
    resolved = resolve(value, {"msg_1": item})
    assert resolved[:2] == [item, item] and resolved[0] is not item
    with pytest.raises(RequestError) as raised:
        resolve([user("a"), ref("msg_2")], {"msg_1": item})
    assert raised.value.param == "input[1].id"


async def test_the_memory_item_index_is_bounded_like_the_store() -> None:
    store = MemoryStore(max_responses=2)
    for n in range(5):
        output = [{"type": "message", "id": f"msg_{n}", "role": "assistant", "content": []}]
        response = {"id": f"resp_{n}", "output": output}
        await store.put(StoredResponse(response, [{"id": f"in_{n}", **user("q")}], "a"))
    assert await store.get_item("msg_0") is None and await store.get_item("in_2") is None
    assert (await store.get_item("msg_4", owner="a"))["id"] == "msg_4"  # type: ignore[index]
    assert await store.get_item("msg_4", owner="b") is None  # another client's
    assert len(store._items) == 4  # two records, two items each: evicted ones left with them
    await store.delete("resp_4")
    assert await store.get_item("in_4") is None and len(store._items) == 2
