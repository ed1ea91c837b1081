"""Stored responses through the official SDK, against the memory store and a real Redis.

Every test here runs three times: with the default in-memory store, with `--store
sqlite:…` in the test's folder, and with `--store redis://…` pointed at a redis-server this
module starts on a free port. The
store-outage tests at the end point the gateway at a Redis port where nothing listens.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
import redis.asyncio as aioredis
from builders import TOOLS
from harness import GatewayHarness
from openai import AsyncOpenAI
from redis_server import RedisServer, redis_marks, requires_redis
from redis_server import redis_server as redis_server  # the module-scoped fixture
from scripted_backend import (
    DONE,
    HANG,
    DelayHeaders,
    Gate,
    Sleep,
    finish,
    refusing_url,
    text_chunks,
    tool_call_chunks,
    usage,
)
from sdk_models import validate_event, validate_response

from streamer.store import MemoryStore, open_store
from streamer.store.sqlite_store import SqliteStore
from streamer.turns.gateway import SHUT_DOWN

END = [finish("stop"), usage(5, 2), DONE]
ERROR_KEYS = {"message", "type", "param", "code"}
TERMINAL = {"response.completed", "response.failed", "response.incomplete"}


def text(*parts: str) -> list[Any]:
    return [*text_chunks(list(parts)), *END]


def search_call(call_id: str = "call_1", *, pause: float = 0.0) -> list[Any]:
    chunks = tool_call_chunks(0, call_id, ["mcp__docs__search"], ['{"q":', '"x"}'])
    if pause:
        chunks = [step for c in chunks for step in (c, Sleep(pause))]
    return [*chunks, finish("tool_calls"), usage(5, 2), DONE]


@pytest.fixture(params=["memory", "sqlite", pytest.param("redis", marks=redis_marks)])
async def gw(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[GatewayHarness]:
    """The gateway with each store; Redis starts every test from an empty database.
    `@pytest.mark.gateway(**settings)` adds settings."""
    marker = request.node.get_closest_marker("gateway")
    overrides = dict(marker.kwargs) if marker else {}
    spec = "memory" if request.param == "memory" else f"sqlite:{tmp_path / 'store.db'}"
    if request.param == "redis":
        server = request.getfixturevalue("redis_server")
        spec = server.url
        async with aioredis.Redis.from_url(spec) as r:
            await r.flushdb()
    async with GatewayHarness(store=spec, **overrides) as harness:
        yield harness


async def stored_keys(gw: GatewayHarness) -> int:
    """How much the store holds of responses: records in memory, keys in Redis (the state
    key and the readiness probe are the store's own)."""
    store = gw.gateway.store
    if isinstance(store, MemoryStore):
        return len(store)
    if isinstance(store, SqliteStore):
        return store._db._scalar("SELECT count(*) FROM records")
    async with aioredis.Redis.from_url(str(gw.settings.store)) as r:
        own = (b"streamer:secret:", b"streamer:probe:")
        return len([k for k in await r.keys() if not k.startswith(own)])


async def wait_status(
    client: AsyncOpenAI, response_id: str, wanted: set[str], timeout: float = 10.0
) -> list[str]:
    """Poll retrieve until the status is one of `wanted`; return every status seen."""
    seen: list[str] = []
    async with asyncio.timeout(timeout):
        while True:
            status = (await client.responses.retrieve(response_id)).status
            assert status is not None
            if not seen or seen[-1] != status:
                seen.append(status)
            if status in wanted:
                return seen
            await asyncio.sleep(0.02)


def assert_error(
    exc: openai.APIStatusError, status: int, code: str | None = None
) -> dict[str, Any]:
    assert exc.status_code == status
    body = exc.body
    assert isinstance(body, dict) and set(body) == ERROR_KEYS, body
    if code is not None:
        assert body["code"] == code
    return body


# -- retrieve, delete, input_items --------------------------------------------------------


async def test_retrieve_then_delete(gw: GatewayHarness, client: AsyncOpenAI) -> None:
    gw.backend.script(search_call())
    created = await client.responses.create(model="m", input="find x", tools=TOOLS)
    got = await client.responses.retrieve(created.id)
    assert got.to_dict() == created.to_dict()
    validate_response(got.to_dict())
    (call,) = got.output
    assert (call.type, call.namespace, call.name) == ("function_call", "mcp__docs", "search")

    raw = await client.responses.with_raw_response.delete(created.id)
    assert raw.http_response.json() == {"id": created.id, "object": "response", "deleted": True}
    with pytest.raises(openai.NotFoundError) as raised:
        await client.responses.retrieve(created.id)
    assert_error(raised.value, 404)
    with pytest.raises(openai.NotFoundError):
        await client.responses.delete(created.id)
    assert await stored_keys(gw) == 0


async def test_streamed_response_is_stored_as_streamed(
    gw: GatewayHarness, client: AsyncOpenAI
) -> None:
    gw.backend.script(text("Hel", "lo"))
    events = [e async for e in await client.responses.create(model="m", input="hi", stream=True)]
    final = events[-1]
    assert final.type == "response.completed"
    got = await client.responses.retrieve(final.response.id)
    assert got.to_dict() == final.response.to_dict()
    assert got.output_text == "Hello"


async def test_input_items_pages(gw: GatewayHarness, client: AsyncOpenAI) -> None:
    gw.backend.script(text("ok"))
    sent = [{"role": "user", "content": f"message {i}"} for i in range(5)]
    created = await client.responses.create(model="m", input=sent)  # type: ignore[arg-type]

    page = await client.responses.input_items.list(created.id)  # default: desc, 20
    texts = [item.content[0].text for item in page.data]  # type: ignore[union-attr]
    assert texts == [f"message {i}" for i in reversed(range(5))]
    assert page.has_more is False
    ids = [item.id for item in page.data]
    assert all(ids) and len(set(ids)) == 5
    raw = page.to_dict()
    assert (raw["object"], raw["first_id"], raw["last_id"]) == ("list", ids[0], ids[-1])

    asc = list(reversed(ids))
    first = await client.responses.input_items.list(created.id, limit=2, order="asc")
    assert [i.id for i in first.data] == asc[:2] and first.has_more is True
    second = await client.responses.input_items.list(
        created.id, limit=2, order="asc", after=first.data[-1].id
    )
    assert [i.id for i in second.data] == asc[2:4] and second.has_more is True
    last = await client.responses.input_items.list(created.id, limit=2, order="asc", after=asc[3])
    assert [i.id for i in last.data] == asc[4:] and last.has_more is False
    desc_after = await client.responses.input_items.list(created.id, limit=2, after=ids[1])
    assert [i.id for i in desc_after.data] == ids[2:4]
    # The SDK's auto-pagination walks every page with `after`.
    walked = [item.id async for item in client.responses.input_items.list(created.id, limit=2)]
    assert walked == ids

    with pytest.raises(openai.BadRequestError) as raised:
        await client.responses.input_items.list(created.id, limit=0)
    assert assert_error(raised.value, 400)["param"] == "limit"


# -- previous_response_id and store:false --------------------------------------------------


async def test_previous_response_chain_keeps_flat_names(
    gw: GatewayHarness, client: AsyncOpenAI
) -> None:
    gw.backend.script(search_call(), text("found it"), text("bye"))
    first = await client.responses.create(model="m", input="find x", tools=TOOLS)
    (call,) = first.output
    assert (call.type, call.namespace, call.name) == ("function_call", "mcp__docs", "search")

    second = await client.responses.create(
        model="m",
        tools=TOOLS,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "result"}],
    )
    assert second.output_text == "found it" and second.previous_response_id == first.id
    third = await client.responses.create(
        model="m", tools=TOOLS, previous_response_id=second.id, input="thanks"
    )
    assert third.output_text == "bye"

    backend_calls = [
        {"id": "call_1", "type": "function",
         "function": {"name": "mcp__docs__search", "arguments": '{"q":"x"}'}}
    ]  # fmt: skip
    turn2, turn3 = gw.backend.requests[1], gw.backend.requests[2]
    for sent in (turn2, turn3):
        assert [t["function"]["name"] for t in sent["tools"]] == [
            "mcp__docs__search",
            "exec_command",
        ]
    m2 = turn2["messages"]
    assert [m["role"] for m in m2] == ["user", "assistant", "tool"]
    assert m2[1]["tool_calls"] == backend_calls
    assert m2[2]["tool_call_id"] == "call_1" and "result" in m2[2]["content"]
    m3 = turn3["messages"]
    assert [m["role"] for m in m3] == ["user", "assistant", "tool", "assistant", "user"]
    assert m3[:3] == m2
    assert "found it" in m3[3]["content"] and "thanks" in str(m3[4]["content"])

    # The third response's stored input is the whole history, in public shape.
    items = [i.to_dict() async for i in client.responses.input_items.list(third.id, order="asc")]
    assert [i["type"] for i in items] == [
        "message", "function_call", "function_call_output", "message", "message"
    ]  # fmt: skip
    assert (items[1]["namespace"], items[1]["name"]) == ("mcp__docs", "search")


async def test_store_false_keeps_nothing(gw: GatewayHarness, client: AsyncOpenAI) -> None:
    gw.backend.script(search_call(), search_call())
    plain = await client.responses.create(model="m", input="hi", tools=TOOLS, store=False)
    assert plain.store is False
    events = [
        e
        async for e in await client.responses.create(
            model="m", input="hi", tools=TOOLS, store=False, stream=True
        )
    ]
    assert events[-1].type == "response.completed"
    assert await stored_keys(gw) == 0
    for response_id in (plain.id, events[-1].response.id):
        with pytest.raises(openai.NotFoundError):
            await client.responses.retrieve(response_id)
    with pytest.raises(openai.BadRequestError) as raised:
        await client.responses.create(model="m", input="more", previous_response_id=plain.id)
    assert assert_error(raised.value, 400, "previous_response_not_found")["param"] == (
        "previous_response_id"
    )


async def test_unknown_or_deleted_previous_response(
    gw: GatewayHarness, client: AsyncOpenAI
) -> None:
    gw.backend.script(text("ok"))
    kept = await client.responses.create(model="m", input="hi")
    await client.responses.delete(kept.id)
    for previous in ("resp_unknown", kept.id):
        for stream in (False, True):
            with pytest.raises(openai.BadRequestError) as raised:
                await client.responses.create(
                    model="m", input="again", previous_response_id=previous, stream=stream
                )
            body = assert_error(raised.value, 400, "previous_response_not_found")
            assert body["param"] == "previous_response_id" and previous in body["message"]
    assert len(gw.backend.requests) == 1  # the backend never saw the rejected turns


async def test_unknown_ids_are_404(gw: GatewayHarness, client: AsyncOpenAI) -> None:
    calls = [
        client.responses.retrieve("resp_nope"),
        client.responses.retrieve("resp_nope", stream=True, starting_after=3),
        client.responses.delete("resp_nope"),
        client.responses.input_items.list("resp_nope"),
        client.responses.cancel("resp_nope"),
    ]
    for call in calls:
        with pytest.raises(openai.NotFoundError) as raised:
            await call
        assert "resp_nope" in assert_error(raised.value, 404)["message"]


# -- background mode ----------------------------------------------------------------------


async def test_background_moves_queued_in_progress_completed(
    gw: GatewayHarness, client: AsyncOpenAI
) -> None:
    gw.backend.script(
        [
            DelayHeaders(0.4),
            *text_chunks(["Hel"]),
            Sleep(0.4),
            *text_chunks(["lo"], role=False),
            *END,
        ]
    )
    created = await client.responses.create(model="m", input="hi", background=True)
    assert (created.status, created.background) == ("queued", True)
    seen = await wait_status(client, created.id, {"completed", "failed", "cancelled"})
    assert seen == ["queued", "in_progress", "completed"]
    final = await client.responses.retrieve(created.id)
    assert final.output_text == "Hello"
    validate_response(final.to_dict())


async def test_background_requires_store(gw: GatewayHarness, client: AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        await client.responses.create(model="m", input="hi", background=True, store=False)
    assert assert_error(raised.value, 400)["param"] == "background"
    assert gw.backend.requests == []


async def test_background_stream_then_resume_live(gw: GatewayHarness, client: AsyncOpenAI) -> None:
    gw.backend.script(search_call(pause=0.15))
    stream = await client.responses.create(
        model="m", input="hi", tools=TOOLS, background=True, stream=True
    )
    head = []
    async for event in stream:
        head.append(event)
        if event.type == "response.output_item.added":
            break
    await stream.close()  # the client goes away; the turn goes on
    assert [e.type for e in head[:3]] == [
        "response.queued",
        "response.created",
        "response.in_progress",
    ]
    response_id = head[0].response.id
    after = head[-1].sequence_number
    assert [e.sequence_number for e in head] == list(range(after + 1))

    resumed = await client.responses.retrieve(response_id, stream=True, starting_after=after)
    tail = [event async for event in resumed]
    for event in tail:
        validate_event(event.to_dict())
    assert [e.sequence_number for e in tail] == list(range(after + 1, after + 1 + len(tail)))
    terminal = [e for e in tail if e.type in TERMINAL]
    assert [e.type for e in terminal] == ["response.completed"] and tail[-1] is terminal[0]
    done = [e.item for e in tail if e.type == "response.output_item.done"]
    assert [(i.namespace, i.name) for i in done] == [("mcp__docs", "search")]  # type: ignore[union-attr]
    assert gw.backend.disconnects == 0  # leaving the first stream did not stop the turn

    # Once over, the whole log replays from any point, ending at the terminal event.
    again = [
        e async for e in await client.responses.retrieve(response_id, stream=True, starting_after=1)
    ]
    assert [e.sequence_number for e in again] == list(range(2, after + 1 + len(tail)))
    assert again[-1].to_dict() == tail[-1].to_dict()


async def test_cancel_background_stops_the_backend(gw: GatewayHarness, client: AsyncOpenAI) -> None:
    gw.backend.script([*text_chunks(["partial"]), HANG])
    created = await client.responses.create(model="m", input="hi", background=True)
    await wait_status(client, created.id, {"in_progress"})
    cancelled = await client.responses.cancel(created.id)
    assert cancelled.status == "cancelled"
    await gw.backend.records[-1].wait_disconnect(timeout=5)
    assert (await client.responses.retrieve(created.id)).status == "cancelled"
    assert (await client.responses.cancel(created.id)).status == "cancelled"  # idempotent
    log = [e async for e in await client.responses.retrieve(created.id, stream=True)]
    assert log[-1].type == "response.failed" and log[-1].response.status == "cancelled"
    assert sum(1 for e in log if e.type in ("response.completed", "response.failed")) == 1

    gw.backend.script(text("ok"))
    foreground = await client.responses.create(model="m", input="hi")
    with pytest.raises(openai.BadRequestError):
        await client.responses.cancel(foreground.id)


async def test_cancel_while_queued(gw: GatewayHarness, client: AsyncOpenAI) -> None:
    gw.backend.script([DelayHeaders(30), *text("never")])
    created = await client.responses.create(model="m", input="hi", background=True)
    cancelled = await client.responses.cancel(created.id)
    assert cancelled.status == "cancelled"
    await gw.backend.records[-1].wait_disconnect(timeout=5)


async def test_delete_running_background_cancels_it(
    gw: GatewayHarness, client: AsyncOpenAI
) -> None:
    gw.backend.script([*text_chunks(["partial"]), HANG])
    created = await client.responses.create(model="m", input="hi", background=True)
    await wait_status(client, created.id, {"in_progress"})
    turn = gw.gateway.background.tasks[created.id]
    await client.responses.delete(created.id)
    await gw.backend.records[-1].wait_disconnect(timeout=5)
    # Once the turn's task is over, whatever it wrote is written: it must not have written
    # its record back.
    done, _ = await asyncio.wait([turn], timeout=10)
    assert done == {turn}
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(created.id)


@pytest.mark.gateway(shutdown_grace=0.2)
async def test_shutdown_ends_running_background_turns(
    gw: GatewayHarness, client: AsyncOpenAI
) -> None:
    """Past --shutdown-grace, a background turn still running ends failed, logged and stored."""
    gw.backend.script([*text_chunks(["partial"]), HANG])
    created = await client.responses.create(model="m", input="hi", background=True)
    await wait_status(client, created.id, {"in_progress"})
    memory = gw.gateway.store if isinstance(gw.gateway.store, MemoryStore) else None
    assert gw.runner is not None
    await gw.runner.cleanup()  # the gateway stops (the backend stays up)
    gw.runner = None
    await gw.backend.records[-1].wait_disconnect(timeout=5)
    store = memory or open_store(str(gw.settings.store))  # what another instance would see
    try:
        response = await store.get_response(created.id)
        assert response is not None and response["status"] == "failed"
        assert response["error"]["message"] == SHUT_DOWN
        logged = [(seq, orjson.loads(data)) async for seq, data in store.events(created.id)]
        assert [seq for seq, _ in logged] == list(range(len(logged)))
        assert logged[-1][1]["type"] == "response.failed"  # followers are not left hanging
    finally:
        if memory is None:
            await store.close()


# -- a store that is down -----------------------------------------------------------------


@pytest.fixture
async def dead_store_gw() -> AsyncIterator[GatewayHarness]:
    """A gateway whose Redis is a port that refuses connections."""
    port = refusing_url().split(":")[2].split("/")[0]
    async with GatewayHarness(store=f"redis://127.0.0.1:{port}/0") as harness:
        yield harness


async def test_store_outage_spares_traffic_that_needs_no_store(
    dead_store_gw: GatewayHarness,
) -> None:
    gw = dead_store_gw
    async with AsyncOpenAI(base_url=gw.url, api_key="k", max_retries=0) as client:
        async with asyncio.timeout(20):
            gw.backend.script(text("one"), text("two"), text("three"))
            events = [
                e
                async for e in await client.responses.create(
                    model="m", input="hi", store=False, stream=True
                )
            ]
            assert events[-1].type == "response.completed"
            assert events[-1].response.output_text == "one"
            # store:true could not be kept: refused before the backend is asked, as are
            # the requests that read the store
            some_id = events[-1].response.id
            needs_store = [
                client.responses.create(model="m", input="hi"),
                client.responses.create(model="m", input="hi", stream=True),
                client.responses.create(model="m", input="x", previous_response_id=some_id),
                client.responses.create(model="m", input="x", background=True),
                client.responses.retrieve(some_id),
                client.responses.input_items.list(some_id),
                client.responses.cancel(some_id),
                client.responses.delete(some_id),
            ]
            for call in needs_store:
                with pytest.raises(openai.InternalServerError) as raised:
                    await call
                body = assert_error(raised.value, 503, "store_unavailable")
                assert body["type"] == "server_error"
    assert len(gw.backend.requests) == 1


@requires_redis
async def test_store_dying_mid_turn_releases_backend_and_followers() -> None:
    # The turn waits 1 s for the store to come back (--background-store-wait), then gives up.
    async with (
        RedisServer() as server,
        GatewayHarness(store=server.url, background_store_wait=1.0) as gw,
    ):
        # "b" comes only once the store is down: a timed pause here used to let "b" be
        # logged before a slow stop under CPU load, and then nothing ever noticed the outage
        store_down = asyncio.Event()
        script = [*text_chunks(["a"]), Gate(store_down), *text_chunks(["b"], role=False), HANG]
        gw.backend.script(script)
        async with AsyncOpenAI(base_url=gw.url, api_key="k", max_retries=0) as client:
            created = await client.responses.create(model="m", input="hi", background=True)
            await wait_status(client, created.id, {"in_progress"})
            follower = await client.responses.retrieve(created.id, stream=True)
            # the follower is replaying the log before the store goes (its head alone says
            # nothing: the replay may not have read the log yet)
            stream = aiter(follower)
            first = await anext(stream)
            await asyncio.to_thread(server.stop)
            store_down.set()
            async with asyncio.timeout(15):
                events = [first, *[event async for event in stream]]  # ends with an `error`
                # The turn could not log its next events: it stopped the backend request.
                await gw.backend.records[-1].wait_disconnect(timeout=10)
        assert events[0].type == "response.queued"
        last = validate_event(events[-1].to_dict())
        assert (last.type, last.code) == ("error", "store_unavailable")
        assert [e.sequence_number for e in events] == list(range(len(events)))


@requires_redis
async def test_a_response_the_store_failed_to_keep_says_store_false() -> None:
    # Issue 27 row 6: a store blip at a turn's end answered 200 and silently kept nothing.
    # Now the Response's own `store` field says false (JSON body and the terminal event),
    # it is counted, and while the store stays down the next store:true turn is a 503
    # before any byte; once it answers again, turns are stored again.
    async with RedisServer() as server, GatewayHarness(store=server.url,
                                                       readyz_cache_seconds=0) as gw:  # fmt: skip
        gone = asyncio.Event()
        gw.backend.script(
            [*text_chunks(["kept? "]), Gate(gone), *text(" no")],
            [*text_chunks(["kept? "]), Gate(gone), *text(" no")],
            text("after"),
        )
        async with AsyncOpenAI(base_url=gw.url, api_key="k", max_retries=0) as client:
            json_turn = asyncio.create_task(client.responses.create(model="m", input="hi"))
            stream = await client.responses.create(model="m", input="hi", stream=True)
            events = aiter(stream)
            assert (await anext(events)).type == "response.created"
            async with asyncio.timeout(10):  # both turns wait at the gate
                before = len(text_chunks(["kept? "]))
                while sum(r.steps_written >= before for r in gw.backend.records) < 2:
                    await asyncio.sleep(0.01)  # polling a real condition
            await asyncio.to_thread(server.stop)
            gone.set()
            answered = await json_turn
            assert answered.status == "completed" and answered.store is False
            last = [event async for event in events][-1]
            assert last.type == "response.completed" and last.response.store is False
            validate_response(last.response.to_dict())

            with pytest.raises(openai.InternalServerError) as raised:
                await client.responses.create(model="m", input="again")
            assert_error(raised.value, 503, "store_unavailable")
            assert len(gw.backend.requests) == 2  # refused before the backend was asked

            await asyncio.to_thread(server.restart)
            kept = await client.responses.create(model="m", input="again")
            assert kept.store is True
            assert (await client.responses.retrieve(kept.id)).output_text == "after"
        metrics = gw.gateway.metrics.render().decode()
        assert "streamer_responses_not_stored_total 2.0" in metrics


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_store_max_bytes_bounds_the_local_stores(kind: str, tmp_path: Path) -> None:
    spec = "memory" if kind == "memory" else f"sqlite:{tmp_path / 'bound.db'}"
    async with (
        GatewayHarness(store=spec, store_max_bytes=60_000) as gw,
        AsyncOpenAI(base_url=gw.url, api_key="k", max_retries=0) as client,
    ):
        made = [await client.responses.create(model="m", input="x" * 4000) for _ in range(30)]
        with pytest.raises(openai.NotFoundError):  # the oldest went to make room
            await client.responses.retrieve(made[0].id)
        assert (await client.responses.retrieve(made[-1].id)).id == made[-1].id
        store = gw.gateway.store
        held = store.bytes_used if isinstance(store, MemoryStore) else store._db.bytes
        assert held <= 60_000
