"""The signals an operator's tools send a gateway, on real processes.

SIGHUP is what logrotate and `systemctl reload` send. With `--config` it reloads the
models (tests/test_routing.py); without one there is nothing to reload, and it is logged
and ignored, by a single gateway, by a `--workers` supervisor and by a worker itself
(issue 27 row 7: the process died without a word, its default action).

SIGTERM with `--drain-seconds` first opens the drain window: `/readyz` fails, everything
else is served, each answer closing its connection; a second signal ends the window (the
rolling restart behind haproxy that needs it: tests/test_load_balancer.py).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import aiohttp
import pytest
from builders import REPO, GatewayProcess, gateway_process
from redis_server import RedisServer, free_port, requires_redis

from streamer.config import NO_RELOAD

BOUND = 30  # seconds any one step may take on a loaded machine (a bound, not a claim)


async def until_logged(gw: GatewayProcess, text: str, count: int = 1) -> None:
    """Until `text` is in the gateway's log `count` times (it exits or BOUND: a failure)."""
    async with asyncio.timeout(BOUND):
        while gw.log().count(text) < count:
            assert gw.process.returncode is None, f"exited {gw.process.returncode}:\n{gw.log()}"
            await asyncio.sleep(0.02)


async def answers(gw: GatewayProcess) -> dict[str, object]:
    """A turn through the gateway (it still serves), and its /healthz."""
    async with aiohttp.ClientSession() as http:
        body = {"model": "m", "input": "hi"}
        async with http.post(f"{gw.url}/responses", json=body) as reply:
            assert reply.status == 200, await reply.text()
            assert (await reply.json())["status"] == "completed"
        async with http.get(gw.origin + "/healthz", headers={"Connection": "close"}) as reply:
            return dict(await reply.json())


async def test_sighup_without_config_is_logged_and_ignored(tmp_path: Path) -> None:
    async with gateway_process(tmp_path / "gw.log") as gw:  # the embedded model, no --config
        for n in (1, 2):
            gw.process.send_signal(signal.SIGHUP)
            await until_logged(gw, NO_RELOAD, n)
        await answers(gw)
        assert gw.process.returncode is None
        assert await gw.terminate(BOUND) == 0, gw.log()


@pytest.mark.redis
@requires_redis
async def test_sighup_without_config_is_ignored_by_workers_and_their_supervisor(
    tmp_path: Path,
) -> None:
    async with RedisServer() as redis:
        args = ("--workers", "2", "--store", redis.url)
        async with gateway_process(tmp_path / "gw.log", *args) as gw:
            gw.process.send_signal(signal.SIGHUP)  # the supervisor: logged, not passed on
            await until_logged(gw, NO_RELOAD, 1)
            worker = (await answers(gw))["worker"]
            assert isinstance(worker, dict)
            os.kill(int(worker["pid"]), signal.SIGHUP)  # a worker itself
            await until_logged(gw, NO_RELOAD, 2)
            again = (await answers(gw))["worker"]
            assert isinstance(again, dict)
            assert "exited" not in gw.log(), gw.log()  # no worker was restarted
            assert gw.process.returncode is None
            assert await gw.terminate(BOUND) == 0, gw.log()


async def test_sigterm_first_fails_readyz_while_everything_else_is_served(tmp_path: Path) -> None:
    async with gateway_process(tmp_path / "gw.log", "--drain-seconds", "60") as gw:
        async with aiohttp.ClientSession() as http:
            async with http.get(gw.origin + "/readyz") as reply:
                assert reply.status == 200
            gw.process.send_signal(signal.SIGTERM)
            await until_logged(gw, "before the listener closes")
            async with http.get(gw.origin + "/readyz") as reply:
                assert reply.status == 503
                assert (await reply.json())["status"] == "stopping"
            for stream in (False, True):  # the fast path and aiohttp's handler alike
                body = {"model": "m", "input": "hi", "stream": stream}
                async with http.post(f"{gw.url}/responses", json=body) as reply:
                    assert reply.status == 200
                    assert b"response.completed" in await reply.read() or not stream
                    assert reply.headers["Connection"] == "close"  # the next one: elsewhere
            async with http.get(gw.origin + "/healthz") as reply:
                assert reply.status == 200  # alive: only readiness fails
                assert reply.headers["Connection"] == "close"
        gw.process.send_signal(signal.SIGTERM)  # a second one ends the window
        assert await gw.wait(BOUND) == 0, gw.log()


async def test_sigterm_while_starting_stops_it_cleanly_once_started() -> None:
    """SIGTERM as the process starts (its first line is out; the app, the store and the
    listener are still to come): kept and acted on once it serves, exit 0, where it died
    of the signal (a `--workers` supervisor stopping a worker it had just restarted then
    exited 1)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMER_")}
    env["PYTHONPATH"] = str(REPO)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "streamer", "serve", "--port", str(free_port()),
        cwd=REPO, env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    try:
        async with asyncio.timeout(BOUND):
            first = await proc.stdout.readline()
            assert first.startswith(b"streamer: serving"), first
            proc.send_signal(signal.SIGTERM)
            code = await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert code == 0, (code, await proc.stderr.read())


def test_a_worker_signalled_before_it_serves_keeps_the_sigterm_not_dying_of_it() -> None:
    """A `--workers` worker installs its early SIGTERM handler before it imports the app: one
    that has imported everything and waits for its seat (a supervisor stopping at once) is
    not killed by the signal's default action."""
    import subprocess
    import time

    code = "import sys; from streamer.worker_entry import main; sys.exit(main())"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, env=env)
    try:
        deadline = time.monotonic() + BOUND
        syscall = Path(f"/proc/{proc.pid}/syscall")
        # until it blocks reading its seat on stdin (syscall 0, read, of fd 0): imports done
        while not syscall.read_text().startswith("0 0x0 "):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)  # polling a real condition of the process
        proc.send_signal(signal.SIGTERM)
        assert proc.stdin is not None
        proc.stdin.close()  # no seat: the worker returns as a supervisor gone away (1)
        assert proc.wait(BOUND) == 1  # not -SIGTERM
    finally:
        proc.kill()
        proc.wait()
