"""Two gateway processes sharing one real Redis, as behind a load balancer.

A background streaming turn with namespaced calls starts on instance A; instance B
fetches it, resumes its stream with `starting_after` and cancels it, and the backend
request (served to A) stops. Then A is killed mid-turn and B still ends the response.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from builders import TWO_NAMESPACES, GatewayProcess, gateway_process
from redis_server import RedisServer, redis_marks
from scripted_backend import (
    DONE,
    HANG,
    ScriptedBackend,
    Sleep,
    finish,
    reasoning_chunks,
    text_chunks,
    tool_call_chunks,
    usage,
)

pytestmark = redis_marks

REPO = Path(__file__).resolve().parents[1]
PUBLIC = {("mcp__docs", "search"), ("crm", "lookup")}
FLAT = (b"mcp__docs__search", b"crm__lookup")
TERMINAL = {"response.completed", "response.failed", "response.incomplete", "error"}


async def data_lines(reply: aiohttp.ClientResponse) -> AsyncIterator[tuple[dict[str, Any], bytes]]:
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
async def cluster(
    tmp_path: Path,
) -> AsyncIterator[tuple[ScriptedBackend, GatewayProcess, GatewayProcess]]:
    async with RedisServer() as redis, ScriptedBackend() as backend:
        # no startup profile probe: the backend's records[0] is the turn's request
        args = ("--upstream", backend.base_url, "--store", redis.url, "--profile-probe", "off")
        async with contextlib.AsyncExitStack() as stack:
            a, b = await asyncio.gather(
                stack.enter_async_context(gateway_process(tmp_path / "a.log", *args)),
                stack.enter_async_context(gateway_process(tmp_path / "b.log", *args)),
            )
            yield backend, a, b


async def test_background_turn_is_fetched_resumed_and_cancelled_elsewhere(
    cluster: tuple[ScriptedBackend, GatewayProcess, GatewayProcess],
) -> None:
    backend, a, b = cluster
    script = slow_calls_then_hang()
    backend.script(script)
    body = {
        "model": "m",
        "input": "look it up",
        "tools": TWO_NAMESPACES,
        "background": True,
        "stream": True,
    }
    async with aiohttp.ClientSession() as http, asyncio.timeout(30):
        # Start on A; leave once the first call is out (the turn goes on without us).
        async with http.post(f"{a.url}/responses", json=body) as reply:
            assert reply.status == 200
            head = []
            async for event, _ in data_lines(reply):
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
            async for event, raw in data_lines(reply):
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
    cluster: tuple[ScriptedBackend, GatewayProcess, GatewayProcess],
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
                asyncio.wait_for(_collect(data_lines(reply)), timeout=20)
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


# -- what a shared store shares besides responses (issue 27 rows 8 and 9) --------------------

HISTORY = [
    {"type": "message", "role": "user", "content": "Fix the parser in src/parse.py"},
    {"type": "message", "role": "assistant", "content": "Done with step one."},
]


async def test_sealed_items_made_on_one_instance_open_on_the_other(
    cluster: tuple[ScriptedBackend, GatewayProcess, GatewayProcess],
) -> None:
    # Row 8: with default settings (no --state-key-file) a compaction item or a sealed
    # reasoning item from A was a 400 invalid_encrypted_content on B; the state key now
    # lives in the shared store.
    backend, a, b = cluster
    summary = [*text_chunks(["Goal: ship the parser."]), finish("stop"), usage(9, 3), DONE]
    thought = [*reasoning_chunks(["think hard"]), *text_chunks(["ok"]), finish("stop"),
               usage(5, 2), DONE]  # fmt: skip
    fine = [*text_chunks(["fine"]), finish("stop"), DONE]
    backend.script(summary, thought, fine, fine)
    async with aiohttp.ClientSession() as http, asyncio.timeout(30):
        compact = {"model": "m", "input": HISTORY}
        async with http.post(f"{a.url}/responses/compact", json=compact) as reply:
            assert reply.status == 200
            compaction = (await reply.json())["output"][-1]
        assert compaction["type"] == "compaction"
        body = {"model": "m", "input": "hi", "store": False,
                "include": ["reasoning.encrypted_content"]}  # fmt: skip
        async with http.post(f"{a.url}/responses", json=body) as reply:
            reasoning = (await reply.json())["output"][0]
        assert reasoning["type"] == "reasoning" and reasoning["encrypted_content"]

        for item in (compaction, reasoning):
            go_on = {"model": "m", "input": [item, {"role": "user", "content": "Next."}]}
            async with http.post(f"{b.url}/responses", json=go_on) as reply:
                answer = await reply.json()
                assert reply.status == 200, answer
    seen = [str(m.get("content")) for m in backend.requests[2]["messages"]]
    assert any("Goal: ship the parser." in text for text in seen)


AFFINITY_CONFIG = """
default_model = "m"

[[models]]
name = "m"
upstreams = ["{u0}", "{u1}"]
"""


async def test_a_chain_keeps_to_one_replica_across_instances(tmp_path: Path) -> None:
    # Row 9: a previous_response_id chain switched replicas 5-10 times in 11 turns across
    # two instances (0 on one), so backend prefix caches went cold; the chain's affinity
    # key now travels in its stored records.
    async with RedisServer() as redis, ScriptedBackend() as r0, ScriptedBackend() as r1:
        config = tmp_path / "models.toml"
        config.write_text(AFFINITY_CONFIG.format(u0=r0.base_url, u1=r1.base_url))
        args = ("--config", str(config), "--store", redis.url, "--profile-probe", "off",
                "--health-interval", "0")  # fmt: skip
        async with contextlib.AsyncExitStack() as stack:
            gateways = await asyncio.gather(
                stack.enter_async_context(gateway_process(tmp_path / "a.log", *args)),
                stack.enter_async_context(gateway_process(tmp_path / "b.log", *args)),
            )
            previous: str | None = None
            async with aiohttp.ClientSession() as http, asyncio.timeout(60):
                for turn in range(11):
                    body: dict[str, Any] = {"model": "m", "input": f"turn {turn}"}
                    if previous is not None:
                        body["previous_response_id"] = previous
                    gateway = gateways[turn % 2]  # every turn on the other instance
                    async with http.post(f"{gateway.url}/responses", json=body) as reply:
                        assert reply.status == 200
                        previous = (await reply.json())["id"]
    served = [
        index
        for turn in range(11)
        for index, replica in enumerate((r0, r1))
        for request in replica.requests
        if request["messages"][-1]["content"] == f"turn {turn}"
    ]
    assert len(served) == 11
    switches = sum(1 for x, y in itertools.pairwise(served) if x != y)
    assert switches == 0, served
