"""One suite for both response stores: the memory store and the Redis store on a real server."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
import redis.asyncio as aioredis
from builders import ManualClock
from redis_server import RedisServer, free_port, redis_marks, requires_redis
from redis_server import redis_server as redis_server  # the module-scoped fixture
from redis_topologies import redis_cluster as redis_cluster  # module-scoped fixtures
from redis_topologies import redis_sentinel as redis_sentinel
from redis_topologies import requires_cluster_tools

from streamer.store import (
    IncompleteRecord,
    MemoryStore,
    ResponseStore,
    StoredResponse,
    StoreUnavailable,
    open_store,
    with_item_ids,
)

pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")


class Stores:
    """Opens store "instances" that share one backend: new RedisStore objects on the same
    server and prefix (as two gateway processes would), or the one in-process store (memory,
    SQLite) per options."""

    def __init__(self, kind: str, url: str | None) -> None:
        self.kind = kind
        self.url = url
        self.prefix = f"test-{uuid.uuid4().hex[:8]}:"
        self.opened: list[Any] = []
        self._local: dict[tuple[tuple[str, Any], ...], Any] = {}

    def open(self, **options: Any) -> Any:
        if self.kind in ("memory", "sqlite"):
            key = tuple(sorted(options.items()))
            if key not in self._local:
                spec = (
                    "memory" if self.kind == "memory" else f"sqlite:{self.url}-{len(self.opened)}"
                )
                self._local[key] = open_store(spec, **options)
                self.opened.append(self._local[key])
            return self._local[key]
        store = open_store(self.url, key_prefix=self.prefix, **options)
        self.opened.append(store)
        return store


KINDS = [
    "memory",
    "sqlite",
    pytest.param("redis", marks=redis_marks),
    pytest.param("cluster", marks=[pytest.mark.redis, requires_cluster_tools]),
    pytest.param("sentinel", marks=redis_marks),
]
SERVERS = {"redis": "redis_server", "cluster": "redis_cluster", "sentinel": "redis_sentinel"}


@pytest.fixture(params=KINDS)
async def stores(request: pytest.FixtureRequest, tmp_path: Any) -> AsyncIterator[Stores]:
    if request.param in SERVERS:
        url = request.getfixturevalue(SERVERS[request.param]).url
    else:
        url = str(tmp_path / "store.db")
    stores = Stores(request.param, url)
    yield stores
    for store in stores.opened:
        await store.close()


@pytest.fixture
def store(stores: Stores) -> Any:
    return stores.open()


def event(seq: int, kind: str = "response.output_text.delta", **extra: Any) -> bytes:
    return orjson.dumps({"type": kind, "sequence_number": seq, **extra})


def completed(seq: int) -> bytes:
    return event(seq, "response.completed", response={"id": "x", "status": "completed"})


def record(response_id: str, items: list[dict[str, Any]] | None = None, **response: Any) -> Any:
    body = {"id": response_id, "object": "response", "status": "completed", "output": []}
    return StoredResponse({**body, **response}, items or [])


async def collect(events: AsyncIterator[tuple[int, bytes]], timeout: float = 10.0) -> list[int]:
    async with asyncio.timeout(timeout):
        return [seq async for seq, _ in events]


def new_id() -> str:
    return f"resp_{uuid.uuid4().hex}"


async def until_following(store: Any, count: int = 1) -> None:
    """Return once `count` followers wait for live events, as the store itself shows it.

    A new follower task on the memory store runs to its first real wait (the log's wake-up)
    within one turn of the loop; on SQLite it first reads the log in the store's thread,
    then counts itself as waiting. On Redis it waits in a blocking XREAD, which CLIENT LIST
    (of every node of a Cluster) shows as `cmd=xread` with the `b` (blocked) flag.
    """
    if isinstance(store, MemoryStore):
        await asyncio.sleep(0)  # one loop turn, not a length of time
        return
    async with asyncio.timeout(10):
        while True:
            if hasattr(store, "_waiting"):
                blocked = store._waiting
            else:
                blocked = sum(1 for c in await _clients(store) if _blocked_in_xread(c))
            if blocked >= count:
                return
            await asyncio.sleep(0.005)  # polling a real condition


async def _clients(store: Any) -> list[dict[str, Any]]:
    if store.target.kind == "cluster":
        every = await store._r.client_list(target_nodes="all")
        return [c for node in every.values() for c in node] if isinstance(every, dict) else every
    return list(await store._r.client_list())


def _blocked_in_xread(client: dict[str, Any]) -> bool:
    return client.get("cmd") == "xread" and "b" in client.get("flags", "")


async def until_listening(store: Any) -> None:
    """Return once the store listens for cancels: on Redis, its subscription is counted
    (on a Cluster, by the node it subscribed at: summed over them all)."""
    if not hasattr(store, "_channel"):
        await asyncio.sleep(0)  # one loop turn: the waiter task reaches its Event
        return
    async with asyncio.timeout(10):
        while await _subscribers(store) < 1:
            await asyncio.sleep(0.005)  # polling a real condition


async def _subscribers(store: Any) -> int:
    if store.target.kind == "cluster":
        every = await store._r.pubsub_numsub(store._channel, target_nodes="all")
        if isinstance(every, dict):
            return sum(int(n) for reply in every.values() for _, n in reply)
        return sum(int(n) for _, n in every)
    return int((await store._r.pubsub_numsub(store._channel))[0][1])


# -- records -------------------------------------------------------------------------------


async def test_both_stores_satisfy_the_protocol(store: Any) -> None:
    assert isinstance(store, ResponseStore)
    assert await store.ping() is True


async def test_put_get_roundtrip_restores_everything(store: Any) -> None:
    rid = new_id()
    call = {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "call_1",
        "name": "search",
        "namespace": "mcp__docs",
        "arguments": '{"q":"x"}',
        "status": "completed",
    }
    items = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        {"role": "user", "content": "bare message"},
        {"type": "function_call", "call_id": "c0", "name": "search", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c0", "output": "ok", "id": "kept_1"},
    ]
    original = [dict(item) for item in items]
    rec = StoredResponse({"id": rid, "object": "response", "output": [call]}, items)
    await store.put(rec)
    assert items == original  # put copies items to give them ids; the caller's stay as sent

    got = await store.get(rid)
    assert got is not None
    assert got.response == rec.response
    assert got.response["output"][0]["namespace"] == "mcp__docs"
    ids = [item["id"] for item in got.input_items]
    assert ids[0].startswith("msg_") and ids[1].startswith("msg_") and ids[2].startswith("fc_")
    assert ids[3] == "kept_1"
    assert len(set(ids)) == 4
    assert [{k: v for k, v in i.items() if k != "id"} for i in got.input_items[:3]] == original[:3]
    assert await store.get_response(rid) == rec.response


async def test_reads_are_copies(store: Any) -> None:
    rid = new_id()
    await store.put(record(rid, [{"type": "message", "id": "m1", "role": "user", "content": "a"}]))
    got = await store.get(rid)
    got.response["status"] = "mutated"
    got.input_items[0]["content"] = "mutated"
    again = await store.get(rid)
    assert again.response["status"] == "completed"
    assert again.input_items[0]["content"] == "a"


async def test_put_replaces(store: Any) -> None:
    rid = new_id()
    items = [{"type": "message", "id": f"m{i}", "role": "user", "content": "x"} for i in range(3)]
    await store.put(record(rid, items, status="queued"))
    await store.put(record(rid, items[:1], status="completed"))
    got = await store.get(rid)
    assert got.response["status"] == "completed"
    assert [item["id"] for item in got.input_items] == ["m0"]
    page = await store.input_items(rid, order="asc")
    assert [item["id"] for item in page["data"]] == ["m0"]
    assert await store.input_items(rid, after="m2") == {
        "object": "list",
        "data": [],
        "first_id": None,
        "last_id": None,
        "has_more": False,
    }


async def test_unknown_ids(store: Any) -> None:
    assert await store.get("resp_missing") is None
    assert await store.get_response("resp_missing") is None
    assert await store.input_items("resp_missing") is None
    assert await store.delete("resp_missing") is False


async def test_delete(store: Any) -> None:
    rid = new_id()
    await store.put(record(rid, [{"type": "message", "role": "user", "content": "x"}]))
    await store.append_event(rid, 0, event(0))
    assert await store.delete(rid) is True
    assert await store.get(rid) is None
    assert await store.get_response(rid) is None
    assert await store.input_items(rid) is None
    assert await collect(store.events(rid)) == []
    assert await store.delete(rid) is False


async def test_delete_ends_a_live_follower(stores: Stores) -> None:
    a, b = stores.open(), stores.open()
    rid = new_id()
    await a.put(record(rid, status="in_progress"))
    await a.append_event(rid, 0, event(0))
    follower = asyncio.create_task(collect(b.events(rid)))
    await until_following(b)
    assert await a.delete(rid) is True
    assert await follower == [0]


# -- input_items paging --------------------------------------------------------------------


def reference_page(ids: list[str], limit: int, order: str, after: str | None) -> dict[str, Any]:
    ordered = ids if order == "asc" else ids[::-1]
    if after is not None:
        ordered = ordered[ordered.index(after) + 1 :]
    data = ordered[:limit]
    return {
        "ids": data,
        "first_id": data[0] if data else None,
        "last_id": data[-1] if data else None,
        "has_more": len(ordered) > limit,
    }


async def test_input_items_pages(store: Any) -> None:
    rid = new_id()
    ids = [f"msg_{i}" for i in range(7)]
    await store.put(
        record(rid, [{"type": "message", "id": i, "role": "user", "content": i} for i in ids])
    )

    page = await store.input_items(rid)  # desc, limit 20
    assert page["object"] == "list"
    assert [item["id"] for item in page["data"]] == ids[::-1]
    assert (page["first_id"], page["last_id"], page["has_more"]) == ("msg_6", "msg_0", False)
    assert page["data"][0] == {"type": "message", "id": "msg_6", "role": "user", "content": "msg_6"}

    page = await store.input_items(rid, limit=3)
    assert [item["id"] for item in page["data"]] == ["msg_6", "msg_5", "msg_4"]
    assert page["has_more"] is True
    page = await store.input_items(rid, limit=3, after="msg_1")
    assert [item["id"] for item in page["data"]] == ["msg_0"]
    assert page["has_more"] is False
    page = await store.input_items(rid, limit=3, order="asc", after="msg_2")
    assert [item["id"] for item in page["data"]] == ["msg_3", "msg_4", "msg_5"]
    assert (page["first_id"], page["last_id"], page["has_more"]) == ("msg_3", "msg_5", True)
    page = await store.input_items(rid, order="asc", after="msg_6")
    assert page["data"] == [] and page["has_more"] is False and page["first_id"] is None
    page = await store.input_items(rid, after="msg_nope")
    assert page["data"] == [] and page["has_more"] is False

    # Every combination agrees with a naive reference.
    for order in ("asc", "desc"):
        for limit in range(1, 9):
            for after in [None, *ids]:
                page = await store.input_items(rid, limit=limit, order=order, after=after)
                want = reference_page(ids, limit, order, after)
                got = {
                    "ids": [item["id"] for item in page["data"]],
                    "first_id": page["first_id"],
                    "last_id": page["last_id"],
                    "has_more": page["has_more"],
                }
                assert got == want, (order, limit, after)


async def test_input_items_cursor_walk_visits_each_item_once(store: Any) -> None:
    rid = new_id()
    await store.put(record(rid, [{"role": "user", "content": str(i)} for i in range(11)]))
    for order, expected in (("asc", list(range(11))), ("desc", list(range(10, -1, -1)))):
        seen: list[int] = []
        after = None
        while True:
            page = await store.input_items(rid, limit=4, order=order, after=after)
            seen += [int(item["content"]) for item in page["data"]]
            if not page["has_more"]:
                break
            after = page["last_id"]
        assert seen == expected


async def test_input_items_empty(store: Any) -> None:
    rid = new_id()
    await store.put(record(rid, []))
    page = await store.input_items(rid)
    assert page == {
        "object": "list",
        "data": [],
        "first_id": None,
        "last_id": None,
        "has_more": False,
    }


# -- TTL -----------------------------------------------------------------------------------


async def test_ttl_expiry_and_refresh_by_events_in_memory() -> None:
    clock = ManualClock()
    store = MemoryStore(ttl_seconds=1.0, clock=clock)
    stale, live = new_id(), new_id()
    await store.put(record(stale, [{"role": "user", "content": "x"}]))
    await store.put(record(live, [{"role": "user", "content": "x"}]))
    assert await store.get_response(stale) is not None
    clock.advance(0.6)
    await store.append_event(live, 0, event(0))  # events keep a running response alive
    clock.advance(0.6)
    assert await store.get(stale) is None
    assert await store.get_response(stale) is None
    assert await store.input_items(stale) is None
    assert (await store.get(live)) is not None
    clock.advance(1.2)
    assert await store.get(live) is None
    assert await collect(store.events(live)) == []  # record and log both expired


@requires_redis
@pytest.mark.redis
async def test_ttl_expiry_and_refresh_by_events_in_redis(redis_server: RedisServer) -> None:
    # Redis expires keys by its own clock. Two instances with TTLs 0.3 s and 60 s share the
    # data, so each wait below is only bounded from below: a slow machine cannot break it.
    prefix = f"ttl-{uuid.uuid4().hex[:8]}:"
    short = open_store(redis_server.url, key_prefix=prefix, ttl_seconds=0.3)
    long = open_store(redis_server.url, key_prefix=prefix, ttl_seconds=60)
    try:
        stale, live = new_id(), new_id()
        await short.put(record(stale, [{"role": "user", "content": "x"}]))
        await short.put(record(live, [{"role": "user", "content": "x"}]))
        assert await short.get_response(stale) is not None
        await long.append_event(live, 0, event(0))  # events keep a running response alive
        await asyncio.sleep(0.4)  # past the short TTL: Redis's clock, not a synchronisation
        assert await short.get(stale) is None
        assert await short.get_response(stale) is None
        assert await short.input_items(stale) is None
        assert (await short.get(live)) is not None
        await short.append_event(live, 1, event(1))  # refreshed to the short TTL again
        await asyncio.sleep(0.4)
        assert await short.get(live) is None
        assert await collect(short.events(live)) == []  # record and log both expired
    finally:
        await short.close()
        await long.close()


# -- memory bounds -------------------------------------------------------------------------


async def test_memory_count_bound_evicts_oldest_written() -> None:
    store = MemoryStore(max_responses=3)
    ids = [new_id() for _ in range(5)]
    for rid in ids[:3]:
        await store.put(record(rid))
    await store.put(record(ids[0], status="rewritten"))  # now the newest
    await store.put(record(ids[3]))
    await store.put(record(ids[4]))
    assert len(store) == 3
    assert [await store.get_response(rid) is not None for rid in ids] == [
        True,
        False,
        False,
        True,
        True,
    ]


async def test_memory_byte_bound_evicts_oldest() -> None:
    blob = "x" * 10_000
    store = MemoryStore(max_bytes=35_000)
    ids = [new_id() for _ in range(6)]
    for rid in ids:
        await store.put(record(rid, [{"role": "user", "content": blob}]))
        assert store.bytes_used <= 35_000
    present = [await store.get(rid) is not None for rid in ids]
    assert present == [False, False, False, True, True, True]

    # Event logs count too: a growing log pushes older records out and keeps itself.
    for seq in range(15):
        await store.append_event(ids[5], seq, event(seq, delta=blob[:1000]))
    assert store.bytes_used <= 35_000
    assert await store.get(ids[3]) is None
    assert await store.get(ids[5]) is not None


async def test_memory_eviction_ends_followers() -> None:
    store = MemoryStore(max_responses=1)
    rid = new_id()
    await store.put(record(rid, status="in_progress"))
    await store.append_event(rid, 0, event(0))
    follower = asyncio.create_task(collect(store.events(rid)))
    await until_following(store)
    await store.put(record(new_id()))  # evicts rid
    assert await follower == [0]


async def test_memory_oversized_record_is_kept_alone() -> None:
    store = MemoryStore(max_bytes=1000)
    small, big = new_id(), new_id()
    await store.put(record(small))
    await store.put(record(big, [{"role": "user", "content": "y" * 5000}]))
    assert await store.get(big) is not None
    assert await store.get(small) is None


# -- background event streams --------------------------------------------------------------


async def test_replay_after_n_stops_at_terminal(store: Any) -> None:
    rid = new_id()
    await store.put(record(rid, status="completed", background=True))
    for seq in range(4):
        await store.append_event(rid, seq, event(seq))
    await store.append_event(rid, 4, completed(4))
    await store.append_event(rid, 5, event(5))  # after the terminal event: ignored

    assert await collect(store.events(rid)) == [0, 1, 2, 3, 4]
    assert await collect(store.events(rid, after=1)) == [2, 3, 4]
    assert await collect(store.events(rid, after=4)) == []
    assert await collect(store.events(rid, after=99)) == []
    pairs = [pair async for pair in store.events(rid, after=2)]
    assert pairs == [(3, event(3)), (4, completed(4))]


async def test_duplicate_and_out_of_order_seqs_are_ignored(store: Any) -> None:
    rid = new_id()
    await store.put(record(rid))
    await store.append_event(rid, 0, event(0, delta="first"))
    await store.append_event(rid, 0, event(0, delta="again"))
    await store.append_event(rid, 2, event(2))
    await store.append_event(rid, 1, event(1))
    await store.end_events(rid)
    got = [pair async for pair in store.events(rid)]
    assert got == [(0, event(0, delta="first")), (2, event(2))]
    with pytest.raises(ValueError):
        await store.append_event(rid, -1, event(-1))


async def test_events_of_an_unknown_response_end_at_once(store: Any) -> None:
    assert await collect(store.events("resp_never", after=-1), timeout=3) == []


async def test_follow_live_events_from_another_task(store: Any) -> None:
    rid = new_id()
    await store.put(record(rid, status="queued", background=True))
    await store.append_event(rid, 0, event(0, "response.queued"))

    async def produce() -> None:
        for seq in range(1, 8):
            await until_following(store, 3)  # every event arrives while all three wait
            await store.append_event(rid, seq, event(seq))
        await store.append_event(rid, 8, completed(8))

    followers = [asyncio.create_task(collect(store.events(rid))) for _ in range(2)]
    late = asyncio.create_task(collect(store.events(rid, after=3)))
    await produce()
    assert await followers[0] == list(range(9))
    assert await followers[1] == list(range(9))
    assert await late == [4, 5, 6, 7, 8]


async def test_follower_on_a_second_instance(stores: Stores) -> None:
    a, b = stores.open(), stores.open()
    rid = new_id()
    await a.put(record(rid, status="in_progress", background=True))
    await a.append_event(rid, 0, event(0))
    await a.append_event(rid, 1, event(1))
    follower = asyncio.create_task(collect(b.events(rid, after=0)))
    await until_following(b)
    for seq in range(2, 5):
        await a.append_event(rid, seq, event(seq))
    await a.append_event(rid, 5, event(5, "response.failed"))
    assert await follower == [1, 2, 3, 4, 5]
    got = await b.get(rid)
    assert got is not None and got.response["background"] is True


async def test_follower_before_the_first_event(stores: Stores) -> None:
    a, b = stores.open(), stores.open()
    rid = new_id()
    await a.put(record(rid, status="queued", background=True))
    follower = asyncio.create_task(collect(b.events(rid)))
    await until_following(b)
    await a.append_event(rid, 0, event(0, "response.queued"))
    await a.append_event(rid, 1, event(1, "error"))
    assert await follower == [0, 1]


async def test_end_events_stops_followers_without_terminal(stores: Stores) -> None:
    a, b = stores.open(), stores.open()
    rid = new_id()
    await a.put(record(rid, status="in_progress", background=True))
    await a.append_event(rid, 0, event(0))
    follower = asyncio.create_task(collect(b.events(rid)))
    await until_following(b)
    await a.end_events(rid)
    assert await follower == [0]
    await a.append_event(rid, 1, event(1))  # after the end: ignored
    assert await collect(b.events(rid)) == [0]


async def test_a_follower_can_stop_early(store: Any) -> None:
    rid = new_id()
    await store.put(record(rid, status="in_progress"))
    for seq in range(5):
        await store.append_event(rid, seq, event(seq))
    events = store.events(rid)
    seen = []
    async for seq, _ in events:
        seen.append(seq)
        if seq == 2:
            break
    await events.aclose()
    assert seen == [0, 1, 2]
    await store.append_event(rid, 5, completed(5))  # the store still works afterwards
    assert await collect(store.events(rid, after=3)) == [4, 5]


# -- cancellation --------------------------------------------------------------------------


async def test_cancel_wakes_a_waiter_on_another_instance(stores: Stores) -> None:
    a, b = stores.open(), stores.open()
    rid, other = new_id(), new_id()
    waiter = asyncio.create_task(b.wait_cancel(rid))
    bystander = asyncio.create_task(b.wait_cancel(other))
    await until_listening(b)
    assert not waiter.done()
    await a.request_cancel(rid)
    async with asyncio.timeout(5):
        await waiter
    for _ in range(3):  # a wrongly woken bystander would finish within these loop turns
        await asyncio.sleep(0)
    assert not bystander.done()  # a cancel for one id leaves the others waiting
    await a.request_cancel(other)  # and it was really waiting: its own cancel wakes it
    async with asyncio.timeout(5):
        await bystander


async def test_cancel_requested_before_the_waiter_is_seen(stores: Stores) -> None:
    a, b = stores.open(), stores.open()
    rid = new_id()
    await a.request_cancel(rid)
    async with asyncio.timeout(5):
        await b.wait_cancel(rid)
        await a.wait_cancel(rid)


async def test_wait_cancel_blocks_without_a_cancel(store: Any) -> None:
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.3):
            await store.wait_cancel(new_id())


async def test_delete_clears_the_cancel_flag(stores: Stores) -> None:
    store = stores.open()
    rid = new_id()
    await store.put(record(rid))
    await store.request_cancel(rid)
    await store.delete(rid)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.3):
            await store.wait_cancel(rid)


# -- outages (Redis) -----------------------------------------------------------------------


async def test_dead_redis_raises_store_unavailable_promptly() -> None:
    store = open_store(f"redis://127.0.0.1:{free_port()}/0")
    rid = new_id()
    calls = [
        lambda: store.put(record(rid)),
        lambda: store.get(rid),
        lambda: store.get_response(rid),
        lambda: store.delete(rid),
        lambda: store.input_items(rid),
        lambda: store.append_event(rid, 0, event(0)),
        lambda: collect(store.events(rid)),
        lambda: store.end_events(rid),
        lambda: store.request_cancel(rid),
        lambda: store.wait_cancel(rid),
    ]
    try:
        for call in calls:
            async with asyncio.timeout(3):
                with pytest.raises(StoreUnavailable):
                    await call()
        assert await store.ping() is False
    finally:
        await store.close()


async def test_silent_redis_times_out_instead_of_hanging() -> None:
    # Accepts connections and never answers: the case socket timeouts exist for.
    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(-1)
        writer.close()

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    store = open_store(f"redis://127.0.0.1:{port}/0", connect_timeout=0.5, op_timeout=0.5)
    try:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            await store.get(new_id())
        with pytest.raises(StoreUnavailable):
            await store.wait_cancel(new_id())
        assert time.monotonic() - started < 5
    finally:
        await store.close()
        server.close()


@requires_redis
@pytest.mark.redis
async def test_redis_record_missing_a_part_reads_as_absent_and_is_counted(
    redis_server: RedisServer,
) -> None:
    # One key holds a record whole; a hash that lost a field (not something eviction does,
    # but a foreign write may) is never served as a record with a shorter history.
    seen: list[str] = []
    store = open_store(redis_server.url, key_prefix=f"part-{uuid.uuid4().hex[:8]}:")
    store.on_incomplete = seen.append
    try:
        rid = new_id()
        await store.put(record(rid, [{"type": "message", "role": "user", "content": "x"}]))
        await store._r.hdel(store._key("rec", rid), "i")
        assert await store.get(rid) is None
        assert await store.input_items(rid) is None
        assert seen == ["record"]
    finally:
        await store.close()


@requires_redis
@pytest.mark.redis
async def test_redis_event_log_lost_while_its_record_stayed_is_not_replayed_with_a_hole(
    redis_server: RedisServer,
) -> None:
    # As an evicting server does: the stream key goes, the record stays. A writer does
    # not begin the log again from the middle, and a follower is told it is incomplete.
    seen: list[str] = []
    store = open_store(redis_server.url, key_prefix=f"log-{uuid.uuid4().hex[:8]}:",
                       block_seconds=0.2)  # fmt: skip
    store.on_incomplete = seen.append
    try:
        rid = new_id()
        await store.put(record(rid, status="in_progress", background=True))
        await store.append_event(rid, 0, event(0))
        await store._r.delete(store._key("events", rid))
        await store.append_event(rid, 1, event(1))
        assert await store._r.exists(store._key("events", rid)) == 0
        await store.put(record(rid, status="completed", background=True))
        with pytest.raises(IncompleteRecord):
            await collect(store.events(rid))
        assert seen == ["events", "events"]
    finally:
        await store.close()


@requires_redis
@pytest.mark.redis
async def test_redis_write_probe_fails_when_a_full_server_refuses_writes() -> None:
    # Issue 27 row 4: with maxmemory and noeviction, reads go on and writes are refused;
    # the probe (what /readyz asks) must say no.
    async with RedisServer(extra_args=("--maxmemory-policy", "noeviction")) as server:
        store = open_store(server.url)
        try:
            assert await store.ping() is True
            async with aioredis.Redis.from_url(server.url) as r:
                used = int((await r.info("memory"))["used_memory"])
                await r.config_set("maxmemory", str(used // 2))  # full at once
            assert await store.ping() is False
            with pytest.raises(StoreUnavailable):
                await store.put(record(new_id()))
        finally:
            await store.close()


async def test_shared_secret_is_set_once_for_every_instance(stores: Stores) -> None:
    a, b = stores.open(), stores.open()
    first = await a.shared_secret("state-key", b"a" * 44)
    assert first == b"a" * 44
    assert await b.shared_secret("state-key", b"b" * 44) == first
    assert await a.shared_secret("other", b"c" * 44) == b"c" * 44


@requires_redis
@pytest.mark.redis
async def test_redis_restart_recovers_and_keeps_cancel_waiters() -> None:
    async with RedisServer() as server:
        a, b = open_store(server.url), open_store(server.url)
        try:
            rid = new_id()
            await a.put(record(rid))
            waiter = asyncio.create_task(b.wait_cancel(rid))
            await until_listening(b)
            await asyncio.to_thread(server.stop)
            with pytest.raises(StoreUnavailable):
                await a.get(rid)
            await asyncio.to_thread(server.restart)
            # Pooled connections died with the old server; the store reconnects by itself.
            assert await a.get(rid) is None  # no persistence: the data went with it
            await a.put(record(rid))
            assert (await b.get(rid)) is not None
            await a.request_cancel(rid)  # possibly before b has resubscribed: the flag covers it
            async with asyncio.timeout(10):
                await waiter
        finally:
            await a.close()
            await b.close()


@requires_redis
@pytest.mark.redis
async def test_redis_follower_raises_when_the_server_dies() -> None:
    async with RedisServer() as server:
        store = open_store(server.url)
        try:
            rid = new_id()
            await store.put(record(rid, status="in_progress"))
            follower = asyncio.create_task(collect(store.events(rid), timeout=30))
            await until_following(store)
            await asyncio.to_thread(server.stop)
            async with asyncio.timeout(5):
                with pytest.raises(StoreUnavailable):
                    await follower
        finally:
            await store.close()


# -- open_store and helpers ----------------------------------------------------------------


async def test_open_store_specs() -> None:
    assert isinstance(open_store(None), MemoryStore)
    assert isinstance(open_store("memory", max_responses=5), MemoryStore)
    assert open_store("memory", max_responses=5).max_responses == 5
    redis_store = open_store("redis://127.0.0.1:1/0", ttl_seconds=60, key_prefix="x:")
    assert type(redis_store).__name__ == "RedisStore"
    assert isinstance(redis_store, ResponseStore)
    await redis_store.close()
    with pytest.raises(ValueError):
        open_store("postgres://nope")


def test_with_item_ids_copies_only_what_it_changes() -> None:
    has_id = {"type": "reasoning", "id": "rs_1", "summary": []}
    lacks = {"type": "custom_tool_call", "call_id": "c", "name": "n", "input": ""}
    out = with_item_ids([has_id, lacks, {"type": "item_reference", "id": "msg_9"}])
    assert out[0] is has_id
    assert "id" not in lacks and out[1]["id"].startswith("ctc_")
    assert out[2] == {"type": "item_reference", "id": "msg_9"}


async def test_cancelling_a_blocked_follower_leaves_the_store_sound(stores: Stores) -> None:
    a, b = stores.open(), stores.open()
    rid = new_id()
    await a.put(record(rid, status="in_progress"))
    for _ in range(3):  # each one blocked in its read when cancelled
        blocked = asyncio.create_task(collect(b.events(rid)))
        await until_following(b)
        blocked.cancel()
        with pytest.raises(asyncio.CancelledError):
            await blocked
    follower = asyncio.create_task(collect(b.events(rid)))
    await until_following(b)
    await a.append_event(rid, 0, event(0))
    await a.append_event(rid, 1, completed(1))
    assert await follower == [0, 1]
    assert (await b.get(rid)) is not None
