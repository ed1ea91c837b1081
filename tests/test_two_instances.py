"""Two gateway processes sharing one real Redis, as behind a load balancer.

A background streaming turn with namespaced calls starts on instance A; instance B
fetches it, resumes its stream with `starting_after` and cancels it, and the backend
request (served to A) stops. Then A is killed mid-turn and B still ends the response.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from redis_server import RedisServer, free_port, redis_marks
from scripted_backend import HANG, ScriptedBackend, Sleep, text_chunks, tool_call_chunks

pytestmark = redis_marks

REPO = Path(__file__).resolve().parents[1]
TOOLS: list[dict[str, Any]] = [
    {
        "type": "namespace",
        "name": "mcp__docs",
        "description": "Docs.",
        "tools": [{"type": "function", "name": "search", "parameters": {"type": "object"}}],
    },
    {
        "type": "namespace",
        "name": "crm",
        "description": "CRM.",
        "tools": [{"type": "function", "name": "lookup", "parameters": {"type": "object"}}],
    },
]
PUBLIC = {("mcp__docs", "search"), ("crm", "lookup")}
FLAT = (b"mcp__docs__search", b"crm__lookup")
TERMINAL = {"response.completed", "response.failed", "response.incomplete", "error"}


@dataclass
class Instance:
    process: asyncio.subprocess.Process
    url: str  # .../v1
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@contextlib.asynccontextmanager
async def gateway_process(log_path: Path, *args: str) -> AsyncIterator[Instance]:
    """`python -m streamer serve --port <free> *args`, ready once /healthz answers."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    port = free_port()
    with log_path.open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "streamer", "serve", "--host", "127.0.0.1", "--port", str(port),
            *args, cwd=REPO, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log,
        )  # fmt: skip
    instance = Instance(process, f"http://127.0.0.1:{port}/v1", log_path)
    try:
        async with aiohttp.ClientSession() as session, asyncio.timeout(30):
            while True:
                if process.returncode is not None:
                    raise RuntimeError(f"gateway exited {process.returncode}:\n{instance.log()}")
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(f"http://127.0.0.1:{port}/healthz") as reply:
                        if reply.status == 200:
                            break
                await asyncio.sleep(0.1)
        yield instance
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                process.kill()
                await process.wait()


async def sse_events(reply: aiohttp.ClientResponse) -> AsyncIterator[tuple[dict[str, Any], bytes]]:
    """Each event's parsed JSON and its raw data line."""
    async for line in reply.content:
        if line.startswith(b"data: "):
            data = line[6:].rstrip(b"\r\n")
            yield orjson.loads(data), data


def call_items(event: dict[str, Any]) -> list[dict[str, Any]]:
    """Every function_call item an event carries, in `item` or in `response.output`."""
    items = [event["item"]] if "item" in event else []
    items += (event.get("response") or {}).get("output") or []
    return [i for i in items if i.get("type") == "function_call"]


def slow_calls_then_hang() -> list[Any]:
    search = tool_call_chunks(0, "call_s", ["mcp__docs__search"], ['{"q":', '"a"}'])
    lookup = tool_call_chunks(1, "call_l", ["crm__lookup"], ['{"id":', "7}"])
    return [step for c in (*search, *lookup) for step in (c, Sleep(0.1))] + [HANG]


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[tuple[ScriptedBackend, Instance, Instance]]:
    async with RedisServer() as redis, ScriptedBackend() as backend:
        args = ("--upstream", backend.base_url, "--store", redis.url)
        async with contextlib.AsyncExitStack() as stack:
            a, b = await asyncio.gather(
                stack.enter_async_context(gateway_process(tmp_path / "a.log", *args)),
                stack.enter_async_context(gateway_process(tmp_path / "b.log", *args)),
            )
            yield backend, a, b


async def test_background_turn_is_fetched_resumed_and_cancelled_elsewhere(
    cluster: tuple[ScriptedBackend, Instance, Instance],
) -> None:
    backend, a, b = cluster
    script = slow_calls_then_hang()
    backend.script(script)
    body = {"model": "m", "input": "look it up", "tools": TOOLS, "background": True, "stream": True}
    async with aiohttp.ClientSession() as http, asyncio.timeout(30):
        # Start on A; leave once the first call is out (the turn goes on without us).
        async with http.post(f"{a.url}/responses", json=body) as reply:
            assert reply.status == 200
            head = []
            async for event, _ in sse_events(reply):
                head.append(event)
                if event["type"] == "response.output_item.added":
                    break
        assert head[0]["type"] == "response.queued"
        response_id = head[0]["response"]["id"]
        after = head[-1]["sequence_number"] - 1  # the resumed stream replays the call's item
        assert [e["sequence_number"] for e in head] == list(range(after + 2))
        # Both calls are sent (the last chunk 0.1 s ago), and the backend now hangs: A holds
        # the second call open until the turn ends.
        while backend.records[0].steps_written < len(script) - 1:
            await asyncio.sleep(0.02)

        # Fetch on B.
        async with http.get(f"{b.url}/responses/{response_id}") as reply:
            fetched = await reply.json()
        assert (fetched["id"], fetched["background"]) == (response_id, True)
        assert fetched["status"] == "in_progress"

        # Resume on B after `after`; cancel on B once the replay reached the last logged event.
        resumed: list[tuple[dict[str, Any], bytes]] = []
        cancel: asyncio.Task[Any] | None = None

        async def cancel_on_b() -> Any:
            async with http.post(f"{b.url}/responses/{response_id}/cancel") as reply:
                assert reply.status == 200
                return await reply.json()

        url = f"{b.url}/responses/{response_id}?stream=true&starting_after={after}"
        async with http.get(url) as reply:
            assert reply.status == 200
            assert reply.headers["Content-Type"].startswith("text/event-stream")
            async for event, raw in sse_events(reply):
                resumed.append((event, raw))
                if cancel is None and event.get("delta") == '"a"}':
                    cancel = asyncio.create_task(cancel_on_b())
        assert cancel is not None
        cancelled = await cancel
        await backend.records[0].wait_disconnect(timeout=5)  # the cancel cut A's backend request

    events = [event for event, _ in resumed]
    assert [e["sequence_number"] for e in events] == list(range(after + 1, after + 1 + len(events)))
    terminal = [e for e in events if e["type"] in TERMINAL]
    assert len(terminal) == 1 and terminal[0] is events[-1]
    assert terminal[0]["type"] == "response.failed"
    assert terminal[0]["response"]["status"] == "cancelled"
    # Every replayed or live call item carries the client's name and namespace, never the flat one.
    items = [item for event in events for item in call_items(event)]
    assert {i["call_id"] for i in items} == {"call_s", "call_l"}
    assert all((i.get("namespace"), i.get("name")) in PUBLIC for i in items), items
    assert not any(flat in raw for _, raw in resumed for flat in FLAT)
    assert cancelled["status"] == "cancelled"
    assert {(i["namespace"], i["name"]) for i in call_items({"response": cancelled})} == PUBLIC

    # One backend request in all, served to A, and cut when B cancelled.
    assert len(backend.requests) == 1
    assert {t["function"]["name"] for t in backend.requests[0]["tools"]} == {
        "mcp__docs__search", "crm__lookup"
    }  # fmt: skip


async def test_cancel_ends_a_turn_whose_instance_died(
    cluster: tuple[ScriptedBackend, Instance, Instance],
) -> None:
    backend, a, b = cluster
    backend.script([*text_chunks(["part"]), HANG])
    body = {"model": "m", "input": "hi", "background": True}
    async with aiohttp.ClientSession() as http, asyncio.timeout(30):
        async with http.post(f"{a.url}/responses", json=body) as reply:
            response_id = (await reply.json())["id"]
        while True:  # wait until A is streaming it
            async with http.get(f"{b.url}/responses/{response_id}") as reply:
                if (await reply.json())["status"] == "in_progress":
                    break
            await asyncio.sleep(0.05)
        a.process.send_signal(signal.SIGKILL)
        await a.process.wait()

        url = f"{b.url}/responses/{response_id}?stream=true&starting_after=0"
        async with http.get(url) as reply:  # a follower waiting on the dead instance's turn
            follower = asyncio.create_task(
                asyncio.wait_for(_collect(sse_events(reply)), timeout=20)
            )
            async with http.post(f"{b.url}/responses/{response_id}/cancel") as cancel:
                assert cancel.status == 200
                assert (await cancel.json())["status"] == "cancelled"
            events = await follower
        async with http.get(f"{b.url}/responses/{response_id}") as reply:
            assert (await reply.json())["status"] == "cancelled"
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["status"] == "cancelled"
    seqs = [e["sequence_number"] for e in events]
    assert seqs == list(range(1, len(events) + 1))


async def _collect(events: AsyncIterator[tuple[dict[str, Any], bytes]]) -> list[dict[str, Any]]:
    return [event async for event, _ in events]
