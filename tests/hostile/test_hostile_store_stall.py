"""Issue 13, row 8: the response store stalls or goes away while a background turn runs.

Before the fix a store that stopped answering for a few seconds (`DEBUG SLEEP 5`) left the
background response `in_progress` until its TTL, and a follower's stream
(`GET /v1/responses/{id}?stream=true`) ended with no terminal event. Now the turn waits
for the store (`--background-store-wait`), then either completes and is stored, or ends
`failed` with `store_unavailable` once the store answers again; a follower always ends
with a terminal event or an `error` event.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson
import pytest
from harness import GatewayHarness
from raw_backend import RawBackend, RawConnection, chunked, http_response, sse_data, sse_head
from redis_server import RedisServer, requires_redis
from scripted_backend import finish, text_chunks, usage
from test_faults import parse_sse

from streamer.store import MemoryStore, StoreUnavailable

TERMINAL = {"response.completed", "response.failed", "response.incomplete", "error"}
FINAL = {"completed", "failed", "incomplete", "cancelled"}


class HeldBackend:
    """A backend that streams "a", then "b" once `release` is set, then the end once
    `finish` is set."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.finish = asyncio.Event()
        self.gone = asyncio.Event()  # the gateway closed the request before its end

    async def __call__(self, conn: RawConnection) -> None:
        while (request := await conn.request()) is not None:
            if "/models" in request.line:
                await conn.send(http_response(orjson.dumps({"object": "list", "data": []})))
                continue
            await conn.send(sse_head() + sse_data(text_chunks(["a"])[0]))
            await self._hold(conn, self.release)
            await conn.send(sse_data(text_chunks(["b"], role=False)[0]))
            await self._hold(conn, self.finish)
            for part in (finish("stop"), usage(3, 2)):
                await conn.send(sse_data(part))
            await conn.send(sse_data(b"[DONE]") + chunked(b""))

    async def _hold(self, conn: RawConnection, until: asyncio.Event) -> None:
        """Hold until `until` is set, noticing meanwhile if the gateway hangs up."""
        hangup = asyncio.ensure_future(conn.reader.read(1))
        release = asyncio.ensure_future(until.wait())
        await asyncio.wait({hangup, release}, return_when=asyncio.FIRST_COMPLETED)
        release.cancel()
        if hangup.done():
            self.gone.set()
            raise ConnectionResetError("the gateway closed the request")
        hangup.cancel()
        await asyncio.wait({hangup})  # the reader is free again for the next request


async def status_of(http: aiohttp.ClientSession, url: str) -> str | None:
    """The stored status, or None while the store cannot answer (503)."""
    async with http.get(url) as reply:
        if reply.status == 503:
            return None
        assert reply.status == 200, await reply.text()
        return str((await reply.json())["status"])


async def wait_status(
    http: aiohttp.ClientSession, url: str, wanted: set[str], timeout: float = 15.0
) -> str:
    """Poll the stored response until its status is one of `wanted` (a bounded loop)."""
    async with asyncio.timeout(timeout):
        while (status := await status_of(http, url)) not in wanted:
            await asyncio.sleep(0.05)
    assert status is not None
    return status


async def follow(http: aiohttp.ClientSession, url: str) -> asyncio.Task[list[dict[str, Any]]]:
    """Start following (once this returns the gateway is streaming); the task reads it all."""
    reply = await http.get(url, params={"stream": "true"})
    assert reply.status == 200, await reply.text()

    async def read() -> list[dict[str, Any]]:
        async with reply:
            return parse_sse(await reply.read())

    return asyncio.create_task(read())


async def start_turn(http: aiohttp.ClientSession, gw: GatewayHarness) -> str:
    body = {"model": "m", "input": "hi", "background": True}
    async with http.post(gw.url + "/responses", json=body) as reply:
        assert reply.status == 200, await reply.text()
        response_id = str((await reply.json())["id"])
    await wait_status(http, f"{gw.url}/responses/{response_id}", {"in_progress"})
    return response_id


def check_follower(events: list[dict[str, Any]]) -> dict[str, Any]:
    """A follower's stream ends with a terminal or `error` event, sequence unbroken."""
    assert events, "the follower got nothing"
    assert events[-1]["type"] in TERMINAL, [e["type"] for e in events]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events[-1]


def store_failure(response: dict[str, Any]) -> bool:
    """Whether a failed response says the store failed: codes clients do not know are sent
    as `server_error`, the gateway's own code in `type` (OutputItemStreamer.fail)."""
    error = response["error"]
    return "store_unavailable" in (error["code"], error.get("type"))


def debug_sleep(port: int, seconds: int) -> socket.socket:
    """Send `DEBUG SLEEP` on a raw socket (the reply comes once Redis wakes up)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=seconds + 10)
    sock.sendall(b"DEBUG SLEEP %d\r\n" % seconds)
    return sock


@pytest.mark.redis
@requires_redis
@pytest.mark.parametrize(
    ("stall", "timeouts"),
    [
        (2, {"store_timeout": 0.3, "background_store_wait": 10.0}),
        pytest.param(5, {}, marks=pytest.mark.slow, id="issue-5s-defaults"),
    ],
)
async def test_redis_stall_mid_turn_ends_the_response(
    stall: int, timeouts: dict[str, float]
) -> None:
    """DEBUG SLEEP while the turn writes its last events: it still ends, stored and followed."""
    held = HeldBackend()
    async with (
        RedisServer(extra_args=("--enable-debug-command", "local")) as server,
        RawBackend(held) as backend,
        GatewayHarness(upstream=backend.url, store=server.url, **timeouts) as gw,
        aiohttp.ClientSession() as http,
        asyncio.timeout(40),
    ):
        response_id = await start_turn(http, gw)
        url = f"{gw.url}/responses/{response_id}"
        follower = await follow(http, url)
        sleeper = debug_sleep(server.port, stall)
        held.release.set()  # the rest of the answer arrives while Redis sleeps
        held.finish.set()
        with sleeper:
            assert (await asyncio.to_thread(sleeper.recv, 16)).startswith(b"+OK")
        status = await wait_status(http, url, FINAL)
        last = check_follower(await follower)
    print(f"\nredis stall {stall} s: stored {status}, follower ended with {last['type']}")
    assert status in ("completed", "failed"), status
    if last["type"] == "error":  # the store failed under the follower itself
        assert last["code"] == "store_unavailable"
    elif status == "failed":
        assert store_failure(last["response"])
    else:
        assert last["type"] == "response.completed"
        assert last["response"]["output"][0]["content"][0]["text"] == "ab"


class FlakyStore(MemoryStore):
    """A memory store that raises StoreUnavailable for every operation while `down`."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        for name in ("put", "get", "get_response", "append_event", "end_events"):
            setattr(self, name, self._guarded(getattr(self, name)))

    def _guarded(self, method: Callable[..., Any]) -> Callable[..., Any]:
        async def call(*args: Any, **kwargs: Any) -> Any:
            if self.down:
                raise StoreUnavailable("store down (test)")
            return await method(*args, **kwargs)

        return call


async def test_store_gone_past_the_wait_ends_failed_when_it_returns() -> None:
    """A store out longer than --background-store-wait: the backend is released, and the
    response ends `failed` (store_unavailable) once the store answers again."""
    held = HeldBackend()
    store = FlakyStore()
    async with (
        RawBackend(held) as backend,
        GatewayHarness(upstream=backend.url, background_store_wait=0.5) as gw,
        aiohttp.ClientSession() as http,
        asyncio.timeout(30),
    ):
        gw.gateway.store = store  # the same store the gateway's routes and turns use
        gw.gateway.background.store = store
        response_id = await start_turn(http, gw)
        url = f"{gw.url}/responses/{response_id}"
        follower = await follow(http, url)
        store.down = True
        held.release.set()
        await held.gone.wait()  # the turn gave up waiting and stopped the backend
        store.down = False
        status = await wait_status(http, url, FINAL)
        last = check_follower(await follower)
    assert status == "failed"
    assert last["type"] == "response.failed"
    assert store_failure(last["response"])
