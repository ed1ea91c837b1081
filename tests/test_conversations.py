"""The Conversations API on the gateway's store (memory and a real Redis), through the official
SDK: conversations and their items, and `conversation` on responses.create (its items first,
the turn's input and output appended)."""

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
from scripted_backend import DONE, finish, text_chunks, usage

END = [finish("stop"), usage(3, 2), DONE]


@pytest.fixture(params=["memory", pytest.param("redis", marks=redis_marks)])
async def gw(request: pytest.FixtureRequest) -> AsyncIterator[GatewayHarness]:
    spec = "memory"
    if request.param == "redis":
        spec = request.getfixturevalue("redis_server").url
        async with aioredis.Redis.from_url(spec) as r:
            await r.flushdb()
    async with GatewayHarness(store=spec, api_keys=("key-a", "key-b"), max_input_items=6) as h:
        yield h


@pytest.fixture
async def client(gw: GatewayHarness) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(base_url=gw.url, api_key="key-a", max_retries=0) as c:
        yield c


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}


async def test_conversation_objects(gw: GatewayHarness, client: AsyncOpenAI) -> None:
    created = await client.conversations.create(metadata={"topic": "demo"}, items=[user("hi")])  # type: ignore[list-item]
    assert created.id.startswith("conv_") and created.object == "conversation"
    assert created.metadata == {"topic": "demo"}
    assert (await client.conversations.retrieve(created.id)).to_dict() == created.to_dict()
    updated = await client.conversations.update(created.id, metadata={"topic": "other"})
    assert updated.metadata == {"topic": "other"}
    assert (await client.conversations.retrieve(created.id)).metadata == {"topic": "other"}
    with pytest.raises(openai.NotFoundError):  # a conversation is not a response
        await client.responses.retrieve(created.id)
    async with AsyncOpenAI(base_url=gw.url, api_key="key-b", max_retries=0) as other:
        with pytest.raises(openai.NotFoundError):  # another client's
            await other.conversations.retrieve(created.id)
        with pytest.raises(openai.NotFoundError):
            await other.conversations.delete(created.id)
    deleted = await client.conversations.delete(created.id)
    assert (deleted.id, deleted.deleted, deleted.object) == (
        created.id,
        True,
        "conversation.deleted",
    )
    with pytest.raises(openai.NotFoundError) as raised:
        await client.conversations.retrieve(created.id)
    assert raised.value.body["param"] == "conversation_id"  # type: ignore[index]


async def test_conversation_items(client: AsyncOpenAI) -> None:
    conversation = await client.conversations.create(items=[user("one")])  # type: ignore[list-item]
    added = await client.conversations.items.create(
        conversation.id,
        items=[user("two"), {"role": "assistant", "content": "three"}],  # type: ignore[list-item]
    )
    assert [i.type for i in added.data] == ["message", "message"]
    assert all(i.id for i in added.data)  # type: ignore[union-attr]
    page = await client.conversations.items.list(conversation.id, order="asc")
    texts = [i.content[0].text for i in page.data]  # type: ignore[union-attr]
    assert texts == ["one", "two", "three"] and page.has_more is False
    newest = await client.conversations.items.list(conversation.id, limit=1)  # desc by default
    assert newest.data[0].content[0].text == "three" and newest.has_more  # type: ignore[union-attr]
    first_id = page.data[0].id  # type: ignore[union-attr]
    item = await client.conversations.items.retrieve(first_id, conversation_id=conversation.id)
    assert item.content[0].text == "one"  # type: ignore[union-attr]
    after = await client.conversations.items.delete(first_id, conversation_id=conversation.id)
    assert after.id == conversation.id
    left = await client.conversations.items.list(conversation.id, order="asc")
    assert len(left.data) == 2
    with pytest.raises(openai.NotFoundError) as raised:
        await client.conversations.items.retrieve(first_id, conversation_id=conversation.id)
    assert raised.value.body["param"] == "item_id"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as bad:  # validated as input items
        await client.conversations.items.create(
            conversation.id, items=[{"role": "robot", "content": "x"}]
        )  # type: ignore[list-item]
    assert bad.value.body["param"] == "items[0].role"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as full:  # at most --max-input-items (6 here)
        await client.conversations.items.create(conversation.id, items=[user("x")] * 5)  # type: ignore[list-item]
    assert full.value.body["param"] == "items"  # type: ignore[index]


async def test_responses_on_a_conversation(gw: GatewayHarness, client: AsyncOpenAI) -> None:
    conversation = await client.conversations.create(items=[user("My name is Ada.")])  # type: ignore[list-item]
    gw.backend.script([*text_chunks(["Hello Ada."]), *END])
    first = await client.responses.create(
        model="m", input="Hi!", conversation=conversation.id, store=False
    )
    assert first.conversation is not None and first.conversation.id == conversation.id
    assert [m["content"] for m in gw.backend.requests[-1]["messages"]] == ["My name is Ada.", "Hi!"]
    gw.backend.script([*text_chunks(["Ada."]), *END])
    async with client.responses.stream(
        model="m", input="My name?", conversation={"id": conversation.id}
    ) as stream:
        async for _ in stream:
            pass
        second = await stream.get_final_response()
    assert second.output_text == "Ada."
    assert [m["content"] for m in gw.backend.requests[-1]["messages"]] == [
        "My name is Ada.", "Hi!", "Hello Ada.", "My name?",
    ]  # fmt: skip
    items = await client.conversations.items.list(conversation.id, order="asc")
    assert [(i.type, i.role) for i in items.data] == [  # type: ignore[union-attr]
        ("message", "user"), ("message", "user"), ("message", "assistant"),
        ("message", "user"), ("message", "assistant"),
    ]  # fmt: skip
    assert items.data[2].id == first.output[0].id  # the output items keep their ids

    with pytest.raises(openai.BadRequestError) as raised:  # 5 items + 2 new > 6
        await client.responses.create(
            model="m", input=[user("a"), user("b")], conversation=conversation.id
        )
    assert raised.value.body["param"] == "input"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError) as missing:
        await client.responses.create(model="m", input="x", conversation="conv_nope")
    assert missing.value.body["param"] == "conversation"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as both:
        await client.responses.create(
            model="m", input="x", conversation=conversation.id, previous_response_id=second.id
        )
    assert both.value.body["param"] == "previous_response_id"  # type: ignore[index]
    assert len(gw.backend.requests) == 2


async def test_the_agents_sdk_conversations_session(
    gw: GatewayHarness, client: AsyncOpenAI
) -> None:
    """`OpenAIConversationsSession` (openai-agents) keeps a chat's history on the gateway."""
    agents = pytest.importorskip("agents")
    from agents.memory import OpenAIConversationsSession

    agents.set_tracing_disabled(True)
    model = agents.OpenAIResponsesModel(model="m", openai_client=client)
    agent = agents.Agent(name="helper", instructions="Be brief.", model=model)
    session = OpenAIConversationsSession(openai_client=client)
    gw.backend.script([*text_chunks(["Hello Ada."]), *END], [*text_chunks(["Ada."]), *END])
    first = await agents.Runner.run(agent, "My name is Ada.", session=session)
    assert first.final_output == "Hello Ada."
    second = await agents.Runner.run(agent, "What is my name?", session=session)
    assert second.final_output == "Ada."
    contents = [m["content"] for m in gw.backend.requests[-1]["messages"]]
    assert contents == ["Be brief.", "My name is Ada.", "Hello Ada.", "What is my name?"]
    items = await session.get_items()
    assert [i.get("role") for i in items] == ["user", "assistant", "user", "assistant"]
    popped = await session.pop_item()
    assert popped is not None and len(await session.get_items()) == 3
    await session.clear_session()
