"""Issue 25, row 4: background turns were unbounded.

2,000 `background: true` creates in 7.7 s on 4 connections, against a backend that takes
its time: each turn held a backend connection, and at the common 1,024 open-file limit
the gateway ran out of descriptors. Every new client connection was reset, turns failed
"Too many open files", nothing was logged. Now background turns are capped per client
and in all (`--background-max-per-client`, `--background-max-turns`), from the
open-file budget (`streamer/fd_budget.py`), which also keeps the client connections'
share away from the backend connections': a create beyond a cap is a 429 with
`retry-after`, the log says the cap filled up, and other clients are served throughout.

The gateway runs as a process with `RLIMIT_NOFILE` 1,024 (soft and hard, as
`prlimit --nofile=1024:1024`); the clients are real, on loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from builders import gateway_process
from harness import GatewayHarness
from openai import AsyncOpenAI, RateLimitError
from scripted_backend import DONE, HANG, ScriptedBackend, finish, text_chunks, usage

FLOOD_KEY = "sk-flood-0123456789abcdef0123"
CLIENT_KEY = "sk-client-0123456789abcdef012"
NOFILE = 1024
CREATES = 2000
FLOOD_CONNECTIONS = 4
CLIENTS = 4  # normal clients at once, each request on a new connection


def respond(body: Any) -> list[Any]:
    """The flood's turns take as long as the test does; the normal clients' answer "ok"."""
    if b"flood" in orjson.dumps(body.get("messages")):
        return [HANG]
    return [*text_chunks(["ok"]), finish("stop"), usage(3, 1), DONE]


async def flood(url: str) -> list[tuple[int, Mapping[str, str], Any]]:
    """`CREATES` background creates on `FLOOD_CONNECTIONS` kept-alive connections: each
    one's status, headers and body (status 0: the connection failed)."""
    connector = aiohttp.TCPConnector(limit=FLOOD_CONNECTIONS)
    headers = {"Authorization": f"Bearer {FLOOD_KEY}"}
    async with aiohttp.ClientSession(connector=connector, headers=headers) as http:

        async def create(i: int) -> tuple[int, Mapping[str, str], Any]:
            body = {"model": "m", "input": f"flood {i}", "background": True}
            try:
                async with http.post(f"{url}/responses", json=body) as resp:
                    return resp.status, resp.headers.copy(), await resp.json()
            except (aiohttp.ClientError, OSError) as exc:
                return 0, {}, repr(exc)

        return await asyncio.gather(*(create(i) for i in range(CREATES)))


async def client(url: str, done: asyncio.Event, results: list[str]) -> None:
    """A normal client (the official SDK, no retries, a new connection per request):
    requests until the flood is over, at least 25; each result is "ok" or what failed."""
    close = {"Connection": "close"}  # the gateway closes after each answer
    async with AsyncOpenAI(
        base_url=url, api_key=CLIENT_KEY, max_retries=0, timeout=30, default_headers=close
    ) as sdk:
        count = 0
        while not done.is_set() or count < 25:
            count += 1
            try:
                response = await sdk.responses.create(model="m", input="hello")
                results.append(response.output_text)
            except Exception as exc:  # what a reset or a refusal looks like to a client
                results.append(repr(exc))


def raise_own_limit() -> None:
    """The backend runs in this process: let it hold what an unbounded gateway opens."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def test_background_flood_at_1024_open_files(tmp_path: Path) -> None:
    raise_own_limit()
    async with (
        ScriptedBackend(responder=respond) as backend,
        gateway_process(
            tmp_path / "gateway.log", "--upstream", backend.base_url,
            "--api-key", FLOOD_KEY, "--api-key", CLIENT_KEY, nofile=NOFILE,
        ) as gw,
    ):  # fmt: skip
        done = asyncio.Event()
        results: list[str] = []
        clients = [asyncio.create_task(client(gw.url, done, results)) for _ in range(CLIENTS)]
        try:
            creates = await flood(gw.url)
        finally:
            done.set()
            await asyncio.gather(*clients)
        log = gw.stderr()
    failed = [r for r in results if r != "ok"]
    accepted = sum(1 for status, _, _ in creates if status == 200)
    print(
        f"\nbackground flood at {NOFILE} fds: {accepted} of {CREATES} creates accepted;"
        f" normal clients {len(results) - len(failed)}/{len(results)} succeeded"
    )
    assert not failed, (len(failed), len(results), failed[:3])

    from streamer.fd_budget import split  # what the gateway shared out of 1,024

    cap = split(NOFILE).background_per_client
    assert accepted == cap, (accepted, cap)
    refused = [(headers, body) for status, headers, body in creates if status != 200]
    assert len(refused) == CREATES - cap
    for headers, body in refused:
        assert headers.get("retry-after") == "1", headers
        error = body["error"]
        assert (error["type"], error["code"], error["param"]) == (
            "requests",
            "rate_limit_exceeded",
            "background",
        )
    assert log.count("background turns at their cap") == 1, log[-2000:]


async def test_caps_per_client_and_in_all_free_up_when_a_turn_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Caps of 2 per client and 3 in all, three clients: each client's third create and
    anyone's fourth are refused before anything is stored; once one ends (cancelled),
    there is room again."""
    caplog.set_level(logging.WARNING, "streamer.frontends.background")
    keys = ("sk-a-0123456789abcdef0123", "sk-b-0123456789abcdef0123", "sk-c-0123456789abc01")
    async with GatewayHarness(
        backend=ScriptedBackend(responder=lambda body: [HANG]),
        api_keys=keys,
        background_max_turns=3,
        background_max_per_client=2,
    ) as gw:
        sdks = [AsyncOpenAI(base_url=gw.url, api_key=key, max_retries=0) for key in keys]
        a, b, c = sdks

        async def create(sdk: AsyncOpenAI) -> Any:
            return await sdk.responses.create(model="m", input="flood", background=True)

        first = await create(a)
        await create(a)
        with pytest.raises(RateLimitError) as mine:
            await create(a)
        await create(b)
        with pytest.raises(RateLimitError) as everyone:
            await create(c)
        assert "for this API key (at most 2 at once)" in mine.value.message
        assert "on this server (at most 3 at once)" in everyone.value.message
        for refused in (mine.value, everyone.value):
            assert refused.response.headers["retry-after"] == "1"
            assert refused.param == "background" and refused.code == "rate_limit_exceeded"
        tasks = gw.gateway.background.tasks
        assert len(tasks) == 3  # the refused ones never ran
        running = tasks[first.id]
        assert (await a.responses.cancel(first.id)).status == "cancelled"
        await asyncio.wait({running}, timeout=10)  # its task ends just after (its caps too)
        assert (await create(c)).status == "queued"
        for sdk in sdks:
            await sdk.close()
    lines = [r.getMessage() for r in caplog.records if "at their cap" in r.getMessage()]
    assert len(lines) == 2 and "in all" in lines[1], lines


async def test_the_gateway_raises_its_soft_open_file_limit(tmp_path: Path) -> None:
    """Started with 512 of a hard 2,048, it serves with 2,048 (as servers do), and the
    budget is shared out of those: the front door admits more than 512 could hold."""
    from streamer.fd_budget import split

    async with (
        gateway_process(tmp_path / "gateway.log", nofile=(512, 2048)) as gw,
        aiohttp.ClientSession() as http,
        http.get(f"{gw.origin}/healthz") as resp,
    ):
        limits = Path(f"/proc/{gw.process.pid}/limits").read_text()
        health = await resp.json()
    (line,) = [x for x in limits.splitlines() if x.startswith("Max open files")]
    assert line.split()[3:5] == ["2048", "2048"], line
    # the embedded model (no --upstream): both ends of a backend connection are its own
    assert health["connections"]["capacity"] == split(2048, backend_fds=2).clients > 512
