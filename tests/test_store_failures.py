"""A Redis that is less than perfect, through the whole gateway and the official SDK
(issue 27 rows 3 and 4): one that evicts under memory pressure, one that refuses writes
when full. Every answer is either whole or a clear error."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import pytest
import redis.asyncio as aioredis
from harness import GatewayHarness
from openai import AsyncOpenAI
from redis_server import RedisServer, redis_marks

pytestmark = redis_marks

RECORDS = 600
PAD = "x" * 3000  # each record holds about 3.5 KB of input


async def fill_to(server: RedisServer, spare: int, policy: str) -> None:
    """Set maxmemory to what the server uses now plus `spare` bytes (less, if negative:
    full at once), under `policy`."""
    async with aioredis.Redis.from_url(server.url) as r:
        used = int((await r.info("memory"))["used_memory"])
        await r.config_set("maxmemory-policy", policy)
        await r.config_set("maxmemory", str(max(1, used + spare)))


async def in_batches(calls: list[Any], size: int = 16) -> list[Any]:
    out: list[Any] = []
    for start in range(0, len(calls), size):
        out += await asyncio.gather(*calls[start : start + size], return_exceptions=True)
    return out


@pytest.fixture
async def evicting() -> AsyncIterator[tuple[RedisServer, GatewayHarness, AsyncOpenAI]]:
    async with (
        RedisServer() as server,
        GatewayHarness(store=server.url) as gw,
        AsyncOpenAI(base_url=gw.url, api_key="k", max_retries=0) as client,
    ):
        yield server, gw, client


async def test_records_evicted_under_allkeys_lru_are_whole_or_absent(
    evicting: tuple[RedisServer, GatewayHarness, AsyncOpenAI],
) -> None:
    # Row 3: 55 of 600 records lost their history but kept the response; continuing
    # from them answered 200 with the earlier input silently dropped.
    server, gw, client = evicting
    await fill_to(server, 3 * 1024 * 1024, "allkeys-lru")  # room for about half of them
    made = await in_batches(
        [client.responses.create(model="m", input=f"{i}: {PAD}") for i in range(RECORDS)]
    )
    ids = [response.id for response in made]  # every turn was answered

    async def go_on(i: int, response_id: str) -> str:
        try:
            await client.responses.create(
                model="m", input=f"more {i}", previous_response_id=response_id
            )
        except openai.BadRequestError as exc:
            assert exc.code == "previous_response_not_found"
            return "missing"
        sent = next(r.body for r in gw.backend.records if r.body["messages"][-1]["content"] == f"more {i}")  # fmt: skip
        earlier = [m["content"] for m in sent["messages"] if m["role"] == "user"]
        return "whole" if earlier[0] == f"{i}: {PAD}" else "partial"

    async def listed(response_id: str) -> str:
        try:
            page = await client.responses.input_items.list(response_id)
        except openai.NotFoundError:
            return "missing"
        return "whole" if len(page.data) == 1 else "partial"

    outcomes = await in_batches([go_on(i, rid) for i, rid in enumerate(ids)])
    pages = await in_batches([listed(rid) for rid in ids])
    async with aioredis.Redis.from_url(server.url) as r:
        evicted = int((await r.info("stats"))["evicted_keys"])
    replayed_partial = outcomes.count("partial")
    print(f"\n{RECORDS} records, {evicted} keys evicted, continuations: "
          f"{outcomes.count('whole')} whole, {outcomes.count('missing')} missing, "
          f"{replayed_partial} replayed partially")  # fmt: skip
    assert evicted > 0 and outcomes.count("missing") > 0  # eviction did hit records
    assert replayed_partial == 0
    assert pages.count("partial") == 0
    assert set(outcomes) <= {"whole", "missing"}, outcomes


async def test_a_full_noeviction_redis_is_not_ready_and_store_true_is_refused() -> None:
    # Row 4: /readyz stayed ready while writes failed; 435 answered 200 and never stored.
    async with (
        RedisServer() as server,
        GatewayHarness(store=server.url, readyz_cache_seconds=0) as gw,
        AsyncOpenAI(base_url=gw.url, api_key="k", max_retries=0) as client,
        aiohttp.ClientSession() as http,
    ):
        kept = await client.responses.create(model="m", input="before")
        origin = gw.url.removesuffix("/v1")
        async with http.get(f"{origin}/readyz") as reply:
            assert reply.status == 200
        await fill_to(server, -200_000, "noeviction")  # full: every write refused from now

        async with http.get(f"{origin}/readyz") as reply:
            assert reply.status == 503
            assert (await reply.json())["store"] is False
        for call in (
            client.responses.create(model="m", input="x"),
            client.responses.create(model="m", input="x", background=True),
            client.responses.create(model="m", input="x", previous_response_id=kept.id),
        ):
            with pytest.raises(openai.InternalServerError) as raised:
                await call
            assert raised.value.code == "store_unavailable"
        unstored = await client.responses.create(model="m", input="x", store=False)
        assert unstored.status == "completed"
        assert (await client.responses.retrieve(kept.id)).id == kept.id  # reads go on
        assert len(gw.backend.requests) == 2  # the refused turns never reached it


async def test_the_redis_settings_that_lose_records_are_warned_of_at_startup(
    caplog: pytest.LogCaptureFixture,
) -> None:
    evicts_all = ("--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru")
    async with RedisServer(extra_args=evicts_all) as server, GatewayHarness(store=server.url):
        warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("maxmemory-policy allkeys-lru" in w and "noeviction" in w for w in warned)
    assert any("keeps nothing on disk" in w for w in warned)
    caplog.clear()
    kept = ("--maxmemory-policy", "volatile-lru", "--appendonly", "yes")
    async with RedisServer(extra_args=kept) as server, GatewayHarness(store=server.url):
        assert not [r for r in caplog.records if r.name == "streamer.store"]
