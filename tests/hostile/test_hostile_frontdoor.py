"""Hostile clients at the front door (issue 13, rows 3 and 11).

- slowloris: request heads trickled a byte at a time, bodies a byte per 10 ms, idle
  keep-alive connections: closed at `--client-header-timeout` / `--client-body-timeout`
  (a 408 in OpenAI's shape when a head or body had begun), while normal clients are served;
- the connection cap evicts the connection that has waited longest for a head, never
  one in a request or a stream, and refuses a newcomer only when every slot is busy;
- a `streamer serve` process at a small open-file limit under hundreds (slow: 2,000) of
  slowloris connections keeps serving normal clients (success rate printed);
- `/readyz` does not turn each call into a backend request; `--metrics-auth`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from builders import client_session
from harness import GatewayHarness
from raw_backend import RawBackend, RawConnection, http_response
from redis_server import free_port
from scripted_backend import DONE, ScriptedBackend, Sleep, finish, text_chunks, usage
from test_faults import BODY

REPO = Path(__file__).resolve().parents[2]
DEADLINE = 10.0  # no wait in these tests lasts longer: a connection left open fails
SLOW_HEAD = b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 4000


def port_of(gw: GatewayHarness) -> int:
    return int(gw.url.split(":")[2].split("/")[0])


class _Peer(asyncio.Protocol):
    """A raw client that keeps every byte it got, even if a reset follows them."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        self.data += data

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


async def trickle(port: int, head: bytes, rest: bytes, interval: float) -> bytes:
    """Send `head` at once, then `rest` a byte per `interval`, until the server closes;
    everything it sent back (b"": closed without a word)."""
    loop = asyncio.get_running_loop()
    transport, peer = await loop.create_connection(_Peer, "127.0.0.1", port)
    try:
        transport.write(head)
        for byte in rest:
            if peer.closed.done():
                break
            transport.write(bytes([byte]))
            await asyncio.wait([peer.closed], timeout=interval)  # the attacker's pace
        await peer.closed
        return bytes(peer.data)
    finally:
        transport.close()


async def normal_requests(url: str, count: int) -> list[int]:
    """`count` ordinary non-streamed turns, each on a new connection: their statuses."""
    statuses = []
    async with client_session() as session:
        for i in range(count):
            async with session.post(url + "/responses", json={**BODY, "input": f"n{i}"}) as r:
                body = await r.read()
                statuses.append(r.status)
                if r.status == 200:
                    assert orjson.loads(body)["status"] == "completed"
    return statuses


def error_of(answer: bytes) -> tuple[bytes, dict[str, Any]]:
    """The status line and the OpenAI error of a raw HTTP answer."""
    head, _, body = answer.partition(b"\r\n\r\n")
    return head.split(b"\r\n")[0], orjson.loads(body)["error"]


# -- timeouts -------------------------------------------------------------------------------


async def test_slowloris_heads_and_idle_connections_are_closed_at_the_header_timeout() -> None:
    async with GatewayHarness(client_header_timeout=1.0) as gw:
        port = port_of(gw)
        slow = [asyncio.ensure_future(trickle(port, b"", SLOW_HEAD, 0.2)) for _ in range(50)]
        idle = [asyncio.ensure_future(trickle(port, b"", b"", 0)) for _ in range(5)]
        statuses = await normal_requests(gw.url, 10)  # served meanwhile
        async with asyncio.timeout(DEADLINE):
            answers = await asyncio.gather(*slow)
            silent = await asyncio.gather(*idle)
        assert statuses == [200] * 10
        for answer in answers:
            line, error = error_of(answer)
            assert line.startswith(b"HTTP/1.1 408"), answer[:200]
            assert error["code"] == "request_timeout" and error["type"] == "invalid_request_error"
        assert silent == [b""] * 5  # nothing had begun: closed without an answer


async def test_an_idle_keep_alive_connection_is_closed_after_the_header_timeout() -> None:
    async with GatewayHarness(client_header_timeout=1.0) as gw:
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(gw))
        try:
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            async with asyncio.timeout(DEADLINE):
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                rest = await reader.read()  # kept alive, then closed: EOF, no stray 408
        finally:
            writer.close()
        assert head.startswith(b"HTTP/1.1 200") and rest == b""


async def test_slowloris_bodies_get_408_and_are_closed_at_the_body_timeout() -> None:
    head = (
        b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100000\r\n\r\n"
    )
    body = b'{"model": "m", "input": "' + b"a" * 99000
    async with GatewayHarness(client_body_timeout=1.0) as gw:
        port = port_of(gw)
        slow = [asyncio.ensure_future(trickle(port, head, body, 0.01)) for _ in range(20)]
        statuses = await normal_requests(gw.url, 10)
        async with asyncio.timeout(DEADLINE):
            answers = await asyncio.gather(*slow)  # read to EOF: the connection closed
        assert statuses == [200] * 10
        for answer in answers:
            line, error = error_of(answer)
            assert line.startswith(b"HTTP/1.1 408"), answer[:200]
            assert error["code"] == "request_timeout"
            assert "did not arrive within 1 seconds" in error["message"]
        assert len(gw.backend.requests) == 10  # the trickled bodies never reached it


# -- the connection cap -----------------------------------------------------------------------


async def _wait_open(gw: GatewayHarness, count: int) -> None:
    from streamer.frontends.frontdoor import FRONT_DOOR

    assert gw.runner is not None
    door = gw.runner.app[FRONT_DOOR].door
    async with asyncio.timeout(DEADLINE):
        while door.open < count:  # a bounded poll on the real condition
            await asyncio.sleep(0.01)


async def _get_healthz(port: int) -> bytes:
    """A whole `GET /healthz` on a raw kept-alive connection (left open)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    await reader.readexactly(length)
    return head


async def test_at_the_cap_slow_connections_are_evicted_for_newcomers() -> None:
    async with GatewayHarness(max_client_connections=10, client_header_timeout=60.0) as gw:
        port = port_of(gw)
        slow = [asyncio.ensure_future(trickle(port, b"", SLOW_HEAD, 0.2)) for _ in range(10)]
        await _wait_open(gw, 10)
        async with asyncio.timeout(DEADLINE):
            heads = await asyncio.gather(*(_get_healthz(port) for _ in range(5)))
            assert all(h.startswith(b"HTTP/1.1 200") for h in heads)
            while sum(t.done() for t in slow) < 5:  # the evicted ones see their end
                await asyncio.sleep(0.01)
        evicted = [t.result() for t in slow if t.done()]
        for task in slow:
            task.cancel()
        assert len(evicted) == 5  # the five longest waiters, no more
        for answer in evicted:
            line, error = error_of(answer)
            assert line.startswith(b"HTTP/1.1 408") and "needed this connection" in error["message"]


def _slow_answer() -> list[Any]:
    return [*text_chunks(["hi"]), Sleep(1.5), *text_chunks([" there"], role=False),
            finish("stop"), usage(3, 2), DONE]  # fmt: skip


async def test_streams_are_never_evicted_and_a_newcomer_is_refused_when_all_are_busy() -> None:
    quick = [*text_chunks(["ok"]), finish("stop"), usage(1, 1), DONE]
    backend = ScriptedBackend(
        responder=lambda body: (
            _slow_answer() if body["messages"][-1]["content"][0] == "s" else quick
        )
    )
    async with (
        GatewayHarness(backend=backend, max_client_connections=3) as gw,
        client_session() as session,
    ):
        ws = await session.ws_connect(gw.ws_url)  # an idle WebSocket: busy all its life
        streams = []
        for i in range(2):
            body = {**BODY, "input": f"s{i}", "stream": True}
            resp = await session.post(gw.url + "/responses", json=body)
            seen = b""
            while b"output_text.delta" not in seen:
                seen += await resp.content.readany()
            streams.append((resp, seen))
        async with asyncio.timeout(DEADLINE):
            refused = await trickle(
                port_of(gw), b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", b"", 0
            )
            for resp, seen in streams:  # each stream runs to its end, untouched
                seen += await resp.read()
                assert b"response.completed" in seen and b" there" in seen
                resp.release()
            await ws.send_bytes(orjson.dumps({"type": "response.create", **BODY}))
            kinds = []
            while "response.completed" not in kinds:  # the socket still serves turns
                kinds.append(orjson.loads((await ws.receive()).data)["type"])
            await ws.close()
        assert refused == b""


# -- a real process at a small open-file limit ---------------------------------------------------


@contextlib.contextmanager
def own_nofile_raised() -> Iterator[None]:
    """The test's own soft open-file limit raised to its hard limit, for its client sockets."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@contextlib.asynccontextmanager
async def limited_gateway(log: Path, nofile: int, *args: str) -> AsyncIterator[int]:
    """`python -m streamer serve` with RLIMIT_NOFILE = `nofile`, ready; yields its port."""
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "streamer", "serve", "--port", str(port), *args,
            cwd=REPO, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out,
            preexec_fn=limit,
        )  # fmt: skip
    try:
        async with aiohttp.ClientSession() as http, asyncio.timeout(30):
            while True:
                assert proc.returncode is None, log.read_text()
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(f"http://127.0.0.1:{port}/healthz") as resp:
                        if resp.status == 200:
                            break
                await asyncio.sleep(0.05)
        yield port
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def _pause(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await stop.wait()


async def _attacker(port: int, stop: asyncio.Event, connected: asyncio.Queue[None]) -> None:
    """One slowloris connection: a head byte per second; reconnects when it is closed."""
    first = True
    while not stop.is_set():
        try:
            async with asyncio.timeout(3):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except (OSError, TimeoutError):
            await _pause(stop, 1.0)
            continue
        if first:
            connected.put_nowait(None)
            first = False
        try:
            for byte in SLOW_HEAD:
                writer.write(bytes([byte]))
                answered = False
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.0):  # the attacker's pace
                        await reader.read(1)  # a 408 or EOF: the gateway let it go
                        answered = True
                if answered or stop.is_set():
                    break
        except OSError:
            pass
        finally:
            writer.close()
        await _pause(stop, 1.0)  # it notices at its next byte, a second on, and reconnects


async def _normal_client(url: str, count: int, until: float) -> tuple[int, int]:
    """Turns on new connections, each within 5 s, at least `count` and until the clock
    reads `until` (the attack's reconnect waves must pass meanwhile): (ok, made)."""
    ok = made = 0
    async with client_session() as session:
        while made < count or time.monotonic() < until:
            made += 1
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with asyncio.timeout(5):
                    body = {**BODY, "input": f"normal {made}"}
                    async with session.post(url + "/responses", json=body) as resp:
                        data = await resp.read()
                        ok += resp.status == 200 and orjson.loads(data)["status"] == "completed"
    return ok, made


async def _door_report(url: str) -> Any:
    """What the front door did, from /healthz (None: a gateway without one, or dead)."""
    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
        async with (
            aiohttp.ClientSession() as http,
            asyncio.timeout(5),
            http.get(url[:-3] + "/healthz") as resp,
        ):
            return orjson.loads(await resp.read()).get("connections")
    return None


async def _siege(tmp: Path, nofile: int, attackers: int, normals: int, seconds: float) -> float:
    """Normal clients' success rate against a gateway at `nofile` under `attackers`."""
    with own_nofile_raised():
        async with ScriptedBackend() as backend:
            args = ("--upstream", backend.base_url)
            async with limited_gateway(tmp / "gw.log", nofile, *args) as port:
                stop = asyncio.Event()
                connected: asyncio.Queue[None] = asyncio.Queue()
                tasks = [
                    asyncio.ensure_future(_attacker(port, stop, connected))
                    for _ in range(attackers)
                ]
                async with asyncio.timeout(60):
                    for _ in range(attackers):  # every attacker got a connection once
                        await connected.get()
                url = f"http://127.0.0.1:{port}/v1"
                started = time.monotonic()
                until = started + seconds
                runs = await asyncio.gather(
                    *(_normal_client(url, normals // 4, until) for _ in range(4))
                )
                ok, made = sum(r[0] for r in runs), sum(r[1] for r in runs)
                print(
                    f"\nslowloris x{attackers} at RLIMIT_NOFILE {nofile}: normal clients "
                    f"{ok}/{made} ok ({ok / made:.1%}) over {time.monotonic() - started:.1f} s"
                )
                print(f"front door: {await _door_report(url)}")
                stop.set()
                await asyncio.gather(*tasks, return_exceptions=True)
                return ok / made


async def test_slowloris_at_a_small_fd_limit_leaves_normal_clients_served(tmp_path: Path) -> None:
    assert await _siege(tmp_path, nofile=256, attackers=400, normals=40, seconds=3) >= 0.95


@pytest.mark.slow
async def test_2000_slowloris_at_1024_fds_leave_normal_clients_served(tmp_path: Path) -> None:
    assert await _siege(tmp_path, nofile=1024, attackers=2000, normals=100, seconds=10) >= 0.95


# -- /readyz and /metrics --------------------------------------------------------------------------


async def test_readyz_calls_share_a_cached_backend_probe() -> None:
    models = http_response(b'{"object": "list", "data": []}')
    probes = 0

    async def serve(conn: RawConnection) -> None:
        nonlocal probes
        while (request := await conn.request()) is not None:
            probes += request.line.startswith("GET ") and "/models" in request.line
            await conn.send(models)

    async with RawBackend(serve) as raw, GatewayHarness(upstream=raw.url) as gw:
        root = gw.url.removesuffix("/v1")
        async with aiohttp.ClientSession() as http:

            async def ready() -> int:
                async with http.get(root + "/readyz") as resp:
                    assert orjson.loads(await resp.read())["backend"] is True
                    return resp.status

            statuses = list(await asyncio.gather(*(ready() for _ in range(100))))
            statuses += [await ready() for _ in range(100)]
        print(f"\n/readyz x200: {probes} backend probe(s) over {raw.connections} connection(s)")
        assert statuses == [200] * 200
        # one probe per --readyz-cache-seconds (2 s) at most: 200 calls well under 10 s
        assert probes <= 5 and raw.connections <= 5, (probes, raw.connections)


async def test_metrics_auth_requires_a_client_key() -> None:
    async with (
        GatewayHarness(api_keys=("sk-front",), metrics_auth=True) as gw,
        aiohttp.ClientSession() as http,
    ):
        root = gw.url.removesuffix("/v1")
        for headers in ({}, {"Authorization": "Bearer sk-wrong"}):
            async with http.get(root + "/metrics", headers=headers) as resp:
                assert resp.status == 401, headers
                error = orjson.loads(await resp.read())["error"]
                assert error["code"] == "invalid_api_key"
                assert set(error) == {"message", "type", "param", "code"}
        auth = {"Authorization": "Bearer sk-front"}
        async with http.get(root + "/metrics", headers=auth) as resp:
            assert resp.status == 200 and b"streamer_" in await resp.read()
        for path in ("/healthz", "/readyz"):  # still open to probes
            async with http.get(root + path) as resp:
                assert resp.status == 200


async def test_metrics_auth_without_keys_is_refused_at_startup() -> None:
    from streamer.app import create_app
    from streamer.config import Settings

    with pytest.raises(ValueError, match="--metrics-auth needs client keys"):
        create_app(Settings(metrics_auth=True))
