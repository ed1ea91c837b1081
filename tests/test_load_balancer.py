"""Gateways behind a real load balancer: haproxy (tests/haproxy.py), real processes.

- A rolling restart of 3 instances under load loses nothing (issue 27 row 12: 176 of 178
  answers were ok, as the listener closed the moment SIGTERM came): with `--drain-seconds`
  a SIGTERM first makes `/readyz` fail while the listener still serves, so haproxy's
  health checks move the traffic away before the instance stops taking connections.
- A proxy with a short idle timeout (`timeout server`) does not cut a quiet stream or a
  background follower (issue 27 row 11): `--sse-keepalive` sends SSE comments on both.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from builders import GatewayProcess, gateway_process
from haproxy import HAProxy, requires_haproxy
from redis_server import free_port
from scripted_backend import DONE, ScriptedBackend, Sleep, finish, text_chunks, usage

pytestmark = requires_haproxy

BOUND = 60  # seconds any one step may take on a loaded machine (a bound, not a claim)
CLIENTS = 8  # concurrent clients of the rolling restart, each with kept-alive connections


def answer(body: Any) -> list[Any]:
    """A short streamed answer with pauses, so that turns are in flight at every moment."""
    return [*text_chunks(["Hel"]), Sleep(0.05), *text_chunks(["lo"], role=False), Sleep(0.05),
            finish("stop"), usage(3, 2), DONE]  # fmt: skip


class Load:
    """`CLIENTS` clients posting turns through the balancer until stopped: what each got."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.outcomes: Counter[str] = Counter()
        self.stopping = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self.tasks = [asyncio.create_task(self._client(i)) for i in range(CLIENTS)]

    async def _client(self, index: int) -> None:
        async with aiohttp.ClientSession() as http:  # a pool of kept-alive connections
            while not self.stopping.is_set():
                self.outcomes[await self._turn(http, stream=index % 2 == 0)] += 1

    async def _turn(self, http: aiohttp.ClientSession, *, stream: bool) -> str:
        body = {"model": "m", "input": "hi", "stream": stream, "store": False}
        try:
            async with http.post(f"{self.url}/responses", json=body) as reply:
                raw = await reply.read()
                if reply.status != 200:
                    return f"status {reply.status}"
        except aiohttp.ClientError as exc:
            return type(exc).__name__
        if stream:
            last = raw.rstrip().rsplit(b"\n", 1)[-1]
            ok = last.startswith(b"data: ") and b'"response.completed"' in last
        else:
            ok = orjson.loads(raw).get("status") == "completed"
        return "ok" if ok else "incomplete"

    async def until(self, count: int) -> None:
        async with asyncio.timeout(BOUND):
            while self.outcomes["ok"] < count:
                await asyncio.sleep(0.01)

    async def stop(self) -> Counter[str]:
        self.stopping.set()
        await asyncio.gather(*self.tasks)
        return self.outcomes


@contextlib.asynccontextmanager
async def instance(
    tmp_path: Path, name: str, port: int, backend: ScriptedBackend, *more: str
) -> AsyncIterator[GatewayProcess]:
    args = ("--upstream", backend.base_url, "--port", str(port), "--profile-probe", "off",
            "--shutdown-grace", "20", *more)  # fmt: skip
    async with gateway_process(tmp_path / f"{name}.log", *args) as gw:
        yield gw


async def test_a_rolling_restart_under_load_loses_nothing(tmp_path: Path) -> None:
    ports = [free_port() for _ in range(3)]
    drain = ("--drain-seconds", "1")  # ten of haproxy's checks: it sees /readyz fail first
    async with ScriptedBackend(responder=answer) as backend, contextlib.AsyncExitStack() as stack:
        gateways = [
            await stack.enter_async_context(instance(tmp_path, f"g{i}", p, backend, *drain))
            for i, p in enumerate(ports)
        ]
        lb = await stack.enter_async_context(HAProxy(ports))
        for i in range(3):
            await lb.until(f"s{i}", "UP")
        load = Load(lb.url)
        load.start()
        await load.until(20)
        for i, port in enumerate(ports):
            served = load.outcomes["ok"]
            gateways[i].process.send_signal(signal.SIGTERM)
            await lb.until(f"s{i}", "DOWN")  # /readyz fails while it still serves
            assert await gateways[i].wait(BOUND) == 0, gateways[i].log()
            new = instance(tmp_path, f"g{i}-again", port, backend, *drain)
            gateways[i] = await stack.enter_async_context(new)
            await lb.until(f"s{i}", "UP")
            await load.until(served + 20)  # traffic flows through all three again
        outcomes = await load.stop()
    assert set(outcomes) == {"ok"}, outcomes
    print(f"rolling restart of 3 instances under load: {dict(outcomes)}")


def quiet(body: Any) -> list[Any]:
    """An answer with a stretch of silence longer than the proxy's idle timeout."""
    return [*text_chunks(["thinking"]), Sleep(QUIET), *text_chunks([" done"], role=False),
            finish("stop"), usage(3, 2), DONE]  # fmt: skip


QUIET = 3.0  # seconds the backend says nothing, past haproxy's `timeout server 2s`


@pytest.mark.parametrize("fast_http", ["true", "false"])
async def test_quiet_streams_and_followers_outlast_a_proxy_idle_timeout(
    tmp_path: Path, fast_http: str
) -> None:
    keepalive = ("--sse-keepalive", "0.5", "--fast-http", fast_http)
    async with ScriptedBackend(responder=quiet) as backend, contextlib.AsyncExitStack() as stack:
        gw = await stack.enter_async_context(
            instance(tmp_path, "g", free_port(), backend, *keepalive)
        )
        lb = await stack.enter_async_context(HAProxy([gw.port], server_timeout="2s"))
        await lb.until("s0", "UP")
        async with aiohttp.ClientSession() as http, asyncio.timeout(BOUND):
            body = {"model": "m", "input": "hi", "stream": True}
            streamed, background = await asyncio.gather(
                _read(http, "POST", f"{lb.url}/responses", body),
                _followed(http, lb.url),
            )
    for raw in (streamed, background):
        assert b": keepalive\n\n" in raw  # what kept the proxy from cutting it
        events = [orjson.loads(line[6:]) for line in raw.split(b"\n") if line.startswith(b"data: ")]
        assert events[-1]["type"] == "response.completed", events[-1]
        assert events[-1]["response"]["output"][0]["content"][0]["text"] == "thinking done"


async def _read(http: aiohttp.ClientSession, method: str, url: str, body: Any = None) -> bytes:
    async with http.request(method, url, json=body) as reply:
        assert reply.status == 200, await reply.text()
        return await reply.read()  # a stream the proxy cut raises ClientPayloadError


async def _followed(http: aiohttp.ClientSession, url: str) -> bytes:
    """A background turn created, then followed from its start, through the proxy."""
    body = {"model": "m", "input": "hi", "background": True}
    async with http.post(f"{url}/responses", json=body) as reply:
        rid = (await reply.json())["id"]
    return await _read(http, "GET", f"{url}/responses/{rid}?stream=true")
