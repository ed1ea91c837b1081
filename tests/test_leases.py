"""Background turns whose instance dies (issue 27 row 1), on real processes killed with SIGKILL.

The instance running a background turn holds a lease on it in the store and renews it
(streamer/frontends/leases.py). Killed, it stops renewing: once the lease lapses the turn
ends `failed`, saying the instance stopped, ended by whoever sees it first. Each way is
tried here: followers on another instance (each gets the terminal event), a poller (GET),
the interval sweep of the instance left (no request at all, read in Redis itself), the
startup sweep of an instance restarted on a SQLite file, and a killed `--workers` worker.
Before, followers stayed open and silent, pollers read `in_progress` for the store's TTL,
and a restart recovered nothing.

`--background-lease 1` keeps these short: the lease lapses a second after the kill.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import aiohttp
import orjson
import pytest
import redis.asyncio as aioredis
from builders import GatewayProcess, gateway_process
from redis_server import RedisServer, redis_marks
from scripted_backend import HANG, ScriptedBackend, text_chunks
from test_gateway_run import HeldStream
from test_pipeline_first_batch import ListUpstream

from streamer.config import Settings
from streamer.core.deltas import TextDelta
from streamer.frontends.background import Background
from streamer.frontends.leases import LAPSED, Leases
from streamer.store import MemoryStore, StoreUnavailable
from streamer.turns.gateway import Gateway
from streamer.turns.registry import Backend, UpstreamRegistry
from streamer.worker import WORKER_HEADER

BOUND = 30  # seconds any one step may take on a loaded machine (a bound, not a claim)
LEASE = ("--background-lease", "1")
BODY = {"model": "m", "input": "hi", "background": True}
TRIES = 200  # connections opened at most to land on a given worker


def hanging_backend() -> ScriptedBackend:
    backend = ScriptedBackend()
    backend.responder = lambda body: [*text_chunks(["part"]), HANG]  # streams, then waits
    return backend


async def events_of(reply: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
    async for line in reply.content:
        if line.startswith(b"data: "):
            yield orjson.loads(line[6:])


class Follower:
    """`GET /v1/responses/{id}?stream=true` read in a task: its events, and when the
    terminal one came (monotonic)."""

    def __init__(self, reply: aiohttp.ClientResponse) -> None:
        self.reply = reply
        self.events: list[dict[str, Any]] = []
        self.delta = asyncio.Event()  # a text delta came: the runner is streaming
        self.ended_at = 0.0
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            async for event in events_of(self.reply):
                self.events.append(event)
                if event["type"] == "response.output_text.delta":
                    self.delta.set()
        except aiohttp.ClientPayloadError:  # cut: its instance was killed
            self.events.append({"type": "(cut)"})
        self.ended_at = time.monotonic()

    async def end(self) -> dict[str, Any]:
        """The last event, once the stream ended (BOUND: a failure)."""
        async with asyncio.timeout(BOUND):
            await self.task
        return self.events[-1]


async def follow(http: aiohttp.ClientSession, gw: GatewayProcess, rid: str) -> Follower:
    reply = await http.get(f"{gw.url}/responses/{rid}?stream=true")
    assert reply.status == 200
    return Follower(reply)


async def streaming(follower: Follower) -> None:
    async with asyncio.timeout(BOUND):
        await follower.delta.wait()


def check_lapsed(response: dict[str, Any]) -> None:
    assert response["status"] == "failed", response
    assert response["error"]["code"] == "server_error"
    assert response["error"]["message"] == LAPSED


async def start(http: aiohttp.ClientSession, gw: GatewayProcess) -> str:
    async with http.post(f"{gw.url}/responses", json=BODY) as reply:
        assert reply.status == 200, await reply.text()
        return str((await reply.json())["id"])


async def kill(gw: GatewayProcess) -> float:
    gw.process.send_signal(signal.SIGKILL)
    await gw.process.wait()
    return time.monotonic()


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[tuple[GatewayProcess, GatewayProcess, str]]:
    async with RedisServer() as redis, hanging_backend() as backend:
        args = ("--upstream", backend.base_url, "--store", redis.url, *LEASE)
        async with contextlib.AsyncExitStack() as stack:
            a, b = await asyncio.gather(
                stack.enter_async_context(gateway_process(tmp_path / "a.log", *args)),
                stack.enter_async_context(gateway_process(tmp_path / "b.log", *args)),
            )
            yield a, b, redis.url


@pytest.mark.redis
@redis_marks[1]
async def test_followers_and_pollers_elsewhere_see_a_killed_instance_s_turn_fail(
    pair: tuple[GatewayProcess, GatewayProcess, str],
) -> None:
    a, b, _ = pair
    async with aiohttp.ClientSession() as http:
        rid = await start(http, a)
        followers = [await follow(http, b, rid) for _ in range(2)]
        for follower in followers:
            await streaming(follower)
        killed = await kill(a)
        ends = [await follower.end() for follower in followers]
        async with http.get(f"{b.url}/responses/{rid}") as reply:
            polled = await reply.json()
    for end, follower in zip(ends, followers, strict=True):
        assert end["type"] == "response.failed"
        check_lapsed(end["response"])
        seqs = [e["sequence_number"] for e in follower.events]
        assert seqs == list(range(len(seqs)))  # the whole log, then its end: no gap
        print(f"kill -9 to response.failed at a follower: {follower.ended_at - killed:.2f} s")
    check_lapsed(polled)
    assert "ended failed: nobody renewed its lease" in b.log()


@pytest.mark.redis
@redis_marks[1]
async def test_a_poll_alone_ends_the_turn(pair: tuple[GatewayProcess, GatewayProcess, str]) -> None:
    a, b, _ = pair
    async with aiohttp.ClientSession() as http:
        rid = await start(http, a)
        on_a = await follow(http, a, rid)
        await streaming(on_a)
        await kill(a)
        await on_a.end()  # cut
        on_a.reply.release()
        async with asyncio.timeout(BOUND):
            while True:
                async with http.get(f"{b.url}/responses/{rid}") as reply:
                    response = await reply.json()
                if response["status"] != "in_progress":
                    break
                await asyncio.sleep(0.05)
        check_lapsed(response)
        follower = await follow(http, b, rid)  # a late follower: the log, then the end
        last = await follower.end()
    assert last["type"] == "response.failed"
    check_lapsed(last["response"])


@pytest.mark.redis
@redis_marks[1]
async def test_the_sweep_of_the_instance_left_ends_the_turn_unasked(
    pair: tuple[GatewayProcess, GatewayProcess, str],
) -> None:
    a, _, url = pair
    async with aiohttp.ClientSession() as http:
        rid = await start(http, a)
        on_a = await follow(http, a, rid)
        await streaming(on_a)
        await kill(a)
        await on_a.end()  # cut
        on_a.reply.release()
    redis = aioredis.from_url(url)
    try:  # nobody asks B anything: what ends it is B's sweep, read in Redis itself
        async with asyncio.timeout(BOUND):
            while True:
                stored = await redis.hget(f"streamer:rec:{{{rid}}}", "r")
                response = orjson.loads(stored)
                if response["status"] != "in_progress":
                    break
                await asyncio.sleep(0.05)
        logged = await redis.xrange(f"streamer:events:{{{rid}}}")
    finally:
        await redis.aclose()
    check_lapsed(response)
    terminal = orjson.loads([fields for _, fields in logged if b"d" in fields][-1][b"d"])
    assert terminal["type"] == "response.failed"
    check_lapsed(terminal["response"])


async def test_a_restart_on_the_same_sqlite_file_ends_the_turn_at_startup(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    args = ("--store", f"sqlite:{path}", *LEASE)
    async with hanging_backend() as backend, aiohttp.ClientSession() as http:
        upstream = ("--upstream", backend.base_url)
        async with gateway_process(tmp_path / "a.log", *upstream, *args) as a:
            rid = await start(http, a)
            on_a = await follow(http, a, rid)
            await streaming(on_a)
            await kill(a)
            await on_a.end()  # cut
            on_a.reply.release()
        async with gateway_process(tmp_path / "b.log", *upstream, *args) as b:
            async with asyncio.timeout(BOUND):  # no request: the startup sweep ends it
                while (response := _sqlite_response(path, rid))["status"] == "in_progress":
                    await asyncio.sleep(0.05)
            check_lapsed(response)
            follower = await follow(http, b, rid)
            last = await follower.end()
    assert last["type"] == "response.failed"
    check_lapsed(last["response"])


def _sqlite_response(path: Path, rid: str) -> dict[str, Any]:
    with contextlib.closing(sqlite3.connect(path)) as db:
        row = db.execute("SELECT response FROM records WHERE id = ?", (rid,)).fetchone()
    return dict(orjson.loads(row[0]))


@pytest.mark.redis
@redis_marks[1]
async def test_a_killed_worker_s_turn_fails_at_a_follower_on_the_other(tmp_path: Path) -> None:
    async with RedisServer() as redis, hanging_backend() as backend:
        args = ("--upstream", backend.base_url, "--store", redis.url, "--workers", "2", *LEASE)
        async with (
            gateway_process(tmp_path / "gw.log", *args) as gw,
            aiohttp.ClientSession() as http,
        ):
            async with http.post(f"{gw.url}/responses", json=BODY) as reply:
                rid, runner = (await reply.json())["id"], reply.headers[WORKER_HEADER]
            follower, session = await _follow_on_another(gw, rid, runner)
            await streaming(follower)
            pid = await _pid_of(gw, runner)
            os.kill(pid, signal.SIGKILL)
            killed = time.monotonic()
            last = await follower.end()
            follower.reply.release()
            await session.close()
    assert last["type"] == "response.failed"
    check_lapsed(last["response"])
    print(
        f"kill -9 of a worker to response.failed at a follower: {follower.ended_at - killed:.2f} s"
    )


async def _follow_on_another(
    gw: GatewayProcess, rid: str, runner: str
) -> tuple[Follower, aiohttp.ClientSession]:
    """A follower whose connection a worker other than `runner` serves, and its session."""
    for _ in range(TRIES):
        http = aiohttp.ClientSession()  # a fresh connection each time
        reply = await http.get(f"{gw.url}/responses/{rid}?stream=true")
        if reply.headers[WORKER_HEADER] != runner:
            return Follower(reply), http
        reply.close()
        await http.close()
    raise AssertionError(f"no connection reached a worker other than {runner}")


async def _pid_of(gw: GatewayProcess, index: str) -> int:
    for _ in range(TRIES):
        async with aiohttp.ClientSession() as http, http.get(gw.origin + "/healthz") as reply:
            worker = (await reply.json())["worker"]
        if str(worker["index"]) == index:
            return int(worker["pid"])
    raise AssertionError(f"no connection reached worker {index}")


# -- in one process: a runner that was only stalled ------------------------------------------


class StalledFor(MemoryStore):
    """A store that fails one holder's lease renewals while `stalled` (its runner's store,
    or its event loop, stalled longer than the lease), and takes everybody else's."""

    def __init__(self) -> None:
        super().__init__()
        self.stalled: str | None = None

    async def hold_lease(self, response_id: str, holder: str, seconds: float) -> bool:
        if holder == self.stalled:
            raise StoreUnavailable("stalled")
        return await super().hold_lease(response_id, holder, seconds)


async def test_a_runner_that_lost_its_lease_stops_without_writing_over_the_end() -> None:
    store = StalledFor()
    stream = HeldStream([[TextDelta("a")]], ready=False, end_with_last=False)
    background = Background(store, store_wait=0.0, lease=0.3)
    gw = Gateway(Settings(), UpstreamRegistry(cast(Backend, ListUpstream(stream))), store,
                 background)  # fmt: skip
    turn = await gw.prepare({"model": "m", "input": "hi", "background": True}, client="")
    rid = turn.response["id"]
    await gw.start_background(turn)
    task = background.tasks[rid]
    async with asyncio.timeout(BOUND):
        while (await store.last_seq(rid) or 0) < 3:  # streaming: created, in_progress, …
            await asyncio.sleep(0.01)
        store.stalled = background.leases.holder
        while await store.lease_alive(rid):  # its renewals fail: the lease lapses
            await asyncio.sleep(0.01)
    other = Leases(store, 0.3, 60.0)  # another instance, seeing it lapsed
    assert await other.end_if_lapsed(rid) is True
    assert await other.end_if_lapsed(rid) is False  # ended once
    ended = await store.last_seq(rid)
    store.stalled = None  # the runner's store answers again: the lease is somebody else's
    async with asyncio.timeout(BOUND):
        await asyncio.wait({task})
    assert stream.closed  # its backend request was let go
    record = await store.get(rid)
    assert record is not None
    check_lapsed(record.response)  # not written over by the runner
    assert ended is None and await store.last_seq(rid) is None
    logged = [orjson.loads(data) async for _, data in store.events(rid)]
    assert [e["type"] for e in logged].count("response.failed") == 1
    check_lapsed(logged[-1]["response"])
    await background.close()
