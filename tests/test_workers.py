"""`streamer serve --workers 2`: real processes on one port, a real Redis, the official SDK.

Every worker names itself (`X-Streamer-Worker` on every answer, `worker` in /healthz), so a
test reaches a given worker by opening connections until the kernel hands one to it and
then keeping that connection (one per client, kept alive).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2 as httpx  # the transport of the openai SDK
import openai
import orjson
import pytest
from builders import GatewayProcess, gateway_process, parse_sse
from redis_server import RedisServer, redis_marks
from scripted_backend import (
    DONE,
    HANG,
    ScriptedBackend,
    Sleep,
    finish,
    reasoning_chunks,
    text_chunks,
    usage,
)

from streamer.config import NO_RELOAD, Settings
from streamer.supervisor import RestartBudget, check_workers
from streamer.worker import WORKER_HEADER, Seat

REPO = Path(__file__).resolve().parents[1]
BOUND = 60  # seconds any one test step may take on a loaded machine (a bound, not a claim)
TRIES = 400  # connections opened at most to land on one worker (each lands on either)


def _answer(text: str, *, slow: bool = False) -> list[Any]:
    pause = [Sleep(1.0)] if slow else []
    return [*text_chunks([text]), *pause, *text_chunks([" done"], role=False),
            finish("stop"), usage(3, 2), DONE]  # fmt: skip


def _echo(body: Any) -> list[Any]:
    """The last user text back, and how many messages the backend was sent."""
    messages = body["messages"]
    last = messages[-1]["content"]
    text = last if isinstance(last, str) else last[0]["text"]
    return _answer(f"{text} ({len(messages)} messages)", slow=text.startswith("slow"))


async def _client_on(gw: GatewayProcess, index: int) -> tuple[openai.AsyncOpenAI, int]:
    """An SDK client whose one kept-alive connection is served by worker `index`; its pid."""
    for _ in range(TRIES):
        http = httpx.AsyncClient(
            limits=httpx.Limits(max_connections=1, max_keepalive_connections=1), timeout=BOUND
        )
        health = (await http.get(gw.origin + "/healthz")).json()
        if health["worker"]["index"] == index:
            client = openai.AsyncOpenAI(
                base_url=gw.url, api_key="unused", http_client=http, max_retries=0
            )
            return client, int(health["worker"]["pid"])
        await http.aclose()
    raise AssertionError(f"no connection reached worker {index} in {TRIES} tries")


async def _pids(gw: GatewayProcess) -> dict[int, int]:
    """Each worker's pid, by index: fresh connections until both answered. A worker that is
    still starting (a restarted one) answers nothing for a while, so this is bounded by
    time, not by a count of connections."""
    seen: dict[int, int] = {}
    try:
        async with httpx.AsyncClient(timeout=BOUND) as http, asyncio.timeout(BOUND):
            while len(seen) < 2:
                r = await http.get(gw.origin + "/healthz", headers={"Connection": "close"})
                worker = r.json()["worker"]
                if worker["index"] in seen:  # leave the CPU to a worker that is starting
                    await asyncio.sleep(0.01)
                seen[worker["index"]] = worker["pid"]
    except TimeoutError:
        raise AssertionError(f"only workers {seen} answered within {BOUND} s") from None
    return seen


@pytest.fixture
async def redis_url() -> AsyncIterator[str]:
    async with RedisServer() as server:
        yield server.url


def _workers_args(backend: ScriptedBackend, redis_url: str, *more: str) -> tuple[str, ...]:
    return ("--upstream", backend.base_url, "--workers", "2", "--store", redis_url, *more)


def _with_redis(test: Any) -> Any:
    """Marked as the other Redis tests (skipped without redis-server)."""
    for mark in redis_marks:
        test = mark(test)
    return test


@_with_redis
async def test_chain_alternates_between_workers_and_metrics_sum(
    tmp_path: Path, redis_url: str
) -> None:
    """previous_response_id turns alternating between the two workers continue one history;
    a reasoning item one worker sealed opens on the other (the shared state key); /metrics
    on either worker counts the turns of both."""
    async with ScriptedBackend() as backend:
        backend.responder = _echo
        async with gateway_process(tmp_path / "gw.log", *_workers_args(backend, redis_url)) as gw:
            (a, pid_a), (b, pid_b) = await _client_on(gw, 0), await _client_on(gw, 1)
            assert pid_a != pid_b
            previous = None
            for turn in range(6):
                client, index = (a, 0) if turn % 2 == 0 else (b, 1)
                raw = await client.responses.with_raw_response.create(
                    model="m", input=f"turn {turn}", previous_response_id=previous
                )
                assert raw.headers[WORKER_HEADER] == str(index)
                response = raw.parse()
                # the whole chain so far reached the backend: 2 messages per earlier turn
                assert response.output_text == f"turn {turn} ({2 * turn + 1} messages) done"
                previous = response.id
            # each worker reads the other's stored response
            for client in (a, b):
                fetched = await client.responses.retrieve(previous)
                assert fetched.output_text == "turn 5 (11 messages) done"

            # sealed by worker 0, opened by worker 1 (no --state-key-file given)
            backend.script([*reasoning_chunks(["thinking hard"]), *_answer("sealed")])
            sealed = await a.responses.create(
                model="m", input="think", store=False, include=["reasoning.encrypted_content"]
            )
            reasoning = next(item for item in sealed.output if item.type == "reasoning")
            assert reasoning.encrypted_content
            reply = await b.responses.create(
                model="m",
                store=False,
                input=[
                    {"role": "user", "content": "think"},
                    *(item.model_dump(exclude_none=True) for item in sealed.output),
                    {"role": "user", "content": "again"},
                ],
            )
            assert reply.output_text.startswith("again")
            replayed = backend.requests[-1]["messages"]
            assert any(m.get("reasoning_content") == "thinking hard" for m in replayed), replayed

            for client in (a, b):  # either worker answers for both
                text = (await client._client.get(gw.origin + "/metrics")).text
                assert _requests(text, "/v1/responses", "200") == 8, text
                # the turns summed too; the build is one, not one per worker
                assert _sum(text, "streamer_responses_total{", 'status="completed"') == 8, text
                assert _sum(text, "streamer_build_info{", "version=") == 1, text
            await a.close()
            await b.close()


def _sum(metrics: str, prefix: str, *labels: str) -> float:
    total = 0.0
    for line in metrics.splitlines():
        if line.startswith(prefix) and all(x in line for x in labels):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _requests(metrics: str, route: str, status: str) -> float:
    total = 0.0
    for line in metrics.splitlines():
        labels = (f'route="{route}"', f'status="{status}"', 'method="POST"')
        if line.startswith("streamer_http_requests_total{") and all(x in line for x in labels):
            total += float(line.rsplit(" ", 1)[1])
    return total


@_with_redis
async def test_background_turn_resumes_and_cancels_on_the_other_worker(
    tmp_path: Path, redis_url: str
) -> None:
    async with ScriptedBackend() as backend:  # noqa: SIM117
        async with gateway_process(tmp_path / "gw.log", *_workers_args(backend, redis_url)) as gw:
            (a, _), (b, _) = await _client_on(gw, 0), await _client_on(gw, 1)
            backend.script(_answer("slow background", slow=True), [*text_chunks(["Hel"]), HANG])
            done = await a.responses.create(model="m", input="x", background=True)
            stuck = await a.responses.create(model="m", input="y", background=True)
            assert done.status == stuck.status == "queued"
            async with asyncio.timeout(BOUND):
                # resumed on worker 1 from the start: every event, to the end worker 0 wrote
                url = f"{gw.url}/responses/{done.id}?stream=true&starting_after=0"
                async with b._client.stream("GET", url) as reply:
                    assert reply.headers[WORKER_HEADER] == "1"
                    events = parse_sse(b"".join([part async for part in reply.aiter_bytes()]))
            assert [e["sequence_number"] for e in events] == list(range(1, len(events) + 1))
            assert events[-1]["type"] == "response.completed"
            assert events[-1]["response"]["output"][0]["content"][0]["text"] == (
                "slow background done"
            )
            while len(backend.requests) < 2:  # worker 0 holds the stuck one's backend request
                await asyncio.sleep(0.02)
            cancelled = await b.responses.cancel(stuck.id)
            assert cancelled.status == "cancelled"
            async with asyncio.timeout(BOUND):
                await backend.records[-1].wait_disconnect(BOUND)  # worker 0 let it go
            assert (await a.responses.retrieve(stuck.id)).status == "cancelled"
            await a.close()
            await b.close()


async def _stream_until_text(client: openai.AsyncOpenAI, text: str) -> Any:
    stream = await client.responses.create(model="m", input=text, stream=True)
    async for event in stream:
        if event.type == "response.output_text.delta":
            return stream
    raise AssertionError("no text before the end")


@_with_redis
async def test_sigterm_drains_both_workers(tmp_path: Path, redis_url: str) -> None:
    async with ScriptedBackend() as backend:
        backend.responder = _echo
        args = _workers_args(backend, redis_url, "--shutdown-grace", "20")
        async with gateway_process(tmp_path / "gw.log", *args) as gw:
            (a, pid_a), (b, pid_b) = await _client_on(gw, 0), await _client_on(gw, 1)
            streams = [await _stream_until_text(c, f"slow {i}") for i, c in enumerate((a, b))]
            gw.process.send_signal(signal.SIGTERM)
            for i, stream in enumerate(streams):  # each finishes, on the worker it began on
                async with asyncio.timeout(BOUND):
                    last = [event async for event in stream][-1]
                assert last.type == "response.completed"
                assert last.response.output_text == f"slow {i} (1 messages) done"
            assert await gw.wait(BOUND) == 0, gw.log()
            for pid in (pid_a, pid_b):
                assert _gone(pid), pid
            assert "Traceback" not in gw.log(), gw.log()
            assert not gw.accepts()
        assert backend.disconnects == 0  # no backend request was cut


def _gone(pid: int) -> bool:
    """The process has exited (reaped, or a zombie waiting to be)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except FileNotFoundError:
        return True


@_with_redis
async def test_killed_worker_is_restarted_within_its_limit(tmp_path: Path, redis_url: str) -> None:
    """SIGKILL a worker: a new one takes its place (and does not probe the backend again);
    killed again within a minute with --worker-restart-limit 1, it waits, logged, while the
    other serves on; SIGTERM then stops everything at once."""
    async with ScriptedBackend() as backend:
        args = _workers_args(
            backend, redis_url, "--worker-restart-limit", "1", "--log-level", "info"
        )
        async with gateway_process(tmp_path / "gw.log", *args) as gw:
            first = await _pids(gw)
            os.kill(first[0], signal.SIGKILL)
            async with asyncio.timeout(BOUND):
                while (now := await _pids(gw))[0] == first[0]:
                    pass
            assert now[1] == first[1]
            restarted = f"worker 0 (pid {first[0]}) exited (signal SIGKILL): restarting it"
            assert restarted in gw.log()
            client, _ = await _client_on(gw, 0)  # the new worker 0 serves turns
            backend.script(_answer("again"))
            assert (await client.responses.create(model="m", input="x")).output_text == (
                "again done"
            )
            await client.close()
            async with asyncio.timeout(BOUND):  # the profile probe, of worker 0's first start
                while not (probes := [r for r in backend.records if r.path.endswith("/models")]):
                    await asyncio.sleep(0.02)
            assert len(probes) == 1  # not worker 1's, not the restarted worker 0's

            os.kill(now[0], signal.SIGKILL)
            async with asyncio.timeout(BOUND):
                while "after 1 restarts in 60 s (--worker-restart-limit)" not in gw.log():
                    await asyncio.sleep(0.05)
            other, pid = await _client_on(gw, 1)  # worker 1 serves meanwhile
            assert pid == first[1]
            await other.close()
            gw.process.send_signal(signal.SIGHUP)  # no --config: logged, stops nobody
            async with asyncio.timeout(BOUND):
                while NO_RELOAD not in gw.log():
                    await asyncio.sleep(0.05)
            other, pid = await _client_on(gw, 1)
            assert pid == first[1] and gw.process.returncode is None
            await other.close()
            assert await gw.terminate(BOUND) == 0, gw.log()


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMER_")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [sys.executable, "-m", "streamer", "serve", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=BOUND,
    )  # fmt: skip


def test_more_than_one_worker_refuses_the_memory_store() -> None:
    done = _serve("--workers", "2")
    assert done.returncode == 2
    assert "--workers 2 needs a shared store" in done.stderr
    assert "use --store redis://host:port/db" in done.stderr
    done = _serve("--workers", "0", "--store", "redis://127.0.0.1:1/0")
    assert done.returncode == 2 and "--workers must be 1 or more (got 0)" in done.stderr


def test_check_workers() -> None:
    check_workers(Settings())  # one worker: the memory store is fine
    check_workers(Settings(workers=4, store="redis://h:6379/0"))
    with pytest.raises(ValueError, match="--worker-restart-limit must be 1 or more"):
        check_workers(Settings(worker_restart_limit=0))


def test_restart_budget() -> None:
    budget = RestartBudget(2, window=60.0)
    assert budget.delay(100.0) == 0.0
    budget.record(100.0)
    budget.record(110.0)
    assert budget.delay(120.0) == 40.0  # the third in a minute waits for the first to age
    assert budget.delay(160.0) == 0.0  # the first one is a minute old: it left the window
    budget.record(160.0)
    assert budget.delay(165.0) == 5.0  # 110 + 60


def test_seat_round_trip_keeps_types_and_the_key_out_of_repr() -> None:
    settings = Settings(api_keys=("k1", "k2"), workers=2, store="redis://h/0", port=9)
    seat = Seat(settings, 1, 2, fd=None, state_key=b"s" * 64)
    back = Seat.decode(seat.encode())
    assert back.settings == settings and back.settings.api_keys == ("k1", "k2")
    assert back.settings.shared_state_key == b"s" * 64 and back.index == 1
    assert "sss" not in repr(back.settings)
    assert orjson.loads(seat.encode())["settings"].get("shared_state_key") is None


NO_REUSEPORT = (
    "import socket, sys; del socket.SO_REUSEPORT; "  # as on a system without it
    "from streamer.cli import main; sys.exit(main())"
)


@_with_redis
async def test_without_so_reuseport_workers_share_one_listening_socket(
    tmp_path: Path, redis_url: str
) -> None:
    from builders import _until_healthy
    from redis_server import free_port

    async with ScriptedBackend() as backend:
        backend.responder = _echo
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMER_")}
        env["PYTHONPATH"] = str(REPO)
        log = tmp_path / "gw.log"
        with log.open("wb") as err, log.with_name("gw.log.stdout").open("wb") as out:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", NO_REUSEPORT, "serve", "--port", str(port),
                *_workers_args(backend, redis_url),
                cwd=REPO, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=err,
            )  # fmt: skip
        gw = GatewayProcess(proc, port, log)
        try:
            await _until_healthy(gw)
            assert "2 workers serving" in gw.stdout() and "one shared socket" in gw.stdout()
            pids = await _pids(gw)
            assert pids[0] != pids[1]  # both accept on the one socket
            (a, _), (b, _) = await _client_on(gw, 0), await _client_on(gw, 1)
            first = await a.responses.create(model="m", input="one")
            second = await b.responses.create(model="m", input="two", previous_response_id=first.id)
            assert second.output_text == "two (3 messages) done"
            await a.close()
            await b.close()
            assert await gw.terminate(BOUND) == 0, gw.log()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


@_with_redis
async def test_workers_leave_when_their_supervisor_is_killed(
    tmp_path: Path, redis_url: str
) -> None:
    async with ScriptedBackend() as backend:
        args = _workers_args(backend, redis_url)
        async with gateway_process(tmp_path / "gw.log", *args) as gw:
            pids = await _pids(gw)
            gw.process.kill()  # SIGKILL: no chance to stop its workers
            await gw.wait(BOUND)
            async with asyncio.timeout(BOUND):  # each sees its stdin end, drains, exits
                while not all(_gone(pid) for pid in pids.values()):
                    await asyncio.sleep(0.05)
            assert not gw.accepts()
